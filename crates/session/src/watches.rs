//! The path of every inode a session's processes watch (inotify, fanotify),
//! found before a dump and handed to CRIU as its irmap cache
//! (`drums_criu::fsnotify` says why CRIU cannot find them itself).
//!
//! A watch on the session's root shows an overlayfs file handle, which
//! wraps the handle of the real inode in one of the root's two layers (the
//! session's upper directory, or the image) in overlayfs's own on-disk
//! format (`struct ovl_fh`, the one it stores in `trusted.overlay.origin`).
//! Unwrapped, that inner handle gives the watch's candidate paths:
//! - opened by handle on the layer's file system (open_by_handle_at, as
//!   host root), the inode's path on the host, less the layer's directory;
//! - for a btrfs layer, the paths of the handle's inode number in its
//!   subvolume (BTRFS_IOC_INO_PATHS), since an inode opened by handle may
//!   come back without a name.
//!
//! Each candidate (and each of its suffixes: a subvolume's paths start at
//! its root, above the layer's directory) is then checked from the
//! session's side: opened in the session's root as the session would
//! resolve it but following no symlink (CRIU's own check, a `stat` from the
//! root, follows intermediate ones from its own root), and kept only if it
//! is the very inode: the same device, inode number, and file handle as the
//! kernel shows for the watch. A path the session planted or swapped can
//! therefore only fail a check; it is never opened on the host's side of a
//! link, and nothing is read.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use drums_criu::fsnotify::{kernel_dev, Handle, Mark};
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use tracing::warn;

use crate::SessionError;

/// name_to_handle_at's AT_HANDLE_FID (linux/fcntl.h, 6.5+): the handle an
/// inotify mark shows, which a file system without NFS export (overlayfs
/// without `nfs_export`) can encode but not open.
const AT_HANDLE_FID: libc::c_int = 0x200;
/// MAX_HANDLE_SZ.
const MAX_HANDLE: usize = 128;

/// (device, inode, path in the session) for each watched inode on the
/// session's root, for [`drums_criu::fsnotify::write_irmap_cache`].
pub(crate) type IrmapEntries = Vec<(u32, u64, String)>;

/// The irmap entries for `marks` (of a session's processes, whose root is
/// `/proc/init/root`, an overlay of `layers`). A watch on the root that has no path the
/// session can reach (its file was deleted, or is only reachable through a
/// symlink) cannot be restored, and fails here, naming the process.
pub(crate) fn irmap_entries(
    session: &str,
    init: i32,
    marks: &[Mark],
    layers: &[PathBuf],
) -> Result<IrmapEntries, SessionError> {
    if marks.is_empty() {
        return Ok(Vec::new());
    }
    let root_path = PathBuf::from(format!("/proc/{init}/root"));
    let root = nix::fcntl::open(
        &root_path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SessionError::Io {
        op: "open the root of",
        path: root_path.clone(),
        source: e.into(),
    })?;
    // SAFETY: open just returned this descriptor, and nothing else owns it.
    let root = unsafe { OwnedFd::from_raw_fd(root) };
    let root_dev = nix::sys::stat::fstat(root.as_raw_fd())
        .map(|st| kernel_dev(st.st_dev))
        .map_err(|e| SessionError::Io {
            op: "stat the root of",
            path: root_path,
            source: e.into(),
        })?;

    // One entry per inode, however many processes and fds watch it.
    let mut inodes: BTreeMap<(u32, u64), &Mark> = BTreeMap::new();
    for m in marks {
        inodes.entry((m.s_dev, m.ino)).or_insert(m);
    }
    let mut out = Vec::new();
    for ((s_dev, ino), mark) in inodes {
        // Elsewhere (the session's tmpfs mounts) CRIU opens the handle itself.
        if s_dev != root_dev {
            continue;
        }
        match path_of(root.as_fd(), layers, s_dev, ino, mark.handle.as_ref()) {
            Some(path) => out.push((s_dev, ino, path)),
            None => {
                return Err(SessionError::NotCheckpointable {
                    session: session.to_owned(),
                    process: crate::process::describe(mark.pid),
                    object: format!(
                        "an inotify or fanotify watch (fd {}) on inode {ino} of the session's root, which no path in the session leads to without a symlink",
                        mark.fd
                    ),
                    advice: "CRIU restores a watch by its path: watch the file by its real path, or remove the watch (restart the watcher) before checkpointing".into(),
                })
            }
        }
    }
    Ok(out)
}

