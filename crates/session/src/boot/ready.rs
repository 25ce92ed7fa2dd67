//! When a booted session is ready: its guest answers (and a new desktop
//! starts), or for a sibling, its guest's hygiene gives it its own identity
//! first. Every call is bounded ([`crate::manager::GUEST_TIMEOUT`]): a hung
//! guest costs this task, never drumsd.

use drums_api::Profile;
use std::time::{Duration, Instant};

use drums_catalog::SessionRecord;

use crate::create::random_hex;
use crate::faults::Faults;
use crate::manager::guest_client;
use crate::spec::DesktopSpec;
use crate::{process, SessionError};

/// The desktop profile: the guest agent starts Xvfb, dbus, openbox and
/// Chromium and answers when the desktop is agent-ready.
pub(super) async fn start_desktop(pid: i32, desktop: &DesktopSpec) -> Result<(), SessionError> {
    let body = drums_api::guest::DesktopStart {
        screen: Some(desktop.screen.clone()),
        url: desktop.url.clone(),
        user: None,
        timeout_ms: Some(crate::manager::DESKTOP_START_TIMEOUT.as_millis() as u64),
    };
    let _: serde_json::Value = crate::manager::desktop_start_client(pid)
        .json(hyper::Method::POST, "/v1/desktop", Some(&body))
        .await
        .map_err(|e| SessionError::Desktop(e.into()))?;
    Ok(())
}

/// Ready means the guest agent answers its health check. The socket appears
/// only when the agent listens, so a failed connect costs microseconds.
pub(super) async fn wait_ready(id: &str, pid: i32, timeout: Duration) -> Result<(), SessionError> {
    let client = guest_client(pid);
    let start = Instant::now();
    loop {
        if client
            .call(hyper::Method::GET, "/v1/health", None::<&()>)
            .await
            .is_ok()
        {
            return Ok(());
        }
        let waited_ms = start.elapsed().as_millis() as u64;
        if !process::alive(pid) {
            return Err(SessionError::NotReady {
                id: id.into(),
                waited_ms,
                detail: ": its init exited".into(),
            });
        }
        if start.elapsed() > timeout {
            // The session's own file: read inside its root, never through
            // a symlink it made, never a FIFO that would block drumsd
            // (O_NONBLOCK, then a regular file only), and at most 64 KiB.
            let log = drums_sys::open_in_root(
                &crate::manager::session_root(pid),
                std::path::Path::new(drums_init::INIT_LOG),
                nix::fcntl::OFlag::O_RDONLY
                    | nix::fcntl::OFlag::O_NOFOLLOW
                    | nix::fcntl::OFlag::O_NONBLOCK,
            )
            .ok()
            .filter(|fd| {
                nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(fd))
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
            })
            .map(|fd| {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(
                    &mut std::io::Read::take(std::fs::File::from(fd), 64 << 10),
                    &mut text,
                );
                text
            })
            .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let detail = if tail.is_empty() {
                String::new()
            } else {
                format!("; init log: {}", tail.join(" | "))
            };
            return Err(SessionError::NotReady {
                id: id.into(),
                waited_ms,
                detail,
            });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
/// The in-session half of hygiene, by the guest agent: hostname,
/// machine-id, generation, and the reseed of registered processes. Its
/// answer is also the sibling's readiness.
pub(super) async fn hygiene(
    faults: &Faults,
    rec: &SessionRecord,
    pid: i32,
    clean: bool,
) -> Result<(), SessionError> {
    // The kernel's half of the new identity, from outside (the session
    // holds no CAP_SYS_ADMIN); the guest rewrites the files and reseeds.
    let (p, h) = (pid, rec.hostname.clone());
    tokio::task::spawn_blocking(move || drums_sys::set_hostname_in(p, &h))
        .await
        .expect("no panic")
        .map_err(|e| SessionError::Hygiene(e.into()))?;
    let ip = rec
        .ip
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: std::net::AddrParseError| SessionError::Hygiene(e.into()))?;
    let body = drums_api::guest::HygieneRequest {
        hostname: rec.hostname.clone(),
        machine_id: random_hex(16),
        generation: rec.generation,
        ip,
        ack_timeout_ms: None,
    };
    let client = guest_client(pid);
    let _: serde_json::Value = client
        .json(hyper::Method::POST, "/v1/hygiene", Some(&body))
        .await
        .map_err(|e| SessionError::Hygiene(e.into()))?;
    if rec.profile == Profile::Desktop {
        faults.check("restore.desktop")?;
        // The hostname has changed: now the browser's profile lock, and for
        // a clean checkpoint its cookies, storage and renderers. Then the
        // sibling is ready when its desktop is agent-ready.
        let browser = drums_api::guest::BrowserHygiene {
            hostname: rec.hostname.clone(),
            clean,
        };
        let _: serde_json::Value = client
            .json(hyper::Method::POST, "/v1/desktop/hygiene", Some(&browser))
            .await
            .map_err(|e| SessionError::Desktop(e.into()))?;
        desktop_ready(pid).await?;
    }
    Ok(())
}

pub(super) async fn desktop_ready(pid: i32) -> Result<(), SessionError> {
    // The guest's budget ends before drumsd's client gives up, so a
    // late desktop answers with what was late.
    let ready = format!(
        "/v1/desktop/ready?timeout_ms={}",
        (crate::manager::GUEST_TIMEOUT - crate::manager::GUEST_GRACE).as_millis()
    );
    let _: serde_json::Value = guest_client(pid)
        .json(hyper::Method::GET, &ready, None::<&()>)
        .await
        .map_err(|e| SessionError::Desktop(e.into()))?;
    Ok(())
}
