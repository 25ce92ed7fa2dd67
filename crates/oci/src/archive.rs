//! An image from an archive stream: a `docker save` archive (also what
//! `skopeo copy … docker-archive:F` and `podman save` write) or an OCI image
//! layout in a tar (`oci-archive`; the CLI turns a layout directory into the
//! same stream). The stream is unpacked into a staging directory, then read
//! as an image, every blob's sha256 checked.
//!
//! The archive is a stranger's: only regular files and directories whose
//! names have the shapes these formats use are written, each one new
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, resolved beneath the staging directory
//! with no symlink followed), and the stream is refused, with the entry
//! named, for an absolute path, a `..`, a link, a device, or any other name
//! or type. One exception is skipped rather than refused: the symlink
//! `<id>/layer.tar` that containers/image writes for old `docker load`s,
//! since the manifest names the file it points at directly.
//!
//! An archive holds one image (several tags of it are fine). podman loads
//! every image an archive holds; drums refuses more than one, so that an
//! import names what it stored.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{io_err, SourceError};
use crate::manifest::{self, is_sha256_hex, Descriptor, Document, ImageManifest, MAX_JSON_BYTES};

type Result<T> = std::result::Result<T, SourceError>;

/// What one archive may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Entry content, all of it.
    pub max_bytes: u64,
    pub max_entries: u64,
    /// What the store can take of the unpacked entries (their content is
    /// written to the staging directory, on the store).
    pub room: u64,
}

impl Default for ArchiveLimits {
    /// Twice a layer's default limit; a real image archive has a few dozen
    /// entries.
    fn default() -> Self {
        ArchiveLimits {
            max_bytes: 64 << 30,
            max_entries: 100_000,
            room: u64::MAX,
        }
    }
}

/// An image unpacked from an archive, ready to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    pub image: ImageManifest,
    /// The names the archive gives the image: a `docker save` archive's
    /// `RepoTags`; for an OCI layout, each index entry's
    /// `io.containerd.image.name` annotation (a full name, which docker and
    /// containerd write) or else its `org.opencontainers.image.ref.name`
    /// (often a bare tag). Possibly none.
    pub refs: Vec<String>,
    /// Layer `i`'s blob, in the staging directory, its digest verified.
    pub blobs: Vec<PathBuf>,
}

/// Unpack the archive stream `tar` (plain, or gzip-compressed: told by its
/// first bytes) into `staging`, a fresh empty directory the caller made, and
/// read the image it holds.
///
/// On an error, `staging` may hold part of the archive: the caller deletes
/// it, and trusts nothing in it. Nothing is ever written outside it.
pub fn unpack(tar: impl Read, staging: &Path, limits: &ArchiveLimits) -> Result<Archive> {
    let mut r = BufReader::with_capacity(1 << 20, tar);
    let head = r.fill_buf().map_err(SourceError::ArchiveRead)?;
    let files = if head.starts_with(&[0x1f, 0x8b]) {
        let gz = flate2::read::GzDecoder::new(r);
        extract(BufReader::with_capacity(1 << 20, gz), staging, limits)?
    } else {
        extract(r, staging, limits)?
    };
    let l = Unpacked {
        root: staging,
        files,
    };
    if l.files.contains_key("oci-layout") && l.files.contains_key("index.json") {
        // A docker 25 archive is both; its OCI side has the real manifest
        // digest and can hold compressed layers.
        l.oci()
    } else if l.files.contains_key("manifest.json") {
        l.docker()
    } else {
        Err(SourceError::NotAnImage)
    }
}

/// A file written to staging.
#[derive(Debug, Clone)]
struct Written {
    digest: String,
    size: u64,
}

/// What to do with an entry, by its name and type.
enum Shape {
    Dir,
    /// Written; if the name is a sha256, the content must have it.
    File {
        sha256: Option<String>,
    },
    /// Read past: known, but never needed.
    Skip,
}

