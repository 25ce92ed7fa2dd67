//! drums-criu: checkpoint and restore of a session's process tree through
//! CRIU's RPC (`criu swrk`).
//!
//! - [`request`] holds every CRIU option drums sets, each with its reason.
//! - `swrk` is the transport: one `criu swrk` per request over a socketpair,
//!   notifications answered through a callback.
//! - [`CriuError`] carries CRIU's errno, the log path and its last error lines.
//!
//! The message types are rust-criu's generated rpc.proto types (identical to
//! CRIU 4.2.1's); its client is not used.
//!
//! Restored trees are children of the calling process (see
//! [`RestoreReport::pid`]): the caller must reap them.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use rust_criu::rust_criu_protobuf::rpc::{Criu_req_type, Criu_resp};

mod error;
pub mod fsnotify;
pub mod request;
mod swrk;
pub mod userns_image;

pub use error::{log_tail, CriuError, Op, Unsupported};

/// Whether the dump in `images` kept established TCP connections (dumped
/// with `tcp_established`: one `tcp-stream-*.img` per connection), so that
/// its restore must keep them too rather than close them.
pub fn kept_connections(images: &std::path::Path) -> bool {
    std::fs::read_dir(images).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().as_encoded_bytes().starts_with(b"tcp-stream-"))
    })
}
pub use swrk::{NotifyError, NotifyFn};

/// Names of the notifications CRIU sends, in the order they arrive.
pub mod script {
    pub const PRE_DUMP: &str = "pre-dump";
    /// CRIU asks which external files to dump; drums has none to add.
    pub const QUERY_EXT_FILES: &str = "query-ext-files";
    /// The tree is frozen (and stays frozen) until this is acknowledged: the
    /// place to snapshot the session's files consistently with the image.
    pub const POST_DUMP: &str = "post-dump";
    pub const PRE_RESTORE: &str = "pre-restore";
    /// The restored root exists (its pid is given) but runs nothing yet:
    /// the place to move its veth ends and configure the host side.
    pub const SETUP_NAMESPACES: &str = "setup-namespaces";
    pub const POST_SETUP_NAMESPACES: &str = "post-setup-namespaces";
    pub const POST_RESTORE: &str = "post-restore";
    pub const PRE_RESUME: &str = "pre-resume";
    pub const POST_RESUME: &str = "post-resume";
}

/// How CRIU keeps the tree's network quiet while it is frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkLock {
    /// No lock: for trees with no TCP connections worth protecting.
    Skip,
    /// nftables lock: ~12 ms more frozen time, for trees whose TCP
    /// connections must not see resets or lost packets.
    Nftables,
}

#[derive(Debug, Clone)]
pub struct DumpOpts {
    /// Root of the tree (a session's PID 1, as a host pid).
    pub pid: i32,
    /// Must exist; the image and dump.log go there.
    pub images_dir: PathBuf,
    pub leave_running: bool,
    /// v1 freezer cgroup dir of the tree: a faster, race-free freeze than ptrace.
    pub freeze_cgroup: Option<PathBuf>,
    /// (mountpoint inside the tree, key): bind mounts from the host.
    pub external_mounts: Vec<(String, String)>,
    pub network_lock: NetworkLock,
    pub tcp_established: bool,
}

#[derive(Debug, Clone)]
pub struct RestoreOpts {
    /// Used read-only (concurrent restores share it); opened as a dir fd.
    pub images_dir: PathBuf,
    /// Must exist; per-restore home of restore.log and stats-restore.
    pub work_dir: PathBuf,
    /// The new root (a merged overlay dir). Mandatory: CRIU 4.2.1 crashes
    /// restoring a mount namespace without one.
    pub root: PathBuf,
    /// (key, host path), matching the dump's keys.
    pub external_mounts: Vec<(String, PathBuf)>,
    /// (name inside, host-side name).
    pub veth_pairs: Vec<(String, String)>,
    /// cgroup.procs files swrk joins before restoring, so the restored tree
    /// lands in them (CRIU's own cgroup handling is off).
    pub join_cgroups: Vec<PathBuf>,
    /// Must match the dump's.
    pub network_lock: NetworkLock,
    /// Must be true if the dump allowed established TCP connections.
    pub tcp_established: bool,
    /// Restore the network namespace empty (CRIU's `empty_ns`): no links,
    /// addresses, routes or firewall rules from the image. The caller builds
    /// it in the `setup-namespaces` notification, before any socket is
    /// restored. `veth_pairs` is then ignored.
    pub empty_net: bool,
}

