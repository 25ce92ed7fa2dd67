//! `POST /v1/hygiene` and `GET /v1/hygiene`: what a restored sibling changes
//! inside itself so that it is not a clone of its siblings.
//!
//! drumsd re-addresses a restored sibling from the host (IP and MAC, over
//! netlink), then calls this endpoint once. The agent then, in order:
//!
//! 1. sets the hostname (it is in the session's UTS namespace) and rewrites
//!    `/etc/hostname`, the hostname lines of `/etc/hosts` and `/etc/machine-id`;
//! 2. writes the restore generation to `/run/drums/generation`;
//! 3. runs the **reseed protocol**: every process registered in
//!    `/run/drums/reseed/` gets its signal, and the agent waits (briefly) for
//!    the acknowledgements.
//!
//! The protocol is documented for program authors in `docs/hygiene.md`. Its
//! one subtle point is how a registration is tied to its process. A pid alone
//! is not enough: pids are recycled, and signalling a stranger with SIGUSR2
//! (default action: terminate) kills it. The start time in `/proc/PID/stat`
//! does not work either, because CRIU cannot restore it: every restored
//! process has the restore's start time, so after a restore (the only time
//! this endpoint runs) every registration would look recycled. What CRIU does
//! restore is open files. So a registrant keeps its registration file open,
//! and the agent signals a pid only if that pid has the very file (same
//! device and inode) among its open fds. A recycled pid never has it open; a
//! program that `exec`s loses it with `O_CLOEXEC`, so the new program (which
//! has not installed a handler) is not signalled either.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
pub use drums_api::guest::{HygieneReport, HygieneRequest, HygieneStatus};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::ApiError;

/// Where the session's configuration lives.
pub const DEFAULT_ETC_DIR: &str = "/etc";
/// The agent's directory on the session's private `/run` tmpfs.
pub const DEFAULT_RUN_DIR: &str = "/run/drums";
/// Under the run directory: one registration file per process.
pub const RESEED_DIR: &str = "reseed";
/// Under the run directory: the restore generation, as decimal text.
pub const GENERATION_FILE: &str = "generation";
/// How long to wait for acknowledgements when the request does not say.
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 200;
/// The longest wait a request may ask for. The wait holds one of the agent's
/// few blocking threads, and drumsd is waiting on the answer to call the
/// sibling ready; seconds already mean something is wrong with a registrant.
pub const MAX_ACK_TIMEOUT_MS: u64 = 10_000;
/// The signal a registration with no number asks for.
pub const DEFAULT_SIGNAL: Signal = Signal::SIGUSR2;

/// Registration and ack files are a signal number or a generation; anything
/// longer is not ours and is not read further.
const SMALL_FILE: u64 = 64;

/// Where the hygiene files are. The defaults are the production paths; tests
/// point both into a temporary directory (`--etc-dir`, `--run-dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HygieneConfig {
    pub etc_dir: PathBuf,
    pub run_dir: PathBuf,
}

impl Default for HygieneConfig {
    fn default() -> Self {
        Self {
            etc_dir: DEFAULT_ETC_DIR.into(),
            run_dir: DEFAULT_RUN_DIR.into(),
        }
    }
}

impl HygieneConfig {
    pub fn reseed_dir(&self) -> PathBuf {
        self.run_dir.join(RESEED_DIR)
    }

