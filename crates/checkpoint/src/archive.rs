//! The checkpoint archive (format 2): what an export signs, and what an import
//! accepts.
//!
//! An archive is a POSIX (pax) tar stream:
//! `manifest.json`, `images/…` (CRIU's images), `fs/…` (the snapshot of the
//! session's overlay upper layer), then `signature.json` as the last member.
//! The signature covers every byte of the stream before that member: every
//! header (path, type, mode, owner, times, link target, the pax records that
//! carry xattrs) and every content byte. One flipped byte anywhere is refused.
//!
//! An archive comes from elsewhere, and its CRIU images become root processes
//! here, so an import reads the WHOLE archive and refuses it before anything is
//! extracted unless: the first member is the manifest; every other member is
//! `images/NAME` (a regular file with a CRIU file name) or lies under `fs/`; an
//! `fs/` member is a regular file, directory, symlink, hard link to an earlier
//! `fs/` file or an overlay whiteout (character device 0:0), without setuid or
//! setgid bits, with no xattr but [`OVERLAY_XATTRS`], no pax record a newline
//! breaks, and no member's path
//! goes through a symlink member; no path is absolute or has a `..`; and the
//! signature verifies with a trusted key (or the importer said
//! `--trust-unsigned`). The same parser (the `tar` crate) then extracts the
//! file it validated, so the two can never read one archive differently.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use base64::Engine;
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use drums_targuard::Guard;

use crate::keys::{self, HostKey};
use crate::{CheckpointError, Manifest};

/// The archive's last member.
pub const SIGNATURE_MEMBER: &str = "signature.json";
/// The version of [`SignatureFile`].
// A change to SignatureFile or to what it signs needs a bump.
pub const SIGNATURE_VERSION: u32 = 1;
/// Signed together with the digest, so a drums archive signature can never be
/// replayed as a signature of anything else made with the same key.
const SIGNED_CONTEXT: &[u8] = b"drums checkpoint archive, signature format 1\0";
const MAX_MANIFEST: u64 = 1 << 20;
const MAX_SIGNATURE: u64 = 16 << 10;

/// `signature.json`.
// A change here needs a SIGNATURE_VERSION bump.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignatureFile {
    pub format_version: u32,
    pub algorithm: String,
    /// The signer's public key, base64.
    pub public_key: String,
    /// sha256 (hex) of every archive byte before this member.
    pub sha256: String,
    /// ed25519 over `SIGNED_CONTEXT || sha256 bytes`, base64.
    pub signature: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The tar stream itself is broken: truncated, a bad header checksum.
    #[error("not a readable checkpoint archive")]
    Read(#[source] std::io::Error),
    #[error("archive member {path:?} refused: {why}")]
    Refused { path: String, why: String },
    #[error("not a drums checkpoint archive: {0}")]
    Layout(String),
    #[error("archive manifest")]
    Manifest(#[source] CheckpointError),
    #[error("the archive is not signed: import it with --trust-unsigned only if you trust where it came from")]
    Unsigned,
    #[error("archive signature: {0}")]
    BadSignatureFile(String),
    #[error("archive signature")]
    SignatureKey(#[source] keys::PublicKeyError),
    #[error("archive checksum mismatch: the archive was damaged or altered after it was signed")]
    Checksum,
    #[error("bad archive signature: the archive was altered after it was signed")]
    BadSignature,
    #[error("the archive is signed by {key}, which this host does not trust: add that key to {trusted} to trust it (or import with --trust-unsigned)")]
    Untrusted { key: String, trusted: PathBuf },
    /// An injected failure (tests only), to prove a failing export fails loudly.
    #[error("injected fault: {0}")]
    Injected(String),
}

impl ArchiveError {
    /// A refusal for lack of trust, rather than a malformed archive.
    pub fn is_untrusted(&self) -> bool {
        matches!(
            self,
            ArchiveError::Unsigned | ArchiveError::Untrusted { .. }
        )
    }
}

type Result<T> = std::result::Result<T, ArchiveError>;

fn read_err(e: std::io::Error) -> ArchiveError {
    ArchiveError::Read(e)
}

fn refused(path: &[u8], why: impl Into<String>) -> ArchiveError {
    ArchiveError::Refused {
        path: String::from_utf8_lossy(path).into_owned(),
        why: why.into(),
    }
}

/// A name that [`check_image_name`] refuses.
#[derive(Debug, thiserror::Error)]
#[error("invalid CRIU image name {0:?}: use letters, digits, '_', '.' or '-', not \".\" or \"..\"")]
pub struct InvalidImageName(pub String);

/// A CRIU image file name: one path component of `[A-Za-z0-9_.-]`, not `.`
/// or `..`.
pub fn check_image_name(name: &str) -> std::result::Result<(), InvalidImageName> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(InvalidImageName(name.to_owned()))
    }
}

