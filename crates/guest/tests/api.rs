//! End-to-end tests: the real server, in-process, on a temporary unix socket,
//! spoken to over HTTP/1.1 with a hyper client. These run real commands as
//! real users, so they need root (as the agent itself does).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use drums_guest::{Listener, Server};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

/// A running agent on a socket in its own temporary directory.
struct Guest {
    dir: TempDir,
    sock: PathBuf,
    server: JoinHandle<()>,
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A connection to the agent; dropping it closes the socket.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The decoded NDJSON stream of one exec.
#[derive(Debug)]
struct Exec {
    status: StatusCode,
    pid: u32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Value,
    error: Value,
}

impl Exec {
    fn stdout(&self) -> String {
        String::from_utf8(self.stdout.clone()).unwrap()
    }
    fn stderr(&self) -> String {
        String::from_utf8(self.stderr.clone()).unwrap()
    }
}

impl Guest {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // A directory that does not exist yet: the server must create it.
        let sock = dir.path().join("run/drums/guest.sock");
        let server = Server::bind(vec![Listener::Unix(sock.clone())])
            .await
            .unwrap();
        let server = tokio::spawn(async move { server.run().await.unwrap() });
        Self { dir, sock, server }
    }

    async fn connect(&self) -> Conn {
        let stream = UnixStream::connect(&self.sock).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender, task }
    }

    async fn send(
        &self,
        conn: &mut Conn,
        method: Method,
        uri: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Response<Incoming> {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "guest");
        let body = match body {
            Some((content_type, bytes)) => {
                builder = builder.header("content-type", content_type);
                Full::new(Bytes::from(bytes))
            }
            None => Full::new(Bytes::new()),
        };
        conn.sender
            .send_request(builder.body(body).unwrap())
            .await
            .unwrap()
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut conn = self.connect().await;
        let response = self.send(&mut conn, method, uri, body).await;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes().to_vec();
        (parts.status, parts.headers, bytes)
    }

    async fn json(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map(|v| ("application/json", serde_json::to_vec(&v).unwrap()));
        let (status, headers, bytes) = self.call(method, uri, body).await;
        assert_eq!(headers["content-type"], "application/json", "{uri}");
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    async fn exec(&self, request: Value) -> Exec {
        let body = ("application/json", serde_json::to_vec(&request).unwrap());
        let (status, headers, bytes) = self.call(Method::POST, "/v1/exec", Some(body)).await;
        let mut exec = Exec {
            status,
            pid: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
            exit: Value::Null,
            error: Value::Null,
        };
        if status != StatusCode::OK {
            exec.error = serde_json::from_slice::<Value>(&bytes).unwrap()["error"].clone();
            return exec;
        }
        assert_eq!(headers["content-type"], "application/x-ndjson");
        exec.pid = headers["x-drums-pid"].to_str().unwrap().parse().unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.ends_with('\n'),
            "frames are newline-terminated: {text:?}"
        );
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let frame: Value = serde_json::from_str(line).unwrap();
            if let Some(exit) = frame.get("exit") {
                assert_eq!(i, lines.len() - 1, "exit is the last frame");
                exec.exit = exit.clone();
                continue;
            }
            let data = base64::engine::general_purpose::STANDARD
                .decode(frame["data"].as_str().unwrap())
                .unwrap();
            match frame["stream"].as_str().unwrap() {
                "stdout" => exec.stdout.extend(data),
                "stderr" => exec.stderr.extend(data),
                other => panic!("unknown stream {other}"),
            }
        }
        assert!(exec.exit.is_object(), "no exit frame in {text:?}");
        exec
    }
}

/// Percent-encodes a query value (paths from tempfile are plain, but be
/// correct anyway).
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn exit(code: Option<i32>, signal: Option<i32>, timed_out: bool) -> Value {
    json!({"code": code, "signal": signal, "timed_out": timed_out})
}

/// True once `pid` no longer runs: gone from /proc, or a zombie (dead, waiting
/// for whoever its parent now is to reap it).
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.rsplit_once(") ").unwrap().1.chars().next().unwrap();
            state == 'Z' || state == 'X'
        }
    }
}

