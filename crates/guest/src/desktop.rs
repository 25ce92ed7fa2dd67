//! `/v1/desktop…`: the desktop profile, run by the agent.
//!
//! - `POST /v1/desktop` starts Xvfb, dbus, openbox, Chromium and socat as the
//!   desktop user (see `drums_desktop::services`), then serves OSWorld's guest
//!   protocol on port 5000, and answers once the desktop is agent-ready.
//! - `GET /v1/desktop/ready` waits until it is agent-ready (after a restore).
//! - `POST /v1/desktop/hygiene` is the browser's part of clone hygiene.
//!
//! The agent is the desktop's supervisor rather than init because it already
//! answers drumsd, and readiness and hygiene need the CDP client it carries.
//! The services and the OSWorld listener live in the agent's process tree, so
//! a checkpoint captures them with everything else and a restored sibling
//! comes back with them running.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use drums_api::guest::DesktopStart;
use drums_desktop::{BrowserHygiene, DesktopConfig, DesktopError, User};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::ApiError;

/// OSWorld's clients reach the guest here.
pub const OSWORLD_PORT: u16 = 5000;
/// Whose desktop it is when the request does not say: OSWorld's user.
const DEFAULT_USER: &str = "user";
/// How long a cold start may take, from spawning Xvfb to agent-ready, when
/// the request does not say: Chromium's first start on a loaded 2-core
/// machine takes seconds, so two minutes means broken. drumsd sends its own
/// budget and waits a little longer, so that this agent's error, which
/// names the service that was late, is what the user sees.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `GET /v1/desktop/ready` waits when the query does not say.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct DesktopState {
    running: Mutex<Option<Running>>,
}

struct Running {
    user: User,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Started {
    pub services: Vec<Service>,
    /// Until Chromium's DevTools answered.
    pub started_ms: f64,
    pub ready: drums_desktop::Ready,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    pub pid: u32,
}

#[derive(Debug, Deserialize)]
struct ReadyQuery {
    timeout_ms: Option<u64>,
}

pub fn router() -> Router {
    Router::new()
        .route("/v1/desktop", post(start))
        .route("/v1/desktop/ready", get(ready))
        .route("/v1/desktop/hygiene", post(hygiene))
        .with_state(Arc::new(DesktopState::default()))
}

fn desktop_error(e: DesktopError) -> ApiError {
    let status = match e {
        DesktopError::Invalid(_) => StatusCode::BAD_REQUEST,
        DesktopError::AlreadyStarted | DesktopError::NoDesktop => StatusCode::CONFLICT,
        DesktopError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let kind = match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::CONFLICT => "conflict",
        StatusCode::GATEWAY_TIMEOUT => "timeout",
        _ => "desktop",
    };
    ApiError::new(status, kind, crate::error::lowercase_chain(&e))
}

async fn start(
    State(state): State<Arc<DesktopState>>,
    body: Result<Json<DesktopStart>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    let Json(req) = body.map_err(crate::server::json_rejection)?;
    let (width, height) = drums_desktop::parse_screen(req.screen.as_deref().unwrap_or("1280x800"))
        .map_err(desktop_error)?;
    let account = crate::users::lookup(Some(req.user.as_deref().unwrap_or(DEFAULT_USER)))
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    let user = User {
        name: account
            .name
            .clone()
            .unwrap_or_else(|| account.uid.to_string()),
        uid: account.uid,
        gid: account.gid,
        home: account.home.clone(),
    };
    let mut running = state.running.lock().await;
    if running.is_some() {
        return Err(desktop_error(DesktopError::AlreadyStarted));
    }
    let config = DesktopConfig {
        width,
        height,
        url: req.url.unwrap_or_else(|| drums_desktop::DEFAULT_URL.into()),
        user: user.clone(),
    };
    let timeout = req.timeout_ms.map_or(START_TIMEOUT, Duration::from_millis);
    let t0 = std::time::Instant::now();
    let desktop = drums_desktop::Desktop::start(config, timeout)
        .await
        .map_err(desktop_error)?;
    serve_osworld(&user).await?;
    *running = Some(Running { user });
    drop(running);
    let ready = drums_desktop::ready::wait(timeout.saturating_sub(t0.elapsed()))
        .await
        .map_err(desktop_error)?;
    Ok((
        StatusCode::CREATED,
        Json(Started {
            services: desktop
                .services
                .iter()
                .map(|(name, pid)| Service {
                    name: (*name).into(),
                    pid: *pid,
                })
                .collect(),
            started_ms: desktop.started_in.as_secs_f64() * 1e3,
            ready,
        }),
    ))
}

/// OSWorld's protocol on every address of the session (its own network
/// namespace), as OSWorld's VMs serve it.
async fn serve_osworld(user: &User) -> Result<(), ApiError> {
    let mut cfg = drums_osworld::OsworldConfig::for_user(drums_desktop::DISPLAY, &user.name)
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "desktop",
                format!("configure the OSWorld server: {e}"),
            )
        })?;
    // The same environment as the desktop's own programs (session bus,
    // runtime dir), so commands OSWorld runs see the desktop they drive.
    for (k, v) in user.env() {
        cfg.set_env(&k, &v);
    }
    let app = drums_osworld::router(Arc::new(cfg));
    let addr = SocketAddr::from(([0, 0, 0, 0], OSWORLD_PORT));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "desktop",
            format!("bind the OSWorld server to {addr}: {e}"),
        )
    })?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "OSWorld server stopped");
        }
    });
    Ok(())
}

async fn ready(
    State(state): State<Arc<DesktopState>>,
    q: Result<Query<ReadyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<drums_desktop::Ready>, ApiError> {
    let Query(q) = q.map_err(crate::server::query_rejection)?;
    if state.running.lock().await.is_none() {
        return Err(desktop_error(DesktopError::NoDesktop));
    }
    let timeout = q.timeout_ms.map_or(READY_TIMEOUT, Duration::from_millis);
    drums_desktop::ready::wait(timeout)
        .await
        .map(Json)
        .map_err(desktop_error)
}

async fn hygiene(
    State(state): State<Arc<DesktopState>>,
    body: Result<Json<BrowserHygiene>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<drums_desktop::BrowserReport>, ApiError> {
    let Json(req) = body.map_err(crate::server::json_rejection)?;
    crate::hygiene::validate_hostname(&req.hostname)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    let running = state.running.lock().await;
    let Some(r) = running.as_ref() else {
        return Err(desktop_error(DesktopError::NoDesktop));
    };
    drums_desktop::browser::apply(&r.user, &req)
        .await
        .map(Json)
        .map_err(desktop_error)
}