fn padded(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

/// Bytes read through a [`Tee`] wait in `pending` until the walker knows
/// they belong to a member (then they are hashed and passed on); what follows
/// the last member (tar's end-of-archive blocks) never is.
struct TeeState<S> {
    pending: Vec<u8>,
    /// Archive offset of `pending[0]`.
    at: u64,
    /// Bytes before this offset belong to members.
    safe: u64,
    hasher: Sha256,
    sink: S,
}

impl<S: FnMut(&[u8]) -> std::io::Result<()>> TeeState<S> {
    fn advance(&mut self, to: u64) -> std::io::Result<()> {
        self.safe = self.safe.max(to);
        let n = (self.safe.saturating_sub(self.at) as usize).min(self.pending.len());
        if n > 0 {
            self.hasher.update(&self.pending[..n]);
            (self.sink)(&self.pending[..n])?;
            self.pending.drain(..n);
            self.at += n as u64;
        }
        Ok(())
    }
}

type Shared<S> = Rc<RefCell<TeeState<S>>>;

struct Tee<R, S> {
    inner: R,
    st: Rc<RefCell<TeeState<S>>>,
}

impl<R: Read, S: FnMut(&[u8]) -> std::io::Result<()>> Read for Tee<R, S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut st = self.st.borrow_mut();
        st.pending.extend_from_slice(&buf[..n]);
        let safe = st.safe;
        st.advance(safe)?;
        Ok(n)
    }
}

fn tee<R: Read, S: FnMut(&[u8]) -> std::io::Result<()>>(
    inner: R,
    sink: S,
) -> (tar::Archive<Guard<Tee<R, S>>>, Shared<S>) {
    let st = Rc::new(RefCell::new(TeeState {
        pending: Vec::new(),
        at: 0,
        safe: 0,
        hasher: Sha256::new(),
        sink,
    }));
    // Bounded before the tar crate reads an extension header whole: this
    // runs before the signature is checked, on anyone's archive.
    let a = tar::Archive::new(Guard::new(Tee {
        inner,
        st: st.clone(),
    }));
    (a, st)
}

/// Export, first half: pass GNU tar's output to `out` without its
/// end-of-archive blocks, and return the sha256 of what was passed.
/// `after_member(i)` runs after member `i` is known (a fault point for tests).
/// The caller checks that tar succeeded before it appends
/// [`signature_member`]: a failed tar never gets a signature.
pub fn pass_members<R: Read>(
    tar_out: R,
    out: impl FnMut(&[u8]) -> std::io::Result<()>,
    mut after_member: impl FnMut(usize) -> Result<()>,
) -> Result<[u8; 32]> {
    let (mut a, st) = tee(tar_out, out);
    for (i, e) in a.entries().map_err(read_err)?.enumerate() {
        let mut e = e.map_err(read_err)?;
        // A member an import would refuse fails the export, loudly, rather
        // than make an archive nobody can import.
        let raw = e.path_bytes().into_owned();
        pax_records(&mut e, &raw)?;
        let end = e.raw_file_position() + padded(e.size());
        st.borrow_mut().advance(end).map_err(read_err)?;
        after_member(i)?;
    }
    // Let tar write its end-of-archive blocks and exit; they are not passed on.
    let mut rest = a.into_inner().into_inner().inner;
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(read_err)?;
    let st = Rc::try_unwrap(st)
        .ok()
        .expect("the archive reader is gone")
        .into_inner();
    Ok(st.hasher.finalize().into())
}