/// The shape of `p` (no leading `./`, no trailing `/`) for an entry of
/// `kind`, or why it is refused.
fn shape(p: &str, kind: tar::EntryType) -> std::result::Result<Shape, &'static str> {
    let parts: Vec<&str> = p.split('/').collect();
    let hex_name = |n: &str, ext: &str| {
        n.strip_suffix(ext)
            .filter(|h| is_sha256_hex(h))
            .map(str::to_owned)
    };
    use tar::EntryType as T;
    match kind {
        T::Directory => match parts[..] {
            ["blobs"] | ["blobs", "sha256"] => Ok(Shape::Dir),
            [id] if is_sha256_hex(id) => Ok(Shape::Dir),
            _ => Err("not a directory an image archive holds"),
        },
        T::Regular | T::Continuous => match parts[..] {
            ["manifest.json" | "index.json" | "oci-layout"] => Ok(Shape::File { sha256: None }),
            ["repositories"] => Ok(Shape::Skip),
            ["blobs", "sha256", h] if is_sha256_hex(h) => Ok(Shape::File {
                sha256: Some(h.to_owned()),
            }),
            // docker save's config and containers/image's layers.
            [n] if hex_name(n, ".json").is_some() => Ok(Shape::File {
                sha256: hex_name(n, ".json"),
            }),
            [n] if hex_name(n, ".tar").is_some() => Ok(Shape::File {
                sha256: hex_name(n, ".tar"),
            }),
            // An old docker save's layer directory.
            [id, "layer.tar"] if is_sha256_hex(id) => Ok(Shape::File { sha256: None }),
            [id, "json" | "VERSION"] if is_sha256_hex(id) => Ok(Shape::Skip),
            _ => Err("not a file an image archive holds"),
        },
        T::Symlink => match parts[..] {
            [id, "layer.tar"] if is_sha256_hex(id) => Ok(Shape::Skip),
            _ => Err("a symlink"),
        },
        T::Link => Err("a hard link"),
        T::Char | T::Block => Err("a device"),
        T::Fifo => Err("a fifo"),
        _ => Err("an entry type an image archive does not hold"),
    }
}

/// Notes when the stream beneath the tar reader ends: a tar that ends
/// without its end-of-archive blocks is cut short.
struct EofWatch<R> {
    inner: R,
    hit: Rc<Cell<bool>>,
}

impl<R: Read> Read for EofWatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.hit.set(true);
        }
        Ok(n)
    }
}

fn refused(path: &str, why: &str) -> SourceError {
    SourceError::ArchiveEntry {
        path: path.to_owned(),
        why: why.to_owned(),
    }
}

/// Write the archive's entries below `staging`; returns what was written.
fn extract(
    r: impl Read,
    staging: &Path,
    limits: &ArchiveLimits,
) -> Result<HashMap<String, Written>> {
    let root = open_dir(staging)?;
    let hit = Rc::new(Cell::new(false));
    let read_err = |e: std::io::Error, hit: &Rc<Cell<bool>>| {
        if hit.get() || e.kind() == std::io::ErrorKind::UnexpectedEof {
            SourceError::Truncated {
                why: "it ends inside an entry's header".to_owned(),
                source: Some(e),
            }
        } else {
            SourceError::ArchiveRead(e)
        }
    };
    // Bounded before the tar crate reads an extension header whole.
    let mut a = tar::Archive::new(drums_targuard::Guard::new(EofWatch {
        inner: r,
        hit: hit.clone(),
    }));
    let mut files = HashMap::new();
    let mut dirs = HashSet::new();
    let (mut entries, mut bytes) = (0u64, 0u64);
    for e in a.entries().map_err(SourceError::ArchiveRead)? {
        let mut e = e.map_err(|e| read_err(e, &hit))?;
        entries += 1;
        if entries > limits.max_entries {
            return Err(SourceError::ArchiveTooManyEntries {
                limit: limits.max_entries,
            });
        }
        let kind = e.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let raw = e.path_bytes().into_owned();
        let Ok(name) = std::str::from_utf8(&raw) else {
            return Err(refused(
                &String::from_utf8_lossy(&raw),
                "its name is not UTF-8",
            ));
        };
        if name.starts_with('/') {
            return Err(refused(name, "an absolute path"));
        }
        let p = name.strip_prefix("./").unwrap_or(name);
        let p = p.strip_suffix('/').unwrap_or(p);
        if p.split('/').any(|c| c == "..") {
            return Err(refused(name, "a .. in its path"));
        }
        if p.is_empty() || p == "." {
            continue; // the root
        }
        let shape = shape(p, kind).map_err(|why| refused(name, why))?;
        let size = e.size();
        if size > limits.max_bytes - bytes {
            return Err(SourceError::ArchiveTooBig {
                limit: limits.max_bytes,
            });
        }
        if size > limits.room.saturating_sub(bytes) {
            return Err(SourceError::NoRoom { room: limits.room });
        }
        bytes += size;
        match shape {
            Shape::Dir => make_dirs(&root, staging, p, &mut dirs)?,
            Shape::Skip => {
                let got =
                    std::io::copy(&mut e, &mut std::io::sink()).map_err(|e| read_err(e, &hit))?;
                cut_short(name, got, size)?;
            }
            Shape::File { sha256 } => {
                if let Some((parent, _)) = p.rsplit_once('/') {
                    make_dirs(&root, staging, parent, &mut dirs)?;
                }
                let full = staging.join(p);
                let mut f = create(&root, p, &full, name)?;
                let mut hash = Sha256::new();
                let mut buf = vec![0u8; 1 << 16];
                let mut got = 0u64;
                loop {
                    let n = e.read(&mut buf).map_err(|e| read_err(e, &hit))?;
                    if n == 0 {
                        break;
                    }
                    hash.update(&buf[..n]);
                    f.write_all(&buf[..n]).map_err(io_err("write", &full))?;
                    got += n as u64;
                }
                cut_short(name, got, size)?;
                let digest = manifest::finish(hash);
                if let Some(hex) = sha256 {
                    let expected = format!("sha256:{hex}");
                    if digest != expected {
                        return Err(SourceError::DigestMismatch {
                            what: format!("archive entry {name:?}"),
                            expected,
                            got: digest,
                        });
                    }
                }
                files.insert(p.to_owned(), Written { digest, size });
            }
        }
    }
    if hit.get() {
        return Err(SourceError::Truncated {
            why: "it ends without the end-of-archive blocks".to_owned(),
            source: None,
        });
    }
    Ok(files)
}

