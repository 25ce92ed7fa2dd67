//! How drums-init names a path inside the session's root. Every name there
//! is the image's or the session's, so none may lead out of the root:
//!
//! - **Before the pivot** (stage 1 building the root) the root is a host
//!   path, and a symlink in it is followed from the host's side: `proc ->
//!   /etc` is the host's /etc, and `run -> ../../../..` climbs out. So a path
//!   is walked from a descriptor of the root's directory with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: no symlink at all, and no `..`
//!   above the start ([`open`], [`make_dirs`], [`create_file`]). Mounts then
//!   land on the descriptor (`/proc/self/fd/N`), never on a path looked up
//!   again.
//! - **After the pivot** the session's own symlinks are its business and
//!   resolve inside it, but no /proc magic link is followed
//!   (`RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, [`open_in_root`]): stage 1's
//!   `/proc/self/fd/2` is drumsd's stderr on the host.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

fn openat2(dir: BorrowedFd<'_>, rel: &Path, how: OpenHow) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::openat2(dir.as_raw_fd(), rel, how).map_err(io::Error::from)?;
    // SAFETY: openat2 just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn beneath(flags: OFlag, mode: Mode) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
}

/// Open `rel` below `dir` without following any symlink on the way
/// (ELOOP) or climbing above `dir` (EXDEV). `O_PATH` gives a handle to
/// mount on.
pub fn open(dir: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> io::Result<OwnedFd> {
    openat2(dir, rel, beneath(flags, Mode::empty()))
}

/// Make a new regular file `name` in `dir`, which must not exist (a node of
/// the session's fresh /dev, to bind a host device onto).
pub fn create_file(dir: BorrowedFd<'_>, name: &str, mode: Mode) -> io::Result<OwnedFd> {
    let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW;
    openat2(dir, Path::new(name), beneath(flags, mode))
}

/// Why [`make_dirs`] failed: the operation, the path (relative to the
/// walk's start) and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}")]
pub struct WalkError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Make every component of `rel` below `dir` a real directory and return
/// an `O_PATH` handle to the last one.
///
/// A component that is missing is made (0755). One that is a symlink or any
/// other non-directory is unlinked and replaced by a directory: these are
/// mount points drums makes itself (docs/oci.md), whatever was there is
/// hidden by the mount anyway, and in an overlay the unlink only writes a
/// whiteout to the session's upper layer. Each replaced path is pushed to
/// `replaced`. No component is ever followed as a link, and every one is
/// opened again after it was made, so a link put there meanwhile fails the
/// walk (ELOOP) rather than being followed.
pub fn make_dirs(
    dir: BorrowedFd<'_>,
    rel: &Path,
    replaced: &mut Vec<PathBuf>,
) -> Result<OwnedFd, WalkError> {
    // Checked before anything is made: a walk either is all below `dir`
    // or does nothing.
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(WalkError {
            op: "walk",
            path: rel.to_owned(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        });
    }
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    // The start, as a descriptor of our own to walk from.
    let mut cur = open(dir, Path::new("."), dir_flags).map_err(|source| WalkError {
        op: "open",
        path: PathBuf::from("."),
        source,
    })?;
    let mut walked = PathBuf::new();
    for name in rel.iter() {
        walked.push(name);
        let fail = |op| {
            let path = walked.clone();
            move |source| WalkError { op, path, source }
        };
        let name = Path::new(name);
        let next = match open(cur.as_fd(), name, dir_flags) {
            Ok(fd) => fd,
            Err(e) => {
                match e.raw_os_error() {
                    Some(libc::ENOENT) => {}
                    // ELOOP: a symlink; ENOTDIR: a file, a device, a socket.
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                        nix::unistd::unlinkat(
                            Some(cur.as_raw_fd()),
                            name,
                            nix::unistd::UnlinkatFlags::NoRemoveDir,
                        )
                        .map_err(|e| fail("remove the non-directory at")(e.into()))?;
                        replaced.push(walked.clone());
                    }
                    _ => return Err(fail("open")(e)),
                }
                nix::sys::stat::mkdirat(
                    Some(cur.as_raw_fd()),
                    name,
                    Mode::from_bits_truncate(0o755),
                )
                .map_err(|e| fail("create directory")(e.into()))?;
                open(cur.as_fd(), name, dir_flags).map_err(fail("open"))?
            }
        };
        cur = next;
    }
    Ok(cur)
}