/// Export, second half: the signature member over `digest`, then the
/// end-of-archive blocks.
pub fn signature_member(key: &HostKey, digest: &[u8; 32]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let sig = key.sign(&signed_message(digest));
    let file = SignatureFile {
        format_version: SIGNATURE_VERSION,
        algorithm: keys::ALGORITHM.into(),
        public_key: b64.encode(key.public().as_bytes()),
        sha256: hex(digest),
        signature: b64.encode(sig.to_bytes()),
    };
    let body = serde_json::to_vec_pretty(&file).expect("signature serializes");
    let mut h = tar::Header::new_ustar();
    h.set_path(SIGNATURE_MEMBER).expect("short ascii path");
    h.set_size(body.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(&body);
    out.resize(
        out.len() + (padded(body.len() as u64) as usize - body.len()),
        0,
    );
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Sign a tar stream of members that has no end-of-archive blocks: the
/// stream, its signature member and the end-of-archive blocks. What an export
/// does, for archives made some other way (tools, tests).
pub fn seal(members: &[u8], key: &HostKey) -> Vec<u8> {
    let digest: [u8; 32] = Sha256::digest(members).into();
    [members, &signature_member(key, &digest)].concat()
}

fn signed_message(digest: &[u8; 32]) -> Vec<u8> {
    [SIGNED_CONTEXT, digest.as_slice()].concat()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whom an import trusts.
pub struct Trust {
    /// The host's own key and those of `trusted-keys`.
    pub keys: Vec<VerifyingKey>,
    /// Where to add a key (named in the refusal).
    pub trusted_keys_file: PathBuf,
    /// `--trust-unsigned`: accept an archive without a signature, or signed by
    /// a key not trusted here. A signature that does not verify is refused
    /// all the same: that archive was altered.
    pub trust_unsigned: bool,
}

/// What a validated archive holds.
#[derive(Debug)]
pub struct Verified {
    pub manifest: Manifest,
    /// The signer's key (`ed25519 <base64>`), if signed.
    pub signer: Option<String>,
}

/// The pax records an accepted member may carry; any other is refused.
fn pax_key_allowed(key: &str) -> bool {
    matches!(
        key,
        "path"
            | "linkpath"
            | "size"
            | "mtime"
            | "atime"
            | "ctime"
            | "uid"
            | "gid"
            | "uname"
            | "gname"
            // GNU tar's mark of a file name that is not UTF-8.
            | "hdrcharset"
    ) || key
        .strip_prefix("SCHILY.xattr.")
        .is_some_and(|x| OVERLAY_XATTRS.contains(&x))
}

/// The overlay xattrs an archive carries: those that give an upper layer its
/// meaning. An export writes no other (`trusted.overlay.origin`, `impure` and
/// `uuid` name inodes and filesystems of the exporting host, and hold binary
/// values), and an import accepts no other.
pub const OVERLAY_XATTRS: &[&str] = &["trusted.overlay.opaque", "trusted.overlay.redirect"];

/// A member's pax records, each framed by its length.
///
/// The `tar` crate (0.4.46) splits a pax header on newlines before it reads
/// each record's length, so a value holding a newline (a long file name or
/// link target with a newline in it, or a binary xattr) fails to parse, and
/// its tail could be read as a record of its own (tar-rs issues 428 and 452).
/// Such a member is refused, here and at export, rather than read in a way
/// GNU tar would not.
fn pax_records(e: &mut tar::Entry<'_, impl Read>, raw: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let Some(exts) = e.pax_extensions().map_err(read_err)? else {
        return Ok(out);
    };
    for x in exts {
        let x = x.map_err(|_| {
            refused(
                raw,
                "a pax record this reader cannot frame (a value holding a newline: \
                 a long file name, link target or xattr with a newline in it)",
            )
        })?;
        let key = x
            .key()
            .map_err(|_| refused(raw, "a pax record that is not UTF-8"))?;
        out.push((key.to_owned(), x.value_bytes().to_vec()));
    }
    Ok(out)
}

/// A member's path as plain components: no root, no `.`/`..`, no NUL.
fn clean_path(raw: &[u8]) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if raw.is_empty() {
        return Err(refused(raw, "empty path"));
    }
    if raw.starts_with(b"/") {
        return Err(refused(raw, "absolute path"));
    }
    let p = Path::new(std::ffi::OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => return Err(refused(raw, "a \"..\" component")),
            Component::CurDir => return Err(refused(raw, "a \".\" component")),
            Component::RootDir | Component::Prefix(_) => return Err(refused(raw, "absolute path")),
        }
    }
    Ok(out)
}

