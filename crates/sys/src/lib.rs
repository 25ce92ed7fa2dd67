//! The one narrow layer through which drums makes privileged system calls.
//!
//! Following youki's `Syscall` trait: session set-up code takes `&dyn Syscall`, so
//! the order and arguments of its mounts, pivots and namespace calls can be unit
//! tested without root through [`RecordingSyscall`], while [`LinuxSyscall`] does
//! the real thing.

pub mod idmap;

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use idmap::Extent;

pub use nix::mount::{MntFlags, MsFlags};
pub use nix::sched::CloneFlags;
pub use nix::sys::stat::{Mode, SFlag};

/// A failed privileged call: which call, on what, and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{op} {target}: {source}")]
pub struct SysError {
    pub op: &'static str,
    pub target: String,
    #[source]
    pub source: nix::Error,
}

pub type Result<T> = std::result::Result<T, SysError>;

fn err(op: &'static str, target: impl Into<String>) -> impl FnOnce(nix::Error) -> SysError {
    let target = target.into();
    move |source| SysError { op, target, source }
}

/// What [`Syscall::mount_setattr`] sets on a detached mount.
#[derive(Debug, Clone, Copy)]
pub struct MountAttr<'a> {
    /// MOUNT_ATTR_IDMAP: ids through the mount are mapped by this user
    /// namespace's map.
    pub idmap: Option<BorrowedFd<'a>>,
    /// MOUNT_ATTR_RDONLY.
    pub read_only: bool,
}

/// The privileged operations drums makes: mounts, namespaces and id maps.
///
/// The code that needs them holds one (`Arc<dyn Syscall + Send + Sync>`) or
/// takes `&dyn Syscall`: [`LinuxSyscall`] in production, [`RecordingSyscall`]
/// in unit tests.
pub trait Syscall {
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<()>;
    fn umount2(&self, target: &Path, flags: MntFlags) -> Result<()>;
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> Result<()>;
    fn chdir(&self, path: &Path) -> Result<()>;
    fn sethostname(&self, name: &str) -> Result<()>;
    fn unshare(&self, flags: CloneFlags) -> Result<()>;
    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: u64) -> Result<()>;
    /// Join the namespace `ns` refers to (this thread only, for most kinds).
    /// `target` names it in an error.
    fn setns(&self, ns: BorrowedFd<'_>, nstype: CloneFlags, target: &str) -> Result<()>;
    /// open_tree(2) of `path` with `flags` (OPEN_TREE_CLONE, ...): a detached
    /// mount when cloning.
    fn open_tree(&self, path: &Path, flags: u32) -> Result<OwnedFd>;
    /// mount_setattr(2) on the mount `tree` (AT_EMPTY_PATH); `target` names
    /// it in an error.
    fn mount_setattr(&self, tree: BorrowedFd<'_>, attr: MountAttr<'_>, target: &str) -> Result<()>;
    /// move_mount(2) of the detached mount `from` onto `to`.
    fn move_mount(&self, from: BorrowedFd<'_>, to: &Path) -> Result<()>;
    /// A new user namespace holding `map` as its uid and gid map, and no
    /// process (see [`idmap::user_namespace`]).
    fn user_namespace(&self, map: &[Extent]) -> Result<OwnedFd>;
    /// Write `map` as the uid and gid map of process `pid`'s user namespace.
    fn write_id_maps(&self, pid: i32, map: &[Extent]) -> Result<()>;
}

/// The real system calls, through nix.
pub struct LinuxSyscall;

impl Syscall for LinuxSyscall {
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<()> {
        nix::mount::mount(source, target, fstype, flags, data)
            .map_err(err("mount", target.display().to_string()))
    }
    fn umount2(&self, target: &Path, flags: MntFlags) -> Result<()> {
        nix::mount::umount2(target, flags).map_err(err("umount", target.display().to_string()))
    }
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> Result<()> {
        nix::unistd::pivot_root(new_root, put_old)
            .map_err(err("pivot_root", new_root.display().to_string()))
    }
    fn chdir(&self, path: &Path) -> Result<()> {
        nix::unistd::chdir(path).map_err(err("chdir", path.display().to_string()))
    }
    fn sethostname(&self, name: &str) -> Result<()> {
        nix::unistd::sethostname(name).map_err(err("sethostname", name))
    }
    fn unshare(&self, flags: CloneFlags) -> Result<()> {
        nix::sched::unshare(flags).map_err(err("unshare", format!("{flags:?}")))
    }
    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: u64) -> Result<()> {
        nix::sys::stat::mknod(path, kind, perm, dev)
            .map_err(err("mknod", path.display().to_string()))
    }
    fn setns(&self, ns: BorrowedFd<'_>, nstype: CloneFlags, target: &str) -> Result<()> {
        nix::sched::setns(ns, nstype).map_err(err("setns", target))
    }
    fn open_tree(&self, path: &Path, flags: u32) -> Result<OwnedFd> {
        let target = path.display().to_string();
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| err("open_tree", target.clone())(nix::Error::EINVAL))?;
        // nix 0.29 has no open_tree.
        // SAFETY: open_tree with a valid C string; the result is a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
        if fd < 0 {
            return Err(err("open_tree", target)(nix::Error::last()));
        }
        // SAFETY: open_tree just returned this descriptor, and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
    fn mount_setattr(&self, tree: BorrowedFd<'_>, attr: MountAttr<'_>, target: &str) -> Result<()> {
        // SAFETY: mount_attr is four u64s; all zeros is "set nothing".
        let mut a: libc::mount_attr = unsafe { std::mem::zeroed() };
        if let Some(userns) = attr.idmap {
            a.attr_set |= libc::MOUNT_ATTR_IDMAP;
            a.userns_fd = userns.as_raw_fd() as u64;
        }
        if attr.read_only {
            a.attr_set |= libc::MOUNT_ATTR_RDONLY;
        }
        // nix 0.29 has no mount_setattr.
        // SAFETY: mount_setattr on a descriptor the caller holds open, with an
        // empty path and AT_EMPTY_PATH, and a correctly sized attr.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                &a as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        };
        if r < 0 {
            return Err(err("mount_setattr", target)(nix::Error::last()));
        }
        Ok(())
    }
    fn move_mount(&self, from: BorrowedFd<'_>, to: &Path) -> Result<()> {
        let target = to.display().to_string();
        let c = std::ffi::CString::new(to.as_os_str().as_encoded_bytes())
            .map_err(|_| err("move_mount", target.clone())(nix::Error::EINVAL))?;
        // nix 0.29 has no move_mount.
        // SAFETY: move_mount of a descriptor the caller holds open (empty path,
        // MOVE_MOUNT_F_EMPTY_PATH) onto a valid C string.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                from.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if r < 0 {
            return Err(err("move_mount", target)(nix::Error::last()));
        }
        Ok(())
    }
    fn user_namespace(&self, map: &[Extent]) -> Result<OwnedFd> {
        idmap::user_namespace(map)
    }
    fn write_id_maps(&self, pid: i32, map: &[Extent]) -> Result<()> {
        idmap::write_id_maps(pid, map)
    }
}

