//! Agent-ready, as the seed defines it for a desktop: the page's title is
//! present, and a screenshot differs from a blank desktop in more than 10%
//! of its pixels.
//!
//! Both halves wait on notifications rather than on a sleep loop: the title
//! is read by a promise that resolves on the page's `load` event, a missing
//! tab is waited for with `Target.targetCreated`, and the screenshot is
//! retaken only when the X server reports damage to the screen.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cdp::{self, Connection};
use crate::{DesktopError, CDP_PORT, DISPLAY};

/// More than this fraction of pixels must differ from the blank desktop.
pub const MIN_CHANGED: f64 = 0.10;

/// How agent-readiness was reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ready {
    /// `document.title` of the first tab.
    pub title: String,
    pub url: String,
    /// Fraction of the screen that differs from a blank desktop.
    pub changed: f64,
    /// Time the check took (from when it was called).
    pub ms: f64,
}

/// `[title, url]` once the first tab has loaded. Resolves at once on a
/// loaded page, so it is cheap after a restore.
const TITLE_AFTER_LOAD: &str = "new Promise(r => { \
    const done = () => r([document.title, location.href]); \
    document.readyState === 'complete' ? done() : addEventListener('load', done, {once: true}); })";

/// Waits until the desktop is agent-ready, or `timeout` passes.
pub async fn wait(timeout: Duration) -> Result<Ready, DesktopError> {
    let t0 = Instant::now();
    let deadline = t0 + timeout;
    // The two halves are independent: the screen is checked while the page
    // loads, and readiness is when both hold.
    let screen = tokio::task::spawn_blocking(move || screen_changed(deadline, timeout));
    let page = async {
        let page = first_page(deadline).await?;
        let mut conn = Connection::open(&page.1).await?;
        let loaded = tokio::time::timeout_at(deadline.into(), loaded(&mut conn))
            .await
            .map_err(|_| timeout_err("the page's load event", timeout))?;
        conn.close().await;
        let loaded = loaded?;
        let title = loaded[0].as_str().unwrap_or_default().to_owned();
        if title.is_empty() {
            return Err(DesktopError::Cdp(format!(
                "the page {} has loaded without a title",
                page.0
            )));
        }
        Ok((title, loaded[1].as_str().unwrap_or_default().to_owned()))
    };
    let (page, screen) = tokio::join!(page, screen);
    let (title, url) = page?;
    let changed = screen.expect("screen check does not panic")?;
    Ok(Ready {
        title,
        url,
        changed,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// `[title, url]` of the tab once its page has loaded. A new tab shows an
/// initial about:blank document (complete, untitled) until its first
/// navigation commits, and an evaluation racing that commit fails: both
/// mean the page's own load is still to come, and `Page.enable` makes the
/// browser report it.
async fn loaded(conn: &mut Connection) -> Result<serde_json::Value, DesktopError> {
    conn.call("Page.enable", json!({})).await?;
    loop {
        match conn.evaluate(TITLE_AFTER_LOAD).await {
            Ok(v) if v[1] != "about:blank" => return Ok(v),
            _ => {
                conn.next_event("Page.loadEventFired", |_| true).await?;
            }
        }
    }
}

fn timeout_err(what: &str, timeout: Duration) -> DesktopError {
    DesktopError::Timeout {
        what: what.into(),
        seconds: timeout.as_secs(),
    }
}

/// (url, WebSocket URL) of the first page target, waiting for one to exist.
async fn first_page(deadline: Instant) -> Result<(String, String), DesktopError> {
    let ws = |id: &str| format!("ws://127.0.0.1:{CDP_PORT}/devtools/page/{id}");
    let mut browser = cdp::browser("127.0.0.1", CDP_PORT).await?;
    let targets = browser.call("Target.getTargets", json!({})).await?;
    if let Some(t) = targets["targetInfos"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["type"] == "page")
    {
        let found = (
            t["url"].as_str().unwrap_or_default().to_owned(),
            ws(t["targetId"].as_str().unwrap_or_default()),
        );
        browser.close().await;
        return Ok(found);
    }
    browser
        .call("Target.setDiscoverTargets", json!({"discover": true}))
        .await?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    let ev = tokio::time::timeout(
        remaining,
        browser.next_event("Target.targetCreated", |p| {
            p["targetInfo"]["type"] == "page"
        }),
    )
    .await
    .map_err(|_| timeout_err("a browser tab", remaining))??;
    browser.close().await;
    let info = &ev["targetInfo"];
    Ok((
        info["url"].as_str().unwrap_or_default().to_owned(),
        ws(info["targetId"].as_str().unwrap_or_default()),
    ))
}

/// Captures the screen until more than [`MIN_CHANGED`] of it differs from
/// black (Xvfb's `-br` root), waiting for X damage between captures.
fn screen_changed(deadline: Instant, timeout: Duration) -> Result<f64, DesktopError> {
    let screen = drums_screen::Screen::connect(DISPLAY)?;
    loop {
        // Changes from here on are reported by wait_for_damage, so none
        // between this capture and the wait is missed.
        screen.reset_damage()?;
        let frame = screen.capture(false)?;
        let blank = drums_screen::Frame::solid(frame.width, frame.height, [0, 0, 0]);
        let changed = frame.differing_fraction(&blank);
        if changed > MIN_CHANGED {
            return Ok(changed);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || !screen.wait_for_damage(remaining)? {
            return Err(DesktopError::Timeout {
                what: format!(
                    "a screen that differs from a blank desktop (last {:.1}%)",
                    changed * 100.0
                ),
                seconds: timeout.as_secs(),
            });
        }
    }
}
