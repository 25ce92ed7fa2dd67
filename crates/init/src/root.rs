//! Building the session's root file system. The mounts are a plan (data) applied
//! through [`drums_sys::Syscall`], so their order is unit-tested without root.
//!
//! The root is untrusted: every name in it is the image's or the session's
//! writable layer's. Stage 1 builds it before the pivot, where a symlink
//! would be followed from the host's side, so no path in it is ever looked
//! up as a path: each mount point is walked from a descriptor without
//! following a link, made a real directory, and mounted on through its
//! descriptor ([`crate::resolve`]; docs/oci.md, "What a session needs from
//! an image").

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use drums_sys::idmap::fd_path;
use drums_sys::{MntFlags, Mode, MsFlags, Syscall};
use nix::fcntl::OFlag;

use crate::{io, resolve, InitConfig, InitError, BIN_DIR};

/// Where a mount's source comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file system's name ("proc", "tmpfs"): not a path.
    Fs(&'static str),
    /// A path of the host's that drums owns (the binaries' directory, a
    /// node of the host's /dev): used as it is.
    Host(String),
    /// A path inside the session's root, walked as a target is: never
    /// through a symlink.
    Root(PathBuf),
}

/// One mount of the plan. `target` and a [`Source::Root`] are paths below
/// the root's directory (`r/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountStep {
    pub source: Option<Source>,
    pub target: PathBuf,
    pub fstype: Option<String>,
    pub flags: MsFlags,
    pub data: Option<String>,
}

impl MountStep {
    /// Mount onto `target`, a handle of [`MountStep::target`] walked from
    /// `parent` (the root's directory), through `/proc/self/fd/N`: the
    /// kernel mounts on what the handle names, and looks nothing up again.
    fn apply(
        &self,
        sys: &dyn Syscall,
        parent: BorrowedFd<'_>,
        target: &OwnedFd,
    ) -> Result<(), InitError> {
        // Held until the mount is made: its path names it.
        let mut held = None;
        let source = match &self.source {
            None => None,
            Some(Source::Fs(name)) => Some((*name).to_owned()),
            Some(Source::Host(p)) => Some(p.clone()),
            Some(Source::Root(p)) => {
                let fd = resolve::open(parent, p, OFlag::O_PATH).map_err(io("open", p))?;
                let path = fd_path(fd.as_fd());
                held = Some(fd);
                Some(path)
            }
        };
        sys.mount(
            source.as_deref(),
            Path::new(&fd_path(target.as_fd())),
            self.fstype.as_deref(),
            self.flags,
            self.data.as_deref(),
        )
        .map_err(|mut e| {
            // Name the mount point, not the descriptor's number.
            e.target = self.target.display().to_string();
            e
        })?;
        drop(held);
        Ok(())
    }
}