fn cut_short(name: &str, got: u64, size: u64) -> Result<()> {
    if got < size {
        return Err(SourceError::Truncated {
            why: format!("entry {name:?} has {got} of its {size} bytes"),
            source: None,
        });
    }
    Ok(())
}

fn open_dir(p: &Path) -> Result<OwnedFd> {
    let fd = nix::fcntl::open(
        p,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("open", p)(e.into()))?;
    // SAFETY: open just returned this descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The directory `rel` and its parents, below `root`. Only names `shape`
/// allows get here, and staging holds nothing this did not write (no
/// symlink among it), so a parent is never a link.
fn make_dirs(root: &OwnedFd, staging: &Path, rel: &str, made: &mut HashSet<String>) -> Result<()> {
    let mut at = String::new();
    for c in rel.split('/') {
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(c);
        if made.contains(&at) {
            continue;
        }
        match nix::sys::stat::mkdirat(
            Some(root.as_raw_fd()),
            at.as_str(),
            Mode::from_bits_truncate(0o700),
        ) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io_err("create", &staging.join(&at))(e.into())),
        }
        made.insert(at.clone());
    }
    Ok(())
}

/// A new file `rel` below `root`: never one that is there, never through a
/// symlink.
fn create(root: &OwnedFd, rel: &str, full: &Path, name: &str) -> Result<File> {
    let how = OpenHow::new()
        .flags(
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        )
        .mode(Mode::from_bits_truncate(0o600))
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    match nix::fcntl::openat2(root.as_raw_fd(), rel, how) {
        // SAFETY: openat2 just returned this descriptor, owned by nothing else.
        Ok(fd) => Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(Errno::EEXIST) => Err(refused(name, "it appears twice")),
        Err(e) => Err(io_err("create", full)(e.into())),
    }
}