/// The path in the session of inode (`s_dev`, `ino`), watched with the
/// overlay handle `handle`, if a layer has one the session reaches as is.
fn path_of(
    root: BorrowedFd<'_>,
    layers: &[PathBuf],
    s_dev: u32,
    ino: u64,
    handle: Option<&Handle>,
) -> Option<String> {
    let inner = handle.and_then(Inner::of)?;
    for layer in layers {
        for rel in candidates(layer, &inner) {
            let parts: Vec<_> = rel
                .components()
                .filter(|c| matches!(c, std::path::Component::Normal(_)))
                .collect();
            // Down to no component at all: the session's root directory
            // (a browser watches it), which CRIU must be told as "/." (it
            // stats the path less its first byte, relative to the root).
            for skip in 0..=parts.len() {
                let mut candidate: PathBuf = parts[skip..].iter().collect();
                if candidate.as_os_str().is_empty() {
                    candidate = PathBuf::from(".");
                }
                if is_the_inode(root, &candidate, s_dev, ino, handle) {
                    // CRIU takes the path as a protobuf string: UTF-8 only.
                    if let Some(path) = candidate.to_str() {
                        return Some(format!("/{path}"));
                    }
                }
            }
        }
    }
    None
}

/// The real inode's handle inside an overlay one.
#[derive(Debug, PartialEq, Eq)]
struct Inner {
    kind: i32,
    fid: Vec<u8>,
}

/// OVL_FILEID_V0 and OVL_FILEID_V1 (fs/overlayfs/overlayfs.h): `struct
/// ovl_fb`, and the same after 3 bytes of padding (`struct ovl_fh`).
const OVL_FILEID_V0: i32 = 0xfb;
const OVL_FILEID_V1: i32 = 0xf8;
/// ovl_fb's magic, and its header: version, magic, len, flags, type, uuid.
const OVL_FH_MAGIC: u8 = 0xfb;
const OVL_FB_HEAD: usize = 5 + 16;
/// FILEID_BTRFS_WITHOUT_PARENT, _WITH_PARENT, _WITH_PARENT_ROOT: each
/// starts with the inode's objectid (u64), then its subvolume's.
const BTRFS_FIDS: [i32; 3] = [0x4d, 0x4e, 0x4f];

impl Inner {
    /// The inner handle, if `h` is a well-formed overlay handle.
    fn of(h: &Handle) -> Option<Inner> {
        let fb = match h.kind {
            OVL_FILEID_V1 => h.bytes.get(3..)?,
            OVL_FILEID_V0 => &h.bytes[..],
            _ => return None,
        };
        let (magic, len, kind) = (*fb.get(1)?, usize::from(*fb.get(2)?), *fb.get(4)?);
        if magic != OVL_FH_MAGIC || len < OVL_FB_HEAD || len > fb.len() {
            return None;
        }
        Some(Inner {
            kind: i32::from(kind),
            fid: fb[OVL_FB_HEAD..len].to_vec(),
        })
    }

    /// The btrfs inode number the handle names, for a btrfs one.
    fn btrfs_ino(&self) -> Option<u64> {
        BTRFS_FIDS
            .contains(&self.kind)
            .then(|| Some(u64::from_le_bytes(self.fid.get(..8)?.try_into().ok()?)))?
    }
}

/// Where `inner` may be in `layer`, as paths to try in the session.
fn candidates(layer: &Path, inner: &Inner) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::File::open(layer) else {
        return out;
    };
    if let (Some(fd), Ok(base)) = (open_by_handle(dir.as_fd(), inner), layer.canonicalize()) {
        if let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
            if let Ok(rel) = path.strip_prefix(&base) {
                out.push(rel.to_owned());
            }
        }
    }
    if let Some(ino) = inner.btrfs_ino() {
        match drums_store::ino_paths(layer, ino) {
            Ok(paths) => out.extend(paths),
            Err(e) => {
                warn!(layer = %layer.display(), ino, "inode paths: {}", crate::error_chain(&e))
            }
        }
    }
    out
}

/// struct file_handle with room for MAX_HANDLE_SZ bytes, as
/// name_to_handle_at and open_by_handle_at take it.
#[repr(C)]
struct FileHandle {
    bytes: libc::c_uint,
    kind: libc::c_int,
    data: [u8; MAX_HANDLE],
}

