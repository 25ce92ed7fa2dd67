//! The browser's part of clone hygiene, run by the guest agent after a
//! restore (after the hostname has changed).
//!
//! - **Profile lock.** Chromium's `SingletonLock` is a symlink to
//!   `<hostname>-<pid>`. A restored sibling has a new hostname, so a second
//!   `google-chrome` (OSWorld's tasks launch one to open a URL) would take
//!   the profile for one locked by another computer and refuse to start.
//!   The link is rewritten to the new hostname with the same pid (the
//!   browser's pid is restored as it was).
//! - **Clean checkpoints.** A checkpoint declared clean promises siblings
//!   that share no browser state: cookies and site storage of the default
//!   context are cleared, and every page is reopened in a fresh browser
//!   context and its old tab closed. The new tabs get new renderer
//!   processes, whose V8 seeds `Math.random` anew, so siblings no longer
//!   draw the same numbers. Without `clean`, the browser is left exactly as
//!   checkpointed, by design (the audit lists it as identical).

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cdp;
pub use drums_api::guest::BrowserHygiene;

use crate::{DesktopError, User, CDP_PORT};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrowserReport {
    /// The profile lock's new target, if there was a lock.
    pub lock: Option<String>,
    pub clean: bool,
    /// Pages reopened in the fresh context (clean only).
    pub pages: Vec<String>,
    pub ms: f64,
}

pub async fn apply(user: &User, h: &BrowserHygiene) -> Result<BrowserReport, DesktopError> {
    let t0 = Instant::now();
    let lock = fix_singleton_lock(&user.chrome_profile(), &h.hostname, user)?;
    let pages = if h.clean { clean().await? } else { Vec::new() };
    Ok(BrowserReport {
        lock,
        clean: h.clean,
        pages,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Points `SingletonLock` at `<hostname>-<pid>`, keeping the pid; replaced
/// atomically (a new link renamed over the old one).
fn fix_singleton_lock(
    profile: &Path,
    hostname: &str,
    user: &User,
) -> Result<Option<String>, DesktopError> {
    let lock = profile.join("SingletonLock");
    let target = match std::fs::read_link(&lock) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DesktopError::io(format!("read {}", lock.display()))(e)),
    };
    let target = target.to_string_lossy();
    let Some((_, pid)) = target.rsplit_once('-') else {
        return Err(DesktopError::Invalid(format!(
            "{} points to {target:?}, not HOSTNAME-PID",
            lock.display()
        )));
    };
    let new = format!("{hostname}-{pid}");
    if new == target {
        return Ok(Some(new));
    }
    let tmp = profile.join(".SingletonLock.drums");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&new, &tmp)
        .map_err(DesktopError::io(format!("create {}", tmp.display())))?;
    std::os::unix::fs::lchown(&tmp, Some(user.uid), Some(user.gid))
        .map_err(DesktopError::io(format!("chown {}", tmp.display())))?;
    std::fs::rename(&tmp, &lock)
        .map_err(DesktopError::io(format!("replace {}", lock.display())))?;
    Ok(Some(new))
}