/// The archive, unpacked.
struct Unpacked<'a> {
    root: &'a Path,
    files: HashMap<String, Written>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciLayout {
    image_layout_version: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    #[serde(default)]
    layers: Vec<String>,
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// An index entry may point at an index; this deep, no further.
const MAX_INDEX_DEPTH: usize = 4;

impl Unpacked<'_> {
    fn file(&self, rel: &str, named_by: &'static str) -> Result<&Written> {
        self.files.get(rel).ok_or_else(|| SourceError::MissingFile {
            path: rel.to_owned(),
            named_by,
        })
    }

    /// A JSON document's bytes, no larger than the cap.
    fn small(&self, rel: &str, what: &'static str, named_by: &'static str) -> Result<Vec<u8>> {
        let w = self.file(rel, named_by)?;
        if w.size > MAX_JSON_BYTES {
            return Err(SourceError::TooLarge {
                what,
                size: w.size,
                limit: MAX_JSON_BYTES,
            });
        }
        let full = self.root.join(rel);
        std::fs::read(&full).map_err(io_err("read", &full))
    }

    fn blob_path(digest: &str) -> String {
        format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
    }

    /// The blob `d` names, its size checked (its digest was, as it was
    /// written).
    fn blob(&self, d: &Descriptor, named_by: &'static str) -> Result<String> {
        manifest::check_digest(&d.digest)?;
        let rel = Self::blob_path(&d.digest);
        let w = self.file(&rel, named_by)?;
        if w.size != d.size {
            return Err(SourceError::BlobSize {
                digest: d.digest.clone(),
                expected: d.size,
                got: format!("the archive's file has {}", w.size),
            });
        }
        Ok(rel)
    }

    /// An OCI image layout.
    fn oci(&self) -> Result<Archive> {
        let layout = self.small("oci-layout", "oci-layout file", "OCI layout")?;
        let layout: OciLayout =
            serde_json::from_slice(&layout).map_err(|source| SourceError::Json {
                what: "oci-layout file",
                source,
            })?;
        if layout.image_layout_version != "1.0.0" {
            return Err(SourceError::Invalid {
                what: "OCI layout",
                why: format!(
                    "its version is {:?}, not 1.0.0",
                    layout.image_layout_version
                ),
            });
        }
        let index = self.small("index.json", "OCI layout's index.json", "OCI layout")?;
        let Document::Index(entries) = manifest::parse_document(&index, None)? else {
            return Err(SourceError::Invalid {
                what: "OCI layout's index.json",
                why: "it is a manifest, not an index".to_owned(),
            });
        };
        // One image, perhaps under several names: entries grouped by digest.
        let mut by_digest: BTreeMap<&str, Vec<&Descriptor>> = BTreeMap::new();
        for e in &entries {
            by_digest.entry(e.digest.as_str()).or_default().push(e);
        }
        let (top, named): (Descriptor, Vec<&Descriptor>) = match by_digest.len() {
            1 => (entries[0].clone(), entries.iter().collect()),
            // An index.json that is itself a platform index (buildx writes
            // these): one image for each platform, of which drums takes one.
            n if n > 1 && entries.iter().all(|e| e.platform.is_some()) => {
                let e = manifest::pick_platform(&entries)?;
                (
                    e.clone(),
                    entries.iter().filter(|x| x.digest == e.digest).collect(),
                )
            }
            n => return Err(SourceError::ImageCount { count: n }),
        };
        let mut refs: Vec<String> = named
            .iter()
            .filter_map(|e| {
                let a = e.annotations.as_ref()?;
                a.get(CONTAINERD_NAME).or_else(|| a.get(REF_NAME)).cloned()
            })
            .collect();
        refs.dedup();

        let mut d = top;
        for _ in 0..MAX_INDEX_DEPTH {
            let rel = self.blob(&d, "OCI layout's index")?;
            let raw = self.small(&rel, "image manifest", "OCI layout's index")?;
            match manifest::parse_document(&raw, Some(&d.media_type))? {
                Document::Index(entries) => d = manifest::pick_platform(&entries)?.clone(),
                Document::Manifest { config, layers } => {
                    let config_rel = self.blob(&config, "image manifest")?;
                    let config_raw = self.small(&config_rel, "image config", "image manifest")?;
                    let blobs = layers
                        .iter()
                        .map(|l| Ok(self.root.join(self.blob(l, "image manifest")?)))
                        .collect::<Result<Vec<_>>>()?;
                    let image =
                        ImageManifest::assemble(d.digest.clone(), &config, &layers, config_raw)?;
                    return Ok(Archive { image, refs, blobs });
                }
            }
        }
        Err(SourceError::Invalid {
            what: "OCI layout's index",
            why: format!("it nests indexes more than {MAX_INDEX_DEPTH} deep"),
        })
    }

    /// A `docker save` archive: `manifest.json`, a config, plain tar layers
    /// whose sha256 is their diff_id.
    fn docker(&self) -> Result<Archive> {
        let raw = self.small(
            "manifest.json",
            "docker save manifest.json",
            "docker save archive",
        )?;
        let list: Vec<DockerEntry> =
            serde_json::from_slice(&raw).map_err(|source| SourceError::Json {
                what: "docker save manifest.json",
                source,
            })?;
        let [entry] = &list[..] else {
            return Err(SourceError::ImageCount { count: list.len() });
        };
        let config_raw = self.small(&entry.config, "image config", "manifest.json")?;
        let written = entry
            .layers
            .iter()
            .map(|l| self.file(l, "manifest.json"))
            .collect::<Result<Vec<_>>>()?;
        let sizes: Vec<u64> = written.iter().map(|w| w.size).collect();
        let image = ImageManifest::synthesise(config_raw, &sizes)?;
        for (i, (w, l)) in written.iter().zip(&image.layers).enumerate() {
            if w.digest != l.diff_id {
                return Err(SourceError::DigestMismatch {
                    what: format!("layer {i} ({:?}) against its diff_id", entry.layers[i]),
                    expected: l.diff_id.clone(),
                    got: w.digest.clone(),
                });
            }
        }
        Ok(Archive {
            image,
            refs: entry.repo_tags.clone().unwrap_or_default(),
            blobs: entry.layers.iter().map(|l| self.root.join(l)).collect(),
        })
    }
}
