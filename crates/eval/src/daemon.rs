//! The drumsd an eval worker drives: its own state directory, bridge, subnet
//! and cgroup parent, so that workers never share a daemon (a `kill -9` of
//! one is a fault of its worker's session only), and the turn policy of the
//! strategy it runs. A fault kills it with SIGKILL; it is started again on
//! the same state, as a supervisor would.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use drums_api::{Client, Policy};
use tokio::process::{Child, Command};

use crate::EvalError;

/// Where every eval daemon's binaries and images are.
#[derive(Debug, Clone)]
pub struct Setup {
    pub bin_dir: PathBuf,
    pub images_dir: PathBuf,
    /// The mock LLM upstream every daemon sends OpenAI requests to.
    pub upstream: SocketAddr,
    /// Under which each daemon gets a state directory.
    pub work: PathBuf,
    /// Where the daemons' logs go (kept with the results).
    pub logs: PathBuf,
    /// The second octet of the daemons' subnets, `10.NET.N.0/24`.
    pub net: u8,
}

/// A second octet for the eval's subnets, in 10.217-10.240, that no route
/// of this host uses yet: another eval (or a test's) may run beside this
/// one.
pub fn free_net() -> Result<u8, EvalError> {
    let path = Path::new("/proc/net/route");
    let routes = std::fs::read_to_string(path).map_err(|e| EvalError::io("read", path, e))?;
    // Destinations are hex, in the host's (little-endian) byte order.
    let used: Vec<u8> = routes
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|d| u32::from_str_radix(d, 16).ok())
        .map(u32::to_le_bytes)
        .filter(|b| b[0] == 10)
        .map(|b| b[1])
        .collect();
    (217..=240)
        .find(|n| !used.contains(n))
        .ok_or_else(|| EvalError::Daemon("no free subnet in 10.217.0.0-10.240.255.255".into()))
}

/// What an agent needs of a drumsd: its API and its LLM proxy. Both stay
/// the same across a restart.
#[derive(Debug, Clone)]
pub struct Handle {
    pub client: Client,
    /// The LLM proxy for agents on this host.
    pub proxy: SocketAddr,
}

pub struct Drumsd {
    pub handle: Handle,
    pub policy: Policy,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// The daemon's pid, for `kill -9`.
    pid: Option<i32>,
}

impl Drumsd {
    /// Starts daemon number `n` (0..250) of this eval with `policy`.
    pub async fn start(setup: &Setup, n: u32, policy: Policy) -> Result<Drumsd, EvalError> {
        let tag = tag();
        let state = setup.work.join(format!("drumsd-{n}"));
        std::fs::create_dir_all(&state).map_err(|e| EvalError::io("create", &state, e))?;
        std::fs::create_dir_all(&setup.logs)
            .map_err(|e| EvalError::io("create", &setup.logs, e))?;
        let proxy = free_port()?;
        let args = vec![
            "--state-dir".into(),
            state.display().to_string(),
            "--images-dir".into(),
            setup.images_dir.display().to_string(),
            "--bin-dir".into(),
            setup.bin_dir.display().to_string(),
            "--bridge".into(),
            format!("drev{tag}x{n}"),
            "--subnet".into(),
            format!("10.{}.{n}.0/24", setup.net),
            "--cgroup-parent".into(),
            format!("drums-eval-{tag}-{n}"),
            "--store-gib".into(),
            "8".into(),
            "--enable-fault-injection".into(),
            "--turn-policy".into(),
            policy.as_str().into(),
            "--llm-upstream".into(),
            format!("openai=http://{}", setup.upstream),
            "--llm-proxy-local".into(),
            proxy.to_string(),
            // Agents here are outside: no proxy or session API on the bridge
            // is needed, but both stay, as a user's drumsd has them.
        ];
        let mut d = Drumsd {
            handle: Handle {
                client: Client::new(state.join("drumsd.sock")),
                proxy,
            },
            policy,
            log: setup
                .logs
                .join(format!("drumsd-{n}-{}.log", policy.as_str())),
            args,
            child: None,
            pid: None,
        };
        d.spawn(&setup.bin_dir).await?;
        Ok(d)
    }

    pub fn log_path(&self) -> PathBuf {
        self.log.clone()
    }

    /// Starts drumsd and waits for its API (drumsd itself waits for a killed
    /// predecessor's state lock to be let go).
    async fn spawn(&mut self, bin_dir: &Path) -> Result<(), EvalError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| EvalError::io("open", &self.log_path(), e))?;
        let err = log
            .try_clone()
            .map_err(|e| EvalError::io("open", &self.log_path(), e))?;
        let drumsd = bin_dir.join("drumsd");
        let mut cmd = Command::new(&drumsd);
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; it runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // An eval killed (Ctrl-C, SIGTERM) takes its daemons with it:
                // each gets SIGTERM and removes what it made.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| EvalError::io("start", &drumsd, e))?;
        self.pid = child.id().map(|p| p as i32);
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self
                .handle
                .client
                .json::<drums_api::Version>(hyper::Method::GET, "/v1/version", None::<&()>)
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(EvalError::Daemon(format!(
                    "drumsd exited with {st} at its start; log {}",
                    self.log_path().display()
                )));
            }
            if Instant::now() > deadline {
                return Err(EvalError::Daemon(format!(
                    "drumsd did not answer within 60 s; log {}",
                    self.log_path().display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the daemon is still running (a restart may have failed).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `kill -9`, then a new drumsd on the same state, once the old one is
    /// reaped.
    pub async fn kill9_and_restart(&mut self, bin_dir: &Path) -> Result<(), EvalError> {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        self.spawn(bin_dir).await
    }

    /// SIGTERM: drumsd removes every session and its own resources.
    pub async fn stop(mut self) -> Result<(), EvalError> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = self.pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let st = tokio::time::timeout(Duration::from_secs(120), c.wait())
            .await
            .map_err(|_| EvalError::Daemon("drumsd did not stop within 120 s".into()))?
            .map_err(|e| EvalError::io("wait for", Path::new("drumsd"), e))?;
        if !st.success() {
            return Err(EvalError::Daemon(format!(
                "drumsd exited with {st}; log {}",
                self.log_path().display()
            )));
        }
        Ok(())
    }
}

/// What names this eval's host resources apart from another's: its pid,
/// cut to fit a bridge's name (`drevTAGxN`).
pub fn tag() -> u32 {
    std::process::id() % 10_000
}

/// A free port on 127.0.0.1 for a daemon's proxy (taken back right away;
/// nothing else of this eval binds ports).
fn free_port() -> Result<SocketAddr, EvalError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| EvalError::io("bind", Path::new("127.0.0.1:0"), e))?;
    l.local_addr()
        .map_err(|e| EvalError::io("bind", Path::new("127.0.0.1:0"), e))
}
