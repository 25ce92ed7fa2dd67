//! Per-session cgroups: resource limits, membership, and a reliable kill.
//!
//! A session gets one cgroup, named `<parent>/<name>`, in every hierarchy that
//! matters on the host. On a cgroup v2-only host that is a single directory under
//! /sys/fs/cgroup. On a v1 (or hybrid) host it is one directory in each of the
//! memory, pids, cpu and freezer hierarchies, plus one in the v2 hierarchy at
//! /sys/fs/cgroup/unified when that is mounted, because the inode of the v2
//! directory is the cgroup id that eBPF programs see for the session's processes.
//!
//! Everything here is plain file I/O on cgroupfs, so a [`Cgroup`] is just the
//! list of its directories; [`Cgroup::open`] rebuilds that list from the names,
//! which is how the daemon cleans up after a crash.

pub mod devices;
mod freeze;
mod limits;

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
use nix::unistd::Pid;

pub use devices::Devices;
pub use freeze::{FreezeMethod, Frozen, FREEZE_TIMEOUT};
pub use limits::{
    host_cpus, host_memory_available_bytes, host_memory_bytes, host_pids_max, Limits, LimitsError,
    ParentCaps, MAX_PIDS, MIN_CPUS, MIN_MEMORY_BYTES,
};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Where hybrid hosts mount the v2 hierarchy next to the v1 controllers.
const UNIFIED: &str = "/sys/fs/cgroup/unified";
/// How long [`Cgroup::kill_all`] keeps trying before naming the survivors.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long rmdir keeps retrying EBUSY: a cgroup whose last process has just died
/// can stay busy until the kernel has finished tearing that process down.
const RMDIR_TIMEOUT: Duration = Duration::from_secs(2);

/// A failed cgroup operation: what was being done, on which path, and why.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error(transparent)]
    Limits(#[from] LimitsError),
    #[error("no cgroup hierarchy is mounted under /sys/fs/cgroup")]
    NoHierarchy,
    #[error("the {controller} controller is not available, so the {limit} limit cannot be set")]
    MissingController {
        controller: &'static str,
        limit: &'static str,
    },
    #[error("create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("write {path}: {value}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parse {path}: unexpected content {content:?}")]
    Parse { path: PathBuf, content: String },
    #[error("remove directory {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("kill process {pid}")]
    Kill {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("kill processes in {path}: still alive after {timeout:?}: {survivors:?}")]
    KillTimeout {
        path: PathBuf,
        timeout: Duration,
        survivors: Vec<i32>,
    },
    #[error(
        "kill processes in {path}: the cgroup contains this process ({pid}), refusing to kill it"
    )]
    ContainsSelf { path: PathBuf, pid: i32 },
    #[error("freeze with the {method} freezer: the cgroup has no directory in that hierarchy")]
    NoFreezer { method: &'static str },
    #[error("freeze {path} ({method}): not frozen after {timeout:?} (state: {state})")]
    FreezeTimeout {
        path: PathBuf,
        method: &'static str,
        timeout: Duration,
        state: String,
    },
    #[error("poll {path}")]
    Poll {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Which hierarchy a cgroup directory belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The only hierarchy of a v2-only host, with all controllers.
    V2,
    Memory,
    Pids,
    Cpu,
    Freezer,
    /// The v1 devices controller: the session's device allow-list.
    Devices,
    /// The controller-less v2 hierarchy of a hybrid host: membership and cgroup id.
    Unified,
}

impl Kind {
    fn is_v2(self) -> bool {
        matches!(self, Kind::V2 | Kind::Unified)
    }
}

/// The host's cgroup hierarchies, in the order directories are created.
/// Read once per process: they are mounted at boot, and reading them means
/// parsing the whole mount table, which every session's mounts make long
/// (and every turn begin opens its session's cgroup).
fn hierarchies() -> Vec<(Kind, PathBuf)> {
    static FOUND: std::sync::OnceLock<Vec<(Kind, PathBuf)>> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_hierarchies).clone()
}

