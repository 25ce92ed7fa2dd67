//! One layer applied onto a tree that holds its parent's (a writable snapshot
//! of the parent layer's subvolume): the image spec's changeset, with its
//! whiteouts (`.wh.NAME` removes NAME below; `.wh..wh..opq` hides what the
//! layers below put in its directory).
//!
//! A layer comes from a stranger, so every name is resolved inside the tree
//! (openat2 with RESOLVE_IN_ROOT, as the session will resolve it) and a final
//! component is never followed. A path is read as podman reads it: a leading
//! `/` is dropped and `a/../b` is `b`. What is refused, with the entry named,
//! is what would reach past the tree or the store, or what cannot be made as
//! the layer says (docs/oci.md, "Applying a layer", says which is which): a
//! `..` that climbs above the root, a whiteout that names more than one entry
//! of its directory, more bytes or entries than the limits, a hard link to a
//! directory or to nothing, an entry type the spec does not use.
//!
//! Some entries are read but not written, and listed in [`Applied::skipped`]
//! for the caller to log: device nodes (a session's devices are drums' own,
//! and the store never holds one a stranger chose; rootless podman skips them
//! too), a hard link to such a node, and AUFS's metadata
//! (`.wh..wh.plnk`, `.wh..wh.aufs`, ...), which docker and podman skip.
//! Symlinks are kept as written, whatever their target: inside the session
//! they name its own files (a session can make any link it likes itself),
//! and drums never follows one from the host (it opens a session's paths
//! with `drums_sys::open_in_root`).
//!
//! The diff-id (the sha256 of the uncompressed stream, all of it, skipped
//! entries included) is computed as the layer is applied; the caller
//! compares it with the image config's and throws the tree away on a
//! mismatch, as on any error here: a refused layer leaves a half-applied
//! tree that must not be used.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use sha2::{Digest, Sha256};

/// The whiteout prefix, and the opaque-directory marker.
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// What one layer may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// File content, uncompressed.
    pub max_bytes: u64,
    pub max_entries: u64,
    /// What the store can take of this layer, all it writes charged: every
    /// file's content and [`ENTRY_BYTES`] for each entry. A layer is the
    /// stranger's and the store is every session's.
    pub room: u64,
}

impl Default for LayerLimits {
    /// Larger than any benchmark's task image (SWE-bench's are a few GiB).
    fn default() -> Self {
        LayerLimits {
            max_bytes: 32 << 30,
            max_entries: 4 << 20,
            room: u64::MAX,
        }
    }
}

/// What an entry costs the store beyond its content, charged against the
/// room: btrfs's inode item, its two directory items and their share of a
/// leaf, with metadata kept twice. A million empty files cost the store
/// about a GiB, and must not pass as nothing.
pub const ENTRY_BYTES: u64 = 1024;

/// What a layer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// `sha256:HEX` of the uncompressed stream.
    pub diff_id: String,
    pub entries: u64,
    /// File content written.
    pub bytes: u64,
    pub whiteouts: u64,
    /// What was charged against the room (see [`LayerLimits::room`]).
    pub charged: u64,
    /// Entries read but not written, in the layer's order.
    pub skipped: Vec<Skipped>,
}

