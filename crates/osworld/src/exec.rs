//! Running commands as the desktop user: /execute, /setup/execute,
//! /execute_with_verification, /setup/launch, /run_python and
//! /run_bash_script, plus the helpers other modules run wmctrl, xdg-open
//! and python3 through.

use std::io::Write as _;
use std::os::unix::fs::{fchown, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Gid, Pid, Uid};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::RunError;
use crate::reply::{self, json_object, py_list, py_quote, truthy};
use crate::{OsworldConfig, State};

/// The original's limits: /execute 120 s, /run_python 30 s, /run_bash_script
/// 100 s unless the request says otherwise.
const EXECUTE_TIMEOUT: Duration = Duration::from_secs(120);
const RUN_PYTHON_TIMEOUT: Duration = Duration::from_secs(30);
const BASH_DEFAULT_TIMEOUT_SECS: f64 = 100.0;

/// A command for the desktop user: the base environment only, the user's
/// home as working directory, no stdin, and the user's uid, gid and
/// supplementary groups.
pub(crate) fn user_command(
    cfg: &OsworldConfig,
    program: &str,
    args: &[String],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&cfg.user.home)
        .stdin(Stdio::null());
    let uid = Uid::from_raw(cfg.user.uid);
    let gid = Gid::from_raw(cfg.user.gid);
    let groups: Vec<Gid> = cfg.user.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    // SAFETY: the closure runs between fork and exec, where only
    // async-signal-safe calls are allowed; setgroups, setgid and setuid are
    // plain syscalls, and `groups` was allocated before the fork. Groups and
    // gid go first: after setuid we could no longer change them.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setgid(gid)?;
            nix::unistd::setuid(uid)?;
            Ok(())
        });
    }
    cmd
}

/// What a finished command left.
pub(crate) struct Finished {
    /// Python's convention: the exit code, or minus the killing signal.
    pub returncode: i32,
    pub stdout: String,
    pub stderr: String,
}

fn returncode(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .unwrap_or_else(|| -status.signal().unwrap_or(0))
}

/// Runs `program` as the user and collects its output, like Python's
/// `subprocess.run(..., capture_output=True, timeout=...)`: it waits for
/// the exit *and* for end-of-file on the pipes. The command gets its own
/// process group so that a timeout kills everything it started, not just
/// the first process, and nothing outlives the request holding our pipes.
pub(crate) async fn run(
    cfg: &OsworldConfig,
    program: &str,
    args: &[String],
    cwd: Option<&Path>,
    timeout: Option<Duration>,
    merge_stderr: bool,
) -> Result<Finished, RunError> {
    let mut cmd = user_command(cfg, program, args);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.process_group(0).kill_on_drop(true);
    let merged_reader = if merge_stderr {
        // One pipe on both fds, as `stderr=STDOUT` does, keeping the order
        // in which the script wrote. CLOEXEC so that commands spawned
        // concurrently by other requests do not inherit our write end.
        let (r, w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|source| RunError::Pipe {
                program: program.to_string(),
                source,
            })?;
        let w2 = w.try_clone().map_err(|source| RunError::Spawn {
            program: program.to_string(),
            source,
        })?;
        cmd.stdout(Stdio::from(w)).stderr(Stdio::from(w2));
        Some(r)
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        None
    };
    let spawned = cmd.spawn();
    // Drops our copies of the pipe's write end, or EOF would never come.
    drop(cmd);
    let mut child = spawned.map_err(|source| RunError::Spawn {
        program: program.to_string(),
        source,
    })?;
    let pid = child.id();

    let (out, err): (Reader, Reader) = match merged_reader {
        Some(r) => {
            let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(r).map_err(|source| {
                RunError::Spawn {
                    program: program.to_string(),
                    source,
                }
            })?;
            (Some(Box::new(rx)), None)
        }
        None => (
            child.stdout.take().map(|s| Box::new(s) as _),
            child.stderr.take().map(|s| Box::new(s) as _),
        ),
    };

    let outcome = {
        let work = async {
            let (o, e, status) = tokio::join!(read_all(out), read_all(err), child.wait());
            (o, e, status)
        };
        match timeout {
            Some(t) => tokio::time::timeout(t, work).await.ok(),
            None => Some(work.await),
        }
    };
    match outcome {
        Some((stdout, stderr, status)) => {
            let status = status.map_err(|source| RunError::Wait {
                program: program.to_string(),
                source,
            })?;
            Ok(Finished {
                returncode: returncode(status),
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
            })
        }
        None => {
            if let Some(pid) = pid {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            let _ = child.kill().await;
            Err(RunError::Timeout {
                program: program.to_string(),
                seconds: timeout.map(|t| t.as_secs_f64()).unwrap_or_default(),
            })
        }
    }
}

type Reader = Option<Box<dyn AsyncRead + Unpin + Send>>;

async fn read_all(r: Reader) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut r) = r {
        let _ = r.read_to_end(&mut buf).await;
    }
    buf
}

