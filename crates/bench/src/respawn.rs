//! The drumsd a bench talks to, killed with SIGKILL and started again as it
//! was: what `drums bench engine` needs to time recovery after a daemon
//! crash against whatever daemon it was pointed at (the autostarted one, or
//! a test's with its own flags).
//!
//! The daemon is found through its socket (SO_PEERCRED), and started again
//! from what /proc says of it: executable, arguments, working directory,
//! environment, and the file its stderr went to.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drums_client::Failure;

/// Finding, killing and starting again drumsd, or killing a session.
#[derive(Debug, thiserror::Error)]
pub enum RespawnError {
    #[error("connect to {}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("SO_PEERCRED of drumsd's socket")]
    PeerCred(#[source] nix::Error),
    #[error("read /proc/{pid}/{name}")]
    Read {
        pid: i32,
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("read link /proc/{pid}/{name}")]
    ReadLink {
        pid: i32,
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("/proc/{0}/cmdline is empty: pid {0} is not a running drumsd")]
    NotDrumsd(i32),
    /// `what` is "drumsd" or "the session's init".
    #[error("kill -9 {what} (pid {pid})")]
    Kill {
        what: &'static str,
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error("{what} (pid {pid}) did not die")]
    Undying {
        what: &'static str,
        pid: i32,
        #[source]
        source: TimedOut,
    },
    #[error("open {}", path.display())]
    OpenLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("dup log fd")]
    DupLog(#[source] std::io::Error),
    #[error("start {}", exe.display())]
    Start {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("drumsd did not answer on {}", socket.display())]
    NotUp {
        socket: PathBuf,
        #[source]
        source: TimedOut,
    },
}

impl From<RespawnError> for Failure {
    fn from(e: RespawnError) -> Failure {
        Failure::internal(&e)
    }
}

/// [`wait_until`] gave up.
#[derive(Debug, thiserror::Error)]
#[error("not within {0:?}")]
pub struct TimedOut(Duration);

/// A running drumsd, as /proc describes it.
#[derive(Clone)]
pub struct Daemon {
    pid: i32,
    exe: PathBuf,
    args: Vec<OsString>,
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
    log: Option<PathBuf>,
    socket: PathBuf,
}

impl Daemon {
    /// The daemon listening on `socket`.
    pub fn of(socket: &Path) -> Result<Daemon, RespawnError> {
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let s = std::os::unix::net::UnixStream::connect(socket).map_err(|source| {
            RespawnError::Connect {
                socket: socket.to_owned(),
                source,
            }
        })?;
        let pid = getsockopt(&s, PeerCredentials)
            .map_err(RespawnError::PeerCred)?
            .pid();
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let read = |name: &'static str| {
            std::fs::read(proc.join(name)).map_err(|source| RespawnError::Read {
                pid,
                name,
                source,
            })
        };
        let link = |name: &'static str| {
            std::fs::read_link(proc.join(name)).map_err(|source| RespawnError::ReadLink {
                pid,
                name,
                source,
            })
        };
        let split = |b: Vec<u8>| -> Vec<OsString> {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| OsString::from_vec(a.to_vec()))
                .collect()
        };
        let mut args = split(read("cmdline")?);
        if args.is_empty() {
            return Err(RespawnError::NotDrumsd(pid));
        }
        args.remove(0);
        let env = split(read("environ")?)
            .into_iter()
            .filter_map(|kv| {
                let kv = kv.into_vec();
                let eq = kv.iter().position(|&c| c == b'=')?;
                Some((
                    OsString::from_vec(kv[..eq].to_vec()),
                    OsString::from_vec(kv[eq + 1..].to_vec()),
                ))
            })
            .collect();
        // Its log, if stderr went to a regular file; else nowhere.
        let log = link("fd/2").ok().filter(|p| p.is_file());
        Ok(Daemon {
            pid,
            exe: link("exe")?,
            args,
            cwd: link("cwd")?,
            env,
            log,
            socket: socket.to_owned(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// SIGKILL, and wait until it is gone (a zombie counts: it holds no
    /// lock or socket any more).
    pub fn kill9(&self) -> Result<(), RespawnError> {
        kill9("drumsd", self.pid)
    }

    /// Start it again as it was started, detached (its own session, as
    /// `drums` starts one); returns at once, with the new process's pid.
    pub fn respawn(&self) -> Result<u32, RespawnError> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args)
            .current_dir(&self.cwd)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        match &self.log {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(p)
                    .map_err(|source| RespawnError::OpenLog {
                        path: p.clone(),
                        source,
                    })?;
                cmd.stdout(f.try_clone().map_err(RespawnError::DupLog)?)
                    .stderr(f);
            }
            None => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| RespawnError::Start {
            exe: self.exe.clone(),
            source,
        })?;
        // Not waited for: the daemon outlives the bench, as it did before.
        Ok(child.id())
    }

    /// Until the socket accepts a connection, which drumsd opens after it
    /// has taken over (and recovered) its sessions.
    pub fn wait_up(&self, timeout: Duration) -> Result<(), RespawnError> {
        wait_until(timeout, || {
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        })
        .map_err(|source| RespawnError::NotUp {
            socket: self.socket.clone(),
            source,
        })
    }
}

/// Alive and not a zombie.
pub(crate) fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), TimedOut> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return Err(TimedOut(timeout));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Kill a session's processes from outside (its init, and with it its pid
/// namespace), as a crash would, and wait until its init is gone.
pub fn kill_session(init_pid: i32) -> Result<(), RespawnError> {
    kill9("the session's init", init_pid)
}

/// SIGKILL `what`, and wait until it is gone (a zombie counts).
fn kill9(what: &'static str, pid: i32) -> Result<(), RespawnError> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|source| RespawnError::Kill { what, pid, source })?;
    wait_until(Duration::from_secs(10), || !running(pid)).map_err(|source| RespawnError::Undying {
        what,
        pid,
        source,
    })
}
