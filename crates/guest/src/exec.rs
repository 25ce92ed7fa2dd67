//! `POST /v1/exec`: run a command and stream its output as NDJSON frames.
//!
//! Everything that can be checked before forking (argv, env, user, cwd, the
//! program's location) is checked in [`prepare`], so that "could not start"
//! is a clean 4xx with a specific `kind` instead of a 200 stream that ends
//! with a mysterious exit code 127.
//!
//! Once running, one task per command ([`supervise`]) owns the child: it pumps
//! stdout and stderr into a bounded channel that backs the response body, and
//! it is the only place that kills. The command is the leader of its own
//! process group, so a timeout or a vanished client kills everything it
//! started with one `killpg`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Gid, Pid, Uid};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::paths::{self, PathError};
use crate::users::{self, Account, UserError};

/// `PATH` for commands whose request does not set one; Debian's login default
/// for root, which also works for ordinary users.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Response header carrying the command's pid (= its process group id).
pub const PID_HEADER: &str = "x-drums-pid";

/// How long to keep reading output after the command itself has exited.
/// Normally its pipes hit EOF at the same moment; if they don't, a background
/// job (`server &`) inherited them, and we must not wait for it to finish.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

/// Size of one read from a pipe, and so the largest `data` in one frame.
const READ_CHUNK: usize = 32 * 1024;

/// Frames buffered between the command and a slow client before the command
/// is made to block on its pipe (backpressure instead of unbounded memory).
const FRAME_QUEUE: usize = 16;