fn find_hierarchies() -> Vec<(Kind, PathBuf)> {
    if Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
        return vec![(Kind::V2, PathBuf::from(CGROUP_ROOT))];
    }
    let mounts = v1_mounts();
    let mut found = Vec::new();
    for (kind, controller) in [
        (Kind::Memory, "memory"),
        (Kind::Pids, "pids"),
        (Kind::Cpu, "cpu"),
        (Kind::Freezer, "freezer"),
        (Kind::Devices, "devices"),
    ] {
        if let Some(mount) = pick_mount(&mounts, controller) {
            found.push((kind, mount));
        }
    }
    if statfs(UNIFIED).is_ok_and(|fs| fs.filesystem_type() == CGROUP2_SUPER_MAGIC) {
        found.push((Kind::Unified, PathBuf::from(UNIFIED)));
    }
    found
}

/// (mount point, controllers) of every cgroup v1 mount. The mount point is read
/// rather than assumed because the cpu controller may be mounted as "cpu",
/// "cpu,cpuacct" or "cpuacct,cpu" depending on the distribution.
fn v1_mounts() -> Vec<(PathBuf, Vec<String>)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            if right.next()? != "cgroup" {
                return None;
            }
            let options = right.nth(1)?;
            Some((
                PathBuf::from(mount_point),
                options.split(',').map(str::to_owned).collect(),
            ))
        })
        .collect()
}

/// The mount of `controller`, preferring the canonical place under /sys/fs/cgroup
/// over bind mounts elsewhere.
fn pick_mount(mounts: &[(PathBuf, Vec<String>)], controller: &str) -> Option<PathBuf> {
    let with = |m: &&(PathBuf, Vec<String>)| m.1.iter().any(|o| o == controller);
    mounts
        .iter()
        .filter(with)
        .find(|m| m.0.starts_with(CGROUP_ROOT))
        .or_else(|| mounts.iter().find(with))
        .map(|m| m.0.clone())
}

