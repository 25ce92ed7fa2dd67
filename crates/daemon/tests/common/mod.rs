//! A drumsd per test, with its own state directory, bridge, subnet and cgroup
//! parent, so tests run in parallel without touching each other, and a leak
//! check that every test ends with.
//!
//! These tests need root and the images set-up builds. Without root they fail
//! with a message saying so: they never pass by skipping.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use drums_api::{Client, CreateSession, Session};
use hyper::Method;

pub mod llm;
pub mod oci;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Run a test's async body on a runtime of its own.
pub fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (namespaces, mounts, cgroups); CI runs it as root. NOT SKIPPED: failing on purpose"
    );
}

pub fn bin_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_BIN_EXE_drumsd"))
        .parent()
        .unwrap()
        .to_path_buf();
    for b in ["drums-init", "drums-guest", "drums", "drums-bench"] {
        assert!(
            d.join(b).exists(),
            "{} missing: build the workspace's binaries first (`make test` does)",
            d.join(b).display()
        );
    }
    d
}

pub fn images_dir() -> PathBuf {
    let d = PathBuf::from(
        std::env::var("DRUMS_IMAGES_DIR").unwrap_or_else(|_| "/var/lib/drums/images".into()),
    );
    assert!(
        d.join("default/image.json").exists(),
        "no default image in {}: run scripts/setup.sh",
        d.display()
    );
    d
}

pub struct TestDaemon {
    pub state: tempfile::TempDir,
    pub bridge: String,
    pub cgroup_parent: String,
    pub child: Option<Child>,
    pub client: Client,
    /// Flags added to every start of this daemon.
    pub extra_args: Vec<String>,
    /// Variables added to its environment at every start.
    pub extra_env: Vec<(String, String)>,
    /// Where its LLM proxy listens for agents on the host (a port of its
    /// own, since tests run daemons side by side).
    pub proxy_local: std::net::SocketAddr,
}

impl TestDaemon {
    pub fn start() -> TestDaemon {
        TestDaemon::start_with(&[])
    }

    /// [`TestDaemon::start`] with more drumsd flags.
    pub fn start_with(extra_args: &[&str]) -> TestDaemon {
        TestDaemon::start_with_env(extra_args, &[])
    }

    /// [`TestDaemon::start_with`], with variables added to its environment.
    pub fn start_with_env(extra_args: &[&str], env: &[(&str, &str)]) -> TestDaemon {
        require_root();
        let k = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = (std::process::id() % 200) as u32 + k * 7;
        let state = tempfile::Builder::new()
            .prefix("drumstest")
            .tempdir()
            .unwrap();
        let d = TestDaemon {
            // Bounded as the CLI's calls are (CLI_CALL_LIMIT): a hung call
            // fails its test instead of holding the run.
            client: Client::new(state.path().join("drumsd.sock"))
                .with_limits(Some(CLI_CALL_LIMIT), None),
            bridge: format!("drt{}x{}", std::process::id() % 100000, k),
            cgroup_parent: format!("drums-test-{}-{}", std::process::id(), k),
            state,
            child: None,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            // Below the kernel's ephemeral range (32768 and up by default):
            // a port in it may be any connection's source port when drumsd
            // binds it (it was: "Address already in use", and the test's
            // own retried connect then reached itself, a TCP self-connect).
            proxy_local: std::net::SocketAddr::from((
                [127, 0, 0, 1],
                10000 + (std::process::id() % 1400) as u16 * 16 + (k % 16) as u16,
            )),
        };
        let subnet = format!("10.214.{}.0/24", tag % 250);
        let mut d = d;
        d.child = Some(d.spawn(&subnet));
        d.wait_up();
        d
    }

    fn spawn(&self, subnet: &str) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        // A test may bring images of its own (`--images-dir` among its flags).
        let images = (!self.extra_args.iter().any(|a| a == "--images-dir"))
            .then(|| ["--images-dir".into(), images_dir()]);
        Command::new(env!("CARGO_BIN_EXE_drumsd"))
            .arg("--state-dir")
            .arg(self.state.path())
            .args(images.into_iter().flatten())
            .arg("--bin-dir")
            .arg(bin_dir())
            .args([
                "--bridge",
                &self.bridge,
                "--subnet",
                subnet,
                "--cgroup-parent",
                &self.cgroup_parent,
            ])
            .args(
                // A test may size the store itself.
                (!self.extra_args.iter().any(|a| a == "--store-gib"))
                    .then_some(["--store-gib", "4"])
                    .into_iter()
                    .flatten(),
            )
            .arg("--enable-fault-injection")
            .args(["--llm-proxy-local", &self.proxy_local.to_string()])
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    pub fn subnet(&self) -> String {
        let cmd = std::fs::read_to_string(format!(
            "/proc/{}/cmdline",
            self.child.as_ref().unwrap().id()
        ))
        .unwrap();
        let args: Vec<&str> = cmd.split('\0').collect();
        args[args.iter().position(|a| *a == "--subnet").unwrap() + 1].to_owned()
    }