/// Read and check the whole archive at `path` (see the module's doc). Nothing
/// is written anywhere.
pub fn verify(path: &Path, trust: &Trust) -> Result<Verified> {
    let f = std::fs::File::open(path).map_err(|source| ArchiveError::Io {
        op: "open",
        path: path.to_owned(),
        source,
    })?;
    let (mut a, st) = tee(
        std::io::BufReader::with_capacity(1 << 20, f),
        |_: &[u8]| Ok(()),
    );
    let mut manifest: Option<Manifest> = None;
    let mut signature: Option<Vec<u8>> = None;
    // Where the signature's content ends: all that follows must be zeros.
    let mut signature_end = 0u64;
    let mut last_end = 0u64;
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    let mut fs_files: HashSet<PathBuf> = HashSet::new();
    let mut images: BTreeSet<String> = BTreeSet::new();
    // The snapshot's root: without it a restore has no files to start from.
    let mut has_fs = false;
    for (i, e) in a.entries().map_err(read_err)?.enumerate() {
        let mut e = e.map_err(read_err)?;
        let raw = e.path_bytes().into_owned();
        if signature.is_some() {
            return Err(refused(&raw, format!("a member after {SIGNATURE_MEMBER}")));
        }
        let p = clean_path(&raw)?;
        let kind = e.header().entry_type();
        let end = e.raw_file_position() + padded(e.size());
        if i == 0 {
            if p != Path::new("manifest.json") || !kind.is_file() {
                return Err(ArchiveError::Layout(
                    "the first member must be manifest.json".into(),
                ));
            }
            if e.size() > MAX_MANIFEST {
                return Err(refused(&raw, "larger than 1 MiB"));
            }
            let mut text = Vec::new();
            e.read_to_end(&mut text).map_err(read_err)?;
            manifest = Some(
                Manifest::from_slice(&text, PathBuf::from("manifest.json"))
                    .map_err(ArchiveError::Manifest)?,
            );
            st.borrow_mut().advance(end).map_err(read_err)?;
            last_end = end;
            seen.insert(p);
            continue;
        }
        if p == Path::new(SIGNATURE_MEMBER) {
            if !kind.is_file() || e.size() > MAX_SIGNATURE {
                return Err(refused(&raw, "not a small regular file"));
            }
            // Nothing between the last signed byte and this header (no pax
            // record of its own): every byte before it is signed.
            if e.raw_header_position() != last_end {
                return Err(refused(&raw, "extended headers before the signature"));
            }
            let mut text = Vec::new();
            e.read_to_end(&mut text).map_err(read_err)?;
            signature_end = e.raw_file_position() + e.size();
            signature = Some(text);
            continue;
        }
        for (key, _) in pax_records(&mut e, &raw)? {
            if !pax_key_allowed(&key) {
                let why = match key.strip_prefix("SCHILY.xattr.") {
                    Some(x) => format!(
                        "extended attribute {x:?} (only {} are accepted)",
                        OVERLAY_XATTRS.join(" and ")
                    ),
                    None => format!("pax record {key:?}"),
                };
                return Err(refused(&raw, why));
            }
        }
        if !seen.insert(p.clone()) {
            return Err(refused(&raw, "a second member with this path"));
        }
        let mut comps = p.components();
        let top = comps.next().map(|c| c.as_os_str().to_owned());
        let depth = p.components().count();
        match top.as_deref().and_then(|t| t.to_str()) {
            Some("images") if depth == 1 => {
                if !kind.is_dir() {
                    return Err(refused(&raw, "images must be a directory"));
                }
            }
            Some("images") => {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if depth != 2 || !kind.is_file() {
                    return Err(refused(&raw, "images/ holds only regular files"));
                }
                check_image_name(name).map_err(|why| refused(&raw, why.to_string()))?;
                images.insert(name.to_owned());
            }
            Some("fs") => {
                if depth == 1 && !kind.is_dir() {
                    return Err(refused(&raw, "fs must be a directory"));
                }
                has_fs |= depth == 1;
                check_fs_member(&mut e, &raw, &p, &symlinks, &fs_files)?;
                if kind.is_symlink() {
                    symlinks.insert(p.clone());
                } else if kind.is_file() {
                    fs_files.insert(p.clone());
                }
            }
            _ => return Err(refused(&raw, "not a member of a drums checkpoint archive")),
        }
        st.borrow_mut().advance(end).map_err(read_err)?;
        last_end = end;
    }
    let manifest = manifest.ok_or_else(|| ArchiveError::Layout("the archive is empty".into()))?;
    if !has_fs {
        return Err(ArchiveError::Layout(
            "it has no fs/ (the checkpoint's files)".into(),
        ));
    }
    let listed: BTreeSet<String> = manifest.images.iter().map(|i| i.name.clone()).collect();
    if listed != images {
        return Err(ArchiveError::Layout(format!(
            "its images ({}) are not those its manifest lists ({})",
            images.into_iter().collect::<Vec<_>>().join(" "),
            listed.into_iter().collect::<Vec<_>>().join(" ")
        )));
    }
    for i in &manifest.images {
        check_image_name(&i.name).map_err(|why| refused(i.name.as_bytes(), why.to_string()))?;
    }
    drop(a);
    let digest: [u8; 32] = Rc::try_unwrap(st)
        .ok()
        .expect("the archive reader is gone")
        .into_inner()
        .hasher
        .finalize()
        .into();
    if signature.is_some() {
        check_tail(path, signature_end)?;
    }
    let signer = match signature {
        None if trust.trust_unsigned => None,
        None => return Err(ArchiveError::Unsigned),
        Some(text) => Some(check_signature(&text, &digest, trust)?),
    };
    Ok(Verified { manifest, signer })
}