/// Starts `program` as the user in a new session (setsid), detached from
/// the agent: its own process group, so signals to the agent's group do not
/// reach it, and no controlling terminal. A task waits for it, so it never
/// lingers as a zombie of the agent.
pub(crate) fn spawn_detached(
    cfg: &OsworldConfig,
    program: &str,
    args: &[String],
) -> Result<(), RunError> {
    let mut cmd = user_command(cfg, program, args);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.to_string(),
        source,
    })?;
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(())
}

/// `os.path.expanduser` for the configured user.
pub(crate) fn expand_user(cfg: &OsworldConfig, p: &str) -> String {
    let home = cfg.user.home.to_string_lossy();
    if p == "~" {
        home.into_owned()
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("{}/{}", home.trim_end_matches('/'), rest)
    } else {
        p.to_string()
    }
}

/// `os.path.expandvars(os.path.expanduser(p))`, against the commands' base
/// environment; unknown variables stay as written, as in Python.
pub(crate) fn expand_path(cfg: &OsworldConfig, p: &str) -> String {
    let p = expand_user(cfg, p);
    let mut out = String::with_capacity(p.len());
    let mut rest = p.as_str();
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, consumed) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(end) => (&inner[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match cfg.env_var(name).filter(|_| !name.is_empty()) {
            Some(v) => out.push_str(v),
            None => out.push_str(&rest[i..i + 1 + consumed]),
        }
        rest = &rest[i + 1 + consumed..];
    }
    out.push_str(rest);
    out
}

/// The argv a `{command, shell}` request means, the way the original
/// builds it for `subprocess`.
#[derive(Debug, PartialEq)]
pub(crate) struct CommandLine {
    pub argv: Vec<String>,
    /// What /setup/launch echoes back: `str(command)` for shell=true,
    /// `" ".join(command)` otherwise.
    pub display: String,
}

pub(crate) fn parse_command(
    cfg: &OsworldConfig,
    data: &Map<String, Value>,
) -> Result<CommandLine, Response> {
    let shell = truthy(data.get("shell"));
    let command = data
        .get("command")
        .cloned()
        .unwrap_or(if shell { json!("") } else { json!([]) });
    let mut items = match command {
        // A string without shell is split like a POSIX shell would
        // (shlex.split); unbalanced quotes raise in the original.
        Value::String(s) if !shell => shlex::split(&s).ok_or_else(reply::internal_error)?,
        Value::String(s) => {
            return Ok(CommandLine {
                argv: vec!["/bin/sh".into(), "-c".into(), s.clone()],
                display: s,
            })
        }
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(reply::internal_error()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(reply::internal_error()),
    };
    for arg in &mut items {
        if arg.starts_with("~/") {
            *arg = expand_user(cfg, arg);
        }
    }
    if shell {
        // subprocess with shell=True and a list: the first item is the
        // script, the rest become $0, $1, ...
        let display = py_list(items.iter().map(|s| py_quote(s)));
        let mut argv = vec!["/bin/sh".to_string(), "-c".to_string()];
        argv.extend(items);
        return Ok(CommandLine { argv, display });
    }
    if items.is_empty() {
        // Popen([]) raises IndexError inside the original's try.
        return Err(reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": "list index out of range"}),
        ));
    }
    Ok(CommandLine {
        display: items.join(" "),
        argv: items,
    })
}