/// Clears the default context's cookies and storage, then moves every page
/// to a fresh browser context. Returns the URLs reopened.
async fn clean() -> Result<Vec<String>, DesktopError> {
    let mut b = cdp::browser("127.0.0.1", CDP_PORT).await?;
    let targets = b.call("Target.getTargets", json!({})).await?;
    let pages: Vec<(String, String)> = targets["targetInfos"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["type"] == "page")
        .map(|t| {
            (
                t["targetId"].as_str().unwrap_or_default().to_owned(),
                t["url"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    // The default context's cookies and storage are cleared on a second
    // connection while the pages move: the two do not touch each other, and
    // the first clearing after a restore takes tens of milliseconds.
    let origins: Vec<String> = pages.iter().filter_map(|(_, u)| web_origin(u)).collect();
    let clear = async {
        let mut c = cdp::browser("127.0.0.1", CDP_PORT).await?;
        c.call("Storage.clearCookies", json!({})).await?;
        for origin in &origins {
            c.call(
                "Storage.clearDataForOrigin",
                json!({"origin": origin, "storageTypes": "all"}),
            )
            .await?;
        }
        c.close().await;
        Ok::<(), DesktopError>(())
    };
    let reopen_all = async {
        let ctx = b.call("Target.createBrowserContext", json!({})).await?;
        let ctx = ctx["browserContextId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut reopened = Vec::new();
        for (_, url) in &pages {
            reopen(&mut b, &ctx, url).await?;
            reopened.push(url.clone());
        }
        Ok::<Vec<String>, DesktopError>(reopened)
    };
    let (cleared, reopened) = tokio::join!(clear, reopen_all);
    cleared?;
    let reopened = reopened?;
    // Closed tabs linger in the target list for a moment; readiness must
    // not find one, so wait for the browser to say each is gone.
    b.call("Target.setDiscoverTargets", json!({"discover": true}))
        .await?;
    for (id, _) in &pages {
        b.call("Target.closeTarget", json!({"targetId": id}))
            .await?;
    }
    for (id, _) in &pages {
        b.next_event("Target.targetDestroyed", |p| p["targetId"] == id.as_str())
            .await?;
    }
    b.close().await;
    Ok(reopened)
}

/// Opens `url` in a new maximized window of browser context `ctx` and
/// returns once it has loaded. Chromium creates the window and loads the
/// page at the same time; the load is then either already done (the
/// document is complete and no longer the tab's initial about:blank) or
/// reported by `Page.loadEventFired`, which `Page.enable` guarantees from
/// then on.
async fn reopen(b: &mut cdp::Connection, ctx: &str, url: &str) -> Result<(), DesktopError> {
    let created = b
        .call(
            "Target.createTarget",
            json!({
                "url": url,
                "browserContextId": ctx,
                "newWindow": true,
                // As the desktop showed its browser before the restore; asked
                // for here, it spares a resize and repaint after.
                "windowState": "maximized",
            }),
        )
        .await?;
    let id = created["targetId"]
        .as_str()
        .ok_or_else(|| DesktopError::Cdp("Target.createTarget returned no targetId".into()))?;
    let mut page =
        cdp::Connection::open(&format!("ws://127.0.0.1:{CDP_PORT}/devtools/page/{id}")).await?;
    page.call("Page.enable", json!({})).await?;
    // An evaluation racing the navigation's commit fails ("context
    // destroyed"): the load is still to come, so it counts as not loaded.
    let loaded = url == "about:blank"
        || page
            .evaluate("document.readyState === 'complete' && location.href !== 'about:blank'")
            .await
            .is_ok_and(|v| v == true);
    if !loaded {
        page.next_event("Page.loadEventFired", |_| true).await?;
    }
    page.close().await;
    Ok(())
}

/// `scheme://host[:port]` of an http(s) URL; other schemes (data:, about:,
/// file:) have no site storage to clear.
fn web_origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let host = rest.split(['/', '?', '#']).next()?;
    (!host.is_empty()).then(|| format!("{scheme}://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert_eq!(
            web_origin("https://a.b:8443/x?y#z").as_deref(),
            Some("https://a.b:8443")
        );
        assert_eq!(
            web_origin("http://10.0.0.1").as_deref(),
            Some("http://10.0.0.1")
        );
        assert_eq!(web_origin("data:text/html,<title>x</title>"), None);
        assert_eq!(web_origin("about:blank"), None);
        assert_eq!(web_origin("file:///tmp/x.html"), None);
    }

    #[test]
    fn singleton_lock_follows_the_hostname() {
        let tmp = tempfile::tempdir().unwrap();
        let user = User {
            name: "root".into(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            home: tmp.path().into(),
        };
        let p = tmp.path();
        assert_eq!(fix_singleton_lock(p, "new", &user).unwrap(), None);
        std::os::unix::fs::symlink("old-host-42", p.join("SingletonLock")).unwrap();
        assert_eq!(
            fix_singleton_lock(p, "sib-1", &user).unwrap().as_deref(),
            Some("sib-1-42")
        );
        assert_eq!(
            std::fs::read_link(p.join("SingletonLock"))
                .unwrap()
                .to_str(),
            Some("sib-1-42")
        );
        assert!(!p.join(".SingletonLock.drums").exists());
        std::fs::remove_file(p.join("SingletonLock")).unwrap();
        std::os::unix::fs::symlink("garbage", p.join("SingletonLock")).unwrap();
        assert!(fix_singleton_lock(p, "x", &user).is_err());
    }
}