/// Cgroup names become single path components under every hierarchy; anything
/// else could point a kill or rmdir at the wrong cgroup (".." is the root).
fn check_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name == "." || name == ".." {
        "is a relative path component"
    } else if name.contains('/') {
        "contains a slash"
    } else if name.chars().any(char::is_control) {
        "contains a control character"
    } else if name.len() > 255 {
        "is longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(CgroupError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// One session's cgroup: its directories in every hierarchy.
#[derive(Debug, Clone)]
pub struct Cgroup {
    dirs: Vec<(Kind, PathBuf)>,
}

impl Cgroup {
    /// Create `<parent>/<name>` in every hierarchy and apply `limits`. The parent is
    /// created when missing; the session directory must not exist yet. On failure
    /// the directories created so far are removed again.
    pub fn create(
        parent: &str,
        name: &str,
        limits: &Limits,
        devices: Devices,
    ) -> Result<Cgroup, CgroupError> {
        check_name(parent)?;
        check_name(name)?;
        limits.validate()?;
        let hierarchies = hierarchies();
        if hierarchies.is_empty() {
            return Err(CgroupError::NoHierarchy);
        }
        check_controllers(&hierarchies, limits)?;

        let mut cgroup = Cgroup { dirs: Vec::new() };
        if devices == Devices::AllowList && !hierarchies.iter().any(|(k, _)| *k == Kind::Devices) {
            // A v2-only host needs an eBPF device program instead, which
            // drums does not load yet (docs/security.md).
            tracing::warn!("no v1 devices controller: the device allow-list is not enforced");
        }
        match cgroup.build(&hierarchies, parent, name, limits, devices) {
            Ok(()) => {
                tracing::debug!(parent, name, ?limits, "created cgroup");
                Ok(cgroup)
            }
            Err(err) => {
                // Nothing has joined yet, so plain rmdir suffices; only what this
                // call created is in `dirs`, never a pre-existing directory.
                for (_, dir) in cgroup.dirs.iter().rev() {
                    if let Err(e) = rmdir_retry(dir) {
                        tracing::warn!(error = %e, "cleaning up after failed cgroup creation");
                    }
                }
                Err(err)
            }
        }
    }

    fn build(
        &mut self,
        hierarchies: &[(Kind, PathBuf)],
        parent: &str,
        name: &str,
        limits: &Limits,
        devices: Devices,
    ) -> Result<(), CgroupError> {
        for (kind, mount) in hierarchies {
            let parent_dir = mount.join(parent);
            mkdir(&parent_dir, true)?;
            if *kind == Kind::V2 {
                // Limits only exist in a v2 cgroup whose parent delegates the
                // controllers, all the way down from the root.
                enable_controllers(mount)?;
                enable_controllers(&parent_dir)?;
            }
            let dir = parent_dir.join(name);
            mkdir(&dir, false)?;
            self.dirs.push((*kind, dir.clone()));
            apply_limits(*kind, &dir, limits)?;
            if *kind == Kind::Devices {
                apply_devices(&dir, devices)?;
            }
        }
        Ok(())
    }

    /// A handle for `<parent>/<name>` in every hierarchy, whether or not the
    /// directories exist, for teardown and the sweep after a crash. Invalid names
    /// give a handle to nothing, so such a handle can never kill outside the cgroup.
    pub fn open(parent: &str, name: &str) -> Cgroup {
        if let Err(e) = check_name(parent).and_then(|()| check_name(name)) {
            tracing::warn!(error = %e, "opening an invalid cgroup name");
            return Cgroup { dirs: Vec::new() };
        }
        let dirs = hierarchies()
            .into_iter()
            .map(|(kind, mount)| (kind, mount.join(parent).join(name)))
            .collect();
        Cgroup { dirs }
    }

    /// Whether any of the cgroup's directories exists.
    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|(_, dir)| dir.is_dir())
    }

    /// The cgroup's directories, one per hierarchy.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, dir)| dir.clone()).collect()
    }

    /// Every cgroup.procs a new process must join (one per hierarchy).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, dir)| dir.join("cgroup.procs"))
            .collect()
    }

    /// Move process `pid` into the cgroup in every hierarchy. Children it forks
    /// afterwards are born inside.
    pub fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        for file in self.procs_files() {
            write_file(&file, &pid.to_string())?;
        }
        Ok(())
    }

    /// The processes in the cgroup, as the union over its hierarchies (after a
    /// partial add they can differ). Missing directories count as empty.
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut pids = BTreeSet::new();
        for file in self.procs_files() {
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                // ENODEV: the cgroup was removed between open and read.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => continue,
                Err(source) => return Err(CgroupError::Read { path: file, source }),
            };
            for line in text.lines() {
                let pid = line.trim().parse().map_err(|_| CgroupError::Parse {
                    path: file.clone(),
                    content: line.to_owned(),
                })?;
                pids.insert(pid);
            }
        }
        Ok(pids.into_iter().collect())
    }

    /// The cgroup id eBPF sees (`bpf_get_current_cgroup_id()`): the inode number of
    /// the v2 directory. `None` without a v2 hierarchy or before creation.
    pub fn id(&self) -> Option<u64> {
        std::fs::metadata(self.v2_dir()?).ok().map(|m| m.ino())
    }

    /// The cgroup's directory in the v2 hierarchy, if there is one.
    pub fn v2_dir(&self) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(kind, _)| kind.is_v2())
            .map(|(_, dir)| dir.as_path())
    }

    /// SIGKILL every process in the cgroup until it is empty, for at most
    /// [`KILL_TIMEOUT`]. Processes may fork while this runs: on v2 cgroup.kill kills
    /// the whole cgroup atomically; on v1 the freezer stops the cgroup first, so the
    /// set of processes cannot change between listing and killing.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let deadline = Instant::now() + KILL_TIMEOUT;
        let me = std::process::id() as i32;
        let mut rounds = 0u32;
        loop {
            let alive = self.live_pids()?;
            if alive.is_empty() {
                if rounds > 0 {
                    tracing::debug!(path = %self.describe().display(), rounds, "killed all processes");
                }
                return Ok(());
            }
            if alive.contains(&me) {
                return Err(CgroupError::ContainsSelf {
                    path: self.describe(),
                    pid: me,
                });
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::KillTimeout {
                    path: self.describe(),
                    timeout: KILL_TIMEOUT,
                    survivors: alive,
                });
            }
            self.kill_round()?;
            rounds += 1;
            // Killed processes leave the cgroup once they have finished exiting.
            std::thread::sleep(Duration::from_millis(if rounds < 10 { 5 } else { 25 }));
        }
    }

    fn kill_round(&self) -> Result<(), CgroupError> {
        // cgroup.kill (Linux 5.14+) exists in every non-root v2 cgroup, controllers
        // or not, so it also works through the unified dir of a hybrid host.
        for (_, dir) in self.dirs.iter().filter(|(kind, _)| kind.is_v2()) {
            let file = dir.join("cgroup.kill");
            match write_file(&file, "1") {
                Ok(()) => {}
                Err(CgroupError::Write { source, .. })
                    if source.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let freezer = self
            .dirs
            .iter()
            .find(|(kind, _)| *kind == Kind::Freezer)
            .map(|(_, dir)| dir.join("freezer.state"))
            .filter(|state| state.exists());
        let Some(state) = freezer else {
            return self.signal_all();
        };
        // Frozen processes cannot fork, so the list read below is complete; the
        // SIGKILLs stay pending while frozen and take effect on thaw, which must
        // happen even if signalling failed, or the processes would stay stopped.
        write_file(&state, "FROZEN")?;
        wait_frozen(&state);
        let killed = self.signal_all();
        let thawed = write_file(&state, "THAWED");
        killed.and(thawed)
    }

    fn signal_all(&self) -> Result<(), CgroupError> {
        for pid in self.live_pids()? {
            match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                // ESRCH: it exited meanwhile.
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(errno) => {
                    return Err(CgroupError::Kill {
                        pid,
                        source: errno.into(),
                    })
                }
            }
        }
        Ok(())
    }

    /// The cgroup's processes minus the zombies.
    ///
    /// A zombie has already exited and freed everything but its pid; it cannot be
    /// killed again, only reaped by its parent. That parent may be outside the
    /// cgroup, typically the daemon itself, which spawned the session's first
    /// process and is blocked right here until kill_all returns: waiting for
    /// zombies to vanish would then spin until the timeout. The kernel also lets a
    /// cgroup whose only members are zombies be removed, so counting them as gone
    /// is both safe and what teardown needs.
    fn live_pids(&self) -> Result<Vec<i32>, CgroupError> {
        Ok(self
            .pids()?
            .into_iter()
            .filter(|&pid| !is_dead(pid))
            .collect())
    }

    /// kill_all, then remove every directory. Missing directories are fine, so this
    /// can run again after a partial failure or on a cgroup that never existed.
    pub fn remove(&self) -> Result<(), CgroupError> {
        if !self.exists() {
            return Ok(());
        }
        self.kill_all()?;
        let mut first_error = None;
        for (_, dir) in self.dirs.iter().rev() {
            if let Err(e) = rmdir_retry(dir) {
                tracing::warn!(error = %e, "removing cgroup");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            None => {
                tracing::debug!(path = %self.describe().display(), "removed cgroup");
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    /// Memory in use by the cgroup's processes, in bytes, if a memory controller is
    /// available.
    pub fn memory_usage(&self) -> Option<u64> {
        let file = self.dirs.iter().find_map(|(kind, dir)| match kind {
            Kind::Memory => Some(dir.join("memory.usage_in_bytes")),
            Kind::V2 => Some(dir.join("memory.current")),
            _ => None,
        })?;
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// How many processes the OOM killer killed in the cgroup since it was
    /// made (`oom_kill` of v1 `memory.oom_control`, or of v2
    /// `memory.events`), if a memory controller is available.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = self.dirs.iter().find_map(|(kind, dir)| match kind {
            Kind::Memory => Some(dir.join("memory.oom_control")),
            Kind::V2 => Some(dir.join("memory.events")),
            _ => None,
        })?;
        std::fs::read_to_string(file)
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))?
            .trim()
            .parse()
            .ok()
    }

    /// A directory to name in errors.
    fn describe(&self) -> PathBuf {
        self.dirs
            .first()
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    }
}