async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills a process a test deliberately left running, and waits for it.
async fn kill_and_wait(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    wait_until(
        &format!("pid {pid} is dead"),
        Duration::from_secs(5),
        || is_dead(pid),
    )
    .await;
}

#[tokio::test]
async fn health() {
    let guest = Guest::start().await;
    let (status, body) = guest.json(Method::GET, "/v1/health", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(body["pid"], std::process::id());
    // This test's pid namespace (the host's): a pid it handed out already.
    let last = body["last_pid"].as_u64().expect("last_pid is reported");
    assert!(last > 0, "{body}");
    let hostname = nix::unistd::gethostname().unwrap();
    assert_eq!(body["hostname"], hostname.to_str().unwrap());
}

#[tokio::test]
async fn socket_is_private_and_stale_sockets_are_replaced() {
    let guest = Guest::start().await;
    let mode = std::fs::metadata(&guest.sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // A live socket is not stolen.
    let err = Server::bind(vec![Listener::Unix(guest.sock.clone())])
        .await
        .err()
        .expect("binding a live socket must fail");
    assert!(
        matches!(err, drums_guest::ServeError::SocketInUse(_)),
        "{err}"
    );

    // A socket file nobody listens on is stale and replaced.
    let stale = guest.dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let server = Server::bind(vec![Listener::Unix(stale.clone())])
        .await
        .unwrap();
    drop(server);

    // Anything else at the path is left alone.
    let file = guest.dir.path().join("file");
    std::fs::write(&file, "keep me").unwrap();
    assert!(Server::bind(vec![Listener::Unix(file.clone())])
        .await
        .is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[tokio::test]
async fn tcp_listener_serves_the_same_api() {
    let server = Server::bind(vec!["tcp:127.0.0.1:0".parse().unwrap()])
        .await
        .unwrap();
    let Listener::Tcp(addr) = server.local_addrs()[0] else {
        panic!("expected tcp")
    };
    let task = tokio::spawn(server.run());
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::get("/v1/health")
        .header("host", "guest")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    conn.abort();
    task.abort();
}

#[tokio::test]
async fn exec_echo_streams_stdout_and_exits_zero() {
    let guest = Guest::start().await;
    let exec = guest.exec(json!({"argv": ["echo", "hi"]})).await;
    assert_eq!(exec.status, StatusCode::OK);
    assert_eq!(exec.stdout(), "hi\n");
    assert_eq!(exec.stderr(), "");
    assert_eq!(exec.exit, exit(Some(0), None, false));
    assert!(exec.pid > 0);
}

#[tokio::test]
async fn exec_separates_stderr() {
    let guest = Guest::start().await;
    let exec = guest
        .exec(json!({"argv": ["sh", "-c", "echo out; echo err >&2"]}))
        .await;
    assert_eq!(exec.stdout(), "out\n");
    assert_eq!(exec.stderr(), "err\n");
    assert_eq!(exec.exit, exit(Some(0), None, false));
}

#[tokio::test]
async fn exec_reports_exit_code() {
    let guest = Guest::start().await;
    let exec = guest.exec(json!({"argv": ["sh", "-c", "exit 3"]})).await;
    assert_eq!(exec.status, StatusCode::OK);
    assert_eq!(exec.exit, exit(Some(3), None, false));
}

#[tokio::test]
async fn exec_reports_death_by_signal() {
    let guest = Guest::start().await;
    let exec = guest
        .exec(json!({"argv": ["sh", "-c", "kill -TERM $$"]}))
        .await;
    assert_eq!(exec.exit, exit(None, Some(15), false));
}

#[tokio::test]
async fn exec_streams_large_output_intact() {
    let guest = Guest::start().await;
    let exec = guest
        .exec(json!({"argv": ["sh", "-c", "head -c 3000000 /dev/urandom | tee /dev/stderr | sha256sum >&2"]}))
        .await;
    assert_eq!(exec.exit, exit(Some(0), None, false));
    assert_eq!(exec.stdout.len(), 0);
    // stderr = the 3 MB of data followed by its checksum line.
    let (data, sum) = exec.stderr.split_at(3_000_000);
    let sum = String::from_utf8(sum.to_vec()).unwrap();
    let check = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    check.stdin.as_ref().unwrap().write_all(data).unwrap();
    let out = check.wait_with_output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), sum);
}

#[tokio::test]
async fn exec_flushes_output_as_it_arrives() {
    let guest = Guest::start().await;
    let mut conn = guest.connect().await;
    let request = json!({"argv": ["sh", "-c", "echo first; sleep 2; echo second"]});
    let start = Instant::now();
    let response = guest
        .send(
            &mut conn,
            Method::POST,
            "/v1/exec",
            Some(("application/json", serde_json::to_vec(&request).unwrap())),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "first frame took {:?}",
        start.elapsed()
    );
    let frame: Value = serde_json::from_slice(&frame).unwrap();
    assert_eq!(frame["stream"], "stdout");
    assert_eq!(
        frame["data"],
        base64::engine::general_purpose::STANDARD.encode("first\n")
    );
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(start.elapsed() >= Duration::from_secs(2));
    assert!(String::from_utf8_lossy(&rest).contains(r#""exit":{"code":0"#));
}

#[tokio::test]
async fn exec_start_errors_are_4xx() {
    let guest = Guest::start().await;
    let cases = [
        (
            json!({"argv": ["no-such-command-xyz"]}),
            404,
            "command_not_found",
        ),
        (
            json!({"argv": ["./no/such/path"]}),
            404,
            "command_not_found",
        ),
        (json!({"argv": []}), 400, "bad_request"),
        (
            json!({"argv": ["true"], "env": {"A=B": "x"}}),
            400,
            "bad_request",
        ),
        (json!({"argv": ["true"], "timeout": 5}), 400, "bad_request"),
        (
            json!({"argv": ["true"], "user": "no-such-user-xyz"}),
            404,
            "user_not_found",
        ),
        (
            json!({"argv": ["true"], "cwd": "/no/such/dir"}),
            404,
            "cwd_not_found",
        ),
        (
            json!({"argv": ["true"], "cwd": "/etc/passwd"}),
            404,
            "cwd_not_found",
        ),
        (
            json!({"argv": ["true"], "cwd": "../.."}),
            400,
            "path_escapes_root",
        ),
        // Not executable.
        (json!({"argv": ["/etc/passwd"]}), 403, "permission_denied"),
        // Executable, but /root is 0700 and nobody may not traverse it.
        (
            json!({"argv": ["true"], "user": "nobody", "cwd": "/root"}),
            403,
            "permission_denied",
        ),
    ];
    for (request, status, kind) in cases {
        let exec = guest.exec(request.clone()).await;
        assert_eq!(exec.status.as_u16(), status, "{request}: {:?}", exec.error);
        assert_eq!(exec.error["kind"], kind, "{request}");
        let message = exec.error["message"].as_str().unwrap();
        assert!(
            !message.is_empty() && !message.starts_with(char::is_uppercase),
            "{message}"
        );
    }
    let exec = guest.exec(json!({"argv": ["no-such-command-xyz"]})).await;
    assert_eq!(
        exec.error["message"],
        "command not found: no-such-command-xyz"
    );

    // A body that is not JSON at all gets the same error format.
    let (status, _, body) = guest
        .call(
            Method::POST,
            "/v1/exec",
            Some(("application/json", b"{nope".to_vec())),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["kind"], "bad_request");
}

#[tokio::test]
async fn exec_timeout_kills_the_command_quickly() {
    let guest = Guest::start().await;
    let start = Instant::now();
    let exec = guest
        .exec(json!({"argv": ["sleep", "30"], "timeout_ms": 300}))
        .await;
    let took = start.elapsed();
    assert_eq!(exec.exit, exit(None, Some(9), true));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    // The agent reaped it: not even a zombie is left.
    wait_until("sleep is gone from /proc", Duration::from_secs(5), || {
        !Path::new(&format!("/proc/{}", exec.pid)).exists()
    })
    .await;
}

#[tokio::test]
async fn exec_timeout_kills_the_whole_process_group() {
    let guest = Guest::start().await;
    let exec = guest
        .exec(json!({"argv": ["sh", "-c", "sleep 30 & echo $!; wait"], "timeout_ms": 500}))
        .await;
    assert_eq!(exec.exit["timed_out"], true);
    let grandchild: u32 = exec.stdout().trim().parse().unwrap();
    wait_until(
        "the background sleep is dead",
        Duration::from_secs(5),
        || is_dead(grandchild),
    )
    .await;
}

#[tokio::test]
async fn exec_returns_when_the_command_exits_despite_a_background_job() {
    let guest = Guest::start().await;
    let start = Instant::now();
    // The background sleep inherits stdout; we must not wait for its EOF.
    let exec = guest
        .exec(json!({"argv": ["sh", "-c", "sleep 30 & echo $!"]}))
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(exec.exit, exit(Some(0), None, false));
    let background: u32 = exec.stdout().trim().parse().unwrap();
    // By design the job survives its shell (like `cmd &` in a terminal).
    assert!(!is_dead(background));
    kill_and_wait(background).await;
}

#[tokio::test]
async fn exec_runs_as_the_requested_user() {
    let guest = Guest::start().await;
    let exec = guest
        .exec(json!({
            "argv": ["sh", "-c", "id -u; id -g; id -G; echo $USER $LOGNAME $HOME; pwd"],
            "user": "nobody"
        }))
        .await;
    assert_eq!(exec.exit, exit(Some(0), None, false), "{}", exec.stderr());
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let home = passwd
        .lines()
        .find_map(|l| l.strip_prefix("nobody:"))
        .unwrap()
        .split(':')
        .nth(4)
        .unwrap();
    // nobody's home (/nonexistent on Debian) does not exist, so cwd is /.
    let cwd = if Path::new(home).is_dir() { home } else { "/" };
    assert_eq!(
        exec.stdout(),
        format!("65534\n65534\n65534\nnobody nobody {home}\n{cwd}\n")
    );

    // By number, too.
    let exec = guest
        .exec(json!({"argv": ["id", "-u"], "user": "65534"}))
        .await;
    assert_eq!(exec.stdout(), "65534\n");
    // A uid with no passwd entry still works (as with docker exec -u).
    let exec = guest
        .exec(json!({"argv": ["id", "-u"], "user": "4242"}))
        .await;
    assert_eq!(exec.stdout(), "4242\n");
    // And the default is root, with root's home.
    let exec = guest
        .exec(json!({"argv": ["sh", "-c", "id -u; pwd"]}))
        .await;
    assert_eq!(exec.stdout(), "0\n/root\n");
}

#[tokio::test]
async fn exec_applies_env_and_cwd() {
    let guest = Guest::start().await;
    let dir = guest.dir.path().to_str().unwrap().to_owned();
    let exec = guest
        .exec(json!({
            "argv": ["sh", "-c", "echo \"$FOO\"; pwd; echo \"$PATH\"; echo \"${TERM-unset}\""],
            "env": {"FOO": "bar baz"},
            "cwd": dir,
        }))
        .await;
    assert_eq!(
        exec.stdout(),
        format!(
            "bar baz\n{dir}\n{}\nunset\n",
            drums_guest::exec::DEFAULT_PATH
        )
    );

    // The environment starts clean: nothing of the agent's (cargo's, here) leaks through.
    let exec = guest.exec(json!({"argv": ["env"]})).await;
    let mut names: Vec<String> = exec
        .stdout()
        .lines()
        .map(|l| l.split('=').next().unwrap().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["HOME", "LOGNAME", "PATH", "SHELL", "USER"]);

    // PATH from the request is used to find the program.
    let bin = guest.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("hello-drums"), "#!/bin/sh\necho hello from PATH\n").unwrap();
    std::fs::set_permissions(
        bin.join("hello-drums"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let exec = guest
        .exec(json!({"argv": ["hello-drums"], "env": {"PATH": format!("/usr/bin:/bin:{}", bin.display())}}))
        .await;
    assert_eq!(exec.stdout(), "hello from PATH\n");
    let exec = guest.exec(json!({"argv": ["hello-drums"]})).await;
    assert_eq!(exec.error["kind"], "command_not_found");
}

#[tokio::test]
async fn client_disconnect_kills_the_command() {
    let guest = Guest::start().await;
    let mut conn = guest.connect().await;
    let request = json!({"argv": ["sh", "-c", "sleep 30 & echo $!; sleep 30"]});
    let response = guest
        .send(
            &mut conn,
            Method::POST,
            "/v1/exec",
            Some(("application/json", serde_json::to_vec(&request).unwrap())),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let pid: u32 = response.headers()["x-drums-pid"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let frame: Value = serde_json::from_slice(&frame).unwrap();
    let data = base64::engine::general_purpose::STANDARD
        .decode(frame["data"].as_str().unwrap())
        .unwrap();
    let background: u32 = String::from_utf8(data).unwrap().trim().parse().unwrap();
    assert!(!is_dead(pid) && !is_dead(background));

    drop(body);
    drop(conn);

    // The leader is reaped by the agent; its background child is dead too.
    wait_until("the command is gone", Duration::from_secs(5), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    })
    .await;
    wait_until("the background job is dead", Duration::from_secs(5), || {
        is_dead(background)
    })
    .await;
}

#[tokio::test]
async fn files_round_trip_binary_data_with_mode() {
    let guest = Guest::start().await;
    let path = guest.dir.path().join("data.bin");
    let p = enc(path.to_str().unwrap());
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();

    let (status, _, body) = guest
        .call(
            Method::PUT,
            &format!("/v1/files?path={p}&mode=0600"),
            Some(("application/octet-stream", data.clone())),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!({"path": path.to_str().unwrap(), "size": data.len()})
    );
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(std::fs::read(&path).unwrap(), data);

    let (status, headers, body) = guest
        .call(Method::GET, &format!("/v1/files?path={p}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["x-drums-mode"], "0600");
    assert_eq!(headers["content-length"], data.len().to_string().as_str());
    assert_eq!(body, data);

    // Replacing without a mode keeps the file's mode and owner.
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let (status, _, _) = guest
        .call(
            Method::PUT,
            &format!("/v1/files?path={p}"),
            Some(("application/octet-stream", b"new".to_vec())),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o600, 65534, 65534)
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"new");

    // A new file without a mode gets 0644; an empty body is an empty file.
    let fresh = guest.dir.path().join("fresh");
    let (status, _, _) = guest
        .call(
            Method::PUT,
            &format!("/v1/files?path={}", enc(fresh.to_str().unwrap())),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let meta = std::fs::metadata(&fresh).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.len()), (0o644, 0));

    // No temporary files are left next to the targets.
    let mut names: Vec<String> = std::fs::read_dir(guest.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["data.bin", "fresh", "run"]);
}

#[tokio::test]
async fn files_errors() {
    let guest = Guest::start().await;
    let dir = guest.dir.path().to_str().unwrap().to_owned();
    let get = |path: String| {
        let guest = &guest;
        async move {
            guest
                .json(Method::GET, &format!("/v1/files?path={}", enc(&path)), None)
                .await
        }
    };

    let (status, body) = get(format!("{dir}/missing")).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = get(dir.clone()).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("not_a_file"))
    );
    let (status, body) = get("../../..".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["kind"], "path_escapes_root");
    assert_eq!(
        body["error"]["message"],
        "path escapes the session root: ../../.."
    );
    let (status, body) = guest.json(Method::GET, "/v1/files", None).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );

    let put = |path: String, mode: &str| {
        let guest = &guest;
        let mode = mode.to_owned();
        async move {
            let (status, _, body) = guest
                .call(
                    Method::PUT,
                    &format!("/v1/files?path={}{mode}", enc(&path)),
                    Some(("application/octet-stream", b"x".to_vec())),
                )
                .await;
            (status, serde_json::from_slice::<Value>(&body).unwrap())
        }
    };
    let (status, body) = put(format!("{dir}/no/such/dir/file"), "").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = put(dir.clone(), "").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("is_a_directory"))
    );
    let (status, body) = put("/".into(), "").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("is_a_directory"))
    );
    let (status, body) = put(format!("{dir}/f"), "&mode=999").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let (status, body) = put("a/../../b".into(), "").await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("path_escapes_root"))
    );

    // Failed uploads leave nothing behind.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["run"]);
}

