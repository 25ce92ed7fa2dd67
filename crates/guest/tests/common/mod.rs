//! Shared by the hygiene tests: the real `drums-guest` binary in its own UTS
//! namespace, an HTTP client for it, and Python registrants using the hook
//! that images ship.
//!
//! `POST /v1/hygiene` calls sethostname(2). Run in the test process, it
//! would rename the machine running the tests, so the agent always runs as a
//! separate process under `unshare --uts`, and [`SandboxedGuest::start`]
//! checks that its UTS namespace differs from ours before any test talks to
//! it. Its etc and run directories are temporary directories (`--etc-dir`,
//! `--run-dir`). These tests need root, as the agent does.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tempfile::TempDir;

/// What drums-init writes into a new session's /etc.
pub const OLD_HOSTNAME: &str = "old-host";
pub const OLD_HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                             127.0.1.1\told-host\n10.213.0.5\told-host\n";
pub const OLD_MACHINE_ID: &str = "11111111111111111111111111111111";

pub struct SandboxedGuest {
    pub dir: TempDir,
    pub etc: PathBuf,
    pub run: PathBuf,
    pub sock: PathBuf,
    child: Child,
}

impl SandboxedGuest {
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// The agent as a confined session runs it: root, but without
    /// CAP_SYS_PTRACE (drums-init's capability set), so it may not look at
    /// other users' processes' open files as host root may.
    pub async fn start_confined() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(confined: bool) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the hygiene tests need root (unshare, sethostname, signalling other processes)"
        );
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        let run = dir.path().join("run");
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("hostname"), format!("{OLD_HOSTNAME}\n")).unwrap();
        std::fs::write(etc.join("hosts"), OLD_HOSTS).unwrap();
        std::fs::write(etc.join("machine-id"), format!("{OLD_MACHINE_ID}\n")).unwrap();
        let sock = dir.path().join("guest.sock");
        let log = std::fs::File::create(dir.path().join("guest.log")).unwrap();
        // No --fork: unshare execs the agent, so the child's pid is the
        // agent's and killing it leaves nothing in the namespace.
        // setpriv (util-linux) execs too: dropped from the bounding set
        // before the exec, the capability is in none of the agent's sets.
        let mut cmd = Command::new("unshare");
        cmd.arg("--uts").arg("--");
        if confined {
            cmd.args(["setpriv", "--bounding-set=-sys_ptrace", "--"]);
        }
        let child = cmd
            .arg(env!("CARGO_BIN_EXE_drums-guest"))
            .arg(format!("--listen=unix:{}", sock.display()))
            .arg(format!("--etc-dir={}", etc.display()))
            .arg(format!("--run-dir={}", run.display()))
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("failed to run unshare (util-linux)");
        let mut guest = Self {
            dir,
            etc,
            run,
            sock,
            child,
        };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&guest.sock).is_err() {
            if let Some(status) = guest.child.try_wait().unwrap() {
                panic!("the agent exited ({status}): {}", guest.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the agent did not start: {}",
                guest.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let theirs = std::fs::read_link(format!("/proc/{}/ns/uts", guest.pid())).unwrap();
        let ours = std::fs::read_link("/proc/self/ns/uts").unwrap();
        assert_ne!(
            theirs, ours,
            "the agent must run in its own UTS namespace, or hygiene renames this machine"
        );
        guest
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("guest.log")).unwrap_or_default()
    }

    pub fn reseed_dir(&self) -> PathBuf {
        self.run.join("reseed")
    }

    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Vec<u8>) {
        let stream = tokio::net::UnixStream::connect(&self.sock).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "guest");
        let body = match body {
            Some(v) => {
                builder = builder.header("content-type", "application/json");
                Full::new(Bytes::from(serde_json::to_vec(&v).unwrap()))
            }
            None => Full::new(Bytes::new()),
        };
        let response = sender
            .send_request(builder.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        conn.abort();
        (status, bytes)
    }

    pub async fn json(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (status, bytes) = self.call(method, uri, body).await;
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{uri}: not JSON ({e}): {}", String::from_utf8_lossy(&bytes))
        });
        (status, value)
    }

    /// Runs a command through `/v1/exec` (so inside the agent's namespaces)
    /// and returns its stdout.
    pub async fn exec_stdout(&self, argv: &[&str]) -> String {
        let (status, bytes) = self
            .call(
                Method::POST,
                "/v1/exec",
                Some(serde_json::json!({"argv": argv})),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        let mut out = Vec::new();
        for line in String::from_utf8(bytes).unwrap().lines() {
            let frame: Value = serde_json::from_str(line).unwrap();
            if frame["stream"] == "stdout" {
                out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(frame["data"].as_str().unwrap())
                        .unwrap(),
                );
            }
        }
        String::from_utf8(out).unwrap()
    }
}