/// Set the hostname of the UTS namespace that process `pid` is in, from a
/// thread of this process that joins that namespace and then ends.
///
/// This is how a restored sibling gets its hostname: the session itself holds
/// no CAP_SYS_ADMIN, so nothing inside it can. The namespace is opened by pid
/// through /proc/PID/ns, a kernel object the session cannot redirect.
pub fn set_hostname_in(pid: i32, name: &str) -> Result<()> {
    let ns = format!("/proc/{pid}/ns/uts");
    let name = name.to_owned();
    let target = ns.clone();
    std::thread::spawn(move || -> Result<()> {
        let fd = nix::fcntl::open(
            ns.as_str(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err("open", ns.clone()))?;
        // SAFETY: `fd` was just opened and is owned here; OwnedFd closes it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // Only this thread changes namespace, and it ends right after.
        nix::sched::setns(&fd, CloneFlags::CLONE_NEWUTS).map_err(err("setns", ns.clone()))?;
        nix::unistd::sethostname(&name).map_err(err("sethostname", name.clone()))
    })
    .join()
    .unwrap_or(Err(SysError {
        op: "set hostname in",
        target,
        source: nix::Error::EIO,
    }))
}

/// Set the last pid handed out in the pid namespace of process `pid` to
/// `last`, so that its next process gets `last + 1`, as CRIU does when it
/// restores one. `/proc/sys/kernel/ns_last_pid` answers for the writer's own
/// namespace, and a session may not write it (no CAP_CHECKPOINT_RESTORE, a
/// read-only /proc/sys), so a thread of this process joins the namespace for
/// its children and forks one that writes it, through a descriptor opened
/// here, then exits. That child takes a pid of the namespace for its life;
/// the write sets the namespace's cursor whatever that pid was.
pub fn set_last_pid_in(pid: i32, last: u32) -> Result<()> {
    let ns = format!("/proc/{pid}/ns/pid");
    let target = ns.clone();
    std::thread::spawn(move || -> Result<()> {
        let open = |path: &str, flags| {
            nix::fcntl::open(path, flags | nix::fcntl::OFlag::O_CLOEXEC, Mode::empty())
                .map_err(err("open", path.to_owned()))
                // SAFETY: just opened, owned here.
                .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        };
        let fd = open(&ns, nix::fcntl::OFlag::O_RDONLY)?;
        let ctl = open("/proc/sys/kernel/ns_last_pid", nix::fcntl::OFlag::O_WRONLY)?;
        // Formatted before the fork: the child may not allocate.
        let text = last.to_string();
        // Only this thread's children change namespace, and it ends right
        // after.
        nix::sched::setns(&fd, CloneFlags::CLONE_NEWPID).map_err(err("setns", ns.clone()))?;
        // SAFETY: the child only writes to a descriptor opened above and
        // exits: async-signal-safe, so forking a multithreaded drumsd is
        // sound.
        match unsafe { nix::unistd::fork() }.map_err(err("fork", ns.clone()))? {
            // SAFETY: a raw write to a descriptor this thread owns, then
            // _exit without running any of drumsd's destructors.
            nix::unistd::ForkResult::Child => unsafe {
                let n = libc::write(ctl.as_raw_fd(), text.as_ptr().cast(), text.len());
                libc::_exit(if n == text.len() as isize { 0 } else { 1 })
            },
            nix::unistd::ForkResult::Parent { child } => {
                match nix::sys::wait::waitpid(child, None).map_err(err("wait", ns.clone()))? {
                    nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                    _ => Err(SysError {
                        op: "write ns_last_pid",
                        target: format!("{ns} ({last})"),
                        source: nix::Error::EPERM,
                    }),
                }
            }
        }
    })
    .join()
    .unwrap_or(Err(SysError {
        op: "set the last pid in",
        target,
        source: nix::Error::EIO,
    }))
}

/// Open `rel` inside the tree rooted at `root` (a session's root, seen from
/// the host as `/proc/PID/root`) as the session would resolve it: every
/// symlink and `..` stays inside `root` (RESOLVE_IN_ROOT), and no
/// /proc magic link is followed (RESOLVE_NO_MAGICLINKS). A session controls
/// every name below its root, so drumsd never opens such a path as host root
/// any other way: `/proc/PID/root/run/x` alone would follow a session's
/// symlink `x -> /etc/shadow` to the host's file.
///
/// `flags` are the open flags (O_CLOEXEC is added); O_PATH gives a handle
/// for `connect` through `/proc/self/fd/N`.
pub fn open_in_root(
    root: &Path,
    rel: &Path,
    flags: nix::fcntl::OFlag,
) -> std::result::Result<std::os::fd::OwnedFd, std::io::Error> {
    let dir = std::fs::File::open(root)?;
    open_in_root_fd(std::os::fd::AsFd::as_fd(&dir), rel, flags)
}

/// [`open_in_root`] with the root already open (`dir`), for callers that
/// resolve many paths in one session.
pub fn open_in_root_fd(
    dir: std::os::fd::BorrowedFd<'_>,
    rel: &Path,
    flags: nix::fcntl::OFlag,
) -> std::result::Result<std::os::fd::OwnedFd, std::io::Error> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    let fd = nix::fcntl::openat2(dir.as_raw_fd(), rel, how).map_err(std::io::Error::from)?;
    // SAFETY: openat2 just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One recorded call, with the arguments that matter for checking a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Mount {
        source: Option<String>,
        target: PathBuf,
        fstype: Option<String>,
        flags: MsFlags,
        data: Option<String>,
    },
    Umount {
        target: PathBuf,
        flags: MntFlags,
    },
    PivotRoot {
        new_root: PathBuf,
        put_old: PathBuf,
    },
    Chdir(PathBuf),
    Sethostname(String),
    Unshare(CloneFlags),
    Mknod {
        path: PathBuf,
        dev: u64,
    },
    Setns {
        ns: RawFd,
        nstype: CloneFlags,
    },
    /// `fd`: the descriptor the recording handed back, so a test can find it
    /// in later calls' arguments (`/proc/self/fd/N`).
    OpenTree {
        path: PathBuf,
        flags: u32,
        fd: RawFd,
    },
    MountSetattr {
        tree: RawFd,
        idmap: Option<RawFd>,
        read_only: bool,
    },
    MoveMount {
        from: RawFd,
        to: PathBuf,
    },
    /// `fd` as for [`Call::OpenTree`].
    UserNamespace {
        map: Vec<Extent>,
        fd: RawFd,
    },
    WriteIdMaps {
        pid: i32,
        map: Vec<Extent>,
    },
}

