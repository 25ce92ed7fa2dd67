//! Starting the desktop's services as the desktop user.
//!
//! Each service that can say when it is ready is asked to, instead of being
//! given a fixed delay:
//! - Xvfb writes its display number to `-displayfd` once it accepts clients;
//! - dbus-daemon writes its address to `--print-address` once it listens;
//! - Chromium prints "DevTools listening on ws://…" on stderr once its
//!   DevTools endpoint accepts connections.
//!
//! openbox and socat give no such signal, and nothing waits for them:
//! Chromium's window is placed at the screen's origin and sized to it, so it
//! fills the screen whether or not openbox manages it yet, and socat binds
//! its port before it does anything else.
//!
//! Every service's output goes to a log under `/var/log/drums-desktop` in
//! the session (on the copy-on-write layer, not on a tmpfs that CRIU would
//! copy into every checkpoint).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{DesktopConfig, DesktopError, CDP_PORT, DISPLAY, PUBLIC_CDP_PORT};

/// Where the services' logs go inside the session.
pub const LOG_DIR: &str = "/var/log/drums-desktop";

/// A started desktop.
#[derive(Debug)]
pub struct Desktop {
    pub config: DesktopConfig,
    /// (service, pid) of what was started, in order.
    pub services: Vec<(&'static str, u32)>,
    /// Time from the start call until Chromium's DevTools answered.
    pub started_in: Duration,
}

impl Desktop {
    /// Starts Xvfb, dbus, openbox, Chromium and socat, returning once
    /// Chromium's DevTools endpoint listens, or failing once `timeout` has
    /// passed since the call (one budget for every service, so that the
    /// caller's own budget bounds the whole start). Agent-readiness is
    /// [`crate::ready::wait`]'s business.
    pub async fn start(config: DesktopConfig, timeout: Duration) -> Result<Desktop, DesktopError> {
        Self::start_in(config, Path::new(LOG_DIR), timeout).await
    }

    pub async fn start_in(
        config: DesktopConfig,
        log_dir: &Path,
        timeout: Duration,
    ) -> Result<Desktop, DesktopError> {
        let t0 = Instant::now();
        let budget = Budget {
            deadline: tokio::time::Instant::from_std(t0 + timeout),
            timeout,
        };
        prepare_dirs(&config, log_dir)?;
        let user = &config.user;
        let mut services = Vec::new();

        // Xvfb and the bus do not depend on each other: start both, then wait.
        let (xvfb, x_ready) = spawn_notifying(
            "Xvfb",
            &config,
            log_dir,
            &[
                DISPLAY,
                "-screen",
                "0",
                &format!("{}x{}x24", config.width, config.height),
                // Clients come over the session's own unix socket only.
                "-nolisten",
                "tcp",
                // No X authority: everything in the session is the user's.
                "-ac",
                // A black root window: the "blank desktop" the readiness
                // check compares against.
                "-br",
                "-displayfd",
            ],
        )?;
        let (dbus, bus_ready) = spawn_notifying(
            "dbus-daemon",
            &config,
            log_dir,
            &[
                "--session",
                "--nofork",
                "--nopidfile",
                &format!("--address={}", user.bus_address()),
                "--print-address",
            ],
        )?;
        services.push(("Xvfb", pid(&xvfb)));
        services.push(("dbus-daemon", pid(&dbus)));
        let x = wait_notified("Xvfb", xvfb, x_ready, log_dir, budget);
        let bus = wait_notified("dbus-daemon", dbus, bus_ready, log_dir, budget);
        let (x, bus) = tokio::join!(x, bus);
        x?;
        bus?;

        let openbox = spawn("openbox", &config, log_dir, &["--sm-disable"], false)?;
        services.push(("openbox", pid(&openbox)));
        reap("openbox", openbox);

        let chrome = spawn(
            "google-chrome",
            &config,
            log_dir,
            &[
                &format!("--remote-debugging-port={CDP_PORT}"),
                "--window-position=0,0",
                &format!("--window-size={},{}", config.width, config.height),
                "--start-maximized",
                // No "restore pages?" bubble after a crash-like stop.
                "--hide-crash-restore-bubble",
                // No infobar about --no-sandbox over the page: it would be
                // in every screenshot an agent sees.
                "--test-type",
                // Fewer processes, each of which CRIU dumps and restores:
                // no zygotes (they exist to fork sandboxed children, and their
                // sockets hold fds in flight, "Control messages in queue",
                // which CRIU cannot dump), the GPU process's software
                // compositor in the browser, no crash handlers (nothing to
                // report to), no spare renderer.
                "--no-zygote",
                "--in-process-gpu",
                "--disable-crash-reporter",
                "--disable-features=SpareRendererForSitePerProcess",
                "--noerrdialogs",
                &config.url,
            ],
            true,
        )?;
        services.push(("google-chrome", pid(&chrome)));
        wait_devtools(chrome, log_dir, budget).await?;

        let socat = spawn(
            "socat",
            &config,
            log_dir,
            &[
                &format!("TCP-LISTEN:{PUBLIC_CDP_PORT},fork,reuseaddr"),
                &format!("TCP:127.0.0.1:{CDP_PORT}"),
            ],
            false,
        )?;
        services.push(("socat", pid(&socat)));
        reap("socat", socat);

        Ok(Desktop {
            config,
            services,
            started_in: t0.elapsed(),
        })
    }
}

/// When a start gives up, and the whole budget it had (for the message).
#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl Budget {
    fn expired(&self, what: &str) -> DesktopError {
        DesktopError::Timeout {
            what: what.into(),
            seconds: self.timeout.as_secs(),
        }
    }
}