/// The request body of `POST /v1/exec`.
///
/// Unknown fields are rejected: a misspelt `timeout` silently meaning "no
/// timeout" is worse than an error.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Start it and answer at once with its pid (`{"pid":N}`), as `podman
    /// exec -d`: it outlives the request, and the guest reaps it.
    #[serde(default)]
    pub detach: bool,
    /// Where a detached command's stdout and stderr go (appended; parents
    /// made); `/dev/null` if none.
    #[serde(default)]
    pub log: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("open the detached command's log {}", .path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("argv is empty")]
    EmptyArgv,
    #[error("argv[0] is empty")]
    EmptyProgram,
    #[error("argv[{0}] contains a nul byte")]
    NulInArgv(usize),
    #[error("invalid environment variable {name:?}: {reason}")]
    InvalidEnv { name: String, reason: &'static str },
    #[error("failed to look up user")]
    User(#[from] UserError),
    #[error("invalid cwd")]
    CwdPath(#[source] PathError),
    #[error("cwd not found: {}", .path.display())]
    CwdNotFound {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cwd is not a directory: {}", .0.display())]
    CwdNotDirectory(PathBuf),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("permission denied: {} is not executable", .0.display())]
    NotExecutable(PathBuf),
    #[error("failed to start {}", .program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl From<ExecError> for ApiError {
    fn from(err: ExecError) -> Self {
        use StatusCode as S;
        let (status, kind) = match &err {
            // The caller named a path that cannot be a log (a directory, a
            // symlink, under a file).
            ExecError::Log { .. } => (S::BAD_REQUEST, "bad_log"),
            ExecError::EmptyArgv
            | ExecError::EmptyProgram
            | ExecError::NulInArgv(_)
            | ExecError::InvalidEnv { .. } => (S::BAD_REQUEST, "bad_request"),
            ExecError::User(UserError::NotFound(_)) => (S::NOT_FOUND, "user_not_found"),
            ExecError::User(UserError::Read { .. }) => (S::INTERNAL_SERVER_ERROR, "io_error"),
            ExecError::CwdPath(e) => e.status_kind(),
            ExecError::CwdNotFound { .. } | ExecError::CwdNotDirectory(_) => {
                (S::NOT_FOUND, "cwd_not_found")
            }
            ExecError::CommandNotFound(_) => (S::NOT_FOUND, "command_not_found"),
            ExecError::NotExecutable(_) => (S::FORBIDDEN, "permission_denied"),
            ExecError::Spawn { source, .. } => match source.raw_os_error() {
                // Checked in `prepare`, so these mean the world changed in
                // between, or the target user may not traverse the path.
                Some(libc::ENOENT) => (S::NOT_FOUND, "command_not_found"),
                Some(libc::EACCES | libc::EPERM) => (S::FORBIDDEN, "permission_denied"),
                Some(libc::E2BIG) => (S::BAD_REQUEST, "bad_request"),
                _ => (S::INTERNAL_SERVER_ERROR, "spawn_failed"),
            },
        };
        ApiError::from_error(status, kind, &err)
    }
}

/// A validated request: everything needed to fork, nothing left to look up.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Absolute path of the program, found through `PATH`.
    pub program: PathBuf,
    /// argv as given; `argv[0]` is passed through unchanged.
    pub argv: Vec<String>,
    /// The complete environment of the command.
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    /// The cwd was not requested but defaulted to the home directory, so it
    /// may fall back to `/` if the user cannot enter it.
    pub cwd_defaulted: bool,
    pub account: Account,
    pub timeout: Option<Duration>,
    /// Detached, with its output here.
    pub detached: Option<PathBuf>,
}

/// Validates `req` and resolves user, environment, cwd and program.
///
/// This does a few small synchronous reads (`/etc/passwd`, some `stat`s); they
/// hit the page cache and are cheaper than a hop to the blocking pool.
pub fn prepare(req: ExecRequest) -> Result<Prepared, ExecError> {
    let Some(argv0) = req.argv.first() else {
        return Err(ExecError::EmptyArgv);
    };
    if argv0.is_empty() {
        return Err(ExecError::EmptyProgram);
    }
    if let Some(i) = req.argv.iter().position(|a| a.contains('\0')) {
        return Err(ExecError::NulInArgv(i));
    }
    for (name, value) in &req.env {
        let reason = if name.is_empty() {
            "empty name"
        } else if name.contains('=') {
            "name contains '='"
        } else if name.contains('\0') || value.contains('\0') {
            "contains a nul byte"
        } else {
            continue;
        };
        return Err(ExecError::InvalidEnv {
            name: name.clone(),
            reason,
        });
    }

    let account = users::lookup(req.user.as_deref())?;

    // The environment starts clean: the agent's own environment is whatever
    // init gave it and is no business of the command's. The login-ish
    // variables come from passwd, and the request overrides anything.
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
    env.insert(
        "HOME".to_owned(),
        account.home.to_string_lossy().into_owned(),
    );
    if let Some(name) = &account.name {
        env.insert("USER".to_owned(), name.clone());
        env.insert("LOGNAME".to_owned(), name.clone());
    }
    env.insert("SHELL".to_owned(), account.shell.clone());
    env.extend(req.env);

    let (cwd, cwd_defaulted) = match &req.cwd {
        Some(cwd) => {
            let cwd = paths::resolve(cwd).map_err(ExecError::CwdPath)?;
            match std::fs::metadata(&cwd) {
                Ok(m) if m.is_dir() => (cwd, false),
                Ok(_) => return Err(ExecError::CwdNotDirectory(cwd)),
                Err(source) => return Err(ExecError::CwdNotFound { path: cwd, source }),
            }
        }
        None if account.home.is_dir() => (account.home.clone(), true),
        None => (PathBuf::from("/"), true),
    };

    let program = find_program(argv0, &env["PATH"], &cwd)?;
    let bad_log = |path: &str, why: &str| ExecError::Log {
        path: PathBuf::from(path),
        source: io::Error::new(io::ErrorKind::InvalidInput, why.to_owned()),
    };
    match &req.log {
        Some(log) if log.is_empty() || log.contains('\0') => {
            return Err(bad_log(log, "a log path is not empty and holds no NUL"))
        }
        Some(log) if !req.detach => {
            return Err(bad_log(
                log,
                "a log is for a detached command (detach: true)",
            ))
        }
        _ => {}
    }
    let detached = match (req.detach, &req.log) {
        (false, _) => None,
        (true, None) => Some(PathBuf::from("/dev/null")),
        (true, Some(log)) => Some(paths::resolve(log).map_err(ExecError::CwdPath)?),
    };
    Ok(Prepared {
        detached,
        program,
        argv: req.argv,
        env,
        cwd,
        cwd_defaulted,
        account,
        timeout: req.timeout_ms.map(Duration::from_millis),
    })
}

enum Candidate {
    Executable,
    NotExecutable,
    Missing,
}

fn check_candidate(path: &Path) -> Candidate {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Candidate::Executable,
        Ok(_) => Candidate::NotExecutable,
        Err(_) => Candidate::Missing,
    }
}