/// After the pivot: open `rel` from the session's root (`root`) as the
/// session resolves it (its symlinks stay inside it), but never through a
/// /proc magic link, which could name a host file stage 1 still holds open
/// (drumsd's stderr, say). `mode` is for a file `O_CREAT` makes.
pub fn open_in_root(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, rel.strip_prefix("/").unwrap_or(rel), how)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(p: &Path) -> OwnedFd {
        std::fs::File::open(p).unwrap().into()
    }

    #[test]
    fn links_and_files_on_the_way_become_directories_and_nothing_outside_changes() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        symlink(outside.path(), r.join("abs")).unwrap();
        symlink(
            "../../../../../../../../..".to_string() + outside.path().to_str().unwrap(),
            r.join("up"),
        )
        .unwrap();
        symlink("/nonexistent-drums-target", r.join("dangling")).unwrap();
        std::fs::write(r.join("file"), "x").unwrap();
        std::fs::create_dir(r.join("real")).unwrap();
        symlink(outside.path(), r.join("real/link")).unwrap();
        let fd = dir(r);
        for rel in [
            "abs/a",
            "up/b",
            "dangling",
            "file/c/d",
            "real/link/e",
            "new/f",
        ] {
            let mut replaced = Vec::new();
            let made = make_dirs(fd.as_fd(), Path::new(rel), &mut replaced).unwrap();
            let at = std::fs::read_link(format!("/proc/self/fd/{}", made.as_raw_fd())).unwrap();
            assert_eq!(at, r.join(rel), "{rel}");
            let first = Path::new(rel).iter().next().unwrap();
            let expect: Vec<PathBuf> = match rel {
                "new/f" => vec![],
                "real/link/e" => vec!["real/link".into()],
                _ => vec![first.into()],
            };
            assert_eq!(replaced, expect, "{rel}");
            // Every component is a real directory now.
            let mut p = r.to_path_buf();
            for c in Path::new(rel) {
                p.push(c);
                assert!(p.symlink_metadata().unwrap().is_dir(), "{}", p.display());
            }
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // Idempotent: the second walk finds directories and replaces nothing.
        let mut replaced = Vec::new();
        make_dirs(fd.as_fd(), Path::new("abs/a"), &mut replaced).unwrap();
        assert!(replaced.is_empty());
        // No climbing, no absolute walk.
        for bad in ["../x", "/x", "a/../b"] {
            let e = make_dirs(fd.as_fd(), Path::new(bad), &mut replaced).unwrap_err();
            assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
        assert!(!r.join("a").exists(), "a refused walk makes nothing");
    }

    #[test]
    fn open_refuses_any_link_and_any_climb() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("in")).unwrap();
        std::fs::write(r.join("in/ok"), "inside").unwrap();
        symlink("ok", r.join("in/rel")).unwrap();
        symlink(outside.path(), r.join("abs")).unwrap();
        let fd = dir(r);
        assert!(open(fd.as_fd(), Path::new("in/ok"), OFlag::O_RDONLY).is_ok());
        for (rel, errno) in [
            ("in/rel", libc::ELOOP),
            ("abs/secret", libc::ELOOP),
            ("../x", libc::EXDEV),
            ("in/missing", libc::ENOENT),
        ] {
            let e = open(fd.as_fd(), Path::new(rel), OFlag::O_PATH).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(errno), "{rel}: {e}");
        }
    }

    #[test]
    fn after_the_pivot_links_resolve_inside_and_magic_links_not_at_all() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("etc")).unwrap();
        symlink("/etc/real", r.join("etc/hosts")).unwrap();
        // A descriptor of a host directory, as stage 1 might hold one.
        let host = dir(outside.path());
        symlink(
            format!("/proc/self/fd/{}/x", host.as_raw_fd()),
            r.join("etc/hostname"),
        )
        .unwrap();
        let fd = dir(r);
        let write = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
        let mode = Mode::from_bits_truncate(0o644);
        open_in_root(fd.as_fd(), Path::new("/etc/hosts"), write, mode).unwrap();
        assert!(r.join("etc/real").is_file(), "the link resolved inside");
        // Absolute inside the root: /proc is not there, so ENOENT; with a
        // real /proc it is a magic link (ELOOP). Either way nothing outside.
        assert!(open_in_root(fd.as_fd(), Path::new("/etc/hostname"), write, mode).is_err());
        let via_magic = format!("/proc/self/fd/{}/y", host.as_raw_fd());
        let e = open_in_root(
            dir(Path::new("/")).as_fd(),
            Path::new(&via_magic),
            write,
            mode,
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}