/// Create `parent` in every hierarchy (where missing) and cap all its sessions
/// together: memory and pids limits on the parent bound the sum of its
/// children's usage, whatever each child's own limit says (v1 memory is
/// hierarchical on every kernel drums supports; v2 always is). Returns the
/// directories, for the ledger. A cap that cannot be written is an error: a
/// daemon that promises a cap must not run without it.
pub fn ensure_parent(parent: &str, caps: &ParentCaps) -> Result<Vec<PathBuf>, CgroupError> {
    check_name(parent)?;
    let hierarchies = hierarchies();
    if hierarchies.is_empty() {
        return Err(CgroupError::NoHierarchy);
    }
    let as_limits = Limits {
        memory_bytes: caps.memory_bytes,
        pids_max: caps.pids_max,
        cpus: None,
    };
    check_controllers(&hierarchies, &as_limits)?;
    let mut dirs = Vec::new();
    for (kind, mount) in &hierarchies {
        let dir = mount.join(parent);
        mkdir(&dir, true)?;
        if *kind == Kind::V2 {
            enable_controllers(mount)?;
            enable_controllers(&dir)?;
        }
        apply_limits(*kind, &dir, &as_limits)?;
        dirs.push(dir);
    }
    tracing::info!(parent, ?caps, "capped all sessions together");
    Ok(dirs)
}

