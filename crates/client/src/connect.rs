//! Finding the daemon, and starting one when none answers.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use drums_api::{Client, Version};
use hyper::Method;

use crate::exit::{Failure, UNAVAILABLE};
use crate::Global;

pub async fn client(g: &Global) -> Result<Client, Failure> {
    let socket = g
        .socket
        .clone()
        .unwrap_or_else(|| g.state_dir.join("drumsd.sock"));
    let client = Client::new(&socket);
    if ping(&client).await {
        return Ok(client);
    }
    if g.no_autostart {
        return Err(Failure::new(
            UNAVAILABLE,
            format!(
                "no drumsd answers on {} (autostart is off)",
                socket.display()
            ),
        ));
    }
    let mut child = start_daemon(g, &socket)?;
    let log = g.state_dir.join("drumsd.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if ping(&client).await {
            return Ok(client);
        }
        // An early exit means it refused to start (another daemon, no root, ...).
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = text
        .lines()
        .rev()
        .take(6)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(Failure::new(
        UNAVAILABLE,
        format!(
            "drumsd could not start (log {}):\n{}",
            log.display(),
            tail.join("\n")
        ),
    ))
}

async fn ping(c: &Client) -> bool {
    c.json::<Version>(Method::GET, "/v1/version", None::<&()>)
        .await
        .is_ok()
}

fn drumsd_path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("drumsd")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("drumsd"))
}

/// Start drumsd in its own session, detached from this terminal, logging to
/// STATE_DIR/drumsd.log.
fn start_daemon(g: &Global, socket: &std::path::Path) -> Result<std::process::Child, Failure> {
    std::fs::create_dir_all(&g.state_dir).map_err(|e| {
        Failure::new(
            UNAVAILABLE,
            format!("create state directory {}: {e}", g.state_dir.display()),
        )
    })?;
    let log_path = g.state_dir.join("drumsd.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| Failure::new(UNAVAILABLE, format!("open {}: {e}", log_path.display())))?;
    let err = log
        .try_clone()
        .map_err(|e| Failure::new(UNAVAILABLE, format!("dup log fd: {e}")))?;
    let exe = drumsd_path();
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("--state-dir")
        .arg(&g.state_dir)
        .arg("--socket")
        .arg(socket);
    cmd.stdin(Stdio::null()).stdout(log).stderr(err);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our
    // terminal and process group so a ^C here does not stop it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| Failure::new(UNAVAILABLE, format!("start {}: {e}", exe.display())))?;
    eprintln!(
        "drums: started drumsd (pid {}), log {}",
        child.id(),
        log_path.display()
    );
    // Dropping a std Child neither kills nor waits: the daemon lives on.
    Ok(child)
}