#[derive(Debug, Clone)]
pub struct DumpReport {
    /// Whole request, including swrk start-up (~50 ms of it).
    pub elapsed: Duration,
    /// From the pre-dump to the post-dump acknowledgement: an upper bound of
    /// how long the tree was frozen (CRIU freezes after pre-dump and thaws
    /// after post-dump). `None` if either notification was missing.
    pub frozen_at_most: Option<Duration>,
    pub log: PathBuf,
}

#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Host pid of the restored root. CRIU creates it as a child of the
    /// calling process (rst_sibling), so the caller must `waitpid` it.
    pub pid: i32,
    pub elapsed: Duration,
    pub log: PathBuf,
}

/// A handle on one CRIU binary. Each call runs its own `criu swrk`, so one
/// `Criu` can serve concurrent dumps and restores.
#[derive(Debug, Clone)]
pub struct Criu {
    bin: PathBuf,
    /// A tmpfs directory mounted as /run for swrk; see [`Criu::with_run_dir`].
    run_dir: Option<PathBuf>,
}

/// The shim's file name in the run dir, which swrk sees as /run.
pub(crate) const PRLIMIT_SHIM: &str = "drums-criu-prlimit.so";
/// Built by build.rs from shim/prlimit.c.
const PRLIMIT_SHIM_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/drums-criu-prlimit.so"));

/// Where a source-built CRIU lands (`make install`), and often not in root's PATH.
const FALLBACK_DIR: &str = "/usr/local/sbin";