/// After the signature's content: its padding and the end-of-archive blocks,
/// all zeros (the tar parser reads none of it, so a byte changed there would
/// otherwise pass unseen).
fn check_tail(path: &Path, from: u64) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let io = |op| {
        move |source| ArchiveError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    };
    let mut f = std::fs::File::open(path).map_err(io("open"))?;
    f.seek(SeekFrom::Start(from)).map_err(io("seek"))?;
    let mut tail = Vec::new();
    f.take(1 << 20).read_to_end(&mut tail).map_err(io("read"))?;
    if tail.len() < 1024 || tail.iter().any(|b| *b != 0) {
        return Err(ArchiveError::Layout(
            "the archive does not end with zero blocks after its signature".into(),
        ));
    }
    Ok(())
}

fn check_fs_member<R: Read>(
    e: &mut tar::Entry<'_, R>,
    raw: &[u8],
    p: &Path,
    symlinks: &HashSet<PathBuf>,
    fs_files: &HashSet<PathBuf>,
) -> Result<()> {
    use tar::EntryType as T;
    // Extraction must never follow a symlink the archive made.
    if let Some(a) = p.ancestors().skip(1).find(|a| symlinks.contains(*a)) {
        return Err(refused(
            raw,
            format!("its path goes through the symlink member {}", a.display()),
        ));
    }
    let h = e.header();
    let mode = h.mode().map_err(read_err)?;
    // setuid/setgid files run with another identity. A setgid directory
    // only passes its group on to new files (Debian ships /var/mail and
    // /var/local so, and a session's upper layer has them once written to):
    // it grants nothing, and refusing it would make such sessions
    // unexportable.
    let setid = if h.entry_type().is_dir() {
        mode & 0o4000
    } else {
        mode & 0o6000
    };
    if setid != 0 {
        return Err(refused(
            raw,
            format!("setuid or setgid bit (mode {mode:o})"),
        ));
    }
    match h.entry_type() {
        T::Regular | T::Directory | T::Symlink => Ok(()),
        T::Char => {
            let major = h.device_major().map_err(read_err)?;
            let minor = h.device_minor().map_err(read_err)?;
            if (major, minor) == (Some(0), Some(0)) {
                Ok(())
            } else {
                Err(refused(
                    raw,
                    "a device node (only 0:0 overlay whiteouts are accepted)",
                ))
            }
        }
        T::Link => {
            let target = e
                .link_name_bytes()
                .ok_or_else(|| refused(raw, "a hard link without a target"))?;
            let t = clean_path(&target)?;
            if !fs_files.contains(&t) {
                return Err(refused(
                    raw,
                    format!(
                        "a hard link to {}, which is not an earlier regular file under fs/",
                        t.display()
                    ),
                ));
            }
            Ok(())
        }
        T::Block => Err(refused(raw, "a block device node")),
        T::Fifo => Err(refused(raw, "a fifo")),
        other => Err(refused(
            raw,
            format!("member type {:?}", other.as_byte() as char),
        )),
    }
}