/// The JSON body of a command endpoint and the command it names, or the
/// original's error reply.
fn command_request(
    cfg: &OsworldConfig,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Map<String, Value>, CommandLine), Response> {
    let data = json_object(headers, body)?;
    let cl = parse_command(cfg, &data)?;
    Ok((data, cl))
}

/// POST /execute and /setup/execute.
pub(crate) async fn execute(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let (_, cl) = match command_request(&st.cfg, &headers, &body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match run(
        &st.cfg,
        &cl.argv[0],
        &cl.argv[1..],
        None,
        Some(EXECUTE_TIMEOUT),
        false,
    )
    .await
    {
        Ok(f) => reply::json(
            StatusCode::OK,
            json!({"status": "success", "output": f.stdout, "error": f.stderr, "returncode": f.returncode}),
        ),
        Err(e) => reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": e.python_message()}),
        ),
    }
}

/// POST /execute_with_verification and /setup/execute_with_verification:
/// /execute, then poll `verification` ({window_exists, command_success})
/// every `check_interval` seconds for up to `max_wait_time`.
pub(crate) async fn execute_with_verification(
    st: State,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (data, cl) = match command_request(&st.cfg, &headers, &body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let verification = match data.get("verification") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return reply::internal_error(),
    };
    let secs = |key: &str, default: f64| data.get(key).and_then(Value::as_f64).unwrap_or(default);
    let max_wait = secs("max_wait_time", 10.0).max(0.0);
    let interval = secs("check_interval", 1.0).max(0.0);
    let error = |e: RunError| {
        reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": e.python_message()}),
        )
    };
    let f = match run(
        &st.cfg,
        &cl.argv[0],
        &cl.argv[1..],
        None,
        Some(EXECUTE_TIMEOUT),
        false,
    )
    .await
    {
        Ok(f) => f,
        Err(e) => return error(e),
    };
    let mut body = json!({"status": "success", "output": f.stdout, "error": f.stderr, "returncode": f.returncode});
    if verification.is_empty() {
        return reply::json(StatusCode::OK, body);
    }
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < max_wait {
        let mut passed = true;
        if let Some(name) = verification.get("window_exists") {
            let name = reply::py_str(name).to_lowercase();
            passed &= match run(
                &st.cfg,
                "wmctrl",
                &["-l".into()],
                None,
                Some(Duration::from_secs(5)),
                false,
            )
            .await
            {
                Ok(w) if w.returncode == 0 => w.stdout.to_lowercase().contains(&name),
                _ => false,
            };
        }
        if let Some(check) = verification.get("command_success") {
            let args = vec!["-c".to_string(), reply::py_str(check)];
            passed &= matches!(
                run(
                    &st.cfg,
                    "/bin/sh",
                    &args,
                    None,
                    Some(Duration::from_secs(5)),
                    false
                )
                .await,
                Ok(Finished { returncode: 0, .. })
            );
        }
        if passed {
            body["verification"] = json!("passed");
            body["wait_time"] = json!(start.elapsed().as_secs_f64());
            return reply::json(StatusCode::OK, body);
        }
        tokio::time::sleep(Duration::from_secs_f64(interval)).await;
    }
    body["status"] = json!("verification_failed");
    body["verification"] = json!("failed");
    body["wait_time"] = json!(max_wait);
    reply::json(StatusCode::INTERNAL_SERVER_ERROR, body)
}

/// POST /setup/launch: start and return at once.
pub(crate) async fn launch(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let (_, cl) = match command_request(&st.cfg, &headers, &body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match spawn_detached(&st.cfg, &cl.argv[0], &cl.argv[1..]) {
        Ok(()) => reply::text(
            StatusCode::OK,
            format!("{} launched successfully", cl.display),
        ),
        Err(e) => reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": e.python_message()}),
        ),
    }
}

/// A file in /tmp owned by the user, created exclusively (O_EXCL: nobody
/// can plant a symlink there first), removed when dropped.
struct UserTempFile(PathBuf);