    pub fn generation_file(&self) -> PathBuf {
        self.run_dir.join(GENERATION_FILE)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HygieneError {
    #[error("invalid hostname {0:?}: expected 1-63 letters, digits or '-', not starting or ending with '-'")]
    InvalidHostname(String),
    #[error("invalid machine_id {0:?}: expected 32 lowercase hex digits, not all zero")]
    InvalidMachineId(String),
    #[error("invalid ack_timeout_ms {0}: at most {MAX_ACK_TIMEOUT_MS}")]
    InvalidAckTimeout(u64),
    #[error("failed to set hostname to {name:?}")]
    SetHostname {
        name: String,
        #[source]
        source: Errno,
    },
    #[error("failed to {op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid generation file {}: {content:?}", .path.display())]
    InvalidGeneration { path: PathBuf, content: String },
    #[error("hygiene task failed")]
    Task(#[source] tokio::task::JoinError),
}

impl From<HygieneError> for ApiError {
    fn from(err: HygieneError) -> Self {
        let (status, kind) = match &err {
            HygieneError::InvalidHostname(_)
            | HygieneError::InvalidMachineId(_)
            | HygieneError::InvalidAckTimeout(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            HygieneError::SetHostname { .. }
            | HygieneError::Io { .. }
            | HygieneError::InvalidGeneration { .. }
            | HygieneError::Task(_) => (StatusCode::INTERNAL_SERVER_ERROR, "hygiene_failed"),
        };
        ApiError::from_error(status, kind, &err)
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> HygieneError {
    let path = path.to_owned();
    move |source| HygieneError::Io { op, path, source }
}

/// Routes `/v1/hygiene`, with `config` as their state.
pub fn router(config: HygieneConfig) -> Router {
    Router::new()
        .route("/v1/hygiene", get(get_handler).post(post_handler))
        .with_state(std::sync::Arc::new(config))
}

/// Creates the run directory and the world-writable reseed directory.
///
/// The agent does this at start-up, not the Python hook: a hook that created
/// the directory would make every Python process on a non-drums machine
/// (where the hook is merely installed) litter `/run`. Sticky, like `/tmp`,
/// because processes of every user register there and must not be able to
/// delete each other's registrations.
pub fn init(config: &HygieneConfig) -> Result<(), HygieneError> {
    let dir = config.reseed_dir();
    fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777))
        .map_err(io_err("set permissions of", &dir))?;
    Ok(())
}

/// An RFC 1123 label: what `sethostname` and every resolver accept.
pub fn validate_hostname(name: &str) -> Result<(), HygieneError> {
    let ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(HygieneError::InvalidHostname(name.to_owned()))
    }
}

/// systemd's format: 32 lowercase hex digits; all zeros means "unset" to it,
/// which would defeat the point of giving each sibling its own id.
pub fn validate_machine_id(id: &str) -> Result<(), HygieneError> {
    let ok = id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && id.bytes().any(|b| b != b'0');
    if ok {
        Ok(())
    } else {
        Err(HygieneError::InvalidMachineId(id.to_owned()))
    }
}

/// `GET /v1/hygiene`.
async fn get_handler(
    State(config): State<std::sync::Arc<HygieneConfig>>,
) -> Result<Json<HygieneStatus>, ApiError> {
    let status = tokio::task::spawn_blocking(move || status(&config))
        .await
        .map_err(HygieneError::Task)??;
    Ok(Json(status))
}

/// `POST /v1/hygiene`.
async fn post_handler(
    State(config): State<std::sync::Arc<HygieneConfig>>,
    body: Result<Json<HygieneRequest>, JsonRejection>,
) -> Result<Json<HygieneReport>, ApiError> {
    let Json(req) = body.map_err(crate::server::json_rejection)?;
    let report = tokio::task::spawn_blocking(move || apply(&config, &req))
        .await
        .map_err(HygieneError::Task)??;
    Ok(Json(report))
}

/// The current generation and the registered pids.
pub fn status(config: &HygieneConfig) -> Result<HygieneStatus, HygieneError> {
    let generation = read_generation(&config.generation_file())?;
    let (registered, _acks) = scan(&config.reseed_dir())?;
    Ok(HygieneStatus {
        generation,
        registered: registered.into_iter().collect(),
        last: LAST_REPORT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    })
}

/// Reads the generation file; a session that was never restored has none.
pub fn read_generation(path: &Path) -> Result<u64, HygieneError> {
    match fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|_| HygieneError::InvalidGeneration {
                path: path.to_owned(),
                content: text,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Two concurrent hygiene calls would interleave hostname writes and each
/// wait for the other's acks; drumsd sends one per restore, so a queue is
/// simply the right behaviour.
static APPLY_LOCK: Mutex<()> = Mutex::new(());

/// The last report, for `GET /v1/hygiene` (and so `drums audit`).
static LAST_REPORT: Mutex<Option<HygieneReport>> = Mutex::new(None);

/// Applies a hygiene request: identity, generation, reseed. Blocking (file
/// I/O and the wait for acks), so the handler runs it on the blocking pool.
///
/// Calling it again with the same request is safe, so a caller that got an
/// error (a partial application) can simply retry.
pub fn apply(config: &HygieneConfig, req: &HygieneRequest) -> Result<HygieneReport, HygieneError> {
    let start = Instant::now();
    validate_hostname(&req.hostname)?;
    validate_machine_id(&req.machine_id)?;
    let ack_timeout = req.ack_timeout_ms.unwrap_or(DEFAULT_ACK_TIMEOUT_MS);
    if ack_timeout > MAX_ACK_TIMEOUT_MS {
        return Err(HygieneError::InvalidAckTimeout(ack_timeout));
    }
    // A panic elsewhere while holding the lock leaves nothing half-done that
    // the next call would not redo, so a poisoned lock is still usable.
    let _guard = APPLY_LOCK.lock().unwrap_or_else(|p| p.into_inner());

    set_identity(config, req)?;
    write_atomic(
        &config.generation_file(),
        format!("{}\n", req.generation).as_bytes(),
        Some(0o644),
    )?;
    let outcome = reseed(
        &config.reseed_dir(),
        req.generation,
        Duration::from_millis(ack_timeout),
    )?;

    let report = HygieneReport {
        hostname: req.hostname.clone(),
        generation: req.generation,
        signalled: outcome.signalled,
        acked: outcome.acked,
        stale_removed: outcome.stale_removed,
        unverified: outcome.unverified,
        elapsed_us: start.elapsed().as_micros().try_into().unwrap_or(u64::MAX),
    };
    tracing::info!(
        hostname = %report.hostname,
        generation = report.generation,
        signalled = report.signalled.len(),
        acked = report.acked.len(),
        stale_removed = report.stale_removed.len(),
        unverified = report.unverified.len(),
        elapsed_us = report.elapsed_us,
        "hygiene applied"
    );
    *LAST_REPORT.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
    Ok(report)
}

/// Hostname (kernel and files), `/etc/hosts` and `/etc/machine-id`.
fn set_identity(config: &HygieneConfig, req: &HygieneRequest) -> Result<(), HygieneError> {
    let etc = &config.etc_dir;
    let hostname_file = etc.join("hostname");
    let hosts_file = etc.join("hosts");

    // Names the old lines of /etc/hosts may carry: the checkpoint's hostname
    // as the kernel and as /etc/hostname know it (they agree unless someone
    // changed one by hand).
    let mut old_names: Vec<String> = Vec::new();
    if let Ok(name) = nix::unistd::gethostname() {
        old_names.push(name.to_string_lossy().into_owned());
    }
    match fs::read_to_string(&hostname_file) {
        Ok(text) => old_names.extend(text.lines().next().map(|l| l.trim().to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("read", &hostname_file)(e)),
    }

    // drumsd sets a confined session's hostname from outside (the session
    // holds no CAP_SYS_ADMIN); only a session where it was not set yet needs
    // the call, and may fail it.
    let current = nix::unistd::gethostname().ok();
    if current.as_deref().and_then(|h| h.to_str()) != Some(req.hostname.as_str()) {
        nix::unistd::sethostname(&req.hostname).map_err(|source| HygieneError::SetHostname {
            name: req.hostname.clone(),
            source,
        })?;
    }
    write_atomic(
        &hostname_file,
        format!("{}\n", req.hostname).as_bytes(),
        None,
    )?;

    let hosts = match fs::read_to_string(&hosts_file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err("read", &hosts_file)(e)),
    };
    let old: Vec<&str> = old_names.iter().map(String::as_str).collect();
    write_atomic(
        &hosts_file,
        rewrite_hosts(&hosts, &old, &req.hostname, req.ip).as_bytes(),
        None,
    )?;

    write_atomic(
        &etc.join("machine-id"),
        format!("{}\n", req.machine_id).as_bytes(),
        None,
    )?;
    Ok(())
}

/// The address Debian maps the hostname to when it has no fixed address.
const DEBIAN_HOSTNAME_ADDR: &str = "127.0.1.1";

/// Rewrites the hostname lines of an `/etc/hosts` text.
///
/// Everything that is not about the hostname is kept as it is (localhost,
/// the IPv6 names, whatever the user added): the `127.0.1.1` line goes, the
/// old and new hostnames are removed from other lines (a line left with no
/// names goes too: that was the old `<ip> <hostname>` line), and
/// `127.0.1.1 <hostname>` plus `<ip> <hostname>` are appended. `localhost` is
/// never removed, whatever the hostnames are.
pub fn rewrite_hosts(text: &str, old_names: &[&str], hostname: &str, ip: Option<IpAddr>) -> String {
    let drop_name = |name: &str| {
        !name.eq_ignore_ascii_case("localhost")
            && (name.eq_ignore_ascii_case(hostname)
                || old_names
                    .iter()
                    .any(|old| !old.is_empty() && name.eq_ignore_ascii_case(old)))
    };
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        let (entry, comment) = match line.find('#') {
            Some(i) => (&line[..i], Some(&line[i..])),
            None => (line, None),
        };
        let mut fields = entry.split_whitespace();
        let Some(addr) = fields.next() else {
            // Blank or comment-only.
            out.push_str(line);
            out.push('\n');
            continue;
        };
        if addr == DEBIAN_HOSTNAME_ADDR {
            continue;
        }
        let names: Vec<&str> = fields.collect();
        let kept: Vec<&str> = names.iter().copied().filter(|n| !drop_name(n)).collect();
        if kept.len() == names.len() {
            out.push_str(line);
        } else if kept.is_empty() {
            continue;
        } else {
            out.push_str(addr);
            out.push('\t');
            out.push_str(&kept.join(" "));
            if let Some(comment) = comment {
                out.push(' ');
                out.push_str(comment);
            }
        }
        out.push('\n');
    }
    out.push_str(&format!("{DEBIAN_HOSTNAME_ADDR}\t{hostname}\n"));
    if let Some(ip) = ip {
        out.push_str(&format!("{ip}\t{hostname}\n"));
    }
    out
}

/// Removes the temporary file unless the write was committed.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "failed to remove temporary file: {e}");
            }
        }
    }
}