fn check_signature(text: &[u8], digest: &[u8; 32], trust: &Trust) -> Result<String> {
    let s: SignatureFile =
        serde_json::from_slice(text).map_err(|e| ArchiveError::BadSignatureFile(e.to_string()))?;
    if s.format_version != SIGNATURE_VERSION || s.algorithm != keys::ALGORITHM {
        return Err(ArchiveError::BadSignatureFile(format!(
            "format {} with {:?}; this drums reads format {SIGNATURE_VERSION} with {:?}",
            s.format_version,
            s.algorithm,
            keys::ALGORITHM
        )));
    }
    if s.sha256 != hex(digest) {
        return Err(ArchiveError::Checksum);
    }
    let key = keys::parse_public_key(&s.public_key).map_err(ArchiveError::SignatureKey)?;
    let sig: [u8; 64] = base64::engine::general_purpose::STANDARD
        .decode(&s.signature)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            ArchiveError::BadSignatureFile("the signature is not 64 bytes of base64".into())
        })?;
    key.verify_strict(
        &signed_message(digest),
        &ed25519_dalek::Signature::from_bytes(&sig),
    )
    .map_err(|_| ArchiveError::BadSignature)?;
    let text = keys::public_key_text(&key);
    if !trust.trust_unsigned && !trust.keys.contains(&key) {
        return Err(ArchiveError::Untrusted {
            key: text,
            trusted: trust.trusted_keys_file.clone(),
        });
    }
    Ok(text)
}