/// Remove the parent directory in every hierarchy, where it has no children left
/// (daemon shutdown). A parent that still has session cgroups is left alone.
pub fn remove_parent(parent: &str) -> Result<(), CgroupError> {
    check_name(parent)?;
    for (_, mount) in hierarchies() {
        let dir = mount.join(parent);
        if !dir.is_dir() {
            continue;
        }
        if !child_dirs(&dir).is_empty() {
            tracing::debug!(path = %dir.display(), "parent cgroup still has children, keeping it");
            continue;
        }
        rmdir_retry(&dir)?;
    }
    Ok(())
}

/// Names of the session cgroups under `parent` in any hierarchy, sorted.
pub fn list_children(parent: &str) -> Vec<String> {
    if check_name(parent).is_err() {
        return Vec::new();
    }
    let mut names = BTreeSet::new();
    for (_, mount) in hierarchies() {
        names.extend(child_dirs(&mount.join(parent)));
    }
    names.into_iter().collect()
}

fn child_dirs(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Fail early, before creating anything, if a requested limit has no controller.
fn check_controllers(hierarchies: &[(Kind, PathBuf)], limits: &Limits) -> Result<(), CgroupError> {
    let v2_controllers =
        hierarchies
            .iter()
            .find(|(kind, _)| *kind == Kind::V2)
            .map(|(_, mount)| {
                std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default()
            });
    let available = |kind: Kind, controller: &str| match &v2_controllers {
        Some(list) => list.split_whitespace().any(|c| c == controller),
        None => hierarchies.iter().any(|(k, _)| *k == kind),
    };
    for (requested, kind, controller, limit) in [
        (
            limits.memory_bytes.is_some(),
            Kind::Memory,
            "memory",
            "memory",
        ),
        (limits.pids_max.is_some(), Kind::Pids, "pids", "pids"),
        (limits.cpus.is_some(), Kind::Cpu, "cpu", "cpu"),
    ] {
        if requested && !available(kind, controller) {
            return Err(CgroupError::MissingController { controller, limit });
        }
    }
    Ok(())
}

/// Delegate memory, pids and cpu from `dir` to its children, as far as `dir` has
/// them itself. Each controller is written on its own, because one that cannot be
/// enabled (e.g. cpu while a realtime thread runs) would fail the whole write.
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let read = |file: &str| -> Result<String, CgroupError> {
        let path = dir.join(file);
        std::fs::read_to_string(&path).map_err(|source| CgroupError::Read { path, source })
    };
    let available = read("cgroup.controllers")?;
    let enabled = read("cgroup.subtree_control")?;
    for controller in ["memory", "pids", "cpu"] {
        let has = |list: &str| list.split_whitespace().any(|c| c == controller);
        if has(&available) && !has(&enabled) {
            if let Err(e) = write_file(
                &dir.join("cgroup.subtree_control"),
                &format!("+{controller}"),
            ) {
                // Only an error if a limit needs it; writing that limit will say so.
                tracing::warn!(error = %e, "enabling cgroup controller");
            }
        }
    }
    Ok(())
}

