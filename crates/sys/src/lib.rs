//! The one narrow layer through which drums makes privileged system calls.
//!
//! Following youki's `Syscall` trait: session set-up code takes `&dyn Syscall`, so
//! the order and arguments of its mounts, pivots and namespace calls can be unit
//! tested without root through [`RecordingSyscall`], while [`LinuxSyscall`] does
//! the real thing.

pub mod idmap;

use std::cell::RefCell;
use std::path::{Path, PathBuf};

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

/// The privileged operations session set-up needs.
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
}

/// Records calls instead of making them; optionally fails the n-th call of one kind,
/// so error paths can be tested without root.
#[derive(Default)]
pub struct RecordingSyscall {
    calls: RefCell<Vec<Call>>,
    fail_on: RefCell<Option<(&'static str, nix::Error)>>,
}

impl RecordingSyscall {
    pub fn new() -> Self {
        Self::default()
    }
    /// Make every call named `op` ("mount", "pivot_root", ...) fail with `errno`.
    pub fn fail(&self, op: &'static str, errno: nix::Error) {
        *self.fail_on.borrow_mut() = Some((op, errno));
    }
    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }
    fn record(&self, op: &'static str, target: String, call: Call) -> Result<()> {
        if let Some((f, e)) = *self.fail_on.borrow() {
            if f == op {
                return Err(SysError {
                    op,
                    target,
                    source: e,
                });
            }
        }
        self.calls.borrow_mut().push(call);
        Ok(())
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