fn step(
    source: Source,
    target: PathBuf,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> MountStep {
    MountStep {
        source: Some(source),
        target,
        fstype: fstype.map(str::to_owned),
        flags,
        data: data.map(str::to_owned),
    }
}

/// Character devices every session gets, each a bind of the host's node: a
/// session's root cannot mknod (it has no CAP_MKNOD in the host's user
/// namespace), and a node on a tmpfs mounted in a user namespace would not
/// open anyway. Anything else (disks, /dev/mem, kvm) stays out of reach
/// because /dev is a fresh tmpfs, and the devices cgroup refuses the rest.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The mounts of a session root, in order. The root itself comes first; every
/// other mount lands inside it.
///
/// `r` is the root's path and `bin_src` the drums binaries' host directory,
/// as stage 1 reaches them (see [`HostDirs`]). Every mount point below the
/// root is a directory stage 1 makes: the first level (`proc`, `sys`,
/// `dev`, `run`) in the root, replacing whatever the image or the session
/// put there, the rest on the tmpfs just mounted above it.
pub fn mount_plan(r: &Path, bin_src: &str) -> Vec<MountStep> {
    let r = &r.to_path_buf();
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    vec![
        // The root drumsd mounted, bound onto itself: a mount of the session's
        // own. pivot_root refuses a mount that the copy into a user
        // namespace's mount namespace locked (EINVAL).
        step(
            Source::Root(r.clone()),
            r.clone(),
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        ),
        step(
            Source::Fs("proc"),
            r.join("proc"),
            Some("proc"),
            nosuid_nodev | MsFlags::MS_NOEXEC,
            None,
        ),
        // Read-only: a session may look at its devices and its own net namespace's
        // links (Chromium and Python probe these), but never change the host's knobs.
        step(
            Source::Fs("sysfs"),
            r.join("sys"),
            Some("sysfs"),
            nosuid_nodev | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
            None,
        ),
        step(
            Source::Fs("tmpfs"),
            r.join("dev"),
            Some("tmpfs"),
            MsFlags::MS_NOSUID,
            Some("mode=755,size=65536k"),
        ),
        step(
            Source::Fs("devpts"),
            r.join("dev/pts"),
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            // newinstance: the session's ptys are its own, not the host's.
            Some("newinstance,ptmxmode=0666,mode=620"),
        ),
        step(
            Source::Fs("tmpfs"),
            r.join("dev/shm"),
            Some("tmpfs"),
            nosuid_nodev,
            // Sized like every tmpfs here (its pages are charged to the
            // session's memory cgroup too); Docker's 64 MiB starves Chromium.
            Some("mode=1777,size=256m"),
        ),
        step(
            Source::Fs("tmpfs"),
            r.join("run"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=755,size=64m"),
        ),
        step(
            Source::Host(bin_src.to_owned()),
            join_abs(r, BIN_DIR),
            None,
            MsFlags::MS_BIND,
            None,
        ),
        // A bind mount ignores MS_RDONLY on creation; read-only takes a remount.
        MountStep {
            source: None,
            target: join_abs(r, BIN_DIR),
            fstype: None,
            flags: MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid_nodev,
            data: None,
        },
    ]
}

/// /proc files a session must not read (kernel memory, the host's keys and
/// timers): each is hidden under a bind of the session's /dev/null, as runc
/// does.
pub const MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
];

/// Directories that describe or drive host hardware: each is hidden under a
/// read-only bind of an empty directory ([`MASK_DIR`]). runc mounts an empty
/// tmpfs there instead; here that would cost every restore a `tar` per
/// tmpfs (CRIU archives each tmpfs's contents), about 4 ms each.
pub const MASKED_DIRS: &[&str] = &[
    "/proc/acpi",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// The empty directory bound over [`MASKED_DIRS`], on the session's /run
/// tmpfs (already in every checkpoint). The session may write into it, and
/// then sees its own files there: nothing of the host's.
pub const MASK_DIR: &str = "/run/drums/masked";

/// /proc paths that are host-global knobs (sysctls, IRQ affinity, the SysRq
/// trigger): read-only, so even a session's root cannot write them.
pub const READ_ONLY: &[&str] = &[
    "/proc/asound",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The confinement mounts, applied after [`mount_plan`] unless the session is
/// privileged. A target that does not exist on this kernel is skipped, as
/// runc skips it: there is nothing to hide.
pub fn confine_plan(r: &Path) -> Vec<MountStep> {
    let hidden = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mut plan = Vec::new();
    let null = join_abs(r, "/dev/null");
    for f in MASKED_FILES {
        plan.push(step(
            Source::Root(null.clone()),
            join_abs(r, f),
            None,
            MsFlags::MS_BIND,
            None,
        ));
    }
    let read_only_bind = |plan: &mut Vec<MountStep>, source: PathBuf, target: PathBuf| {
        plan.push(step(
            Source::Root(source),
            target.clone(),
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        ));
        // A bind ignores MS_RDONLY on creation; read-only takes a remount.
        plan.push(MountStep {
            source: None,
            target,
            fstype: None,
            flags: MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | hidden,
            data: None,
        });
    };
    for d in MASKED_DIRS {
        read_only_bind(&mut plan, join_abs(r, MASK_DIR), join_abs(r, d));
    }
    for p in READ_ONLY {
        read_only_bind(&mut plan, join_abs(r, p), join_abs(r, p));
    }
    plan
}

fn join_abs(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// The host directories stage 1 needs, opened by stage 0 in the session's
/// mount namespace while it is still host uid 0. The session's root (host
/// range) may not even traverse drumsd's state directory (0700), where both
/// live; these descriptors reach them without a path walk.
pub struct HostDirs {
    /// The directory holding the root mount point (`cfg.root`'s parent).
    parent: OwnedFd,
    /// `cfg.bin_dir`.
    bin: OwnedFd,
}

impl HostDirs {
    pub fn open(cfg: &InitConfig) -> Result<HostDirs, InitError> {
        let dir = |p: &Path| -> Result<OwnedFd, InitError> {
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(p)
                .map(OwnedFd::from)
                .map_err(io("open", p))
        };
        let parent = cfg.root.parent().unwrap_or(Path::new("/"));
        Ok(HostDirs {
            parent: dir(parent)?,
            bin: dir(&cfg.bin_dir)?,
        })
    }

    /// The root as stage 1 names it once in [`HostDirs::parent`].
    fn root(cfg: &InitConfig) -> &Path {
        cfg.root
            .file_name()
            .map(Path::new)
            .unwrap_or(Path::new("."))
    }
}

/// Make the session's mounts private, then apply the plan, preparing mount
/// points and /dev's contents on the way. The root's parent directory
/// becomes the working directory, for [`pivot`].
pub fn build(sys: &dyn Syscall, cfg: &InitConfig, dirs: &HostDirs) -> Result<(), InitError> {
    // Private, recursively: nothing mounted in the session propagates back to the
    // host, and the host's later mounts do not appear in the session.
    sys.mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;
    cfg.check_fault("init.mount")?;
    nix::unistd::fchdir(dirs.parent.as_raw_fd()).map_err(|source| InitError::Nix {
        op: "chdir to the root's directory",
        source,
    })?;
    let bin_src = fd_path(dirs.bin.as_fd());
    let replaced = mount_all(
        sys,
        dirs.parent.as_fd(),
        HostDirs::root(cfg),
        &bin_src,
        cfg.privileged,
    )?;
    // drumsd's log, through the stderr it gave us: an operator may want to
    // know why a session's layer gained whiteouts it did not write.
    for p in replaced {
        eprintln!(
            "drums-init: session {}: /{} was not a directory (a symlink or a file): replaced by one in the session's writable layer",
            cfg.session_id,
            p.display()
        );
    }
    Ok(())
}

/// Apply [`mount_plan`], then [`confine_plan`] unless `privileged`, with
/// every path walked from `parent`, the root's directory, and `r` the
/// root's name in it. Returns the mount points that were not directories
/// and were replaced, relative to the root.
fn mount_all(
    sys: &dyn Syscall,
    parent: BorrowedFd<'_>,
    r: &Path,
    bin_src: &str,
    privileged: bool,
) -> Result<Vec<PathBuf>, InitError> {
    let mut replaced = Vec::new();
    for s in mount_plan(r, bin_src) {
        // A new mount gets a mount point made a real directory; a remount
        // finds the mount just made there.
        let target = if s.source.is_some() {
            resolve::make_dirs(parent, &s.target, &mut replaced)?
        } else {
            resolve::open(parent, &s.target, OFlag::O_PATH).map_err(io("open", &s.target))?
        };
        s.apply(sys, parent, &target)?;
        if s.fstype.as_deref() == Some("tmpfs") && s.target.ends_with("dev") {
            populate_dev(sys, parent, &s.target)?;
        }
    }
    if !privileged {
        let empty = join_abs(r, MASK_DIR);
        resolve::make_dirs(parent, &empty, &mut replaced)?;
        let fd = resolve::open(parent, &empty, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
            .map_err(io("open", &empty))?;
        nix::sys::stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(0o555))
            .map_err(|e| io("chmod", &empty)(e.into()))?;
        for s in confine_plan(r) {
            // A target must exist (these are all in kernel file systems, as
            // the walk checks: no link is followed), and one this kernel
            // does not have is skipped.
            let target = match resolve::open(parent, &s.target, OFlag::O_PATH) {
                Ok(fd) => fd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io("open", &s.target)(e)),
            };
            s.apply(sys, parent, &target)?;
        }
    }
    // Relative to the root, as the session sees them.
    Ok(replaced
        .into_iter()
        .map(|p| p.strip_prefix(r).map(Path::to_owned).unwrap_or(p))
        .collect())
}

/// Fill the fresh tmpfs at `dev` (below `parent`) with the device binds and
/// the usual links. The tmpfs is stage 1's own, but it is walked like the
/// rest all the same.
fn populate_dev(sys: &dyn Syscall, parent: BorrowedFd<'_>, dev: &Path) -> Result<(), InitError> {
    let dir =
        resolve::open(parent, dev, OFlag::O_PATH | OFlag::O_DIRECTORY).map_err(io("open", dev))?;
    for name in DEVICES {
        let p = dev.join(name);
        let node = resolve::create_file(dir.as_fd(), name, Mode::from_bits_truncate(0o666))
            .map_err(io("create", &p))?;
        let host = Path::new("/dev").join(name);
        sys.mount(
            Some(&host.display().to_string()),
            Path::new(&fd_path(node.as_fd())),
            None,
            MsFlags::MS_BIND,
            None,
        )
        .map_err(|mut e| {
            e.target = p.display().to_string();
            e
        })?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        nix::unistd::symlinkat(to, Some(dir.as_raw_fd()), link)
            .map_err(|e| io("symlink", dev.join(link))(e.into()))?;
    }
    Ok(())
}

/// Hostname, hosts and machine-id live on the session's upper layer, so each
/// session (and, later, each restored sibling) has its own.
///
/// Called after [`pivot`]: the files are the image's, and an image's symlink
/// (`/etc/hosts -> /etc/shadow`, say) must resolve inside the session, never
/// against the host's root that stage 1 saw before the pivot. Nor through a
/// /proc magic link: stage 1's own `/proc/self/fd/2` is drumsd's stderr
/// ([`resolve::open_in_root`]).
pub fn write_identity(cfg: &InitConfig) -> Result<(), InitError> {
    let root: OwnedFd = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open("/")
        .map_err(io("open", "/"))?
        .into();
    // mkdir never follows a link at its last component; an existing entry
    // is checked by the opens below.
    let mkdir = |name: &str| match nix::sys::stat::mkdirat(
        Some(root.as_raw_fd()),
        name,
        Mode::from_bits_truncate(0o755),
    ) {
        Ok(()) | Err(nix::Error::EEXIST) => Ok(()),
        Err(e) => Err(io("create dir", format!("/{name}"))(e.into())),
    };
    // An image need not have one (a scratch image of one static binary).
    mkdir("etc")?;
    let write = |name: &str, content: String| {
        let p = Path::new("/etc").join(name);
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
        let f = resolve::open_in_root(root.as_fd(), &p, flags, Mode::from_bits_truncate(0o644))
            .map_err(io("open", &p))?;
        std::io::Write::write_all(&mut fs::File::from(f), content.as_bytes())
            .map_err(io("write", &p))
    };
    write("hostname", format!("{}\n", cfg.hostname))?;
    write("machine-id", format!("{}\n", cfg.machine_id))?;
    let mut hosts = format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{}\n",
        cfg.hostname
    );
    if let Some(ip) = &cfg.ip {
        hosts.push_str(&format!("{ip}\t{}\n", cfg.hostname));
    }
    write("hosts", hosts)?;
    // A session with egress gets drumsd's name servers; one without keeps
    // the image's file (it reaches no server anyway).
    if !cfg.nameservers.is_empty() {
        let conf: String = cfg
            .nameservers
            .iter()
            .map(|n| format!("nameserver {n}\n"))
            .collect();
        write("resolv.conf", conf)?;
    }
    mkdir("tmp")?;
    let tmp = resolve::open_in_root(
        root.as_fd(),
        Path::new("/tmp"),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
    .map_err(io("open", "/tmp"))?;
    nix::sys::stat::fchmod(tmp.as_raw_fd(), Mode::from_bits_truncate(0o1777))
        .map_err(|e| io("chmod", "/tmp")(e.into()))?;
    Ok(())
}

/// Enter the new root and drop the old one. `pivot_root(".", ".")` stacks the
/// old root on top of the new one, and the lazy unmount then removes it without
/// needing a directory for it inside the session (runc's trick).
pub fn pivot(sys: &dyn Syscall, cfg: &InitConfig) -> Result<(), InitError> {
    cfg.check_fault("init.pivot")?;
    sys.chdir(HostDirs::root(cfg))?;
    sys.pivot_root(Path::new("."), Path::new("."))?;
    sys.umount2(Path::new("."), MntFlags::MNT_DETACH)?;
    sys.chdir(Path::new("/"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drums_sys::{Call, RecordingSyscall};

    fn cfg() -> InitConfig {
        InitConfig {
            session_id: "s".into(),
            hostname: "h".into(),
            machine_id: "0".repeat(32),
            ip: None,
            cgroup_procs: vec![],
            root: "/r".into(),
            user_namespace: true,
            bin_dir: "/bin-host".into(),
            privileged: false,
            nameservers: vec![],
            session_api_port: None,
            fault: None,
        }
    }

    #[test]
    fn the_root_is_bound_first_and_everything_else_lands_inside_it() {
        let plan = mount_plan(Path::new("/r"), "/bin-host");
        assert_eq!(plan[0].source, Some(Source::Root("/r".into())));
        assert_eq!(plan[0].target, Path::new("/r"));
        assert!(plan[0].flags.contains(MsFlags::MS_BIND | MsFlags::MS_REC));
        for s in &plan[1..] {
            assert!(
                s.target.starts_with("/r/"),
                "{:?} outside the root",
                s.target
            );
        }
        // /dev/pts and /dev/shm come after /dev, or the tmpfs would hide them.
        let pos = |t: &str| plan.iter().position(|s| s.target == Path::new(t)).unwrap();
        assert!(pos("/r/dev") < pos("/r/dev/pts"));
        assert!(pos("/r/dev") < pos("/r/dev/shm"));
        assert!(pos("/r/run") < pos("/r/run/drums/bin"));
        let last = plan.last().unwrap();
        assert!(
            last.flags
                .contains(MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY),
            "binaries end read-only"
        );
    }

    #[test]
    fn confinement_hides_and_locks_what_runc_does_inside_the_root() {
        let plan = confine_plan(Path::new("/r"));
        for s in &plan {
            assert!(
                s.target.starts_with("/r/"),
                "{:?} outside the root",
                s.target
            );
        }
        let null = plan
            .iter()
            .find(|s| s.target == Path::new("/r/proc/keys"))
            .unwrap();
        assert_eq!(null.source, Some(Source::Root("/r/dev/null".into())));
        // Each read-only path: a bind of itself, then the remount that makes
        // it read-only (a bind ignores MS_RDONLY on creation).
        for p in READ_ONLY {
            let t = join_abs(Path::new("/r"), p);
            let i = plan
                .iter()
                .position(|s| s.target == t && s.source.is_some())
                .unwrap();
            assert!(plan[i + 1]
                .flags
                .contains(MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY));
            assert_eq!(plan[i + 1].target, t);
        }
        for d in MASKED_DIRS {
            let t = join_abs(Path::new("/r"), d);
            let bind = plan
                .iter()
                .find(|s| s.target == t && s.source.is_some())
                .unwrap();
            assert_eq!(
                bind.source,
                Some(Source::Root("/r/run/drums/masked".into()))
            );
            assert!(bind.fstype.is_none(), "a bind, not a tmpfs CRIU would tar");
        }
        assert!(READ_ONLY.contains(&"/proc/sys"));
        assert!(MASKED_FILES.contains(&"/proc/kcore"));
        // Every tmpfs of the session has a size.
        for s in mount_plan(Path::new("/r"), "/bin-host").iter().chain(&plan) {
            if s.fstype.as_deref() == Some("tmpfs") {
                assert!(s.data.as_deref().unwrap_or("").contains("size="), "{s:?}");
            }
        }
    }

    #[test]
    fn pivot_detaches_the_old_root() {
        let sys = RecordingSyscall::new();
        pivot(&sys, &cfg()).unwrap();
        assert_eq!(
            sys.calls(),
            vec![
                Call::Chdir("r".into()),
                Call::PivotRoot {
                    new_root: ".".into(),
                    put_old: ".".into()
                },
                Call::Umount {
                    target: ".".into(),
                    flags: MntFlags::MNT_DETACH
                },
                Call::Chdir("/".into()),
            ]
        );
    }

    #[test]
    fn injected_fault_stops_before_any_call() {
        let sys = RecordingSyscall::new();
        let mut c = cfg();
        c.fault = Some("init.pivot".into());
        assert_eq!(
            pivot(&sys, &c).unwrap_err().to_string(),
            "injected fault at init.pivot"
        );
        assert!(sys.calls().is_empty());
    }

    /// Records each mount with its target (and a `/proc/self/fd/N` source)
    /// resolved to the path the descriptor names, while it is still open.
    #[derive(Default)]
    struct Resolving(std::cell::RefCell<Vec<(Option<String>, PathBuf)>>);

    impl Syscall for Resolving {
        fn mount(
            &self,
            source: Option<&str>,
            target: &Path,
            _: Option<&str>,
            _: MsFlags,
            _: Option<&str>,
        ) -> drums_sys::Result<()> {
            let at = |p: &Path| fs::read_link(p).unwrap_or_else(|_| p.to_owned());
            let source = source.map(|s| match s.strip_prefix("/proc/self/fd/") {
                Some(_) => at(Path::new(s)).display().to_string(),
                None => s.to_owned(),
            });
            self.0.borrow_mut().push((source, at(target)));
            Ok(())
        }
        fn umount2(&self, _: &Path, _: MntFlags) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn pivot_root(&self, _: &Path, _: &Path) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn chdir(&self, _: &Path) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn sethostname(&self, _: &str) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn unshare(&self, _: drums_sys::CloneFlags) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn mknod(&self, _: &Path, _: drums_sys::SFlag, _: Mode, _: u64) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn setns(
            &self,
            _: std::os::fd::BorrowedFd<'_>,
            _: drums_sys::CloneFlags,
            _: &str,
        ) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn open_tree(&self, _: &Path, _: u32) -> drums_sys::Result<OwnedFd> {
            unreachable!()
        }
        fn mount_setattr(
            &self,
            _: std::os::fd::BorrowedFd<'_>,
            _: drums_sys::MountAttr<'_>,
            _: &str,
        ) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn move_mount(&self, _: std::os::fd::BorrowedFd<'_>, _: &Path) -> drums_sys::Result<()> {
            unreachable!()
        }
        fn user_namespace(&self, _: &[drums_sys::Extent]) -> drums_sys::Result<OwnedFd> {
            unreachable!()
        }
        fn write_id_maps(&self, _: i32, _: &[drums_sys::Extent]) -> drums_sys::Result<()> {
            unreachable!()
        }
    }

    /// A hostile root (no mount is made here, so the tmpfs of /dev and /run
    /// are the root's own directories): every mount lands inside the root
    /// at its planned place, links and files at mount points become
    /// directories, and nothing outside is touched.
    #[test]
    fn links_at_mount_points_are_replaced_and_never_followed() {
        use std::os::unix::fs::symlink;
        for privileged in [false, true] {
            let outside = tempfile::tempdir().unwrap();
            let parent = tempfile::tempdir().unwrap();
            let r = parent.path().join("root");
            fs::create_dir(&r).unwrap();
            symlink(outside.path(), r.join("proc")).unwrap();
            symlink(
                "../../../../../../../../..".to_string() + outside.path().to_str().unwrap(),
                r.join("run"),
            )
            .unwrap();
            symlink(outside.path().join("dev"), r.join("dev")).unwrap();
            fs::write(r.join("sys"), "not a directory").unwrap();
            let dir: OwnedFd = fs::File::open(parent.path()).unwrap().into();
            let sys = Resolving::default();
            let mut replaced = mount_all(
                &sys,
                dir.as_fd(),
                Path::new("root"),
                "/bin-host",
                privileged,
            )
            .unwrap();
            replaced.sort();
            let expect: Vec<PathBuf> = ["dev", "proc", "run", "sys"].map(PathBuf::from).into();
            assert_eq!(replaced, expect);
            assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
            for d in [
                "proc",
                "sys",
                "dev",
                "run",
                "dev/pts",
                "dev/shm",
                "run/drums/bin",
            ] {
                assert!(r.join(d).symlink_metadata().unwrap().is_dir(), "{d}");
            }
            let made = sys.0.borrow().clone();
            for (source, target) in &made {
                assert!(target.starts_with(&r), "{target:?} outside the root");
                if let Some(s) = source.as_deref().filter(|s| s.starts_with('/')) {
                    assert!(
                        Path::new(s).starts_with(&r) || s == "/bin-host" || s.starts_with("/dev/"),
                        "source {s}"
                    );
                }
            }
            let targets: Vec<&PathBuf> = made.iter().map(|(_, t)| t).collect();
            for s in mount_plan(Path::new("root"), "/bin-host") {
                let p = parent.path().join(&s.target);
                assert!(targets.contains(&&p), "{p:?} not mounted: {targets:?}");
            }
            for n in DEVICES {
                assert!(targets.contains(&&r.join("dev").join(n)), "{n}");
            }
            // The confinement's mask directory, made (0555) only when it is used.
            let masked = r.join("run/drums/masked");
            assert_eq!(masked.exists(), !privileged);
        }
    }

    #[test]
    fn build_makes_mounts_private_first() {
        let sys = RecordingSyscall::new();
        let mut c = cfg();
        c.fault = Some("init.mount".into());
        let mut c2 = c.clone();
        c2.root = "/tmp/r".into();
        c2.bin_dir = "/".into();
        let dirs = HostDirs::open(&c2).unwrap();
        assert!(build(&sys, &c, &dirs).is_err());
        assert!(
            matches!(&sys.calls()[0], Call::Mount { flags, .. } if flags.contains(MsFlags::MS_PRIVATE | MsFlags::MS_REC))
        );
        assert_eq!(sys.calls().len(), 1);
    }
}