/// Replaces `path` with `contents` through a temporary file in the same
/// directory and a rename, so a reader (a process resolving the hostname,
/// one reading the generation in its signal handler) sees the old content
/// or the new, never a torn mix.
///
/// `mode`: set exactly if given; otherwise an existing file keeps its mode
/// (and its owner, always), and a new one gets 0644. No fsync: these files
/// matter only to the running session, which does not survive a host crash
/// (sessions are swept when drumsd restarts), while an fsync on the
/// session's btrfs upper layer would cost milliseconds of every restore.
fn write_atomic(path: &Path, contents: &[u8], mode: Option<u32>) -> Result<(), HygieneError> {
    use std::io::Write;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let parent = path.parent().unwrap_or(Path::new("/"));
    let existing = fs::metadata(path).ok().filter(|m| m.is_file());
    let mode = mode.unwrap_or_else(|| existing.as_ref().map_or(0o644, |m| m.mode() & 0o7777));
    let tmp = parent.join(format!(
        ".drums-hygiene.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    let mut guard = TempFile(Some(tmp.clone()));
    file.write_all(contents).map_err(io_err("write", &tmp))?;
    if let Some(m) = &existing {
        // chown before chmod: chown clears setuid/setgid bits.
        std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))
            .map_err(io_err("chown", &tmp))?;
    }
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", &tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
    guard.0 = None;
    Ok(())
}