/// An entry of a layer that was read (its bytes are in the diff-id) and not
/// written; what was at its path before is gone, as the layer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// As the layer names it.
    pub path: String,
    pub what: Skip,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// A character or block device node. drums never makes one from a
    /// layer: a session gets its devices from drums (its own /dev), and a
    /// node a stranger chose (`/dev/sda`'s numbers, say) must not sit in the
    /// host's store, where anything of the host that walks it could open it.
    Device { block: bool, major: u32, minor: u32 },
    /// A hard link to a device node this layer skipped.
    LinkToDevice { target: String },
    /// AUFS's metadata at the layer's root (`.wh..wh.plnk`, `.wh..wh.aufs`,
    /// `.wh..wh.orph` and what is in them), or a `.wh..wh.` entry that is
    /// not the opaque marker: nothing of the image's files.
    WhiteoutMeta,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Device {
                block,
                major,
                minor,
            } => write!(
                f,
                "a {} device node ({major}:{minor}), never made from a layer",
                if *block { "block" } else { "character" }
            ),
            Skip::LinkToDevice { target } => {
                write!(
                    f,
                    "a hard link to the device node {target}, which was skipped"
                )
            }
            Skip::WhiteoutMeta => write!(f, "AUFS whiteout metadata, skipped as podman does"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer entry {path:?} refused: {why}")]
    Refused { path: String, why: String },
    #[error("the layer unpacks to more than its limit of {limit} bytes")]
    TooBig { limit: u64 },
    #[error("the layer unpacks to more than the {room} bytes the store has room for (its free space less drumsd's reserve)")]
    NoRoom { room: u64 },
    #[error("the layer has more than its limit of {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("zstd-compressed layers are not supported; use gzip or none")]
    Zstd,
    #[error("read the layer (truncated or corrupt?)")]
    Read(#[source] std::io::Error),
    #[error("{op} {path:?} in the layer's tree")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, LayerError>;

fn refused(raw: &[u8], why: impl Into<String>) -> LayerError {
    LayerError::Refused {
        path: String::from_utf8_lossy(raw).into_owned(),
        why: why.into(),
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> LayerError + 'a {
    move |e| LayerError::Io {
        op,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// Reads through, hashing every byte.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Apply the layer `blob` (a tar stream, gzip-compressed or not: told by its
/// first bytes) onto the tree at `root`.
pub fn apply(root: &Path, blob: impl Read, limits: &LayerLimits) -> Result<Applied> {
    let mut r = BufReader::with_capacity(1 << 20, blob);
    let head = r.fill_buf().map_err(LayerError::Read)?;
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(LayerError::Zstd);
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        apply_tar(root, flate2::read::GzDecoder::new(r), limits)
    } else {
        apply_tar(root, r, limits)
    }
}

/// Apply an uncompressed tar stream.
pub fn apply_tar(root: &Path, tar: impl Read, limits: &LayerLimits) -> Result<Applied> {
    let root_fd = open_dir(None, root)?;
    // Bounded before the tar crate reads an extension header whole.
    let mut a = tar::Archive::new(drums_targuard::Guard::new(Hashing {
        inner: tar,
        hash: Sha256::new(),
    }));
    let mut out = Applied::default();
    let mut t = Tree {
        root: root_fd,
        root_path: root.to_owned(),
        made: HashSet::new(),
        devices: HashMap::new(),
        dirs: Vec::new(),
    };
    for e in a.entries().map_err(LayerError::Read)? {
        let mut e = e.map_err(LayerError::Read)?;
        out.entries += 1;
        if out.entries > limits.max_entries {
            return Err(LayerError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        // Charged before anything is written: the declared size is what
        // the tar crate will read of the entry, at most.
        out.charged = out
            .charged
            .saturating_add(ENTRY_BYTES)
            .saturating_add(e.size());
        if out.charged > limits.room {
            return Err(LayerError::NoRoom { room: limits.room });
        }
        let raw = e.path_bytes().into_owned();
        let kind = e.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let Some(p) = clean_path(&raw)? else {
            continue; // the root itself ("./")
        };
        let skipped = |what| Skipped {
            path: String::from_utf8_lossy(&raw).into_owned(),
            what,
        };
        if in_aufs_meta(&p) {
            out.skipped.push(skipped(Skip::WhiteoutMeta));
            continue;
        }
        let name = p.file_name().expect("a clean path ends in a name");
        let parent = p.parent().unwrap_or(Path::new(""));
        if let Some(rest) = name.as_bytes().strip_prefix(WHITEOUT) {
            if name.as_bytes() != OPAQUE && rest.starts_with(WHITEOUT) {
                // What docker and podman do with it is remove `.wh.X` in its
                // directory: a name no layer can have made, since every
                // `.wh.` entry is read as a whiteout.
                out.skipped.push(skipped(Skip::WhiteoutMeta));
                continue;
            }
            t.whiteout(&raw, parent, name.as_bytes(), rest)?;
            out.whiteouts += 1;
            continue;
        }
        let dir = t.parent(&raw, parent)?;
        let budget = limits.max_bytes - out.bytes;
        match t.entry(&mut e, &raw, &p, &dir, name, budget, limits)? {
            Written::Bytes(n) => {
                out.bytes += n;
                t.mark(&p);
            }
            Written::Skipped(what) => out.skipped.push(skipped(what)),
        }
    }
    // The end-of-archive blocks and any padding after them are part of the
    // stream the diff-id covers.
    let mut rest = a.into_inner().into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(LayerError::Read)?;
    t.set_dir_times()?;
    out.diff_id = format!("sha256:{}", hex(&rest.hash.finalize()));
    Ok(out)
}

/// The tree being written, and what this layer made in it.
struct Tree {
    root: OwnedFd,
    root_path: PathBuf,
    /// Every path this layer made, and their ancestors: what an opaque
    /// marker keeps.
    made: HashSet<PathBuf>,
    /// The device nodes this layer skipped, where nothing else has been put
    /// since, and their layer paths: a hard link to one is skipped too.
    devices: HashMap<PathBuf, String>,
    /// Directories' times, set last (their children change them).
    dirs: Vec<(PathBuf, i64)>,
}

/// What [`Tree::entry`] did with an entry.
enum Written {
    /// Made it; its content bytes.
    Bytes(u64),
    Skipped(Skip),
}

impl Tree {
    fn mark(&mut self, p: &Path) {
        for a in p.ancestors() {
            if a.as_os_str().is_empty() || !self.made.insert(a.to_owned()) {
                break;
            }
        }
    }

    /// `.wh.NAME` or the opaque marker, in `parent`.
    fn whiteout(&mut self, raw: &[u8], parent: &Path, name: &[u8], rest: &[u8]) -> Result<()> {
        let dir = match self.resolve_dir(parent) {
            Ok(d) => d,
            // Nothing below to hide.
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(io("open", &self.root_path.join(parent))(e)),
        };
        let full = self.root_path.join(parent);
        if name == OPAQUE {
            for c in list(&dir, &full)? {
                let c = OsStr::from_bytes(&c);
                if !self.made.contains(&parent.join(c)) {
                    remove_all(dir.as_raw_fd(), c, &full.join(c))?;
                }
            }
            // A device node skipped here was never made, so it was not
            // listed: what this layer skipped before the marker stays
            // skipped, as what it made before the marker stays.
            return Ok(());
        }
        // What a whiteout removes is one entry of its own directory: `.wh..`
        // would be that directory, and `.wh...` its parent, which for the
        // layer's root is the staging of every pull and import.
        if !single_name(rest) {
            return Err(refused(
                raw,
                "a whiteout must name one entry of its directory",
            ));
        }
        let rest = OsStr::from_bytes(rest);
        self.forget_devices(&parent.join(rest));
        remove_all(dir.as_raw_fd(), rest, &full.join(rest))
    }

    /// Nothing at `p` or below is a skipped device node any more: it was
    /// removed, or something else was put there.
    fn forget_devices(&mut self, p: &Path) {
        if !self.devices.is_empty() {
            self.devices.retain(|d, _| !d.starts_with(p));
        }
    }

    /// The directory `parent`, resolved in the tree; missing directories
    /// are made (0755, root), as other runtimes do.
    fn parent(&mut self, raw: &[u8], parent: &Path) -> Result<OwnedFd> {
        match self.resolve_dir(parent) {
            Ok(d) => return Ok(d),
            Err(Errno::ENOENT) => {}
            Err(Errno::ENOTDIR) => {
                return Err(refused(raw, "a component of its path is not a directory"))
            }
            Err(e) => return Err(io("open", &self.root_path.join(parent))(e)),
        }
        let mut at = PathBuf::new();
        for c in parent.components() {
            let up = self
                .resolve_dir(&at)
                .map_err(io("open", &self.root_path.join(&at)))?;
            at.push(c);
            match self.resolve_dir(&at) {
                Ok(_) => continue,
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(io("open", &self.root_path.join(&at))(e)),
            }
            match nix::sys::stat::mkdirat(
                Some(up.as_raw_fd()),
                c.as_os_str(),
                Mode::from_bits_truncate(0o755),
            ) {
                Ok(()) => self.mark(&at),
                // A symlink to nothing, say.
                Err(Errno::EEXIST) => {
                    return Err(refused(
                        raw,
                        format!(
                            "{} exists and is not a directory it can go into",
                            at.display()
                        ),
                    ))
                }
                Err(e) => return Err(io("create", &self.root_path.join(&at))(e)),
            }
        }
        self.resolve_dir(parent)
            .map_err(io("open", &self.root_path.join(parent)))
    }

    fn resolve_dir(&self, rel: &Path) -> std::result::Result<OwnedFd, Errno> {
        if rel.as_os_str().is_empty() {
            return nix::unistd::dup(self.root.as_raw_fd())
                // SAFETY: dup just returned this descriptor, owned by nothing else.
                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = nix::fcntl::openat2(self.root.as_raw_fd(), rel, how)?;
        // SAFETY: openat2 just returned this descriptor, owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// One entry that is not a whiteout, in `dir`: what was there before it
    /// (unless both are directories) is removed, then it is made or skipped.
    #[allow(clippy::too_many_arguments)]
    fn entry<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        raw: &[u8],
        p: &Path,
        dir: &OwnedFd,
        name: &OsStr,
        budget: u64,
        limits: &LayerLimits,
    ) -> Result<Written> {
        // A directory over a directory keeps what is below it.
        if e.header().entry_type() == tar::EntryType::Directory {
            self.devices.remove(p);
        } else {
            self.forget_devices(p);
        }
        let written = self.make(e, raw, p, dir, name, budget, limits)?;
        if let Written::Skipped(Skip::Device { .. }) = written {
            self.devices
                .insert(p.to_owned(), String::from_utf8_lossy(raw).into_owned());
        }
        Ok(written)
    }

    #[allow(clippy::too_many_arguments)]
    fn make<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        raw: &[u8],
        p: &Path,
        dir: &OwnedFd,
        name: &OsStr,
        budget: u64,
        limits: &LayerLimits,
    ) -> Result<Written> {
        use tar::EntryType as T;
        let full = self.root_path.join(p);
        let h = e.header();
        let mode = Mode::from_bits_truncate(h.mode().map_err(LayerError::Read)? & 0o7777);
        let uid = Uid::from_raw(h.uid().map_err(LayerError::Read)? as u32);
        let gid = Gid::from_raw(h.gid().map_err(LayerError::Read)? as u32);
        let mtime = h.mtime().map_err(LayerError::Read)? as i64;
        let d = dir.as_raw_fd();
        let existing = lstat_at(d, name);
        let kind = h.entry_type();
        match kind {
            T::Directory => {
                match existing {
                    Some(st) if is(&st, SFlag::S_IFDIR) => {}
                    Some(_) => {
                        remove_all(d, name, &full)?;
                        mkdir(d, name, &full)?;
                    }
                    None => mkdir(d, name, &full)?,
                }
                nix::unistd::fchownat(
                    Some(d),
                    name,
                    Some(uid),
                    Some(gid),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(io("chown", &full))?;
                // A directory (checked above), so there is no link to follow.
                chmod_at(d, name, mode, &full)?;
                self.dirs.push((p.to_owned(), mtime));
                Ok(Written::Bytes(0))
            }
            T::Regular | T::Continuous => {
                if existing.is_some() {
                    remove_all(d, name, &full)?;
                }
                let fd = nix::fcntl::openat(
                    Some(d),
                    name,
                    OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_WRONLY
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(io("create", &full))?;
                // SAFETY: openat just returned this descriptor, owned by nothing else.
                let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
                let xattrs = wanted_xattrs(e)?;
                let n = std::io::copy(&mut (&mut *e).take(budget.saturating_add(1)), &mut f)
                    .map_err(LayerError::Read)?;
                if n > budget {
                    return Err(LayerError::TooBig {
                        limit: limits.max_bytes,
                    });
                }
                if n < e.size() {
                    return Err(LayerError::Read(std::io::ErrorKind::UnexpectedEof.into()));
                }
                nix::unistd::fchown(f.as_raw_fd(), Some(uid), Some(gid))
                    .map_err(io("chown", &full))?;
                // After the chown, which clears setuid and setgid bits.
                nix::sys::stat::fchmod(f.as_raw_fd(), mode).map_err(io("chmod", &full))?;
                for (k, v) in xattrs {
                    xattr::FileExt::set_xattr(&f, &k, &v).map_err(|source| LayerError::Io {
                        op: "set an xattr on",
                        path: full.clone(),
                        source,
                    })?;
                }
                let t = TimeSpec::new(mtime, 0);
                nix::sys::stat::futimens(f.as_raw_fd(), &t, &t)
                    .map_err(io("set the times of", &full))?;
                Ok(Written::Bytes(n))
            }
            T::Symlink => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| refused(raw, "a symlink without a target"))?
                    .into_owned();
                if target.is_empty() {
                    return Err(refused(raw, "a symlink without a target"));
                }
                // Kept as written, whatever it points at (see the module's
                // doc): a session can make the same link itself.
                if existing.is_some() {
                    remove_all(d, name, &full)?;
                }
                nix::unistd::symlinkat(OsStr::from_bytes(&target), Some(d), name)
                    .map_err(io("create the symlink", &full))?;
                self.own_and_time(d, name, uid, gid, mtime, &full)?;
                Ok(Written::Bytes(0))
            }
            T::Link => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| refused(raw, "a hard link without a target"))?
                    .into_owned();
                let Some(tp) = clean_path(&target)? else {
                    return Err(refused(raw, "a hard link to the root"));
                };
                if tp == p {
                    return Ok(Written::Bytes(0));
                }
                if let Some(device) = self.devices.get(&tp) {
                    let target = device.clone();
                    if existing.is_some() {
                        remove_all(d, name, &full)?;
                    }
                    return Ok(Written::Skipped(Skip::LinkToDevice { target }));
                }
                if in_aufs_meta(&tp) {
                    return Err(refused(
                        raw,
                        format!(
                            "a hard link into AUFS metadata ({}), which drums does not unpack",
                            tp.display()
                        ),
                    ));
                }
                let tname = tp.file_name().expect("a clean path ends in a name");
                let tdir = self
                    .resolve_dir(tp.parent().unwrap_or(Path::new("")))
                    .map_err(|_| {
                        refused(
                            raw,
                            format!("a hard link to {}, which is not there", tp.display()),
                        )
                    })?;
                match lstat_at(tdir.as_raw_fd(), tname) {
                    None => {
                        return Err(refused(
                            raw,
                            format!("a hard link to {}, which is not there", tp.display()),
                        ))
                    }
                    Some(st) if is(&st, SFlag::S_IFDIR) => {
                        return Err(refused(
                            raw,
                            format!("a hard link to the directory {}", tp.display()),
                        ))
                    }
                    Some(_) => {}
                }
                if existing.is_some() {
                    remove_all(d, name, &full)?;
                }
                nix::unistd::linkat(
                    Some(tdir.as_raw_fd()),
                    tname,
                    Some(d),
                    name,
                    AtFlags::empty(),
                )
                .map_err(io("link", &full))?;
                Ok(Written::Bytes(0))
            }
            T::Fifo => {
                if existing.is_some() {
                    remove_all(d, name, &full)?;
                }
                nix::sys::stat::mknodat(Some(d), name, SFlag::S_IFIFO, mode, 0)
                    .map_err(io("create the fifo", &full))?;
                self.own_and_time(d, name, uid, gid, mtime, &full)?;
                // After the chown; a fifo just made, so no link to follow.
                chmod_at(d, name, mode, &full)?;
                Ok(Written::Bytes(0))
            }
            T::Char | T::Block => {
                // Whatever the layers below had here goes, as the layer
                // says; the node itself is never made.
                if existing.is_some() {
                    remove_all(d, name, &full)?;
                }
                let number = |n: std::io::Result<Option<u32>>| n.ok().flatten().unwrap_or(0);
                Ok(Written::Skipped(Skip::Device {
                    block: kind == T::Block,
                    major: number(h.device_major()),
                    minor: number(h.device_minor()),
                }))
            }
            other => Err(refused(
                raw,
                format!(
                    "entry type {:?}, which layers do not use",
                    other.as_byte() as char
                ),
            )),
        }
    }

    fn own_and_time(
        &self,
        d: RawFd,
        name: &OsStr,
        uid: Uid,
        gid: Gid,
        mtime: i64,
        full: &Path,
    ) -> Result<()> {
        nix::unistd::fchownat(
            Some(d),
            name,
            Some(uid),
            Some(gid),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io("chown", full))?;
        let t = TimeSpec::new(mtime, 0);
        nix::sys::stat::utimensat(Some(d), name, &t, &t, UtimensatFlags::NoFollowSymlink)
            .map_err(io("set the times of", full))
    }

    fn set_dir_times(&self) -> Result<()> {
        for (p, mtime) in self.dirs.iter().rev() {
            let full = self.root_path.join(p);
            let Ok(dir) = self.resolve_dir(p.parent().unwrap_or(Path::new(""))) else {
                continue; // removed by a later entry
            };
            let name = p.file_name().expect("a clean path ends in a name");
            let t = TimeSpec::new(*mtime, 0);
            match nix::sys::stat::utimensat(
                Some(dir.as_raw_fd()),
                name,
                &t,
                &t,
                UtimensatFlags::NoFollowSymlink,
            ) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(io("set the times of", &full)(e)),
            }
        }
        Ok(())
    }
}

/// An entry's path (or a hard link's target) as plain components, read as
/// podman reads it: a leading `/` and `./` dropped (the layer's root is the
/// root), `a/../b` is `b`; `None` for the root. A `..` that would climb
/// above the root is refused: podman refuses it too, and though every path
/// is resolved inside the tree anyway, an entry that names a place outside
/// it is refused before anything is resolved.
fn clean_path(raw: &[u8]) -> Result<Option<PathBuf>> {
    if raw.contains(&0) {
        return Err(refused(raw, "a NUL in its path"));
    }
    let mut out = PathBuf::new();
    for c in Path::new(OsStr::from_bytes(raw)).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(refused(raw, "a \"..\" that climbs above the layer's root"));
                }
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Whether `p` is AUFS's metadata: a first component that starts with
/// `.wh..wh.`, other than the root's opaque marker.
fn in_aufs_meta(p: &Path) -> bool {
    let mut c = p.components();
    match c.next() {
        Some(Component::Normal(first)) => {
            first.as_bytes().starts_with(b".wh..wh.")
                && !(first.as_bytes() == OPAQUE && c.next().is_none())
        }
        _ => false,
    }
}

/// The xattrs a layer may set on a file: file capabilities (`ping`) and the
/// user namespace's; any other is dropped (SELinux labels, trusted.*).
fn wanted_xattrs<R: Read>(e: &mut tar::Entry<'_, R>) -> Result<Vec<(String, Vec<u8>)>> {
    let Some(exts) = e.pax_extensions().map_err(LayerError::Read)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for x in exts {
        let x = x.map_err(LayerError::Read)?;
        let Ok(key) = x.key() else { continue };
        if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
            if name == "security.capability" || name.starts_with("user.") {
                out.push((name.to_owned(), x.value_bytes().to_vec()));
            }
        }
    }
    Ok(out)
}

fn open_dir(at: Option<RawFd>, p: &Path) -> Result<OwnedFd> {
    let fd = nix::fcntl::openat(
        at,
        p,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("open", p))?;
    // SAFETY: openat just returned this descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn lstat_at(d: RawFd, name: &OsStr) -> Option<FileStat> {
    nix::sys::stat::fstatat(Some(d), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()
}

fn is(st: &FileStat, kind: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// Set the mode of `name` in `d`, which the caller knows is no symlink.
fn chmod_at(d: RawFd, name: &OsStr, mode: Mode, full: &Path) -> Result<()> {
    nix::sys::stat::fchmodat(
        Some(d),
        name,
        mode,
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(io("chmod", full))
}

fn mkdir(d: RawFd, name: &OsStr, full: &Path) -> Result<()> {
    nix::sys::stat::mkdirat(Some(d), name, Mode::from_bits_truncate(0o700))
        .map_err(io("create", full))
}

/// The names in the directory `dir` (an O_PATH descriptor).
fn list(dir: &OwnedFd, full: &Path) -> Result<Vec<Vec<u8>>> {
    let mut d = nix::dir::Dir::openat(
        Some(dir.as_raw_fd()),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("list", full))?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(io("list", full))?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(n.to_vec());
        }
    }
    Ok(out)
}

/// Remove `name` in `d` (`full`, for errors) and, if it is a directory, all
/// below it, without following any symlink; nothing there is fine.
fn remove_all(d: RawFd, name: &OsStr, full: &Path) -> Result<()> {
    let Some(st) = lstat_at(d, name) else {
        return Ok(());
    };
    if is(&st, SFlag::S_IFDIR) {
        let sub = nix::fcntl::openat(
            Some(d),
            name,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io("open", full))?;
        // SAFETY: openat just returned this descriptor, owned by nothing else.
        let sub = unsafe { OwnedFd::from_raw_fd(sub) };
        for c in list(&sub, full)? {
            let c = OsStr::from_bytes(&c);
            remove_all(sub.as_raw_fd(), c, &full.join(c))?;
        }
        nix::unistd::unlinkat(Some(d), name, UnlinkatFlags::RemoveDir).map_err(io("remove", full))
    } else {
        match nix::unistd::unlinkat(Some(d), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(io("remove", full)(e)),
        }
    }
}

/// `name` is one normal path component: not empty, `.` or `..`, and
/// without a `/` (a tar path cannot hold a NUL past clean_path).
fn single_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(raw: &str) -> Result<Option<String>> {
        clean_path(raw.as_bytes()).map(|p| p.map(|p| p.display().to_string()))
    }

    #[test]
    fn paths_are_read_as_podman_reads_them() {
        for (raw, want) in [
            ("etc/passwd", Some("etc/passwd")),
            ("./etc/passwd", Some("etc/passwd")),
            ("/etc/passwd", Some("etc/passwd")),
            ("//etc//./passwd/", Some("etc/passwd")),
            ("a/../b", Some("b")),
            ("a/b/../../c", Some("c")),
            ("./", None),
            ("/", None),
            ("a/..", None),
        ] {
            let got = clean(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(got, want.map(str::to_owned), "{raw}");
        }
        for raw in ["..", "../x", "a/../../x", "/../etc/shadow", "./a/../.."] {
            let e = clean(raw).unwrap_err().to_string();
            assert!(e.contains("climbs above the layer's root"), "{raw}: {e}");
        }
        assert!(clean_path(b"a\0b").is_err());
    }

    #[test]
    fn aufs_metadata_is_what_starts_with_wh_wh_at_the_root_but_the_opaque_marker() {
        for p in [
            ".wh..wh.plnk",
            ".wh..wh.plnk/1.2",
            ".wh..wh.aufs",
            ".wh..wh.orph/x",
            ".wh..wh..opq/x",
        ] {
            assert!(in_aufs_meta(Path::new(p)), "{p}");
        }
        for p in [".wh..wh..opq", "d/.wh..wh.plnk", ".wh.x", "etc"] {
            assert!(!in_aufs_meta(Path::new(p)), "{p}");
        }
    }

    #[test]
    fn a_skip_says_what_was_not_written_and_why() {
        let d = Skip::Device {
            block: false,
            major: 5,
            minor: 1,
        };
        assert_eq!(
            d.to_string(),
            "a character device node (5:1), never made from a layer"
        );
        let l = Skip::LinkToDevice {
            target: "dev/console".into(),
        };
        assert!(l.to_string().contains("dev/console"));
    }
}
