//! The desktop profile inside a session: Xvfb, a D-Bus session bus,
//! openbox and Chromium (as `google-chrome`), started by the guest agent;
//! the agent-ready check; and the browser's part of clone hygiene.
//!
//! Layout:
//! - [`services`]: starting the four services as the desktop user, each
//!   waited for by a notification it gives (Xvfb's `-displayfd`, dbus's
//!   `--print-address`, Chromium's "DevTools listening" line), not by sleeping;
//! - [`cdp`]: a small Chrome DevTools Protocol client (HTTP `/json` and one
//!   WebSocket per target);
//! - [`ready`]: "agent-ready", the seed's definition: the page title is
//!   present and a screenshot differs from a blank desktop in more than 10%
//!   of its pixels;
//! - [`browser`]: after a restore, Chromium's profile lock follows the new
//!   hostname, and for a checkpoint declared clean, cookies and storage are
//!   cleared and pages move to a fresh browser context.

pub mod browser;
pub mod cdp;
pub mod ready;
pub mod services;

use std::path::PathBuf;

pub use browser::{BrowserHygiene, BrowserReport};
pub use ready::Ready;
pub use services::Desktop;

/// The X display every desktop session uses. OSWorld's VMs use `:0`, and a
/// session has its own filesystem and network, so there is nothing to
/// collide with.
pub const DISPLAY: &str = ":0";
/// Chromium's own DevTools port, on loopback only (Chromium ignores
/// `--remote-debugging-address` outside headless mode). OSWorld's task
/// configs use the same pair: Chromium on 1337 and socat on 9222.
pub const CDP_PORT: u16 = 1337;
/// Where socat makes DevTools reachable on every address of the session.
pub const PUBLIC_CDP_PORT: u16 = 9222;
/// The page a desktop opens when the caller names none: local (the sandbox
/// has no internet), titled, and far from blank.
pub const DEFAULT_URL: &str = "data:text/html,<title>drums desktop</title>\
<body style='margin:0;background:%23f4f1ea;font:48px sans-serif'>\
<h1 style='padding:80px'>drums desktop</h1></body>";

/// Who runs the desktop: OSWorld's `user`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl User {
    /// `$XDG_RUNTIME_DIR`, on the session's `/run` tmpfs.
    pub fn runtime_dir(&self) -> PathBuf {
        PathBuf::from(format!("/run/user/{}", self.uid))
    }

    /// Chromium's profile, where the `google-chrome` wrapper puts it.
    pub fn chrome_profile(&self) -> PathBuf {
        self.home.join(".config/google-chrome")
    }

    /// The session bus address the desktop's programs share.
    pub fn bus_address(&self) -> String {
        format!("unix:path={}/bus", self.runtime_dir().display())
    }

    /// The environment every desktop program (and OSWorld's commands) gets.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("DISPLAY".into(), DISPLAY.into()),
            ("HOME".into(), self.home.display().to_string()),
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
            (
                "PATH".into(),
                "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
            ),
            (
                "XDG_RUNTIME_DIR".into(),
                self.runtime_dir().display().to_string(),
            ),
            ("DBUS_SESSION_BUS_ADDRESS".into(), self.bus_address()),
            ("LANG".into(), "C.UTF-8".into()),
        ]
    }
}

/// What a desktop shows: screen size and first page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesktopConfig {
    pub width: u32,
    pub height: u32,
    pub url: String,
    pub user: User,
}

/// Parses `WIDTHxHEIGHT`, within what Xvfb and a screenshot can hold.
pub fn parse_screen(s: &str) -> Result<(u32, u32), DesktopError> {
    let bad = || {
        DesktopError::Invalid(format!(
            "screen {s:?}: expected WIDTHxHEIGHT such as 1280x800, each 64 to 8192"
        ))
    };
    let (w, h) = s.split_once('x').ok_or_else(bad)?;
    let w: u32 = w.parse().map_err(|_| bad())?;
    let h: u32 = h.parse().map_err(|_| bad())?;
    if !(64..=8192).contains(&w) || !(64..=8192).contains(&h) {
        return Err(bad());
    }
    Ok((w, h))
}

#[derive(Debug, thiserror::Error)]
pub enum DesktopError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot {op}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{service} exited before it was ready ({status}); its log: {log}")]
    Exited {
        service: &'static str,
        status: String,
        log: String,
    },
    #[error("{what} was not ready within {seconds} s")]
    Timeout { what: String, seconds: u64 },
    #[error("DevTools: {0}")]
    Cdp(String),
    #[error("screenshot")]
    Screen(#[from] drums_screen::ScreenError),
    #[error("the desktop is already started")]
    AlreadyStarted,
    #[error("this session has no desktop")]
    NoDesktop,
}

impl DesktopError {
    pub(crate) fn io(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> DesktopError {
        let op = op.into();
        move |source| DesktopError::Io { op, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screen_sizes() {
        assert_eq!(parse_screen("1280x800").unwrap(), (1280, 800));
        assert_eq!(parse_screen("1920x1080").unwrap(), (1920, 1080));
        for bad in [
            "",
            "1280",
            "1280x",
            "x800",
            "0x0",
            "99999x800",
            "12a0x800",
            "1280X800",
        ] {
            assert!(parse_screen(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_url_is_a_titled_data_page() {
        assert!(DEFAULT_URL.starts_with("data:text/html,<title>"));
        assert!(!DEFAULT_URL.contains('#'), "a raw # would end the data URL");
    }
}