    pub fn log_path(&self) -> PathBuf {
        self.state.path().join("drumsd.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn wait_up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(self.client.socket()).is_ok() {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("drumsd exited with {st} during start:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("drumsd did not come up:\n{}", self.log());
    }

    /// Start a new daemon on the same state directory (after a crash).
    pub fn restart(&mut self, subnet: &str) {
        self.child = Some(self.spawn(subnet));
        self.wait_up();
    }

    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM and wait: the daemon removes every session and its own resources.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "drumsd exited with {st}:\n{}", self.log());
                    break;
                }
                if Instant::now() > deadline {
                    // Not left running after the test.
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("drumsd did not stop within 60 s:\n{}", self.log());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Stop, then prove nothing of this daemon is left on the host.
    pub fn stop_and_check_leaks(&mut self) {
        self.stop();
        // Teardown finishes asynchronously in the kernel: a killed process
        // lingers for a moment, and a loop device detaches once the last mount
        // namespace holding its file system is gone (another test's session
        // may hold a copy for the few milliseconds before its pivot_root).
        // A real leak outlasts this bounded wait.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut leaks = self.leaks();
        while !leaks.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            leaks = self.leaks();
        }
        assert!(
            leaks.is_empty(),
            "leaked host resources:\n{}\n--- drumsd log ---\n{}",
            leaks.join("\n"),
            self.log()
        );
    }

    /// Every kind of host resource a daemon makes, looked for by this daemon's
    /// names: mounts under its state dir, its bridge, its firewall's nft tables
    /// and any veth on it, its
    /// cgroups in every hierarchy, processes in them, and its loop device.
    pub fn leaks(&self) -> Vec<String> {
        let mut out = Vec::new();
        let state = self.state.path().display().to_string();
        for l in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
        {
            if l.contains(&state) {
                out.push(format!("mount: {l}"));
            }
        }
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            out.push(format!("link: bridge {}", self.bridge));
        }
        match drums_net::firewall::exists(&self.bridge) {
            Ok(false) => {}
            Ok(true) => out.push(format!(
                "nft tables: {}",
                drums_net::firewall::table_name(&self.bridge)
            )),
            Err(e) => out.push(format!("nft tables: cannot list: {e}")),
        }
        out.extend(
            self.session_links()
                .into_iter()
                .map(|l| format!("link: {l}")),
        );
        for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let p = h.path().join(&self.cgroup_parent);
            if p.exists() {
                out.push(format!("cgroup: {}", p.display()));
            }
        }
        for pid in self.processes() {
            out.push(format!(
                "process: {pid} {}",
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .unwrap_or_default()
                    .trim()
            ));
        }
        for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
            let bf = e.path().join("loop/backing_file");
            if let Ok(f) = std::fs::read_to_string(&bf) {
                if f.contains(&state) {
                    out.push(format!(
                        "loop device: {} -> {}",
                        e.file_name().to_string_lossy(),
                        f.trim()
                    ));
                }
            }
        }
        let sessions = self.state.path().join("sessions");
        if let Ok(rd) = std::fs::read_dir(&sessions) {
            for e in rd.flatten() {
                out.push(format!("session dir: {}", e.path().display()));
            }
        }
        out
    }

    /// Processes whose cgroup lies under this daemon's cgroup parent.
    pub fn processes(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                // A zombie handed to the host's init (after a daemon was killed)
                // is dead and waits for that init to reap it: not ours to leak.
                if dead_zombie(pid, self.child.as_ref().map(|c| c.id() as i32)) {
                    continue;
                }
                if cg.contains(&format!("/{}/", self.cgroup_parent)) {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// Veths attached to this daemon's bridge.
    pub fn session_links(&self) -> Vec<String> {
        std::fs::read_dir(Path::new("/sys/class/net").join(&self.bridge).join("brif"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Checkpoint `id`'s directory (manifest and CRIU images), in the store.
    pub fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.state.path().join("store/checkpoint-images").join(id)
    }

    /// Where a checkpoint's files may be, each of which must be empty when
    /// no checkpoint exists: version directories (the state's are an older
    /// drums'), snapshots, sibling views of images, staged dumps.
    pub fn checkpoint_places(&self) -> Vec<PathBuf> {
        [
            "checkpoints",
            "store/checkpoints",
            "store/checkpoint-images",
            "store/restore-views",
            "dump-staging",
        ]
        .iter()
        .map(|p| self.state.path().join(p))
        .collect()
    }

    pub fn store_subvolumes(&self) -> Vec<String> {
        std::fs::read_dir(self.state.path().join("store/sessions"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub async fn create(&self, req: &CreateSession) -> Result<Session, drums_api::ClientError> {
        self.client
            .json(Method::POST, "/v1/sessions", Some(req))
            .await
    }

    /// A checkpoint of `session`; failing the test (with the daemon's log)
    /// if it cannot be taken.
    pub async fn checkpoint(
        &self,
        session: &str,
        clean: bool,
        leave_running: bool,
    ) -> drums_api::Checkpoint {
        let req = drums_api::CreateCheckpoint {
            session: session.into(),
            name: None,
            clean,
            leave_running,
        };
        self.client
            .json(Method::POST, "/v1/checkpoints", Some(&req))
            .await
            .unwrap_or_else(|e| panic!("checkpoint: {e}\n{}", self.log()))
    }

    /// `count` unnamed siblings of checkpoint `ck`.
    pub async fn restore(
        &self,
        ck: &str,
        count: usize,
    ) -> Result<drums_api::RestoreResult, drums_api::ClientError> {
        self.client
            .json(
                Method::POST,
                &format!("/v1/checkpoints/{ck}/restore"),
                Some(&drums_api::RestoreRequest { count, name: None }),
            )
            .await
    }

    /// `GET /v1/audit` of two sessions, as `T` (the typed report or raw JSON).
    pub async fn audit<T: serde::de::DeserializeOwned>(&self, a: &str, b: &str) -> T {
        self.client
            .json(Method::GET, &format!("/v1/audit?a={a}&b={b}"), None::<&()>)
            .await
            .unwrap_or_else(|e| panic!("audit {a} {b}: {e}"))
    }

    pub async fn rm(&self, id: &str) -> Result<(), drums_api::ClientError> {
        self.client
            .call(Method::DELETE, &format!("/v1/sessions/{id}"), None::<&()>)
            .await
            .map(|_| ())
    }

    pub async fn arm(&self, point: Option<&str>) {
        self.client
            .call(
                Method::POST,
                "/v1/debug/faults",
                Some(&drums_api::Fault {
                    point: point.map(str::to_owned),
                    hold: false,
                }),
            )
            .await
            .unwrap();
    }

    /// After a failed create or restore: no session row, and none of the host
    /// resources a session owns (processes, given a moment to die; veths;
    /// subvolumes) is left.
    pub async fn assert_no_session_left(&self, point: &str) {
        let l: drums_api::SessionList = self
            .client
            .json(Method::GET, "/v1/sessions", None::<&()>)
            .await
            .unwrap();
        assert!(l.sessions.is_empty(), "{point}: sessions left");
        assert!(
            gone(|| self.processes().is_empty()),
            "{point}: processes left {:?}",
            self.processes()
        );
        assert!(
            self.session_links().is_empty(),
            "{point}: veths left {:?}",
            self.session_links()
        );
        let ports = drums_net::firewall::ports(&self.bridge).unwrap();
        assert!(ports.is_empty(), "{point}: firewall ports left {ports:?}");
        assert!(
            self.store_subvolumes().is_empty(),
            "{point}: subvolumes left {:?}",
            self.store_subvolumes()
        );
    }

    /// A turn of session `s` (running `script`) whose end takes a version
    /// with `policy`, waited for; failing the test (with the daemon's log)
    /// unless the version is done.
    pub async fn turn_version(
        &self,
        s: &str,
        script: &str,
        policy: drums_api::Policy,
    ) -> drums_api::SessionVersion {
        self.client
            .call(
                Method::POST,
                &format!("/v1/sessions/{s}/turn/begin"),
                None::<&()>,
            )
            .await
            .unwrap_or_else(|e| panic!("turn begin of {s}: {e}\n{}", self.log()));
        let (code, out, err) = self.sh(s, script);
        assert_eq!(code, 0, "{script}: {out} {err}");
        let e: drums_api::TurnEffects = self
            .client
            .json(
                Method::POST,
                &format!("/v1/sessions/{s}/turn/end"),
                Some(&drums_api::EndTurn {
                    checkpoint: true,
                    policy: Some(policy),
                    wait: true,
                }),
            )
            .await
            .unwrap_or_else(|e| panic!("turn end of {s}: {e}\n{}", self.log()));
        let v = e
            .checkpoint
            .as_ref()
            .and_then(|c| c.version.clone())
            .unwrap_or_else(|| panic!("the turn of {s} took no version: {e:#?}"));
        assert_eq!(
            v.state,
            drums_api::VersionState::Done,
            "{v:#?}\n{}",
            self.log()
        );
        v
    }

    /// SIGKILLs session `s`'s init from the host, then `drums recover`s it.
    pub async fn kill_and_recover(&self, s: &str) {
        let now: drums_api::Session = self
            .client
            .json(Method::GET, &format!("/v1/sessions/{s}"), None::<&()>)
            .await
            .unwrap();
        let init = now.init_pid.expect("a running session has an init");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(init),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        assert!(gone(|| !drums_session::process::alive(init)));
        ok(&self.drums(&["recover", s]), &format!("recover {s}"));
    }

    /// The drums CLI against this daemon.
    pub fn drums(&self, args: &[&str]) -> Output {
        bounded(
            Command::new(bin_dir().join("drums"))
                .arg("--state-dir")
                .arg(self.state.path())
                .arg("--no-autostart")
                .args(args),
        )
    }

    /// Run a shell command in a session through the CLI: (exit code, stdout).
    pub fn sh(&self, session: &str, script: &str) -> (i32, String, String) {
        exec_in(self.state.path(), session, script)
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        // A failed test must not leak either: stop the daemon, which removes
        // everything it owns.
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            // Bounded: a drumsd hung in its shutdown must not hold the whole
            // run (the test fails anyway, and says where below).
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(c.try_wait(), Ok(None)) {
                if Instant::now() > deadline {
                    eprintln!(
                        "TestDaemon: drumsd did not stop within 60 s of SIGTERM; killed. Its log:\n{}",
                        self.log()
                    );
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // The binaries drumsd installed beside the state directory.
        let _ =
            std::fs::remove_dir_all(drums_session::manager::installed_bin_dir(self.state.path()));
    }
}

/// A CLI call that must succeed: its stdout, trimmed; `what` names it in
/// the failure, with both streams.
pub fn ok(o: &std::process::Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// A CLI call that must fail: its stderr, trimmed.
pub fn fails(o: &std::process::Output, what: &str) -> String {
    assert!(
        !o.status.success(),
        "{what}: succeeded but must not\nstdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).trim().to_owned()
}

/// `drums exec SESSION -- sh -c SCRIPT` against the daemon at `state`: (exit
/// code, stdout, stderr). Free of the TestDaemon, to run beside a failure.
pub fn exec_in(state: &Path, session: &str, script: &str) -> (i32, String, String) {
    let o = bounded(
        Command::new(bin_dir().join("drums"))
            .arg("--state-dir")
            .arg(state)
            .arg("--no-autostart")
            .args(["exec", session, "--", "sh", "-c", script]),
    );
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        String::from_utf8_lossy(&o.stderr).trim().to_owned(),
    )
}

/// No CLI call of a test takes this long; one that does is hung, and fails
/// the test with what it printed so far rather than hold the whole run
/// until CI's own limit kills it without a word.
const CLI_CALL_LIMIT: Duration = Duration::from_secs(300);

/// `cmd`'s output, its stdin closed; killed, and the test failed, past
/// [`CLI_CALL_LIMIT`].
pub fn bounded(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    // Drained beside the wait: a full pipe would stall the child.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let deadline = Instant::now() + CLI_CALL_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {CLI_CALL_LIMIT:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.join().unwrap()),
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// A zombie has released its memory, files and namespaces; one whose parent
/// is not the daemon waits for another process (the host's init) to reap it,
/// so it is not the daemon's to leak. A zombie child of the daemon is a leak.
/// A teardown's killed processes take a moment to die: wait, bounded.
pub fn gone(check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn dead_zombie(pid: i32, daemon: Option<i32>) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let mut f = stat[close + 2..].split(' ');
    let state = f.next();
    let ppid = f.next().and_then(|p| p.parse::<i32>().ok());
    state == Some("Z") && ppid != daemon
}

/// The fields an OpenAPI schema requires are present in a JSON value
/// (shallow: the document's own required lists, not a full validator).
pub fn assert_schema(schema: &str, v: &serde_json::Value) {
    let doc: serde_yaml::Value = serde_yaml::from_str(drums_api::OPENAPI_YAML).unwrap();
    let s = &doc["components"]["schemas"][schema];
    assert!(!s.is_null(), "no schema {schema} in openapi.yaml");
    if let Some(req) = s["required"].as_sequence() {
        for f in req {
            let f = f.as_str().unwrap();
            assert!(
                v.get(f).is_some(),
                "{schema} response lacks required field {f}: {v}"
            );
        }
    }
}

/// Every operation of `api/openapi.yaml`: (method in lowercase, path, the
/// operation's object).
pub fn spec_operations() -> Vec<(String, String, serde_yaml::Value)> {
    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];
    let doc: serde_yaml::Value = serde_yaml::from_str(drums_api::OPENAPI_YAML).unwrap();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_mapping().unwrap() {
        for (method, op) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap();
            if METHODS.contains(&method) {
                out.push((
                    method.to_owned(),
                    path.as_str().unwrap().to_owned(),
                    op.clone(),
                ));
            }
        }
    }
    out
}