/// What the reseed step did.
#[derive(Debug, Default)]
struct ReseedOutcome {
    signalled: Vec<u32>,
    acked: Vec<u32>,
    stale_removed: Vec<u32>,
    unverified: Vec<u32>,
}

/// Lists the reseed directory: registered pids, and pids with an ack file.
/// Other names (a registrant's `.<pid>.tmp` before its rename) are not ours.
fn scan(dir: &Path) -> Result<(BTreeSet<u32>, BTreeSet<u32>), HygieneError> {
    let mut registered = BTreeSet::new();
    let mut acks = BTreeSet::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((registered, acks)),
        Err(e) => return Err(io_err("list", dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let (stem, set) = match name.strip_suffix(".ack") {
            Some(stem) => (stem, &mut acks),
            None => (name, &mut registered),
        };
        if let Some(pid) = parse_pid(stem) {
            set.insert(pid);
        }
    }
    Ok((registered, acks))
}

/// A positive decimal pid, in its canonical spelling (so `007` or `+7` do not
/// alias pid 7's file).
fn parse_pid(s: &str) -> Option<u32> {
    let pid: u32 = s.parse().ok()?;
    (pid > 0 && pid <= i32::MAX as u32 && pid.to_string() == s).then_some(pid)
}

/// The signal a registration asks for: its first word, a number; empty means
/// [`DEFAULT_SIGNAL`]. Later words are ignored (reserved). SIGKILL and
/// SIGSTOP cannot be handled, so asking for them is a mistake, not a
/// registration.
pub fn parse_registration(content: &[u8]) -> Option<Signal> {
    let text = std::str::from_utf8(content).ok()?;
    let Some(word) = text.split_whitespace().next() else {
        return Some(DEFAULT_SIGNAL);
    };
    let number: i32 = word.parse().ok()?;
    match Signal::try_from(number).ok()? {
        Signal::SIGKILL | Signal::SIGSTOP => None,
        signal => Some(signal),
    }
}

/// What to do with a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Signal(Signal),
    /// Remove it, for the reason given (logged).
    Stale(&'static str),
    /// Neither signal nor remove it: the agent may not see whether the
    /// process holds its file (reported, so a clone is never silent).
    Unverified,
    /// Leave it alone: it disappeared while we looked (the registrant
    /// deregistered), or checking it failed for a reason that says nothing
    /// about it (the agent out of fds); removing a live registration would
    /// silently end the process's reseeds.
    Skip,
}

/// Opens a small file in the world-writable reseed directory defensively:
/// never following a symlink out of it, never blocking on a FIFO planted
/// there, and reading at most [`SMALL_FILE`] bytes.
fn open_small(path: &Path) -> io::Result<Option<(fs::Metadata, Vec<u8>)>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    let mut content = Vec::new();
    file.take(SMALL_FILE).read_to_end(&mut content)?;
    Ok(Some((meta, content)))
}