#[tokio::test]
async fn dir_listing_is_sorted_with_kinds() {
    let guest = Guest::start().await;
    let root = guest.dir.path().join("listing");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("b.txt"), "hello").unwrap();
    std::fs::set_permissions(root.join("b.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::create_dir(root.join("a-dir")).unwrap();
    std::os::unix::fs::symlink("b.txt", root.join("c-link")).unwrap();
    nix::unistd::mkfifo(
        &root.join("d-fifo"),
        nix::sys::stat::Mode::from_bits(0o600).unwrap(),
    )
    .unwrap();

    let path = root.to_str().unwrap();
    let (status, body) = guest
        .json(
            Method::GET,
            &format!("/v1/dir?path={}", enc(&format!("{path}/./"))),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["path"], path);
    let entries = body["entries"].as_array().unwrap();
    let summary: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        summary,
        [
            ("a-dir", "dir"),
            ("b.txt", "file"),
            ("c-link", "symlink"),
            ("d-fifo", "other")
        ]
    );
    assert_eq!(entries[1]["size"], 5);
    assert_eq!(entries[1]["mode"], "0640");

    let (status, body) = guest
        .json(
            Method::GET,
            &format!("/v1/dir?path={}", enc(&format!("{path}/b.txt"))),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("not_a_directory"))
    );
    let (status, body) = guest
        .json(
            Method::GET,
            &format!("/v1/dir?path={}", enc(&format!("{path}/nope"))),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = guest.json(Method::GET, "/v1/dir?path=../../..", None).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("path_escapes_root"))
    );

    // Downloading a FIFO is refused (not hung on).
    let (status, body) = guest
        .json(
            Method::GET,
            &format!("/v1/files?path={}", enc(&format!("{path}/d-fifo"))),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::BAD_REQUEST, Some("not_a_file"))
    );
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let guest = Guest::start().await;
    let (status, body) = guest.json(Method::GET, "/v2/nothing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["kind"], "not_found");
    assert_eq!(body["error"]["message"], "no such endpoint: /v2/nothing");
    let (status, body) = guest.json(Method::DELETE, "/v1/health", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"]["kind"], "method_not_allowed");
}

/// A refused upload whose body is still on its way (drumsd streams the
/// user's upload) gets its answer: the agent reads the rest of the body
/// before answering, instead of closing the connection on it, which made the
/// sender's next write fail with EPIPE and lost the 400 (found by the fuzzer
/// as a 502 from drumsd).
#[tokio::test]
async fn a_refused_upload_is_answered_even_when_its_body_comes_late() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let guest = Guest::start().await;
    let dir = guest.dir.path().to_str().unwrap().to_owned();
    let body = vec![b'x'; 4096];
    for query in [
        format!("path={}&mode=999", enc(&format!("{dir}/f"))),
        format!("path={}", enc(&format!("{dir}/no/such/dir/f"))),
        "mode=0644".to_owned(),
    ] {
        let mut stream = UnixStream::connect(&guest.sock).await.unwrap();
        let head = format!(
            "PUT /v1/files?{query} HTTP/1.1\r\nhost: guest\r\n\
             content-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        // Long enough for an agent that answers at once to have answered
        // and closed.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stream
            .write_all(&body)
            .await
            .unwrap_or_else(|e| panic!("{query}: the agent closed before the body came: {e}"));
        let mut answer = String::new();
        let mut buf = [0u8; 4096];
        while !answer.contains("\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "{query}: no answer");
            answer.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let status = answer.split(' ').nth(1).unwrap();
        assert!(
            status == "400" || status == "404",
            "{query}: answered {answer}"
        );
    }
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["run"], "a refused upload left a file");
}