impl Criu {
    /// `criu` from PATH, else /usr/local/sbin/criu.
    pub fn new() -> Result<Criu, CriuError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain(std::iter::once(PathBuf::from(FALLBACK_DIR)))
            .map(|d| d.join("criu"))
            .find(|p| is_executable(p))
            .map(Criu::with_binary)
            .ok_or(CriuError::NotFound)
    }

    pub fn with_binary(bin: impl Into<PathBuf>) -> Criu {
        Criu {
            bin: bin.into(),
            run_dir: None,
        }
    }

    /// Run swrk with `dir` (a tmpfs) as its /run, in a private mount
    /// namespace, so CRIU can keep its kernel-probe cache between runs on a
    /// host whose /run is not a tmpfs.
    ///
    /// The prlimit shim (`shim/prlimit.c`) is written there too and preloaded
    /// into swrk: without CAP_SYS_RESOURCE, CRIU cannot otherwise read the
    /// limits of a process running as another user, and refuses to dump it.
    /// `dir` must be writable by root only, since swrk loads code from it.
    pub fn with_run_dir(mut self, dir: impl Into<PathBuf>) -> Result<Criu, CriuError> {
        let dir = dir.into();
        let shim = dir.join(PRLIMIT_SHIM);
        std::fs::write(&shim, PRLIMIT_SHIM_SO).map_err(|source| CriuError::Spawn {
            op: Op::Version,
            bin: shim.clone(),
            source,
        })?;
        self.run_dir = Some(dir);
        Ok(self)
    }

    pub fn binary(&self) -> &Path {
        &self.bin
    }

    /// CRIU's version as `criu --version` prints it, e.g. "4.2.1".
    pub fn version(&self) -> Result<String, CriuError> {
        let op = Op::Version;
        let ex = swrk::exchange(
            &self.bin,
            self.run_dir.as_deref(),
            op,
            &request::version_request(),
            &[],
            &mut |_, _| Ok(()),
            &|| None,
        )?;
        let resp = final_response(op, ex.resp, &ex.status, &ex.stderr, Path::new(""))?;
        check_success(op, &resp, Path::new(""), &ex.stderr)?;
        let v = resp
            .version
            .as_ref()
            .ok_or_else(|| CriuError::UnexpectedResponse {
                op,
                got: "a response without version".into(),
                want: "VERSION".into(),
            })?;
        // Mirrors criu --version: the sublevel is printed only when non-zero.
        let mut s = format!("{}.{}", v.major_number(), v.minor_number());
        if v.sublevel() != 0 {
            s.push_str(&format!(".{}", v.sublevel()));
        }
        Ok(s)
    }

    /// Dump the tree rooted at `o.pid` into `o.images_dir`.
    ///
    /// `on_notify(script, pid)` is called for every notification (see
    /// [`script`]); the tree is frozen during post-dump until it returns. An
    /// `Err` makes CRIU abort the dump and thaw the tree; the images written
    /// so far must then be discarded.
    pub fn dump(
        &self,
        o: &DumpOpts,
        on_notify: &mut NotifyFn<'_>,
    ) -> Result<DumpReport, CriuError> {
        let op = Op::Dump;
        let start = Instant::now();
        // Kept open until the exchange ends: CRIU opens it as /proc/<us>/fd/<n>.
        let images = open_dir(op, "open images dir", &o.images_dir)?;
        let log = o.images_dir.join(request::DUMP_LOG);
        let req = request::dump_request(o, images.as_raw_fd());
        // CRIU waits for each task it seized to stop. A root that is killed
        // meanwhile never does: it waits in its exit for the tasks of its
        // pid namespace, which CRIU holds as their tracer, and both wait
        // forever (seen when a session's init was SIGKILLed mid-dump). The
        // tree is going away, so there is nothing to dump: CRIU is killed,
        // which lets the tasks go.
        //
        // Not once a dump that does not leave the tree running is done:
        // CRIU itself then kills the tree, before its final answer, and a
        // look in between would take that exit for an abandoned dump (seen
        // under load in desktop_failures_leave_nothing).
        let root = o.pid;
        let dumped = std::cell::Cell::new(false);
        let mut notify = |script: &str, pid: i32| {
            if script == script::POST_DUMP {
                dumped.set(true);
            }
            on_notify(script, pid)
        };
        let ex = swrk::exchange(
            &self.bin,
            self.run_dir.as_deref(),
            op,
            &req,
            &[],
            &mut notify,
            &|| {
                if dumped.get() && !o.leave_running {
                    return None;
                }
                exiting(root).then(|| format!("the dumped tree's root (pid {root}) began to exit"))
            },
        )?;
        drop(images);
        if let Some(reason) = ex.abandoned {
            return Err(CriuError::Abandoned {
                op,
                reason,
                tail: tail_or_none(&log),
                log,
            });
        }
        let resp = final_response(op, ex.resp, &ex.status, &ex.stderr, &log)?;
        if let Some((script, reason)) = ex.notify_failure {
            return Err(notify_error(op, script, reason, &log));
        }
        check_success(op, &resp, &log, &ex.stderr)?;
        check_type(op, &resp, Criu_req_type::DUMP)?;
        let at = |name: &str| {
            ex.notifications
                .iter()
                .find(|(s, _)| s == name)
                .map(|(_, t)| *t)
        };
        let frozen_at_most = match (at(script::PRE_DUMP), at(script::POST_DUMP)) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
            _ => None,
        };
        Ok(DumpReport {
            elapsed: start.elapsed(),
            frozen_at_most,
            log,
        })
    }

    /// Restore the image in `o.images_dir` under `o.root`, as a new tree
    /// whose root becomes a child of the calling process.
    ///
    /// `on_notify(script, pid)` is called for every notification; pid is the
    /// restored root's host pid for setup-namespaces and post-restore. An
    /// `Err` makes CRIU abort and kill the partly restored tree.
    pub fn restore(
        &self,
        o: &RestoreOpts,
        on_notify: &mut NotifyFn<'_>,
    ) -> Result<RestoreReport, CriuError> {
        let op = Op::Restore;
        let start = Instant::now();
        let images = open_dir(op, "open images dir", &o.images_dir)?;
        let work = open_dir(op, "open work dir", &o.work_dir)?;
        if !o.root.is_dir() {
            return Err(CriuError::Path {
                op,
                what: "root",
                path: o.root.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        let log = o.work_dir.join(request::RESTORE_LOG);
        let req = request::restore_request(o, images.as_raw_fd(), work.as_raw_fd());
        let ex = swrk::exchange(
            &self.bin,
            self.run_dir.as_deref(),
            op,
            &req,
            &o.join_cgroups,
            on_notify,
            &|| None,
        )?;
        drop((images, work));

        let result = (|| {
            let resp = final_response(op, ex.resp, &ex.status, &ex.stderr, &log)?;
            if let Some((script, reason)) = ex.notify_failure {
                return Err(notify_error(op, script, reason, &log));
            }
            check_success(op, &resp, &log, &ex.stderr)?;
            check_type(op, &resp, Criu_req_type::RESTORE)?;
            let pid = resp.restore.as_ref().map(|r| r.pid()).unwrap_or(0);
            if pid <= 0 {
                return Err(CriuError::UnexpectedResponse {
                    op,
                    got: "a restore response without pid".into(),
                    want: "RESTORE with pid".into(),
                });
            }
            Ok(pid)
        })();
        match result {
            Ok(pid) => Ok(RestoreReport {
                pid,
                elapsed: start.elapsed(),
                log,
            }),
            Err(e) => {
                // The root may already exist as our child (CLONE_PARENT) when a
                // later stage fails; CRIU cannot reap it, so we do.
                if let Some(pid) = ex.notified_pid {
                    reap_failed_root(pid);
                }
                reap_strays(&o.join_cgroups);
                Err(e)
            }
        }
    }
}

/// Whether process `pid` is gone or on its way out: a zombie, or past the
/// start of its exit (the kernel's PF_EXITING in /proc/PID/stat's flags).
fn exiting(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Some(fields) = stat_fields(pid) else {
        return true;
    };
    // state, ppid, pgrp, session, tty_nr, tpgid, flags.
    let state = fields.first().map_or("", String::as_str);
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    matches!(state, "Z" | "X") || flags & PF_EXITING != 0
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn open_dir(op: Op, what: &'static str, path: &Path) -> Result<File, CriuError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(path)
        .map_err(|source| CriuError::Path {
            op,
            what,
            path: path.to_path_buf(),
            source,
        })
}

fn final_response(
    op: Op,
    resp: Option<Criu_resp>,
    status: &std::process::ExitStatus,
    stderr: &str,
    log: &Path,
) -> Result<Criu_resp, CriuError> {
    resp.ok_or_else(|| CriuError::NoResponse {
        op,
        status: status.to_string(),
        log: log.to_path_buf(),
        tail: tail_or_none(log),
        stderr: if stderr.is_empty() {
            "(empty)".into()
        } else {
            stderr.to_string()
        },
    })
}

fn check_success(op: Op, resp: &Criu_resp, log: &Path, stderr: &str) -> Result<(), CriuError> {
    if resp.success() {
        return Ok(());
    }
    let mut tail = tail_or_none(log);
    // Failures before CRIU opened its log (e.g. an unusable images dir) are
    // only on stderr.
    if !stderr.is_empty() {
        tail.push_str("; stderr: ");
        tail.push_str(stderr);
    }
    Err(CriuError::Failed {
        op,
        errno: resp.cr_errno(),
        // CRIU sends its *first* error; a known-harmless one says nothing.
        criu_msg: resp.cr_errmsg.clone().filter(|m| !error::is_harmless(m)),
        log: log.to_path_buf(),
        tail,
    })
}

fn check_type(op: Op, resp: &Criu_resp, want: Criu_req_type) -> Result<(), CriuError> {
    if resp.type_() == want {
        return Ok(());
    }
    Err(CriuError::UnexpectedResponse {
        op,
        got: format!("{:?}", resp.type_()),
        want: format!("{want:?}"),
    })
}

fn notify_error(op: Op, script: String, reason: NotifyError, log: &Path) -> CriuError {
    CriuError::Notify {
        op,
        script,
        reason,
        log: log.to_path_buf(),
        tail: tail_or_none(log),
    }
}

fn tail_or_none(log: &Path) -> String {
    if log.as_os_str().is_empty() {
        "(no log)".into()
    } else {
        log_tail(log)
    }
}

/// Kill and reap a restored root left by a failed restore, but only if it is
/// still our unreaped child: then its pid cannot have been reused.
fn reap_failed_root(pid: i32) {
    if parent_of(pid) != Some(std::process::id() as i32) {
        return;
    }
    let pid = Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGKILL);
    let _ = waitpid(pid, None);
}

/// After a failed restore, CRIU can leave helpers it forked as our children
/// (rst_sibling makes them siblings of swrk), e.g. its cgroup daemon: kill and
/// reap every child of ours that lives in the restore's cgroups. Only there:
/// a concurrent restore's processes are in other cgroups and are left alone.
fn reap_strays(join_cgroups: &[PathBuf]) {
    // "…/<parent>/<name>/cgroup.procs" -> "/<parent>/<name>", as /proc/PID/cgroup names it.
    let needles: Vec<String> = join_cgroups
        .iter()
        .filter_map(|p| {
            let dir = p.parent()?;
            let name = dir.file_name()?.to_str()?;
            let parent = dir.parent()?.file_name()?.to_str()?;
            Some(format!("/{parent}/{name}"))
        })
        .collect();
    if needles.is_empty() {
        return;
    }
    let me = std::process::id() as i32;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let mut found = false;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if parent_of(pid) != Some(me) {
                continue;
            }
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if !needles.iter().any(|n| {
                cg.lines()
                    .any(|l| l.ends_with(n.as_str()) || l.contains(&format!("{n} ")))
            }) {
                continue;
            }
            found = true;
            let pid = Pid::from_raw(pid);
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
        if !found || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The fields of /proc/PID/stat after the command name (which may hold
/// spaces and parentheses, so it ends at the last ')'): state, ppid, ...
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_ascii_whitespace().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_exiting_once_killed_and_while_a_zombie() {
        // A command name with a space and a parenthesis, as /proc shows it:
        // the kernel takes it from the name of the file run.
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a (b) c");
        std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap();
        let mut child = std::process::Command::new(&odd).arg("60").spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(50));
        assert!(!exiting(pid), "a running sleep");
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        // Not reaped yet: a zombie.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !exiting(pid) {
            assert!(
                Instant::now() < deadline,
                "a killed sleep never read as exiting"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(exiting(pid), "a reaped pid is gone");
    }
}