/// Finds `argv0` the way a shell does: a name with a slash is a path (relative
/// to the command's cwd), anything else is searched in `path_var`. As in bash,
/// a non-executable match is remembered but the search goes on, and is only
/// reported if nothing executable turns up.
///
/// The execute bits are checked for anyone, not for the target user: the
/// precise answer is the kernel's, and a refusal there comes back from the
/// spawn as `EACCES` → `permission_denied` all the same.
fn find_program(argv0: &str, path_var: &str, cwd: &Path) -> Result<PathBuf, ExecError> {
    if argv0.contains('/') {
        let path = cwd.join(argv0);
        return match check_candidate(&path) {
            Candidate::Executable => Ok(path),
            Candidate::NotExecutable => Err(ExecError::NotExecutable(path)),
            Candidate::Missing => Err(ExecError::CommandNotFound(argv0.to_owned())),
        };
    }
    let mut not_executable = None;
    for dir in path_var.split(':') {
        // An empty PATH element means the current directory (POSIX).
        let candidate = cwd.join(dir).join(argv0);
        match check_candidate(&candidate) {
            Candidate::Executable => return Ok(candidate),
            Candidate::NotExecutable if candidate.is_file() && not_executable.is_none() => {
                not_executable = Some(candidate);
            }
            _ => {}
        }
    }
    match not_executable {
        Some(path) => Err(ExecError::NotExecutable(path)),
        None => Err(ExecError::CommandNotFound(argv0.to_owned())),
    }
}