/// Extract an archive [`verify`] accepted into `staging` (which holds an
/// empty `fs` subvolume): `images/` and `fs/`, with owners, modes, times and
/// the overlay xattrs. The manifest and signature are not extracted: the
/// caller writes its own manifest.
pub fn extract(path: &Path, staging: &Path) -> Result<()> {
    let f = std::fs::File::open(path).map_err(|source| ArchiveError::Io {
        op: "open",
        path: path.to_owned(),
        source,
    })?;
    let mut a = tar::Archive::new(Guard::new(std::io::BufReader::with_capacity(1 << 20, f)));
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_preserve_mtime(true);
    // Set below for every kind of member: the tar crate sets xattrs on
    // regular files only, and an overlay marks opaque *directories* with
    // trusted.overlay.opaque.
    a.set_unpack_xattrs(false);
    a.set_overwrite(false);
    // Directory times are set last: extracting their children changes them.
    let mut dir_times: Vec<(PathBuf, i64)> = Vec::new();
    for (i, e) in a.entries().map_err(read_err)?.enumerate() {
        let mut e = e.map_err(read_err)?;
        let raw = e.path_bytes().into_owned();
        let p = clean_path(&raw)?;
        if i == 0 || p == Path::new(SIGNATURE_MEMBER) {
            continue;
        }
        let dst = staging.join(&p);
        let io = |op| {
            let dst = dst.clone();
            move |source| ArchiveError::Io {
                op,
                path: dst,
                source,
            }
        };
        // verify() accepted only OVERLAY_XATTRS here.
        let xattrs: Vec<(String, Vec<u8>)> = pax_records(&mut e, &raw)?
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("SCHILY.xattr.")?.to_owned(), v)))
            .collect();
        let kind = e.header().entry_type();
        if kind.is_character_special() {
            // An overlay whiteout (verify refused every other device): the
            // tar crate would write a regular file in its place.
            let h = e.header();
            let mode = h.mode().map_err(read_err)? & 0o7777;
            let (uid, gid) = (h.uid().map_err(read_err)?, h.gid().map_err(read_err)?);
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent).map_err(io("create"))?;
            }
            nix::sys::stat::mknod(
                &dst,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(mode),
                0,
            )
            .map_err(|e| io("mknod")(e.into()))?;
            std::os::unix::fs::lchown(&dst, Some(uid as u32), Some(gid as u32))
                .map_err(io("chown"))?;
        } else {
            if kind.is_dir() {
                dir_times.push((dst.clone(), e.header().mtime().map_err(read_err)? as i64));
            }
            if !e.unpack_in(staging).map_err(io("extract"))? {
                return Err(refused(&raw, "outside the staging directory"));
            }
        }
        for (name, value) in &xattrs {
            // Never follows a symlink (lsetxattr).
            xattr::set(&dst, name, value).map_err(io("set an xattr on"))?;
        }
    }
    for (dir, mtime) in dir_times.iter().rev() {
        let t = nix::sys::time::TimeSpec::new(*mtime, 0);
        nix::sys::stat::utimensat(
            None,
            dir,
            &t,
            &t,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| ArchiveError::Io {
            op: "set the times of",
            path: dir.clone(),
            source: e.into(),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{HostFingerprint, ImageFile, SourceSession};

    fn manifest() -> Vec<u8> {
        let m = Manifest {
            format_version: crate::FORMAT_VERSION,
            id: "0123456789ab".into(),
            name: "warm".into(),
            created_at_ms: 1,
            session: SourceSession {
                id: "s1".into(),
                name: "s1".into(),
                hostname: "s1".into(),
                profile: "headless".into(),
                image: "default".into(),
                network: "none".into(),
                limits: serde_json::json!({}),
                generation: 0,
                egress: "none".into(),
                privileged: false,
                user_namespace: true,
            },
            host: HostFingerprint::of_this_host("4.2.1"),
            clean: false,
            leave_running: false,
            images: vec![ImageFile {
                name: "core-1.img".into(),
                size: 4,
                sha256: String::new(),
            }],
            origin: None,
            frozen_ms: 1.0,
            dump_ms: 1.0,
            version: None,
        };
        serde_json::to_vec(&m).unwrap()
    }

    /// A tar stream as GNU tar would write one: members and end blocks.
    fn tar_stream(extra: &[(&str, tar::EntryType, u32, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, kind: tar::EntryType, mode: u32, data: &[u8]| {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, data).unwrap();
        };
        add("manifest.json", tar::EntryType::Regular, 0o644, &manifest());
        add("images/", tar::EntryType::Directory, 0o755, b"");
        add("images/core-1.img", tar::EntryType::Regular, 0o600, b"core");
        add("fs/", tar::EntryType::Directory, 0o755, b"");
        // A setgid directory, as Debian's /var/local: accepted.
        add("fs/var/local/", tar::EntryType::Directory, 0o2775, b"");
        for (p, k, m, d) in extra {
            add(p, *k, *m, d);
        }
        b.into_inner().unwrap()
    }

    fn trust(keys: Vec<VerifyingKey>) -> Trust {
        Trust {
            keys,
            trusted_keys_file: PathBuf::from("/state/trusted-keys"),
            trust_unsigned: false,
        }
    }

    /// Export's signing of a stream (what drumsd does to tar's output).
    fn signed(stream: &[u8], key: &HostKey) -> Vec<u8> {
        let mut passed = Vec::new();
        let digest = pass_members(
            stream,
            |b: &[u8]| {
                passed.extend_from_slice(b);
                Ok(())
            },
            |_| Ok(()),
        )
        .unwrap();
        // Everything but tar's end-of-archive blocks was passed on.
        assert_eq!(passed, stream[..passed.len()]);
        assert!(stream[passed.len()..].iter().all(|b| *b == 0));
        assert!(stream.len() - passed.len() >= 1024);
        [passed, signature_member(key, &digest)].concat()
    }

    fn verify_bytes(bytes: &[u8], trust: &Trust) -> Result<Verified> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.tar");
        std::fs::write(&p, bytes).unwrap();
        verify(&p, trust)
    }

    #[test]
    fn a_signed_archive_verifies_and_any_flipped_byte_is_refused() {
        let kd = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(kd.path()).unwrap();
        let archive = signed(&tar_stream(&[]), &key);
        let t = trust(vec![key.public()]);
        let v = verify_bytes(&archive, &t).unwrap();
        assert_eq!(v.manifest.name, "warm");
        assert_eq!(v.signer, Some(keys::public_key_text(&key.public())));
        // Every byte: headers, contents and padding alike, the signature
        // member's own and the end blocks included.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.tar");
        for i in 0..archive.len() {
            let mut bad = archive.clone();
            bad[i] ^= 0x01;
            std::fs::write(&p, &bad).unwrap();
            assert!(verify(&p, &t).is_err(), "byte {i} flipped and accepted");
        }
    }

    #[test]
    fn unsigned_and_untrusted_archives_need_trust_unsigned() {
        let kd = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(&kd.path().join("a")).unwrap();
        let other = HostKey::load_or_create(&kd.path().join("b")).unwrap();
        let mut t = trust(vec![key.public()]);
        let unsigned = tar_stream(&[]);
        assert!(matches!(
            verify_bytes(&unsigned, &t),
            Err(ArchiveError::Unsigned)
        ));
        let theirs = signed(&tar_stream(&[]), &other);
        let e = verify_bytes(&theirs, &t).unwrap_err();
        assert!(e.is_untrusted(), "{e}");
        assert!(e.to_string().contains("/state/trusted-keys"), "{e}");
        t.trust_unsigned = true;
        assert_eq!(verify_bytes(&unsigned, &t).unwrap().signer, None);
        verify_bytes(&theirs, &t).unwrap();
    }

    #[test]
    fn members_outside_the_allow_list_are_refused() {
        use tar::EntryType as T;
        let kd = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(kd.path()).unwrap();
        let t = trust(vec![key.public()]);
        let cases: &[(&str, T, u32, &str)] = &[
            ("fs/bin/su", T::Regular, 0o4755, "setuid or setgid"),
            ("fs/bin/wall", T::Regular, 0o2755, "setuid or setgid"),
            ("fs/d/", T::Directory, 0o4755, "setuid or setgid"),
            ("fs/p", T::Fifo, 0o644, "a fifo"),
            (
                "images/x/y",
                T::Regular,
                0o644,
                "images/ holds only regular files",
            ),
            (
                "other",
                T::Regular,
                0o644,
                "not a member of a drums checkpoint archive",
            ),
            (
                "fs/var/local/",
                T::Directory,
                0o755,
                "a second member with this path",
            ),
        ];
        for (path, kind, mode, why) in cases {
            let a = signed(&tar_stream(&[(path, *kind, *mode, b"")]), &key);
            let e = verify_bytes(&a, &t).unwrap_err().to_string();
            assert!(e.contains(why), "{path}: {e}");
        }
        // A member after the signature.
        let mut a = signed(&tar_stream(&[]), &key);
        a.truncate(a.len() - 1024);
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_size(0);
        b.append_data(&mut h, "fs/late", &b""[..]).unwrap();
        a.extend(b.into_inner().unwrap());
        let e = verify_bytes(&a, &t).unwrap_err().to_string();
        assert!(e.contains("a member after signature.json"), "{e}");
    }

    #[test]
    fn image_names_are_one_plain_component() {
        for ok in ["core-1.img", "pages-1.img", "stats-dump", "a_b.c"] {
            check_image_name(ok).unwrap();
        }
        for bad in ["", ".", "..", "../x", "a/b", "/etc", "a b", "é"] {
            assert!(check_image_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn paths_with_a_root_or_dots_are_refused() {
        assert_eq!(clean_path(b"fs/a/b/").unwrap(), Path::new("fs/a/b"));
        for bad in [&b"/etc/passwd"[..], b"fs/../x", b"./fs", b""] {
            assert!(
                clean_path(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// An overlay origin, as the kernel writes one: a binary file handle,
    /// here holding a newline byte.
    #[test]
    fn a_pax_value_with_a_newline_fails_the_export_and_the_import() {
        let kd = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(kd.path()).unwrap();
        let t = trust(vec![key.public()]);
        let mut stream = tar_stream(&[]);
        stream.truncate(stream.len() - 1024);
        let mut b = tar::Builder::new(stream);
        b.append_pax_extensions([(
            "SCHILY.xattr.trusted.overlay.opaque",
            &b"y\n12 path=x\n"[..],
        )])
        .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(0);
        b.append_data(&mut h, "fs/dir", &b""[..]).unwrap();
        let stream = b.into_inner().unwrap();
        let e = pass_members(&stream[..], |_: &[u8]| Ok(()), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot frame") && e.contains("fs/dir"), "{e}");
        let mut members = stream.clone();
        members.truncate(members.len() - 1024);
        let e = verify_bytes(&seal(&members, &key), &t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot frame"), "{e}");
    }

    #[test]
    fn only_overlay_xattrs_and_plain_records_pass() {
        assert!(pax_key_allowed("SCHILY.xattr.trusted.overlay.opaque"));
        assert!(pax_key_allowed("path"));
        assert!(!pax_key_allowed("SCHILY.xattr.security.capability"));
        assert!(!pax_key_allowed("SCHILY.xattr.trusted.other"));
        assert!(!pax_key_allowed("SCHILY.xattr.trusted.overlay.origin"));
        assert!(!pax_key_allowed("GNU.sparse.map"));
    }
}
