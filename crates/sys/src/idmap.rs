//! User namespaces as id maps, and idmapped mounts (Linux 5.12+).
//!
//! drumsd mounts a session's root on the host as an overlay of idmapped
//! layers (the policy is `drums_session::ids`). An idmapped mount takes its
//! mapping from a user namespace, so [`user_namespace`] makes one that holds
//! nothing but a map.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::{err, MountAttr, Result, SysError, Syscall};

/// open_tree(2)'s flags, as libc spells them (`c_uint`).
pub const OPEN_TREE_CLONE: u32 = libc::OPEN_TREE_CLONE;
pub const OPEN_TREE_CLOEXEC: u32 = libc::OPEN_TREE_CLOEXEC;

/// One line of a uid_map/gid_map: ids `inside..inside+count` of the namespace
/// are `outside..outside+count` of its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

fn map_text(map: &[Extent]) -> String {
    map.iter()
        .map(|e| format!("{} {} {}\n", e.inside, e.outside, e.count))
        .collect()
}

/// Write `map` as the uid and gid map of the user namespace of process `pid`
/// (which must not have one yet). Host root may write several lines, and
/// needs no `newuidmap`.
pub fn write_id_maps(pid: i32, map: &[Extent]) -> Result<()> {
    let text = map_text(map);
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, &text).map_err(|e| SysError {
            op: "write id map",
            target: path.clone(),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
    }
    Ok(())
}

/// A new user namespace with `map` as both its uid and gid map, held by the
/// returned descriptor alone: a child process is forked into it, mapped, and
/// reaped, so no process lives in it.
pub fn user_namespace(map: &[Extent]) -> Result<OwnedFd> {
    // O_CLOEXEC: a session's init, spawned meanwhile, must not keep them.
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
    let (ready_r, ready_w) = pipe().map_err(err("pipe", "user namespace"))?;
    let (done_r, done_w) = pipe().map_err(err("pipe", "user namespace"))?;
    // SAFETY: the child only makes raw system calls (unshare, write, read,
    // _exit): async-signal-safe, so forking a multithreaded drumsd is sound.
    match unsafe { nix::unistd::fork() }.map_err(err("fork", "user namespace"))? {
        // Both sides signal with a byte, never with EOF: a concurrent fork
        // (another session's namespace) may hold copies of these pipes'
        // write ends, so an EOF could wait for that other child.
        // These calls stay raw, outside the `Syscall` seam: between fork and
        // _exit a child of a multithreaded process may not allocate or take
        // a lock, which the seam's implementations may do.
        // SAFETY: raw system calls on descriptors this function owns, then
        // _exit without running any of drumsd's destructors.
        nix::unistd::ForkResult::Child => unsafe {
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
            let b = [ok as u8];
            libc::write(ready_w.as_raw_fd(), b.as_ptr().cast(), 1);
            let mut x = [0u8; 1];
            libc::read(done_r.as_raw_fd(), x.as_mut_ptr().cast(), 1);
            libc::_exit(0)
        },
        nix::unistd::ForkResult::Parent { child } => {
            drop(ready_w);
            drop(done_r);
            let result = (|| {
                let mut b = [0u8; 1];
                let n = nix::unistd::read(ready_r.as_raw_fd(), &mut b)
                    .map_err(err("read", "user namespace"))?;
                if n != 1 || b[0] != 1 {
                    return Err(SysError {
                        op: "unshare",
                        target: "CLONE_NEWUSER".into(),
                        source: nix::Error::EPERM,
                    });
                }
                write_id_maps(child.as_raw(), map)?;
                let path = format!("/proc/{}/ns/user", child.as_raw());
                let fd = nix::fcntl::open(
                    path.as_str(),
                    nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(err("open", path))?;
                // SAFETY: just opened, owned here.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            })();
            // The byte lets the child exit; it is always reaped.
            let _ = nix::unistd::write(&done_w, &[1]);
            drop(done_w);
            let _ = nix::sys::wait::waitpid(child, None);
            result
        }
    }
}

/// A detached copy of the mount at `src`, idmapped through `userns` (and
/// read-only if asked), usable as an overlay layer through
/// `/proc/self/fd/N` while the descriptor is open. It is in no mount table:
/// nothing is left behind when the descriptor closes.
pub fn idmapped_tree(src: &Path, userns: BorrowedFd<'_>, read_only: bool) -> Result<OwnedFd> {
    idmapped_tree_with(&crate::LinuxSyscall, src, userns, read_only)
}

/// [`idmapped_tree`] through the seam `sys`: open_tree(OPEN_TREE_CLONE),
/// then mount_setattr(MOUNT_ATTR_IDMAP). util-linux's `X-mount.idmap=`
/// silently does nothing on the hosts drums runs on, hence the system calls.
pub fn idmapped_tree_with(
    sys: &dyn Syscall,
    src: &Path,
    userns: BorrowedFd<'_>,
    read_only: bool,
) -> Result<OwnedFd> {
    let tree = sys.open_tree(src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)?;
    let attr = MountAttr {
        idmap: Some(userns),
        read_only,
    };
    sys.mount_setattr(tree.as_fd(), attr, &src.display().to_string())
        .map_err(|e| SysError {
            op: "mount_setattr idmap",
            ..e
        })?;
    Ok(tree)
}

/// The path through which the kernel resolves an open descriptor of this
/// process (a detached mount, say) as a directory.
pub fn fd_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Call, RecordingSyscall};

    #[test]
    fn idmapped_tree_clones_then_sets_the_idmap_on_the_clone() {
        let sys = RecordingSyscall::new();
        let userns = sys.user_namespace(&[]).unwrap();
        let tree = idmapped_tree_with(&sys, Path::new("/img"), userns.as_fd(), true).unwrap();
        let calls = sys.calls();
        assert_eq!(
            calls[1..],
            [
                Call::OpenTree {
                    path: "/img".into(),
                    flags: OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
                    fd: tree.as_raw_fd(),
                },
                Call::MountSetattr {
                    tree: tree.as_raw_fd(),
                    idmap: Some(userns.as_raw_fd()),
                    read_only: true,
                },
            ]
        );
    }

    #[test]
    fn a_failed_idmap_names_the_tree_and_keeps_the_errno() {
        let sys = RecordingSyscall::new();
        let userns = sys.user_namespace(&[]).unwrap();
        sys.fail("mount_setattr", nix::Error::EINVAL);
        let e = idmapped_tree_with(&sys, Path::new("/sv"), userns.as_fd(), false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mount_setattr idmap /sv: EINVAL: Invalid argument"
        );
        assert_eq!(
            std::error::Error::source(&e).map(|s| s.to_string()),
            Some(nix::Error::EINVAL.to_string())
        );

        let sys = RecordingSyscall::new();
        sys.fail("open_tree", nix::Error::ENOENT);
        let e = idmapped_tree_with(&sys, Path::new("/sv"), userns.as_fd(), false).unwrap_err();
        assert_eq!(e.op, "open_tree");
        assert!(
            sys.calls().is_empty(),
            "no mount_setattr after a failed open_tree"
        );
    }
}