/// Forks the command: stdin from `/dev/null`, stdout/stderr piped, in a new
/// process group, as the prepared user, in the prepared cwd.
pub fn spawn(prepared: &Prepared) -> Result<Child, ExecError> {
    let spawn_err = |source| ExecError::Spawn {
        program: prepared.program.clone(),
        source,
    };
    let (stdout, stderr) = match &prepared.detached {
        None => (Stdio::piped(), Stdio::piped()),
        Some(log) => {
            let log_err = |source| ExecError::Log {
                path: log.clone(),
                source,
            };
            if let Some(dir) = log.parent() {
                std::fs::create_dir_all(dir).map_err(log_err)?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o644)
                .open(log)
                .map_err(log_err)?;
            (Stdio::from(f.try_clone().map_err(log_err)?), Stdio::from(f))
        }
    };
    let mut cmd = Command::new(&prepared.program);
    cmd.arg0(&prepared.argv[0])
        .args(&prepared.argv[1..])
        .env_clear()
        .envs(&prepared.env)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        // pgid = pid: one killpg reaches everything the command starts,
        // unless it deliberately makes a new group (setsid, a nested shell's
        // job control), which is the same limit every shell has.
        .process_group(0)
        // Killing is `supervise`'s job; kill_on_drop would only kill the
        // leader, not the group.
        .kill_on_drop(false);

    // Everything the child needs after fork is allocated here, before it:
    // only async-signal-safe calls are allowed between fork and exec.
    let groups: Vec<Gid> = prepared
        .account
        .groups
        .iter()
        .map(|&g| Gid::from_raw(g))
        .collect();
    let uid = Uid::from_raw(prepared.account.uid);
    let gid = Gid::from_raw(prepared.account.gid);
    let cwd = CString::new(prepared.cwd.as_os_str().as_bytes())
        .map_err(|e| spawn_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    let cwd_defaulted = prepared.cwd_defaulted;

    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe operations are allowed. It calls setgroups, setgid,
    // setuid and chdir (all async-signal-safe syscall wrappers), reads only
    // data allocated before the fork, and builds io::Errors from raw errno
    // values, which does not allocate. We do the identity switch ourselves
    // rather than with `Command::uid/gid` because std would clear the
    // supplementary groups (setgroups(0)) and `groups()` is unstable. chdir
    // comes *after* setuid so that a cwd the user may not enter fails as
    // EACCES instead of silently succeeding with root's rights.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setgid(gid)?;
            nix::unistd::setuid(uid)?;
            // SAFETY: `cwd` is a valid NUL-terminated string owned by the closure.
            if libc::chdir(cwd.as_ptr()) != 0 {
                let err = io::Error::last_os_error();
                // SAFETY: a static NUL-terminated literal.
                if !cwd_defaulted || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(spawn_err)
}

/// Output and exit frames, one JSON object per line.
#[derive(Serialize)]
struct DataFrame<'a> {
    stream: &'a str,
    data: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
}

#[derive(Serialize)]
struct ExitFrame {
    exit: ExitInfo,
}

fn encode_line<T: Serialize>(frame: &T) -> Bytes {
    let mut line = serde_json::to_vec(frame).expect("frames serialise infallibly");
    line.push(b'\n');
    Bytes::from(line)
}

fn data_frame(stream: &str, data: &[u8]) -> Bytes {
    encode_line(&DataFrame {
        stream,
        data: base64::engine::general_purpose::STANDARD.encode(data),
    })
}

/// Kills the command's process group, until the leader has been reaped.
///
/// After the leader is reaped its pid may be reused, and a new process that
/// makes itself a group leader would get the same pgid, so from then on we
/// never signal the group again. (Before that, the kernel will not hand the
/// pid out while the zombie holds it.) Dropping the guard kills too, which
/// covers the task being cancelled at runtime shutdown and panics.
struct GroupGuard {
    pgid: Pid,
    reaped: AtomicBool,
}

impl GroupGuard {
    fn kill(&self) -> bool {
        if self.reaped.load(Ordering::SeqCst) {
            return false;
        }
        match killpg(self.pgid, Signal::SIGKILL) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    pgid = self.pgid.as_raw(),
                    "failed to kill process group: {e}"
                );
                false
            }
        }
    }

    fn mark_reaped(&self) {
        self.reaped.store(true, Ordering::SeqCst);
    }

    fn is_reaped(&self) -> bool {
        self.reaped.load(Ordering::SeqCst)
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The client stopped reading: the response body was dropped.
struct ClientGone;

/// Forwards one pipe into the frame channel until EOF.
async fn forward(
    reader: Option<impl AsyncRead + Unpin>,
    stream: &str,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), ClientGone> {
    let Some(mut reader) = reader else {
        return Ok(());
    };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return Ok(()),
            Ok(n) => tx
                .send(data_frame(stream, &buf[..n]))
                .await
                .map_err(|_| ClientGone)?,
            Err(e) => {
                tracing::warn!("failed to read {stream} of command: {e}");
                return Ok(());
            }
        }
    }
}