impl Drop for SandboxedGuest {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(5) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Debian's interpreter, as in the images; any python3 otherwise.
pub fn python3() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Writes the hook (exactly as images ship it) and a stand-in `numpy` whose
/// `random.seed` records its calls into `dir`, for `PYTHONPATH`.
pub fn write_python_path(dir: &Path) -> PathBuf {
    let lib = dir.join("pylib");
    std::fs::create_dir_all(lib.join("numpy")).unwrap();
    std::fs::write(lib.join("drums_reseed.py"), drums_image::RESEED_MODULE).unwrap();
    std::fs::write(lib.join("numpy/__init__.py"), "from . import random\n").unwrap();
    std::fs::write(
        lib.join("numpy/random.py"),
        "seeded = []\n\ndef seed(value):\n    seeded.append(value)\n",
    )
    .unwrap();
    lib
}

/// A registrant that behaves like a clone: it imports the hook (as the .pth
/// does at start-up), loads numpy, then seeds `random` with 1, so every copy
/// has the same state. It prints `ready <pid>`, waits for its ack file, then
/// prints its next `random.random()`, how often numpy was reseeded and the
/// ack's content (before it exits and deregisters, removing the ack).
pub const REGISTRANT: &str = r#"
import os, sys, time, random
import drums_reseed
import numpy
random.seed(1)
# os.write: one write(2) per line, so a forked copy's lines never interleave.
os.write(1, b"ready %d\n" % os.getpid())
ack = os.path.join(os.environ["DRUMS_RUN_DIR"], "reseed", "%d.ack" % os.getpid())
deadline = time.monotonic() + 60
while not os.path.exists(ack):
    if time.monotonic() > deadline:
        sys.exit("no ack")
    time.sleep(0.005)
with open(ack) as f:
    acked = f.read().strip()
os.write(1, b"%r %d %s\n" % (random.random(), len(numpy.random.seeded), acked.encode()))
"#;

/// `random.random()` right after `random.seed(1)`: what every clone would
/// draw without the reseed.
pub const SEED_1_DRAW: f64 = 0.13436424411240122;

/// A child process in its own process group; dropping it kills the group
/// (so forked children too, when a test fails half-way) and reaps it.
pub struct Proc {
    pub child: Child,
    pub stdout: Option<BufReader<ChildStdout>>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Self {
        use std::os::unix::process::CommandExt;
        let mut child = cmd.process_group(0).spawn().expect("failed to spawn");
        let stdout = child.stdout.take().map(BufReader::new);
        Self { child, stdout }
    }

    /// A registrant running [`REGISTRANT`] (or `script`) with the hook
    /// pointed at `run`.
    pub fn python(script: &str, pythonpath: &Path, run: &Path) -> Self {
        Self::spawn(
            Command::new(python3())
                .args(["-S", "-c", script])
                .env("PYTHONPATH", pythonpath)
                .env("DRUMS_RUN_DIR", run)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout
            .as_mut()
            .expect("stdout is piped")
            .read_line(&mut line)
            .unwrap();
        line
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        // Only while the leader is unreaped is the group id surely ours.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Polls `cond` every 5 ms for up to 10 s.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

pub fn hostname() -> String {
    nix::unistd::gethostname().unwrap().into_string().unwrap()
}