/// Decides whether `pid`'s registration in `dir` is live.
///
/// Live means: the process exists and is not a zombie, the file's owner is
/// root or one of the process's uids (so nobody registers someone else's
/// process), and the process holds the file open (see the module docs for
/// why this, and not the start time, is the identity check).
fn check_registration(dir: &Path, pid: u32) -> Verdict {
    let path = dir.join(pid.to_string());
    let (meta, content) = match open_small(&path) {
        Ok(Some(found)) => found,
        Ok(None) => return Verdict::Stale("not a regular file"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Verdict::Skip,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Verdict::Stale("a symlink"),
        Err(e) => {
            tracing::warn!(path = %path.display(), "failed to read registration: {e}");
            return Verdict::Skip;
        }
    };
    let Some(signal) = parse_registration(&content) else {
        return Verdict::Stale("invalid signal number");
    };
    let proc = match ProcStatus::read(pid) {
        Ok(Some(proc)) => proc,
        Ok(None) => return Verdict::Stale("no such process"),
        Err(e) => {
            tracing::warn!(
                pid,
                "failed to read the status of a registered process: {e}"
            );
            return Verdict::Skip;
        }
    };
    if proc.zombie {
        return Verdict::Stale("process exited");
    }
    if meta.uid() != 0 && !proc.uids.contains(&meta.uid()) {
        return Verdict::Stale("file owner is not the process's user");
    }
    match holds_open_as(pid, meta.dev(), meta.ino(), &proc) {
        Ok(true) => Verdict::Signal(signal),
        Ok(false) => Verdict::Stale("process does not hold its registration open"),
        // Refused is not "does not hold": reading that as stale deleted
        // every registration of another user's process in a confined
        // session (the agent has no CAP_SYS_PTRACE there), and those
        // processes silently stayed clones.
        Err(e) if is_refused(&e) => {
            tracing::warn!(pid, "may not list the fds of a registered process: {e}");
            Verdict::Unverified
        }
        Err(e) => {
            tracing::warn!(pid, "failed to list the fds of a registered process: {e}");
            Verdict::Skip
        }
    }
}

fn is_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

/// What the checks need from `/proc/PID/status`.
struct ProcStatus {
    zombie: bool,
    /// Real, effective and saved uid.
    uids: [u32; 3],
    /// Real, effective and saved gid.
    gids: [u32; 3],
}

impl ProcStatus {
    /// `Ok(None)`: there is no such process.
    fn read(pid: u32) -> io::Result<Option<Self>> {
        match fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(text) => Self::parse(&text)
                .map(Some)
                .ok_or_else(|| io::Error::other("unexpected format of /proc/PID/status")),
            // ESRCH: the process exited while we read.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let ids = |s: &str| -> Option<[u32; 3]> {
            let ids: Vec<u32> = s
                .split_whitespace()
                .filter_map(|s| s.parse().ok())
                .collect();
            Some([*ids.first()?, *ids.get(1)?, *ids.get(2)?])
        };
        let (mut zombie, mut uids, mut gids) = (None, None, None);
        for line in text.lines() {
            if let Some(state) = line.strip_prefix("State:") {
                zombie = Some(matches!(state.trim_start().chars().next(), Some('Z' | 'X')));
            } else if let Some(s) = line.strip_prefix("Uid:") {
                uids = Some(ids(s)?);
            } else if let Some(s) = line.strip_prefix("Gid:") {
                gids = Some(ids(s)?);
            }
        }
        Some(Self {
            zombie: zombie?,
            uids: uids?,
            gids: gids?,
        })
    }
}