/// Streams both pipes until the leader exits and its pipes are drained (or
/// [`DRAIN_AFTER_EXIT`] passes), and reaps the leader.
async fn pump(
    child: &mut Child,
    guard: &GroupGuard,
    tx: &mpsc::Sender<Bytes>,
) -> Result<io::Result<ExitStatus>, ClientGone> {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut streams = pin!(async {
        tokio::try_join!(forward(stdout, "stdout", tx), forward(stderr, "stderr", tx))
    });
    let mut streams_done = false;
    let status = tokio::select! {
        status = child.wait() => status,
        r = &mut streams => {
            r?;
            streams_done = true;
            child.wait().await
        }
    };
    guard.mark_reaped();
    if !streams_done {
        match tokio::time::timeout(DRAIN_AFTER_EXIT, &mut streams).await {
            Ok(r) => {
                r?;
            }
            Err(_elapsed) => tracing::debug!(
                pid = guard.pgid.as_raw(),
                "output still open after exit (background job?); not waiting for it"
            ),
        }
    }
    Ok(status)
}

/// Owns a running command until it ends: enforces the timeout, kills the
/// group if the client goes away, and sends the final exit frame.
async fn supervise(
    mut child: Child,
    pgid: Pid,
    timeout: Option<Duration>,
    tx: mpsc::Sender<Bytes>,
) {
    let guard = GroupGuard {
        pgid,
        reaped: AtomicBool::new(false),
    };
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    // A disabled select branch still evaluates its future, so give the sleep
    // a deadline even when there is none; it is never polled then.
    let sleep = tokio::time::sleep_until(
        deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365)),
    );
    let mut sleep = pin!(sleep);
    let mut timed_out = false;

    let outcome = {
        let mut pump = pin!(pump(&mut child, &guard, &tx));
        loop {
            tokio::select! {
                r = &mut pump => break r,
                () = tx.closed() => break Err(ClientGone),
                () = &mut sleep, if deadline.is_some() && !timed_out && !guard.is_reaped() => {
                    // Keep pumping: the group is dead, so the pipes reach EOF
                    // and the leader is reaped, and any output written before
                    // the kill still reaches the client.
                    timed_out = guard.kill();
                    tracing::info!(pid = pgid.as_raw(), "command timed out; killed its process group");
                }
            }
        }
    };

    match outcome {
        Ok(Ok(status)) => {
            let exit = ExitInfo {
                code: status.code(),
                signal: status.signal(),
                timed_out,
            };
            tracing::info!(
                pid = pgid.as_raw(),
                code = exit.code,
                signal = exit.signal,
                timed_out,
                "command finished"
            );
            // If the client left just now there is nobody to tell; ignore.
            let _ = tx.send(encode_line(&ExitFrame { exit })).await;
        }
        Ok(Err(e)) => {
            // Should not happen (we own the child); report what we know.
            tracing::error!(pid = pgid.as_raw(), "failed to wait for command: {e}");
            let exit = ExitInfo {
                code: None,
                signal: None,
                timed_out,
            };
            let _ = tx.send(encode_line(&ExitFrame { exit })).await;
        }
        Err(ClientGone) => {
            if guard.kill() {
                tracing::info!(
                    pid = pgid.as_raw(),
                    "client disconnected; killed process group"
                );
            }
            // Reap the leader now rather than leaving a zombie for tokio's
            // orphan queue.
            if let Err(e) = child.wait().await {
                tracing::warn!(pid = pgid.as_raw(), "failed to reap command: {e}");
            }
            guard.mark_reaped();
        }
    }
}

/// A started command: its pid and the NDJSON frames it produces.
pub struct Running {
    pub pid: u32,
    pub frames: mpsc::Receiver<Bytes>,
}

/// Spawns the prepared command and the task that supervises it. Dropping
/// `frames` counts as the client going away and kills the process group.
pub fn start(prepared: &Prepared) -> Result<Running, ExecError> {
    let child = spawn(prepared)?;
    let pid = child
        .id()
        .expect("a just-spawned child has not been reaped");
    tracing::info!(
        pid,
        argv = ?prepared.argv,
        uid = prepared.account.uid,
        cwd = %prepared.cwd.display(),
        "command started"
    );
    let (tx, rx) = mpsc::channel(FRAME_QUEUE);
    let pgid = Pid::from_raw(pid as i32);
    tokio::spawn(supervise(child, pgid, prepared.timeout, tx));
    Ok(Running { pid, frames: rx })
}

