//! A drumsd of a bench's or the evaluation's own: its own state directory,
//! bridge, subnet, cgroup parent and LLM proxy port, so that it shares
//! nothing with the host's drumsd or with another one started beside it.
//! `drums eval` runs its workers on these, and `drums bench … --ab` its two
//! arms (ab.rs).
//!
//! The daemon is started with `PR_SET_PDEATHSIG`: a bench or an eval killed
//! (Ctrl-C, SIGTERM) takes its daemons with it, and each removes what it
//! made. [`Private::stop`] stops whichever process answers on its socket,
//! so a daemon that a bench killed and started again (respawn.rs) is
//! stopped as well.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use drums_api::Client;
use tokio::process::{Child, Command};

/// Starting or stopping a private drumsd.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("drumsd exited with {status} at its start; log {}", log.display())]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("drumsd did not answer within {secs} s; log {}", log.display())]
    NotUp { secs: u64, log: PathBuf },
    #[error("drumsd (pid {pid}) did not stop within {secs} s; log {}", log.display())]
    NotDown { pid: i32, secs: u64, log: PathBuf },
    #[error("drumsd exited with {status} at its stop; log {}", log.display())]
    StopFailed {
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("no free subnet in 10.217.0.0-10.240.255.255")]
    NoSubnet,
}

impl DaemonError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> DaemonError {
        DaemonError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

/// How long a daemon may take to answer after its start (it recovers its
/// sessions first), and to remove everything after SIGTERM.
const UP_WITHIN: Duration = Duration::from_secs(60);
const DOWN_WITHIN: Duration = Duration::from_secs(120);

/// What a private drumsd is started with.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The drumsd binary; its `drums-init` and `drums-guest` are in `bin_dir`.
    pub drumsd: PathBuf,
    pub bin_dir: PathBuf,
    pub images_dir: PathBuf,
    /// Its state directory (made if missing).
    pub state: PathBuf,
    /// Its bridge's name (at most 15 bytes).
    pub bridge: String,
    /// Its sessions' subnet, `A.B.C.0/24`.
    pub subnet: String,
    pub cgroup_parent: String,
    /// The LLM proxy for agents on this host.
    pub proxy: SocketAddr,
    /// Any other arguments (a turn policy, an upstream, fault injection).
    pub args: Vec<String>,
    /// Where its stdout and stderr go (appended).
    pub log: PathBuf,
}

/// A running private drumsd.
pub struct Private {
    pub client: Client,
    pub proxy: SocketAddr,
    spec: Spec,
    child: Option<Child>,
}