fn apply_limits(kind: Kind, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    match kind {
        Kind::V2 => {
            if let Some(bytes) = limits.memory_bytes {
                write_file(&dir.join("memory.max"), &bytes.to_string())?;
            }
            if let Some(pids) = limits.pids_max {
                write_file(&dir.join("pids.max"), &pids.to_string())?;
            }
            if let Some(cpus) = limits.cpus {
                let quota = Limits::cpu_quota_us(cpus);
                let value = format!("{quota} {}", limits::CPU_PERIOD_US);
                write_file(&dir.join("cpu.max"), &value)?;
            }
        }
        Kind::Memory => {
            if let Some(bytes) = limits.memory_bytes {
                write_file(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
            }
        }
        Kind::Pids => {
            if let Some(pids) = limits.pids_max {
                write_file(&dir.join("pids.max"), &pids.to_string())?;
            }
        }
        Kind::Cpu => {
            if let Some(cpus) = limits.cpus {
                // The period first: the quota is validated against it.
                let period = limits::CPU_PERIOD_US.to_string();
                write_file(&dir.join("cpu.cfs_period_us"), &period)?;
                let quota = Limits::cpu_quota_us(cpus).to_string();
                write_file(&dir.join("cpu.cfs_quota_us"), &quota)?;
            }
        }
        Kind::Freezer | Kind::Devices | Kind::Unified => {}
    }
    Ok(())
}

fn apply_devices(dir: &Path, policy: Devices) -> Result<(), CgroupError> {
    for (file, rule) in devices::v1_writes(policy) {
        write_file(&dir.join(file), rule)?;
    }
    Ok(())
}

/// Whether `pid` has exited: no longer in /proc, or a zombie (state Z or X). A
/// zombie thread-group leader whose other threads still run is alive, though:
/// its leader shows Z but the process is not done, so it still needs killing.
fn is_dead(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The command name in parentheses may contain spaces and parentheses; the
    // state is the first field after the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    match state {
        Some("Z" | "X") => {
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
            threads <= 1
        }
        _ => false,
    }
}

/// Wait (briefly) for a v1 freezer to report FROZEN. A task stuck in
/// uninterruptible sleep can keep it FREEZING; killing and thawing then is still
/// the best move, so this gives up quietly.
fn wait_frozen(state: &Path) {
    let deadline = Instant::now() + Duration::from_millis(500);
    if let Err(e) = freeze::wait_v1_frozen(state, deadline, true) {
        tracing::debug!(path = %state.display(), error = ?e, "cgroup did not finish freezing");
    }
}

/// Write `value` to a cgroup control file in a single write, as cgroupfs expects,
/// and without O_CREAT: a missing file means a missing controller, not a file to
/// create.
fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| CgroupError::Write {
            path: path.into(),
            value: value.to_owned(),
            source,
        })
}

fn mkdir(path: &Path, exist_ok: bool) -> Result<(), CgroupError> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if exist_ok && e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::CreateDir {
            path: path.into(),
            source,
        }),
    }
}

/// rmdir that treats a missing directory as done and retries EBUSY for a moment.
fn rmdir_retry(dir: &Path) -> Result<(), CgroupError> {
    let deadline = Instant::now() + RMDIR_TIMEOUT;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: dir.into(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_single_components() {
        for bad in ["", ".", "..", "a/b", "a\nb", &"x".repeat(256)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("drums").unwrap();
        check_name("session-1.x").unwrap();
        let err = check_name("..").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cgroup name \"..\": is a relative path component"
        );
    }

    #[test]
    fn invalid_names_open_nothing() {
        let cg = Cgroup::open("..", "x");
        assert!(cg.paths().is_empty());
        assert!(!cg.exists());
        assert_eq!(cg.pids().unwrap(), Vec::<i32>::new());
        cg.kill_all().unwrap();
        cg.remove().unwrap();
    }

    #[test]
    fn picks_cpu_from_a_combined_mount() {
        let mounts = vec![
            (
                PathBuf::from("/elsewhere/cpu"),
                vec!["rw".into(), "cpu".into()],
            ),
            (
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                vec!["rw".into(), "cpu".into(), "cpuacct".into()],
            ),
        ];
        assert_eq!(
            pick_mount(&mounts, "cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            pick_mount(&mounts, "cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(pick_mount(&mounts, "memory"), None);
    }

    #[test]
    fn our_own_process_is_alive_and_missing_ones_are_dead() {
        assert!(!is_dead(std::process::id() as i32));
        assert!(is_dead(i32::MAX));
    }
}
