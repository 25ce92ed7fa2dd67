//! The OSWorld guest HTTP protocol (the Flask server OSWorld runs inside its
//! VMs on port 5000), served by the drums guest agent so that OSWorld's
//! unmodified `PythonController` and `SetupController` can drive a drums
//! session. Coverage, and where we differ on purpose: docs/osworld.md.
//!
//! The agent runs as root; every command a client asks for runs as the
//! configured desktop user, with a fixed base environment, in that user's
//! home directory.

// Handlers return early with a ready `Response` as their error; boxing it
// would only add an allocation to every error path.
#![allow(clippy::result_large_err)]

mod accessibility;
mod error;
mod exec;
mod files;
mod recording;
mod reply;
mod screen;
mod user;
mod window;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use drums_screen::{Screen, ScreenError};

pub use error::ConfigError;
pub use user::UserSpec;

/// What the protocol needs to know about the session it serves.
#[derive(Clone, Debug)]
pub struct OsworldConfig {
    /// X display of the session, e.g. ":0".
    pub display: String,
    /// The desktop user commands run as.
    pub user: UserSpec,
    /// The complete environment of every command (nothing is inherited
    /// from the agent): DISPLAY, HOME, USER, LOGNAME, SHELL, PATH, LANG and,
    /// when set, DBUS_SESSION_BUS_ADDRESS. No XAUTHORITY: the session's
    /// Xvfb does not use one.
    pub env: Vec<(String, String)>,
    /// Where /start_recording writes its video.
    pub recordings_dir: PathBuf,
    /// The interpreter /run_python, /accessibility and /terminal use; the
    /// original hard-codes /usr/bin/python3, where Debian's pyatspi lives.
    pub python: PathBuf,
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl OsworldConfig {
    /// A config for `user` (looked up in /etc/passwd and /etc/group) on
    /// `display`, recording into `$TMPDIR/drums-osworld`.
    pub fn for_user(display: &str, user: &str) -> Result<OsworldConfig, ConfigError> {
        Ok(OsworldConfig::new(display, UserSpec::lookup(user)?))
    }

    /// A config for an already resolved user.
    pub fn new(display: &str, user: UserSpec) -> OsworldConfig {
        let home = user.home.to_string_lossy().into_owned();
        let env = vec![
            ("DISPLAY".to_string(), display.to_string()),
            ("HOME".to_string(), home),
            ("USER".to_string(), user.name.clone()),
            ("LOGNAME".to_string(), user.name.clone()),
            ("SHELL".to_string(), user.shell.clone()),
            ("PATH".to_string(), DEFAULT_PATH.to_string()),
            // Python decodes command output as UTF-8 only under a UTF-8 locale.
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ];
        OsworldConfig {
            display: display.to_string(),
            user,
            env,
            recordings_dir: std::env::temp_dir().join("drums-osworld"),
            python: PathBuf::from("/usr/bin/python3"),
        }
    }

    /// Adds DBUS_SESSION_BUS_ADDRESS to the commands' environment (AT-SPI,
    /// gsettings and most desktop apps need the session bus).
    pub fn with_dbus_session_bus(mut self, address: &str) -> OsworldConfig {
        self.set_env("DBUS_SESSION_BUS_ADDRESS", address);
        self
    }

    /// Sets (or replaces) one variable of the base environment.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
    }