impl UserTempFile {
    fn create(
        cfg: &OsworldConfig,
        prefix: &str,
        suffix: &str,
        mode: u32,
        text: &str,
    ) -> std::io::Result<UserTempFile> {
        let path = PathBuf::from(format!("/tmp/{prefix}{}{suffix}", random_hex()?));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)?;
        let guard = UserTempFile(path);
        f.write_all(text.as_bytes())?;
        fchown(&f, Some(cfg.user.uid), Some(cfg.user.gid))?;
        Ok(guard)
    }
}

impl Drop for UserTempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn random_hex() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// POST /run_python: `{code}` run by python3 from a file, 30 s limit.
pub(crate) async fn run_python(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let data = match json_object(&headers, &body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let exec_error = |message: String| {
        reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": format!("Execution error: {message}"),
                   "error": message, "need_more": false, "output": null}),
        )
    };
    let code = match data.get("code") {
        c if !truthy(c) => {
            return reply::json(
                StatusCode::BAD_REQUEST,
                json!({"status": "error", "message": "Code not supplied!"}),
            )
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => return exec_error(format!("code must be a string, not {other}")),
        None => unreachable!("None is not truthy"),
    };
    let file = match UserTempFile::create(&st.cfg, "python_exec_", ".py", 0o600, &code) {
        Ok(f) => f,
        Err(e) => return exec_error(format!("write code to /tmp: {e}")),
    };
    let python = st.cfg.python.to_string_lossy().into_owned();
    let args = vec![file.0.to_string_lossy().into_owned()];
    let result = run(
        &st.cfg,
        &python,
        &args,
        None,
        Some(RUN_PYTHON_TIMEOUT),
        false,
    )
    .await;
    drop(file);
    match result {
        Ok(f) => {
            let mut message = f.stdout.clone();
            let mut error = f.stderr.clone();
            if !error.is_empty() {
                if !message.is_empty() {
                    message.push('\n');
                }
                message.push_str(&error);
            }
            let status = if f.returncode != 0 {
                if error.is_empty() {
                    error = format!("Process exited with code {}", f.returncode);
                    message = if message.is_empty() {
                        error.clone()
                    } else {
                        format!("{message}\n{error}")
                    };
                }
                "error"
            } else {
                "success"
            };
            reply::json(
                StatusCode::OK,
                json!({"status": status, "message": message, "need_more": false,
                       "output": f.stdout, "error": error, "return_code": f.returncode}),
            )
        }
        Err(RunError::Timeout { .. }) => reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": "Execution timeout: Code took too long to execute",
                   "error": "TimeoutExpired", "need_more": false, "output": null}),
        ),
        Err(e) => exec_error(e.python_message()),
    }
}

/// POST /run_bash_script: `{script, timeout=100, working_dir}`, run by
/// /bin/bash with stderr merged into stdout.
pub(crate) async fn run_bash_script(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let data = match json_object(&headers, &body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let fail = |status: StatusCode, output: String| {
        reply::json(
            status,
            json!({"status": "error", "output": output, "error": "", "returncode": -1}),
        )
    };
    let mut script = match data.get("script") {
        s if !truthy(s) => return fail(StatusCode::BAD_REQUEST, "Script not supplied!".into()),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to execute script: script must be a string, not {other}"),
            )
        }
        None => unreachable!("None is not truthy"),
    };
    // Absent means 100 s; an explicit null means no limit, as in subprocess.
    let timeout_secs = match data.get("timeout") {
        None => Some(BASH_DEFAULT_TIMEOUT_SECS),
        Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(other) => {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to execute script: timeout must be a number, not {other}"),
            )
        }
    };
    let timeout = match timeout_secs.map(Duration::try_from_secs_f64) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to execute script: {e}"),
            )
        }
    };
    let working_dir = match data.get("working_dir") {
        Some(w) if truthy(Some(w)) => {
            let dir = expand_user(&st.cfg, &reply::py_str(w));
            if !Path::new(&dir).exists() {
                return fail(
                    StatusCode::BAD_REQUEST,
                    format!("Working directory does not exist: {dir}"),
                );
            }
            Some(PathBuf::from(dir))
        }
        _ => None,
    };
    if !script.contains("#!/bin/bash") {
        script = format!("#!/bin/bash\n\n{script}");
    }
    let file = match UserTempFile::create(&st.cfg, "tmp", ".sh", 0o755, &script) {
        Ok(f) => f,
        Err(e) => {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to execute script: {e}"),
            )
        }
    };
    let args = vec![file.0.to_string_lossy().into_owned()];
    let result = run(
        &st.cfg,
        "/bin/bash",
        &args,
        working_dir.as_deref(),
        timeout,
        true,
    )
    .await;
    drop(file);
    match result {
        Ok(f) => reply::json(
            StatusCode::OK,
            json!({"status": if f.returncode == 0 { "success" } else { "error" },
                   "output": f.stdout, "error": "", "returncode": f.returncode}),
        ),
        Err(RunError::Timeout { .. }) => fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "Script execution timed out after {} seconds",
                timeout_secs.map(reply::py_g).unwrap_or_default()
            ),
        ),
        Err(e) => fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to execute script: {}", e.python_message()),
        ),
    }
}