/// `POST /v1/exec`.
pub async fn handler(body: Result<Json<ExecRequest>, JsonRejection>) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(crate::server::json_rejection)?;
    let prepared = prepare(req)?;
    if prepared.detached.is_some() {
        let mut child = spawn(&prepared)?;
        let pid = child
            .id()
            .expect("a just-spawned child has not been reaped");
        tracing::info!(pid, argv = ?prepared.argv, uid = prepared.account.uid, "detached command started");
        // Reaped here; nothing waits on its output.
        tokio::spawn(async move {
            let status = child.wait().await;
            tracing::info!(pid, ?status, "detached command ended");
        });
        let mut response = axum::Json(serde_json::json!({ "pid": pid })).into_response();
        response
            .headers_mut()
            .insert(PID_HEADER, HeaderValue::from(pid));
        return Ok(response);
    }
    let Running { pid, mut frames } = start(&prepared)?;
    let stream = futures::stream::poll_fn(move |cx| {
        frames
            .poll_recv(cx)
            .map(|frame| frame.map(Ok::<_, std::convert::Infallible>))
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(PID_HEADER, HeaderValue::from(pid));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_like_a_shell() {
        let sh = find_program("sh", DEFAULT_PATH, Path::new("/")).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        assert!(matches!(
            find_program("no-such-command-drums", DEFAULT_PATH, Path::new("/")),
            Err(ExecError::CommandNotFound(_))
        ));
        assert_eq!(
            find_program("/bin/sh", "", Path::new("/tmp")).unwrap(),
            PathBuf::from("/bin/sh")
        );
        assert_eq!(
            find_program("bin/sh", "", Path::new("/")).unwrap(),
            PathBuf::from("/bin/sh")
        );
        // A directory is found but is not something we can run.
        assert!(matches!(
            find_program("/tmp", DEFAULT_PATH, Path::new("/")),
            Err(ExecError::NotExecutable(_))
        ));
    }

    #[test]
    fn rejects_bad_requests_before_forking() {
        let req = |argv: &[&str], env: &[(&str, &str)]| ExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        assert!(matches!(prepare(req(&[], &[])), Err(ExecError::EmptyArgv)));
        let log = |detach: bool, log: &str| ExecRequest {
            argv: vec!["true".into()],
            detach,
            log: Some(log.into()),
            ..Default::default()
        };
        assert!(matches!(prepare(log(true, "")), Err(ExecError::Log { .. })));
        assert!(matches!(
            prepare(log(false, "/tmp/l")),
            Err(ExecError::Log { .. })
        ));
        assert!(matches!(
            prepare(req(&[""], &[])),
            Err(ExecError::EmptyProgram)
        ));
        assert!(matches!(
            prepare(req(&["echo", "a\0b"], &[])),
            Err(ExecError::NulInArgv(1))
        ));
        assert!(matches!(
            prepare(req(&["echo"], &[("A=B", "c")])),
            Err(ExecError::InvalidEnv { .. })
        ));
        assert!(matches!(
            prepare(req(&["echo"], &[("", "c")])),
            Err(ExecError::InvalidEnv { .. })
        ));
    }

    #[test]
    fn environment_starts_clean_and_request_overrides() {
        let p = prepare(ExecRequest {
            argv: vec!["true".into()],
            env: [("HOME".to_string(), "/elsewhere".to_string())].into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.env["PATH"], DEFAULT_PATH);
        assert_eq!(p.env["HOME"], "/elsewhere");
        assert_eq!(p.env["USER"], "root");
        assert!(!p.env.contains_key("TERM"));
    }
}