/// `inner` opened (O_PATH) on the file system of `mount`, or `None` if that
/// file system does not have it.
fn open_by_handle(mount: BorrowedFd<'_>, inner: &Inner) -> Option<OwnedFd> {
    if inner.fid.len() > MAX_HANDLE {
        return None;
    }
    let mut h = FileHandle {
        bytes: inner.fid.len() as libc::c_uint,
        kind: inner.kind,
        data: [0; MAX_HANDLE],
    };
    h.data[..inner.fid.len()].copy_from_slice(&inner.fid);
    // SAFETY: `mount` is open for the call, and `h` is a file_handle whose
    // `bytes` says how much of its buffer holds the handle.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&mut h as *mut FileHandle).cast(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    // SAFETY: open_by_handle_at just returned this descriptor, and nothing
    // else owns it.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `rel`, resolved in the session's root without following any
/// symlink or leaving the root's mount, is inode (`s_dev`, `ino`) with the
/// watch's file handle.
fn is_the_inode(
    root: BorrowedFd<'_>,
    rel: &Path,
    s_dev: u32,
    ino: u64,
    handle: Option<&Handle>,
) -> bool {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let Ok(fd) = nix::fcntl::openat2(root.as_raw_fd(), rel, how) else {
        return false;
    };
    // SAFETY: openat2 just returned this descriptor, and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(st) = nix::sys::stat::fstat(fd.as_raw_fd()) else {
        return false;
    };
    if kernel_dev(st.st_dev) != s_dev || st.st_ino != ino {
        return false;
    }
    // Inode numbers repeat across btrfs subvolumes, and an overlay shows
    // both layers' under one device: the handle tells them apart.
    handle.is_none_or(|h| {
        fid_of(fd.as_fd()).is_some_and(|(kind, bytes)| kind == h.kind && bytes == h.bytes)
    })
}

/// The file handle the kernel encodes for `fd`'s inode as a watch's (the
/// "fid" form), or `None` if it cannot.
fn fid_of(fd: BorrowedFd<'_>) -> Option<(i32, Vec<u8>)> {
    let mut h = FileHandle {
        bytes: MAX_HANDLE as libc::c_uint,
        kind: 0,
        data: [0; MAX_HANDLE],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `fd` is open for the call; the path is an empty C string (with
    // AT_EMPTY_PATH the call names `fd` itself); `h` is a file_handle with
    // room for MAX_HANDLE_SZ bytes, as its `bytes` says; `mount_id` is
    // writable.
    let r = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&mut h as *mut FileHandle).cast(),
            &mut mount_id,
            libc::AT_EMPTY_PATH | AT_HANDLE_FID,
        )
    };
    let len = usize::try_from(h.bytes).ok().filter(|&n| n <= MAX_HANDLE)?;
    (r == 0).then(|| (h.kind, h.data[..len].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_handles_unwrap_to_the_real_inodes() {
        // As kernel 6.18 showed them for watches on an overlay of btrfs.
        let h = |hex: &str| Handle {
            kind: OVL_FILEID_V1,
            bytes: (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect(),
        };
        let lower = h("00000000fb29004d19459cf0a9e6478da50dbfd496c81dbd0501000000000000000100000000000007000000");
        let inner = Inner::of(&lower).unwrap();
        assert_eq!(inner.kind, 0x4d);
        assert_eq!(inner.fid.len(), 20);
        assert_eq!(inner.btrfs_ino(), Some(0x105));
        // Truncated, or not overlay's: nothing, never a panic.
        assert_eq!(Inner::of(&h("00000000fb29004d1945")), None);
        assert_eq!(
            Inner::of(&Handle {
                kind: 1,
                bytes: vec![0; 8]
            }),
            None
        );
        assert_eq!(
            Inner::of(&Handle {
                kind: OVL_FILEID_V1,
                bytes: vec![]
            }),
            None
        );
    }

    #[test]
    fn a_files_own_handle_is_its_fid() {
        let f = std::fs::File::open(std::env::temp_dir()).unwrap();
        // Every file system drums' stores sit on encodes fids (tmpfs, ext4,
        // btrfs); the same inode gives the same handle twice.
        let (a, b) = (fid_of(f.as_fd()), fid_of(f.as_fd()));
        assert!(a.is_some());
        assert_eq!(a, b);
    }
}