/// Whether `name` resolves to an executable on the commands' PATH
/// (`shutil.which`).
pub(crate) fn which(cfg: &OsworldConfig, name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let is_exec = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if name.contains('/') {
        return is_exec(Path::new(name));
    }
    cfg.env_var("PATH")
        .unwrap_or("")
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|d| is_exec(&Path::new(d).join(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UserSpec;

    fn cfg() -> OsworldConfig {
        let user = UserSpec {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
            shell: "/bin/bash".into(),
            groups: vec![1000],
        };
        OsworldConfig::new(":0", user)
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn list_command_expands_home() {
        let cl = parse_command(
            &cfg(),
            &obj(json!({"command": ["ls", "~/Desktop", "a~/b"]})),
        )
        .unwrap();
        assert_eq!(cl.argv, vec!["ls", "/home/user/Desktop", "a~/b"]);
        assert_eq!(cl.display, "ls /home/user/Desktop a~/b");
    }

    #[test]
    fn string_command_without_shell_is_shlex_split() {
        let cl = parse_command(&cfg(), &obj(json!({"command": "echo 'a b' c"}))).unwrap();
        assert_eq!(cl.argv, vec!["echo", "a b", "c"]);
        let r = parse_command(&cfg(), &obj(json!({"command": "echo 'a"}))).unwrap_err();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn shell_commands_go_through_sh() {
        let cl = parse_command(
            &cfg(),
            &obj(json!({"command": "echo $HOME", "shell": true})),
        )
        .unwrap();
        assert_eq!(cl.argv, vec!["/bin/sh", "-c", "echo $HOME"]);
        assert_eq!(cl.display, "echo $HOME");
        let cl = parse_command(
            &cfg(),
            &obj(json!({"command": ["echo $0", "x"], "shell": true})),
        )
        .unwrap();
        assert_eq!(cl.argv, vec!["/bin/sh", "-c", "echo $0", "x"]);
        assert_eq!(cl.display, "['echo $0', 'x']");
    }

    #[test]
    fn bad_command_shapes() {
        let c = cfg();
        let empty = parse_command(&c, &obj(json!({}))).unwrap_err();
        assert_eq!(empty.status(), StatusCode::INTERNAL_SERVER_ERROR);
        for bad in [
            json!({"command": 5}),
            json!({"command": null}),
            json!({"command": ["a", 1]}),
        ] {
            let r = parse_command(&c, &obj(bad)).unwrap_err();
            assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
    }

    #[test]
    fn expands_vars_like_python() {
        let c = cfg();
        assert_eq!(expand_path(&c, "~/x"), "/home/user/x");
        assert_eq!(
            expand_path(&c, "$HOME/a/${USER}.txt"),
            "/home/user/a/user.txt"
        );
        assert_eq!(expand_path(&c, "$NOPE/$/${x"), "$NOPE/$/${x");
    }
}