impl Private {
    /// Start it, and wait until its API answers.
    pub async fn start(spec: Spec) -> Result<Private, DaemonError> {
        std::fs::create_dir_all(&spec.state)
            .map_err(|e| DaemonError::io("create", &spec.state, e))?;
        if let Some(dir) = spec.log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| DaemonError::io("create", dir, e))?;
        }
        let mut d = Private {
            client: Client::new(spec.state.join("drumsd.sock")),
            proxy: spec.proxy,
            spec,
            child: None,
        };
        d.spawn().await?;
        Ok(d)
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn socket(&self) -> PathBuf {
        self.spec.state.join("drumsd.sock")
    }

    fn args(&self) -> Vec<String> {
        let s = &self.spec;
        let mut a: Vec<String> = [
            "--state-dir",
            &s.state.display().to_string(),
            "--images-dir",
            &s.images_dir.display().to_string(),
            "--bin-dir",
            &s.bin_dir.display().to_string(),
            "--bridge",
            &s.bridge,
            "--subnet",
            &s.subnet,
            "--cgroup-parent",
            &s.cgroup_parent,
            "--llm-proxy-local",
            &s.proxy.to_string(),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(s.args.iter().cloned());
        a
    }

    /// Start drumsd and wait for its API (drumsd itself waits for a killed
    /// predecessor's state lock to be let go).
    async fn spawn(&mut self) -> Result<(), DaemonError> {
        let log_path = self.spec.log.clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| DaemonError::io("open", &log_path, e))?;
        let err = log
            .try_clone()
            .map_err(|e| DaemonError::io("open", &log_path, e))?;
        let mut cmd = Command::new(&self.spec.drumsd);
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; it runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .args(self.args())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| DaemonError::io("start", &self.spec.drumsd, e))?;
        self.child = Some(child);
        let deadline = Instant::now() + UP_WITHIN;
        loop {
            if self
                .client
                .json::<drums_api::Version>(hyper::Method::GET, "/v1/version", None::<&()>)
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(DaemonError::Exited {
                    status,
                    log: log_path,
                });
            }
            if Instant::now() > deadline {
                // Stopped as any drumsd is, so that it removes what it made
                // so far (dropping the child would SIGKILL it).
                if let Some(mut c) = self.child.take() {
                    if let Some(pid) = c.id() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGTERM,
                        );
                    }
                    let _ = tokio::time::timeout(DOWN_WITHIN, c.wait()).await;
                }
                return Err(DaemonError::NotUp {
                    secs: UP_WITHIN.as_secs(),
                    log: log_path,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the daemon it started is still running (a restart may have
    /// failed).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `kill -9`, then a new drumsd on the same state, once the old one is
    /// reaped.
    pub async fn kill9_and_restart(&mut self) -> Result<(), DaemonError> {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        self.spawn().await
    }

    /// SIGTERM to the drumsd on its socket (the one it started, or one a
    /// bench started again in its place): drumsd removes every session and
    /// its own resources. Waits until that process is gone.
    pub async fn stop(mut self) -> Result<(), DaemonError> {
        let log = self.spec.log.clone();
        let mine = self.child.as_ref().and_then(|c| c.id()).map(|p| p as i32);
        let answering = crate::respawn::Daemon::of(&self.socket())
            .ok()
            .map(|d| d.pid());
        let Some(pid) = answering.or(mine) else {
            return Ok(());
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        if Some(pid) == mine {
            let mut c = self.child.take().expect("mine");
            let st = tokio::time::timeout(DOWN_WITHIN, c.wait())
                .await
                .map_err(|_| DaemonError::NotDown {
                    pid,
                    secs: DOWN_WITHIN.as_secs(),
                    log: log.clone(),
                })?
                .map_err(|e| DaemonError::io("wait for", Path::new("drumsd"), e))?;
            if !st.success() {
                return Err(DaemonError::StopFailed { status: st, log });
            }
            return Ok(());
        }
        // Not this process's child (a respawned daemon, in its own
        // session): gone when /proc no longer shows it running.
        let deadline = Instant::now() + DOWN_WITHIN;
        while crate::respawn::running(pid) {
            if Instant::now() > deadline {
                return Err(DaemonError::NotDown {
                    pid,
                    secs: DOWN_WITHIN.as_secs(),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The first one it started, killed by the bench, is a zombie.
        if let Some(mut c) = self.child.take() {
            let _ = c.wait().await;
        }
        Ok(())
    }
}

/// What a stopped daemon left on the host: mounts under its state
/// directory, its bridge, its cgroups (v1 and v2), loop devices backed by a
/// file of its state, nftables tables that name its bridge. Empty when
/// nothing is left.
pub fn leftovers(spec: &Spec) -> Vec<String> {
    let mut left = Vec::new();
    let state = spec.state.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&state))
            .map(|l| format!("mount: {l}")),
    );
    if Path::new("/sys/class/net").join(&spec.bridge).exists() {
        left.push(format!("link: {}", spec.bridge));
    }
    let roots = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .chain([PathBuf::from("/sys/fs/cgroup")]);
    for root in roots {
        let dir = root.join(&spec.cgroup_parent);
        if dir.is_dir() {
            left.push(format!("cgroup: {}", dir.display()));
        }
    }
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let backing = e.path().join("loop/backing_file");
        if std::fs::read_to_string(&backing).is_ok_and(|b| b.contains(&state)) {
            left.push(format!("loop device: {}", e.file_name().to_string_lossy()));
        }
    }
    if let Ok(out) = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
    {
        left.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains(&spec.bridge))
                .map(|l| format!("nft: {l}")),
        );
    }
    left
}

/// A second octet for private daemons' subnets, in 10.217-10.240, that no
/// route of this host uses yet: another eval, bench or test may run beside
/// this one.
pub fn free_net() -> Result<u8, DaemonError> {
    let path = Path::new("/proc/net/route");
    let routes = std::fs::read_to_string(path).map_err(|e| DaemonError::io("read", path, e))?;
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
        .ok_or(DaemonError::NoSubnet)
}

/// What names this process's host resources apart from another's: its pid,
/// cut to fit a bridge's name.
pub fn tag() -> u32 {
    std::process::id() % 10_000
}

/// A free port on 127.0.0.1 for a daemon's proxy (taken back right away).
pub fn free_port() -> Result<SocketAddr, DaemonError> {
    let at = Path::new("127.0.0.1:0");
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| DaemonError::io("bind", at, e))?;
    l.local_addr().map_err(|e| DaemonError::io("bind", at, e))
}
