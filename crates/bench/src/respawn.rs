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

use anyhow::{bail, Context};

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
    pub fn of(socket: &Path) -> anyhow::Result<Daemon> {
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let s = std::os::unix::net::UnixStream::connect(socket)
            .with_context(|| format!("connect to {}", socket.display()))?;
        let pid = getsockopt(&s, PeerCredentials)
            .context("SO_PEERCRED of drumsd's socket")?
            .pid();
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let read = |name: &str| {
            std::fs::read(proc.join(name)).with_context(|| format!("read /proc/{pid}/{name}"))
        };
        let link = |name: &str| {
            std::fs::read_link(proc.join(name))
                .with_context(|| format!("read link /proc/{pid}/{name}"))
        };
        let split = |b: Vec<u8>| -> Vec<OsString> {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| OsString::from_vec(a.to_vec()))
                .collect()
        };
        let mut args = split(read("cmdline")?);
        if args.is_empty() {
            bail!("/proc/{pid}/cmdline is empty: pid {pid} is not a running drumsd");
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

    /// SIGKILL, and wait until it is gone (a zombie counts: it holds no
    /// lock or socket any more).
    pub fn kill9(&self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
            .with_context(|| format!("kill -9 drumsd (pid {})", self.pid))?;
        wait_until(Duration::from_secs(10), || !running(self.pid))
            .with_context(|| format!("drumsd (pid {}) did not die", self.pid))
    }

    /// Start it again as it was started, detached (its own session, as
    /// `drums` starts one); returns at once, with the new process's pid.
    pub fn respawn(&self) -> anyhow::Result<u32> {
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
                    .with_context(|| format!("open {}", p.display()))?;
                cmd.stdout(f.try_clone().context("dup log fd")?).stderr(f);
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
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", self.exe.display()))?;
        // Not waited for: the daemon outlives the bench, as it did before.
        Ok(child.id())
    }

    /// Until the socket accepts a connection, which drumsd opens after it
    /// has taken over (and recovered) its sessions.
    pub fn wait_up(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_until(timeout, || {
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        })
        .with_context(|| format!("drumsd did not answer on {}", self.socket.display()))
    }
}

/// Alive and not a zombie.
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            bail!("not within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Kill a session's processes from outside (its init, and with it its pid
/// namespace), as a crash would, and wait until its init is gone.
pub fn kill_session(init_pid: i32) -> anyhow::Result<()> {
    let pid = nix::unistd::Pid::from_raw(init_pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
        .with_context(|| format!("kill -9 the session's init (pid {init_pid})"))?;
    wait_until(Duration::from_secs(10), || !running(init_pid))
        .with_context(|| format!("the session's init (pid {init_pid}) did not die"))
}