/// Records calls instead of making them; fails the calls of one kind, or only
/// the n-th of them, so error paths can be tested without root.
///
/// A `Mutex`, not a `RefCell`, so that it is `Send + Sync` and can stand in
/// for [`LinuxSyscall`] wherever that is held as `Arc<dyn Syscall + Send + Sync>`.
/// Calls that hand back a descriptor (open_tree, user_namespace) hand back
/// one of /dev/null.
#[derive(Default)]
pub struct RecordingSyscall {
    state: Mutex<Recording>,
}

#[derive(Default)]
struct Recording {
    calls: Vec<Call>,
    /// (op, which call of that op, counting from 1 (`None`: every one), errno).
    faults: Vec<(&'static str, Option<usize>, nix::Error)>,
    /// How many calls of each op were attempted, failed ones included.
    attempts: Vec<(&'static str, usize)>,
}

impl RecordingSyscall {
    pub fn new() -> Self {
        Self::default()
    }
    fn state(&self) -> std::sync::MutexGuard<'_, Recording> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Make every call named `op` ("mount", "pivot_root", ...) fail with `errno`.
    pub fn fail(&self, op: &'static str, errno: nix::Error) {
        self.state().faults.push((op, None, errno));
    }
    /// Make only the `n`-th call named `op` (counting from 1) fail with `errno`.
    pub fn fail_nth(&self, op: &'static str, n: usize, errno: nix::Error) {
        self.state().faults.push((op, Some(n), errno));
    }
    /// The calls made, in order; a failed call is not among them.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }
    /// How many calls named `op` were attempted, failed ones included.
    pub fn attempts(&self, op: &str) -> usize {
        self.state()
            .attempts
            .iter()
            .find(|(o, _)| *o == op)
            .map_or(0, |(_, n)| *n)
    }
    fn record(&self, op: &'static str, target: String, call: Call) -> Result<()> {
        let mut st = self.state();
        let n = match st.attempts.iter_mut().find(|(o, _)| *o == op) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                st.attempts.push((op, 1));
                1
            }
        };
        let fault = st
            .faults
            .iter()
            .find(|(f, nth, _)| *f == op && nth.is_none_or(|k| k == n))
            .map(|(_, _, e)| *e);
        if let Some(source) = fault {
            return Err(SysError { op, target, source });
        }
        st.calls.push(call);
        Ok(())
    }
    /// A descriptor to hand back in place of a namespace or a mount.
    fn placeholder(op: &'static str, target: &str) -> Result<OwnedFd> {
        std::fs::File::open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|e| SysError {
                op,
                target: target.to_owned(),
                source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            })
    }
}

