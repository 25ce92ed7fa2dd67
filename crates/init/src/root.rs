//! Building the session's root file system. The mounts are a plan (data) applied
//! through [`drums_sys::Syscall`], so their order is unit-tested without root.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use drums_sys::{MntFlags, MsFlags, Syscall};

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::{io, InitConfig, InitError, BIN_DIR};

/// One mount of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountStep {
    pub source: Option<String>,
    pub target: PathBuf,
    pub fstype: Option<String>,
    pub flags: MsFlags,
    pub data: Option<String>,
}

impl MountStep {
    fn apply(&self, sys: &dyn Syscall) -> Result<(), drums_sys::SysError> {
        sys.mount(
            self.source.as_deref(),
            &self.target,
            self.fstype.as_deref(),
            self.flags,
            self.data.as_deref(),
        )
    }
}

fn step(
    source: &str,
    target: PathBuf,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> MountStep {
    MountStep {
        source: Some(source.to_owned()),
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
/// as stage 1 reaches them (see [`HostDirs`]).
pub fn mount_plan(r: &Path, bin_src: &str) -> Vec<MountStep> {
    let r = &r.to_path_buf();
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    vec![
        // The root drumsd mounted, bound onto itself: a mount of the session's
        // own. pivot_root refuses a mount that the copy into a user
        // namespace's mount namespace locked (EINVAL).
        step(
            &r.display().to_string(),
            r.clone(),
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        ),
        step(
            "proc",
            r.join("proc"),
            Some("proc"),
            nosuid_nodev | MsFlags::MS_NOEXEC,
            None,
        ),
        // Read-only: a session may look at its devices and its own net namespace's
        // links (Chromium and Python probe these), but never change the host's knobs.
        step(
            "sysfs",
            r.join("sys"),
            Some("sysfs"),
            nosuid_nodev | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
            None,
        ),
        step(
            "tmpfs",
            r.join("dev"),
            Some("tmpfs"),
            MsFlags::MS_NOSUID,
            Some("mode=755,size=65536k"),
        ),
        step(
            "devpts",
            r.join("dev/pts"),
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            // newinstance: the session's ptys are its own, not the host's.
            Some("newinstance,ptmxmode=0666,mode=620"),
        ),
        step(
            "tmpfs",
            r.join("dev/shm"),
            Some("tmpfs"),
            nosuid_nodev,
            // Sized like every tmpfs here (its pages are charged to the
            // session's memory cgroup too); Docker's 64 MiB starves Chromium.
            Some("mode=1777,size=256m"),
        ),
        step(
            "tmpfs",
            r.join("run"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=755,size=64m"),
        ),
        step(bin_src, join_abs(r, BIN_DIR), None, MsFlags::MS_BIND, None),
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
    let null = join_abs(r, "/dev/null").display().to_string();
    for f in MASKED_FILES {
        plan.push(step(&null, join_abs(r, f), None, MsFlags::MS_BIND, None));
    }
    let read_only_bind = |plan: &mut Vec<MountStep>, source: PathBuf, target: PathBuf| {
        plan.push(step(
            &source.display().to_string(),
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
/// points and /dev's contents on the way. Paths are relative to the root's
/// parent directory, which becomes the working directory.
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
    let r = HostDirs::root(cfg);
    let bin_src = format!("/proc/self/fd/{}", dirs.bin.as_raw_fd());
    for s in mount_plan(r, &bin_src) {
        if s.source.is_some() {
            fs::create_dir_all(&s.target).map_err(io("create mount point", &s.target))?;
        }
        s.apply(sys)?;
        if s.fstype.as_deref() == Some("tmpfs") && s.target.ends_with("dev") {
            populate_dev(sys, &s.target)?;
        }
    }
    if !cfg.privileged {
        let empty = join_abs(r, MASK_DIR);
        fs::create_dir_all(&empty).map_err(io("create", &empty))?;
        fs::set_permissions(&empty, fs::Permissions::from_mode(0o555))
            .map_err(io("chmod", &empty))?;
        for s in confine_plan(r) {
            // symlink_metadata: a target must exist, and is never followed
            // out of the tree (these are all kernel file systems anyway).
            if s.target.symlink_metadata().is_err() {
                continue;
            }
            s.apply(sys)?;
        }
    }
    Ok(())
}

fn populate_dev(sys: &dyn Syscall, dev: &Path) -> Result<(), InitError> {
    for name in DEVICES {
        let p = dev.join(name);
        fs::File::create(&p).map_err(io("create", &p))?;
        let host = Path::new("/dev").join(name);
        sys.mount(
            Some(&host.display().to_string()),
            &p,
            None,
            MsFlags::MS_BIND,
            None,
        )?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(to, dev.join(link)).map_err(io("symlink", dev.join(link)))?;
    }
    for d in ["pts", "shm"] {
        fs::create_dir_all(dev.join(d)).map_err(io("create dir", dev.join(d)))?;
    }
    Ok(())
}

/// Hostname, hosts and machine-id live on the session's upper layer, so each
/// session (and, later, each restored sibling) has its own.
///
/// Called after [`pivot`]: the files are the image's, and an image's symlink
/// (`/etc/hosts -> /etc/shadow`, say) must resolve inside the session, never
/// against the host's root that stage 1 saw before the pivot.
pub fn write_identity(cfg: &InitConfig) -> Result<(), InitError> {
    let root = Path::new("/");
    let etc = root.join("etc");
    // An image need not have one (a scratch image of one static binary).
    fs::create_dir_all(&etc).map_err(io("create dir", &etc))?;
    let write = |name: &str, content: String| {
        let p = etc.join(name);
        fs::write(&p, content).map_err(io("write", &p))
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
    let tmp = root.join("tmp");
    fs::create_dir_all(&tmp).map_err(io("create dir", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).map_err(io("chmod", &tmp))?;
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
        assert_eq!(plan[0].source.as_deref(), Some("/r"));
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
        assert_eq!(null.source.as_deref(), Some("/r/dev/null"));
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
            assert_eq!(bind.source.as_deref(), Some("/r/run/drums/masked"));
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