fn pid(child: &Child) -> u32 {
    child.id().unwrap_or(0)
}

/// The directories the services expect: X's socket directory (sticky and
/// world-writable, as X requires, owned by root), the user's runtime dir,
/// and the log dir.
fn prepare_dirs(config: &DesktopConfig, log_dir: &Path) -> Result<(), DesktopError> {
    let x11 = Path::new("/tmp/.X11-unix");
    std::fs::create_dir_all(x11).map_err(DesktopError::io("create /tmp/.X11-unix"))?;
    std::fs::set_permissions(x11, std::fs::Permissions::from_mode(0o1777))
        .map_err(DesktopError::io("set permissions of /tmp/.X11-unix"))?;
    let user = &config.user;
    // Parents first: a recursive create would give /run/user the 0700 meant
    // for the user's own directory.
    let run_user = user
        .runtime_dir()
        .parent()
        .expect("/run/user/UID")
        .to_path_buf();
    for (dir, mode) in [
        (run_user, 0o755),
        (user.runtime_dir(), 0o700),
        (log_dir.to_path_buf(), 0o755),
    ] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&dir)
            .map_err(DesktopError::io(format!("create {}", dir.display())))?;
    }
    std::os::unix::fs::chown(user.runtime_dir(), Some(user.uid), Some(user.gid)).map_err(
        DesktopError::io(format!("chown {}", user.runtime_dir().display())),
    )?;
    Ok(())
}

fn log_file(log_dir: &Path, service: &str) -> Result<std::fs::File, DesktopError> {
    let path = log_path(log_dir, service);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(DesktopError::io(format!("open {}", path.display())))
}

fn command(program: &str, config: &DesktopConfig, args: &[&str]) -> Command {
    let user = &config.user;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(user.env())
        .current_dir(&user.home)
        .uid(user.uid)
        .gid(user.gid)
        .stdin(Stdio::null());
    cmd
}

fn spawn(
    service: &'static str,
    config: &DesktopConfig,
    log_dir: &Path,
    args: &[&str],
    pipe_stderr: bool,
) -> Result<Child, DesktopError> {
    let log = log_file(log_dir, service)?;
    let mut cmd = command(service, config, args);
    cmd.stdout(
        log.try_clone()
            .map_err(DesktopError::io(format!("open log of {service}")))?,
    );
    if pipe_stderr {
        cmd.stderr(Stdio::piped());
    } else {
        cmd.stderr(log);
    }
    cmd.spawn()
        .map_err(DesktopError::io(format!("start {service}")))
}