/// [`holds_open`], looked at as the registrant itself where its ids allow.
///
/// Following another process's fd links takes ptrace read access to it
/// (PTRACE_MODE_READ_FSCREDS). In a confined session the agent holds no
/// CAP_SYS_PTRACE, so it passes that check only for processes whose real,
/// effective and saved uids and gids all equal its fs ids. It therefore
/// looks from a thread of its own whose fsuid and fsgid are the
/// registrant's: fs ids are per thread, so nothing else in the agent changes
/// and nothing needs restoring, and the thread can then see exactly what the
/// registrant's own user could. A process whose ids are mixed (a setuid
/// program) can only be looked at with the agent's own ids.
fn holds_open_as(pid: u32, dev: u64, ino: u64, proc: &ProcStatus) -> io::Result<bool> {
    let uniform = |ids: &[u32; 3]| ids.iter().all(|&i| i == ids[0]);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let agent_is_root = unsafe { libc::geteuid() } == 0;
    if !agent_is_root || !uniform(&proc.uids) || !uniform(&proc.gids) {
        return holds_open(pid, dev, ino);
    }
    let (uid, gid) = (proc.uids[0], proc.gids[0]);
    std::thread::scope(|s| {
        s.spawn(|| {
            set_fs_ids(uid, gid)?;
            holds_open(pid, dev, ino)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the fd scan's thread panicked")))
    })
}

/// Sets this thread's fsgid and fsuid, and checks they took: the syscalls
/// report no error, only the previous id.
fn set_fs_ids(uid: u32, gid: u32) -> io::Result<()> {
    // The gid first: a non-zero fsuid drops the capabilities that setting
    // another fsgid may need.
    // SAFETY: setfsgid/setfsuid take plain integers and change only this
    // thread's credentials; called again with an invalid id (-1) they change
    // nothing and return the current one.
    let (g, u) = unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        (libc::setfsgid(u32::MAX), libc::setfsuid(u32::MAX))
    };
    if g as u32 == gid && u as u32 == uid {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// True if one of `pid`'s open fds is the file `(dev, ino)`. Compared by
/// identity, not path: a registrant in another mount namespace would see
/// another path, and a file replaced by rename has a new inode. An fd this
/// thread may not follow fails the whole check (it could be the one).
fn holds_open(pid: u32, dev: u64, ino: u64) -> io::Result<bool> {
    let entries = match fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(entries) => entries,
        // Exited since we read its status.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        // An fd closed while we list is simply not the one.
        let Ok(entry) = entry else { continue };
        // metadata() of /proc/PID/fd/N follows the magic link to the file.
        match fs::metadata(entry.path()) {
            Ok(m) if m.dev() == dev && m.ino() == ino => return Ok(true),
            Err(e) if is_refused(&e) => return Err(e),
            // Another file, or an fd closed while we list.
            _ => {}
        }
    }
    Ok(false)
}

fn remove_quietly(path: &Path) -> bool {
    match fs::remove_file(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => true,
        Err(e) => {
            tracing::warn!(path = %path.display(), "failed to remove: {e}");
            false
        }
    }
}

/// Reads `<pid>.ack`: the generation the process says it handled (its first
/// word; the Python hook adds its next draw after it, for `drums audit`).
fn read_ack(dir: &Path, pid: u32) -> Option<u64> {
    let (_, content) = open_small(&dir.join(format!("{pid}.ack"))).ok()??;
    std::str::from_utf8(&content)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Signals every live registrant, removes stale registrations, and waits up
/// to `timeout` for acks of `generation`.
fn reseed(dir: &Path, generation: u64, timeout: Duration) -> Result<ReseedOutcome, HygieneError> {
    let start = Instant::now();
    let mut outcome = ReseedOutcome::default();
    let (registered, acks) = scan(dir)?;

    // Acks left over from an earlier generation, or by registrants that are
    // gone: an old ack could carry the number this call uses (a checkpoint
    // restored twice with the same generation) and count as an ack without
    // any reseed, so every one goes before anything is signalled.
    for pid in &acks {
        remove_quietly(&dir.join(format!("{pid}.ack")));
    }

    // inotify over polling: acks arrive as renames or closes in one
    // directory, which is exactly what a directory watch reports, so the
    // wait ends the moment the last ack lands instead of up to a poll period
    // later, and costs nothing while it waits. The watch is set up before the
    // first signal so no ack can slip in unseen. If inotify is unavailable
    // (no instances left), polling every millisecond is the fallback.
    let watch = if registered.is_empty() {
        None
    } else {
        match Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).and_then(|ino| {
            ino.add_watch(
                dir,
                AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO,
            )?;
            Ok(ino)
        }) {
            Ok(ino) => Some(ino),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "inotify unavailable, polling for acks: {e}");
                None
            }
        }
    };

    for &pid in &registered {
        let path = dir.join(pid.to_string());
        let signal = match check_registration(dir, pid) {
            Verdict::Signal(signal) => signal,
            Verdict::Skip => continue,
            Verdict::Unverified => {
                outcome.unverified.push(pid);
                continue;
            }
            Verdict::Stale(why) => {
                tracing::info!(pid, "removing stale reseed registration: {why}");
                if remove_quietly(&path) {
                    outcome.stale_removed.push(pid);
                }
                continue;
            }
        };
        match nix::sys::signal::kill(Pid::from_raw(pid as i32), signal) {
            Ok(()) => outcome.signalled.push(pid),
            Err(Errno::ESRCH) => {
                // Exited between the check and the signal.
                if remove_quietly(&path) {
                    outcome.stale_removed.push(pid);
                }
            }
            Err(e) => tracing::warn!(pid, %signal, "failed to signal registered process: {e}"),
        }
    }

    let deadline = start + timeout;
    let mut pending: Vec<u32> = outcome.signalled.clone();
    loop {
        pending.retain(|&pid| {
            let acked = read_ack(dir, pid) == Some(generation);
            if acked {
                outcome.acked.push(pid);
            }
            !acked
        });
        let now = Instant::now();
        if pending.is_empty() || now >= deadline {
            break;
        }
        let left = deadline - now;
        match &watch {
            Some(ino) => {
                // Rounded up: a 0 ms poll in the last sub-millisecond would spin.
                let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
                let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                match nix::poll::poll(
                    &mut fds,
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                ) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => {
                        tracing::warn!("failed to wait for acks: {e}");
                        std::thread::sleep(left.min(Duration::from_millis(1)));
                    }
                }
                // The events only say "look again"; the ack files are re-read
                // above. Drain them so the next poll waits for new ones.
                while ino.read_events().is_ok_and(|events| !events.is_empty()) {}
            }
            None => std::thread::sleep(left.min(Duration::from_millis(1))),
        }
    }
    outcome.acked.sort_unstable();
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_are_rfc1123_labels() {
        for good in ["a", "sib-1", "A1", &"x".repeat(63), "0"] {
            validate_hostname(good).unwrap();
        }
        for bad in ["", "-a", "a-", "a.b", "a_b", "a b", &"x".repeat(64), "é"] {
            assert!(
                matches!(
                    validate_hostname(bad),
                    Err(HygieneError::InvalidHostname(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn machine_ids_are_32_lowercase_hex() {
        validate_machine_id("0123456789abcdef0123456789abcdef").unwrap();
        for bad in [
            "",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "0123456789abcdef0123456789abcdeg",
            "00000000000000000000000000000000",
        ] {
            assert!(validate_machine_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn registrations_parse_to_a_signal() {
        assert_eq!(parse_registration(b""), Some(Signal::SIGUSR2));
        assert_eq!(parse_registration(b"\n"), Some(Signal::SIGUSR2));
        assert_eq!(parse_registration(b"12\n"), Some(Signal::SIGUSR2));
        assert_eq!(parse_registration(b"10"), Some(Signal::SIGUSR1));
        // Further words are reserved and ignored.
        assert_eq!(parse_registration(b"12 4711"), Some(Signal::SIGUSR2));
        for bad in [&b"9"[..], b"19", b"0", b"65", b"-12", b"usr2", b"\xff"] {
            assert_eq!(parse_registration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn proc_status_gives_state_and_uids() {
        let me = ProcStatus::read(std::process::id()).unwrap().unwrap();
        assert!(!me.zombie);
        let uid = nix::unistd::getuid().as_raw();
        assert_eq!(me.uids[0], uid);
        let zombie =
            ProcStatus::parse("Name:\tx\nState:\tZ (zombie)\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\n")
                .unwrap();
        assert!(zombie.zombie);
        assert_eq!(zombie.uids, [1, 2, 3]);
        assert_eq!(zombie.gids, [5, 6, 7]);
        assert!(ProcStatus::parse("State:\tR (running)\n").is_none());
        assert!(ProcStatus::read(i32::MAX as u32).unwrap().is_none());
    }

    #[test]
    fn pids_are_canonical_decimal() {
        assert_eq!(parse_pid("42"), Some(42));
        for bad in ["0", "007", "+7", "-1", "4294967295", "x", "", ".42.tmp"] {
            assert_eq!(parse_pid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hosts_keeps_localhost_and_replaces_hostname_lines() {
        // What drums-init writes for a session.
        let init = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                    127.0.1.1\told\n10.213.0.5\told\n";
        let ip: IpAddr = "10.213.0.7".parse().unwrap();
        assert_eq!(
            rewrite_hosts(init, &["old"], "sib-1", Some(ip)),
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             127.0.1.1\tsib-1\n10.213.0.7\tsib-1\n"
        );
        // Without an ip only the 127.0.1.1 line names the host.
        assert_eq!(
            rewrite_hosts(init, &["old"], "sib-1", None),
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             127.0.1.1\tsib-1\n"
        );
        // Idempotent: applying the result again changes nothing.
        let once = rewrite_hosts(init, &["old"], "sib-1", Some(ip));
        assert_eq!(rewrite_hosts(&once, &["sib-1"], "sib-1", Some(ip)), once);
    }

    #[test]
    fn hosts_keeps_user_lines_and_comments() {
        let text = "# managed by hand\n127.0.0.1 localhost old\n\n192.0.2.1 db old # the db\n\
                    198.51.100.1 web\n127.0.1.1 old alias\n";
        assert_eq!(
            rewrite_hosts(text, &["OLD"], "new", None),
            "# managed by hand\n127.0.0.1\tlocalhost\n\n192.0.2.1\tdb # the db\n\
             198.51.100.1 web\n127.0.1.1\tnew\n"
        );
        // "localhost" is never dropped, even as a hostname.
        assert!(
            rewrite_hosts("127.0.0.1 localhost\n", &["localhost"], "h", None)
                .starts_with("127.0.0.1 localhost\n")
        );
    }

    #[test]
    fn write_atomic_keeps_mode_and_leaves_no_temp_files() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("machine-id");
        fs::write(&path, "old\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
        write_atomic(&path, b"new\n", None).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new\n");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o444);
        write_atomic(&tmp.path().join("fresh"), b"x", None).unwrap();
        assert_eq!(
            fs::metadata(tmp.path().join("fresh")).unwrap().mode() & 0o7777,
            0o644
        );
        let names: BTreeSet<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["fresh", "machine-id"].map(String::from).into());
        // A missing directory fails and names the operation.
        let err = write_atomic(&tmp.path().join("no/such"), b"x", None).unwrap_err();
        assert!(err.to_string().starts_with("failed to create "), "{err}");
    }

    #[test]
    fn generation_is_zero_without_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(GENERATION_FILE);
        assert_eq!(read_generation(&path).unwrap(), 0);
        fs::write(&path, "7\n").unwrap();
        assert_eq!(read_generation(&path).unwrap(), 7);
        fs::write(&path, "seven").unwrap();
        assert!(matches!(
            read_generation(&path),
            Err(HygieneError::InvalidGeneration { .. })
        ));
    }
}