    pub(crate) fn env_var(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Shared by all handlers of one router.
pub(crate) struct AppState {
    cfg: Arc<OsworldConfig>,
    /// One X connection, made on first use (the display may come up after
    /// the router) and dropped after an error so the next request
    /// reconnects.
    screen: Mutex<Option<Arc<Screen>>>,
    recording: tokio::sync::Mutex<Option<recording::Recording>>,
}

impl AppState {
    /// Blocking (connects to X): call from `spawn_blocking`.
    pub(crate) fn screen(&self) -> Result<Arc<Screen>, ScreenError> {
        let mut slot = self.screen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let s = Arc::new(Screen::connect(&self.cfg.display)?);
        *slot = Some(s.clone());
        Ok(s)
    }

    pub(crate) fn forget_screen(&self) {
        *self.screen.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

pub(crate) type State = axum::extract::State<Arc<AppState>>;

/// Every route of the original server that drums serves, with its method.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/screenshot"),
    ("GET", "/cursor_position"),
    ("POST", "/screen_size"),
    ("POST", "/window_size"),
    ("GET", "/platform"),
    ("POST", "/execute"),
    ("POST", "/setup/execute"),
    ("POST", "/execute_with_verification"),
    ("POST", "/setup/execute_with_verification"),
    ("POST", "/setup/launch"),
    ("POST", "/run_python"),
    ("POST", "/run_bash_script"),
    ("POST", "/file"),
    ("POST", "/setup/upload"),
    ("POST", "/list_directory"),
    ("POST", "/desktop_path"),
    ("POST", "/setup/open_file"),
    ("POST", "/setup/activate_window"),
    ("POST", "/setup/close_window"),
    ("POST", "/start_recording"),
    ("POST", "/end_recording"),
    ("GET", "/accessibility"),
    ("GET", "/terminal"),
];

/// The OSWorld protocol as an axum router (serve it on port 5000 inside the
/// session's network namespace).
pub fn router(cfg: Arc<OsworldConfig>) -> Router {
    let state = Arc::new(AppState {
        cfg,
        screen: Mutex::new(None),
        recording: tokio::sync::Mutex::new(None),
    });
    Router::new()
        .route("/screenshot", get(screen::screenshot))
        .route("/cursor_position", get(screen::cursor_position))
        .route("/screen_size", post(screen::screen_size))
        .route("/window_size", post(screen::window_size))
        .route("/platform", get(platform))
        .route("/execute", post(exec::execute))
        .route("/setup/execute", post(exec::execute))
        .route(
            "/execute_with_verification",
            post(exec::execute_with_verification),
        )
        .route(
            "/setup/execute_with_verification",
            post(exec::execute_with_verification),
        )
        .route("/setup/launch", post(exec::launch))
        .route("/run_python", post(exec::run_python))
        .route("/run_bash_script", post(exec::run_bash_script))
        .route("/file", post(files::get_file))
        // OSWorld uploads whole documents and datasets; the original has no limit.
        .route(
            "/setup/upload",
            post(files::upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/list_directory", post(files::list_directory))
        .route("/desktop_path", post(files::desktop_path))
        .route("/setup/open_file", post(window::open_file))
        .route("/setup/activate_window", post(window::activate_window))
        .route("/setup/close_window", post(window::close_window))
        .route("/start_recording", post(recording::start))
        .route("/end_recording", post(recording::end))
        .route("/accessibility", get(accessibility::accessibility))
        .route("/terminal", get(accessibility::terminal))
        .fallback(|| async { reply::not_found() })
        .method_not_allowed_fallback(|| async { reply::method_not_allowed() })
        .with_state(state)
}

async fn platform() -> axum::response::Response {
    reply::text(axum::http::StatusCode::OK, "Linux")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Method, Request, StatusCode};
    use tower::ServiceExt;

    /// ROUTES (what the docs and callers rely on) and the router agree: each
    /// listed path exists (asked with the other method it answers 405, not
    /// the fallback's 404), and an unlisted one does not.
    #[tokio::test]
    async fn routes_match_the_router() {
        let user = UserSpec {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            home: "/nonexistent".into(),
            shell: "/bin/sh".into(),
            groups: vec![65534],
        };
        let app = router(Arc::new(OsworldConfig::new(":99", user)));
        let status = |method: Method, path: &str| {
            let app = app.clone();
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())
                .unwrap();
            async move { app.oneshot(req).await.unwrap().status() }
        };
        for (method, path) in ROUTES {
            let other = if *method == "GET" {
                Method::DELETE
            } else {
                Method::GET
            };
            assert_eq!(
                status(other, path).await,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is listed but not routed"
            );
        }
        assert_eq!(
            status(Method::GET, "/no_such_route").await,
            StatusCode::NOT_FOUND
        );
    }
}