/// Starts `service` with its last argument followed by fd 3, the write end
/// of a pipe it reports readiness on.
fn spawn_notifying(
    service: &'static str,
    config: &DesktopConfig,
    log_dir: &Path,
    args: &[&str],
) -> Result<(Child, OwnedFd), DesktopError> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| DesktopError::io(format!("create a pipe for {service}"))(e.into()))?;
    let log = log_file(log_dir, service)?;
    let mut cmd = command(service, config, args);
    cmd.arg("3")
        .stdout(
            log.try_clone()
                .map_err(DesktopError::io(format!("open log of {service}")))?,
        )
        .stderr(log);
    let fd = write.as_raw_fd();
    // SAFETY: only dup2 (async-signal-safe) runs between fork and exec. The
    // pipe was made O_CLOEXEC so that no other child inherits it; dup2 gives
    // the service its own copy as fd 3, without the flag.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(DesktopError::io(format!("start {service}")))?;
    drop(write);
    Ok((child, read))
}

/// Waits for the first line on the notification pipe; end of file (the
/// service exited or closed it) is a failure with the service's status.
async fn wait_notified(
    service: &'static str,
    mut child: Child,
    pipe: OwnedFd,
    log_dir: &Path,
    budget: Budget,
) -> Result<(), DesktopError> {
    let mut pipe = tokio::fs::File::from_std(std::fs::File::from(pipe));
    let mut buf = Vec::new();
    let read = async {
        let mut byte = [0u8; 256];
        loop {
            let n = pipe.read(&mut byte).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            buf.extend_from_slice(&byte[..n]);
            if buf.contains(&b'\n') {
                return Ok(true);
            }
        }
    };
    let outcome = tokio::time::timeout_at(budget.deadline, read).await;
    match outcome {
        Ok(Ok(true)) => {
            reap(service, child);
            Ok(())
        }
        Ok(Ok(false)) | Ok(Err(_)) => Err(exited(service, &mut child, log_dir).await),
        Err(_) => {
            let _ = child.start_kill();
            reap(service, child);
            Err(budget.expired(service))
        }
    }
}

/// Reads Chromium's stderr until DevTools listens, then keeps copying it to
/// its log (a pipe nobody drains would block Chromium once full).
async fn wait_devtools(
    mut chrome: Child,
    log_dir: &Path,
    budget: Budget,
) -> Result<(), DesktopError> {
    let stderr = chrome.stderr.take().expect("stderr is piped");
    let mut lines = BufReader::new(stderr).lines();
    let mut log = tokio::fs::File::from_std(log_file(log_dir, "google-chrome")?);
    let found = tokio::time::timeout_at(budget.deadline, async {
        use tokio::io::AsyncWriteExt;
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = log.write_all(line.as_bytes()).await;
            let _ = log.write_all(b"\n").await;
            if line.starts_with("DevTools listening on ") {
                return true;
            }
        }
        false
    })
    .await;
    match found {
        Ok(true) => {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                while let Ok(Some(line)) = lines.next_line().await {
                    let _ = log.write_all(line.as_bytes()).await;
                    let _ = log.write_all(b"\n").await;
                }
            });
            reap("google-chrome", chrome);
            Ok(())
        }
        Ok(false) => Err(exited("google-chrome", &mut chrome, log_dir).await),
        Err(_) => {
            let _ = chrome.start_kill();
            reap("google-chrome", chrome);
            Err(budget.expired("Chromium's DevTools"))
        }
    }
}

async fn exited(service: &'static str, child: &mut Child, log_dir: &Path) -> DesktopError {
    let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
        Ok(Ok(s)) => s.to_string(),
        _ => {
            let _ = child.start_kill();
            "still running but closed its notification".into()
        }
    };
    let path = log_path(log_dir, service);
    // The cause is almost always in the last lines; the session (and the
    // whole log) is gone once the failed create is cleaned up.
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(4).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    DesktopError::Exited {
        service,
        status,
        log: format!("{}: {}", path.display(), tail.join(" | ")),
    }
}

fn log_path(log_dir: &Path, service: &str) -> PathBuf {
    log_dir.join(format!("{service}.log"))
}

/// Waits for the service in the background, so it never lingers as a
/// zombie of the agent, and says when one dies.
fn reap(service: &'static str, mut child: Child) {
    tokio::spawn(async move {
        match child.wait().await {
            Ok(status) => tracing::warn!(service, %status, "desktop service exited"),
            Err(e) => tracing::warn!(service, error = %e, "cannot wait for desktop service"),
        }
    });
}