impl Syscall for RecordingSyscall {
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<()> {
        self.record(
            "mount",
            target.display().to_string(),
            Call::Mount {
                source: source.map(str::to_owned),
                target: target.to_owned(),
                fstype: fstype.map(str::to_owned),
                flags,
                data: data.map(str::to_owned),
            },
        )
    }
    fn umount2(&self, target: &Path, flags: MntFlags) -> Result<()> {
        self.record(
            "umount",
            target.display().to_string(),
            Call::Umount {
                target: target.to_owned(),
                flags,
            },
        )
    }
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> Result<()> {
        self.record(
            "pivot_root",
            new_root.display().to_string(),
            Call::PivotRoot {
                new_root: new_root.to_owned(),
                put_old: put_old.to_owned(),
            },
        )
    }
    fn chdir(&self, path: &Path) -> Result<()> {
        self.record(
            "chdir",
            path.display().to_string(),
            Call::Chdir(path.to_owned()),
        )
    }
    fn sethostname(&self, name: &str) -> Result<()> {
        self.record(
            "sethostname",
            name.to_owned(),
            Call::Sethostname(name.to_owned()),
        )
    }
    fn unshare(&self, flags: CloneFlags) -> Result<()> {
        self.record("unshare", format!("{flags:?}"), Call::Unshare(flags))
    }
    fn mknod(&self, path: &Path, _kind: SFlag, _perm: Mode, dev: u64) -> Result<()> {
        self.record(
            "mknod",
            path.display().to_string(),
            Call::Mknod {
                path: path.to_owned(),
                dev,
            },
        )
    }
    fn setns(&self, ns: BorrowedFd<'_>, nstype: CloneFlags, target: &str) -> Result<()> {
        self.record(
            "setns",
            target.to_owned(),
            Call::Setns {
                ns: ns.as_raw_fd(),
                nstype,
            },
        )
    }
    fn open_tree(&self, path: &Path, flags: u32) -> Result<OwnedFd> {
        let target = path.display().to_string();
        let fd = Self::placeholder("open_tree", &target)?;
        self.record(
            "open_tree",
            target,
            Call::OpenTree {
                path: path.to_owned(),
                flags,
                fd: fd.as_raw_fd(),
            },
        )?;
        Ok(fd)
    }
    fn mount_setattr(&self, tree: BorrowedFd<'_>, attr: MountAttr<'_>, target: &str) -> Result<()> {
        self.record(
            "mount_setattr",
            target.to_owned(),
            Call::MountSetattr {
                tree: tree.as_raw_fd(),
                idmap: attr.idmap.map(|fd| fd.as_raw_fd()),
                read_only: attr.read_only,
            },
        )
    }
    fn move_mount(&self, from: BorrowedFd<'_>, to: &Path) -> Result<()> {
        self.record(
            "move_mount",
            to.display().to_string(),
            Call::MoveMount {
                from: from.as_raw_fd(),
                to: to.to_owned(),
            },
        )
    }
    fn user_namespace(&self, map: &[Extent]) -> Result<OwnedFd> {
        let fd = Self::placeholder("user_namespace", "CLONE_NEWUSER")?;
        self.record(
            "user_namespace",
            "CLONE_NEWUSER".to_owned(),
            Call::UserNamespace {
                map: map.to_vec(),
                fd: fd.as_raw_fd(),
            },
        )?;
        Ok(fd)
    }
    fn write_id_maps(&self, pid: i32, map: &[Extent]) -> Result<()> {
        self.record(
            "write id map",
            format!("/proc/{pid}"),
            Call::WriteIdMaps {
                pid,
                map: map.to_vec(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_calls_in_order_and_injects_failures() {
        let sys = RecordingSyscall::new();
        sys.sethostname("a").unwrap();
        sys.chdir(Path::new("/x")).unwrap();
        assert_eq!(
            sys.calls(),
            vec![Call::Sethostname("a".into()), Call::Chdir("/x".into())]
        );
        sys.fail("chdir", nix::Error::EPERM);
        let e = sys.chdir(Path::new("/y")).unwrap_err();
        assert_eq!(e.to_string(), "chdir /y: EPERM: Operation not permitted");
        assert_eq!(sys.calls().len(), 2, "a failed call is not recorded");
        assert_eq!(sys.attempts("chdir"), 2);
    }

    #[test]
    fn fail_nth_fails_only_that_call_of_its_kind() {
        let sys = RecordingSyscall::new();
        sys.fail_nth("umount", 2, nix::Error::EBUSY);
        let t = Path::new("/t");
        sys.umount2(t, MntFlags::empty()).unwrap();
        let e = sys.umount2(t, MntFlags::MNT_DETACH).unwrap_err();
        assert_eq!((e.op, e.source), ("umount", nix::Error::EBUSY));
        sys.umount2(t, MntFlags::MNT_DETACH).unwrap();
        assert_eq!(sys.attempts("umount"), 3);
        assert_eq!(sys.calls().len(), 2);
    }

    #[test]
    fn the_recording_can_be_shared_across_threads() {
        fn shared(_: &(dyn Syscall + Send + Sync)) {}
        shared(&RecordingSyscall::new());
        shared(&LinuxSyscall);
    }
}

#[cfg(test)]
mod open_in_root_tests {
    use super::*;

    #[test]
    fn symlinks_and_dotdot_stay_inside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("run")).unwrap();
        std::fs::write(root.path().join("run/ok"), "inside").unwrap();
        // An absolute symlink and a climbing one, both pointing at the host's file.
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("run/abs"))
            .unwrap();
        std::os::unix::fs::symlink(
            "../../../../../../../../../../".to_string()
                + outside.path().join("secret").to_str().unwrap(),
            root.path().join("run/up"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "/proc/self/root/etc/hostname",
            root.path().join("run/magic"),
        )
        .unwrap();
        let read = |rel: &str| {
            open_in_root(root.path(), Path::new(rel), nix::fcntl::OFlag::O_RDONLY)
                .map(|fd| std::io::read_to_string(std::fs::File::from(fd)).unwrap())
        };
        assert_eq!(read("/run/ok").unwrap(), "inside");
        for escape in ["run/abs", "run/up", "/../../secret", "run/magic"] {
            match read(escape) {
                Ok(text) => assert_ne!(text, "host", "{escape} escaped the root"),
                Err(e) => assert!(
                    matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT) | Some(libc::ELOOP) | Some(libc::EXDEV)
                    ),
                    "{escape}: {e}"
                ),
            }
        }
    }
}
