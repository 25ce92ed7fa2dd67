//! The session API: what drumsd serves to the sessions themselves, on the
//! bridge address (the sessions' gateway), so that an agent inside a session
//! can list and roll back its own session's versions (docs/agent-tool.md).
//!
//! It is a router of its own, apart from the main API's table and spec: the
//! main API is root's, on a unix socket, and can do anything to any session;
//! this one is reachable by hostile code and can do two things, each to the
//! caller's own session only:
//!
//! - `GET /v1/self/versions`: the session's versions;
//! - `POST /v1/self/rollback` `{"to": N | "ID"}`: answered 202 at once, and
//!   the rollback runs afterwards, since it replaces every process of the
//!   session, the caller's included. Each session may have at most
//!   `--self-rollbacks-per-minute` of them started in any minute; more are
//!   429 with a Retry-After.
//!
//! Anything else is 404, and a connection from an address that is no
//! session's is 403 whatever it asks.
//!
//! **Who is calling** is read from the connection's source address, and from
//! nothing the session says. That is sound because of two things:
//! - the listening socket is bound to the bridge device (SO_BINDTODEVICE), so
//!   a packet for the bridge address that arrives on another interface (from
//!   a network outside, with a session's address as its source) is not
//!   accepted. The host's own connections are (the kernel counts them as the
//!   bridge's), with a source address of the host's, which is no session's:
//!   403. An unprivileged host process cannot send from a session's address
//!   (a non-local source needs IP_TRANSPARENT or a raw socket: CAP_NET_ADMIN
//!   or CAP_NET_RAW); host root is trusted anyway;
//! - on the bridge, the firewall's anti-spoofing (the `bridge drums-BRIDGE`
//!   table of `drums_net::firewall`) lets a session's port send IPv4 only
//!   with the (port, MAC, IPv4) drumsd listed for it when it made its veth,
//!   before the veth joined the bridge; every other frame of that port is
//!   dropped. So a source address on the bridge is the session's that owns it.
//!
//! The address is looked up at each request: a session that rolled back
//! keeps its address, and a removed session's address goes back to the pool
//! only once its processes are gone.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use drums_api::{RollingBack, SelfRollback, SessionVersions};
use drums_session::Manager;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::error::ApiError;
use crate::json::OptionalJsonBody;
pub use drums_session::budget::Budget;

/// How long a self rollback waits after its answer was handed to the
/// connection before it starts: the answer travels to drumsd's caller (the
/// session's guest agent) and from there to the process that asked, both of
/// which the rollback then replaces. A caller that has not read it by then
/// loses only the answer; its process was going to be replaced anyway.
pub const ROLLBACK_GRACE: Duration = Duration::from_millis(500);

/// The session API's state: the manager, the self rollbacks under way, and
/// each session's budget of them.
pub struct SessionApi {
    manager: Arc<Manager>,
    /// Self rollbacks granted per session and minute (drumsd's
    /// `--self-rollbacks-per-minute`).
    rollbacks: Budget,
    /// Sessions with a self rollback answered and not finished: a second one
    /// is refused (409) rather than queued behind the first.
    rolling: Mutex<HashSet<String>>,
    /// The rollbacks themselves, waited for at shutdown.
    tasks: Mutex<JoinSet<()>>,
}

/// The calling session, as its source address names it.
#[derive(Clone)]
struct Caller(drums_api::Session);

impl SessionApi {
    pub fn new(manager: Arc<Manager>, rollbacks: Budget) -> Arc<SessionApi> {
        Arc::new(SessionApi {
            manager,
            rollbacks,
            rolling: Mutex::new(HashSet::new()),
            tasks: Mutex::new(JoinSet::new()),
        })
    }

    /// Wait for the self rollbacks already answered: drumsd's shutdown then
    /// removes sessions that are whole, not half rebuilt.
    pub async fn drain(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        while tasks.join_next().await.is_some() {}
    }
}

pub fn router(api: Arc<SessionApi>) -> Router {
    let not_found = |uri: axum::http::Uri| async move {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route {}", uri.path()),
        )
    };
    Router::new()
        .route("/v1/self/versions", get(versions))
        .route("/v1/self/rollback", post(rollback))
        .fallback(not_found)
        // Only two operations exist here; any other method is no route.
        .method_not_allowed_fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(api.clone(), identify))
        .with_state(api)
        .layer(axum::middleware::from_fn(crate::server::uri_limit))
}

/// At most this many connections at once from one address. An agent's tool
/// calls come one at a time; more is a session holding drumsd's sockets and
/// memory, and the extra connections are closed as soon as accepted, so one
/// session cannot take the service from the others.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 8;
/// How long a connection may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection lives, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Serve the session API on `listener` until `shutdown`, with each
/// connection's source address for [`identify`], within the bounds above.
pub async fn serve(
    listener: TcpListener,
    api: Arc<SessionApi>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use tower::ServiceExt as _;
    let router = router(api);
    let bounds = crate::bounded::Bounds {
        per_address: MAX_CONNECTIONS_PER_ADDRESS,
        header_timeout: HEADER_TIMEOUT,
        lifetime: Some(CONNECTION_LIFETIME),
    };
    let make = |peer: SocketAddr| {
        let service =
            router
                .clone()
                .map_request(move |req: hyper::Request<hyper::body::Incoming>| {
                    let mut req = req.map(axum::body::Body::new);
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req
                });
        hyper_util::service::TowerToHyperService::new(service)
    };
    // Requests under way end at shutdown; a self rollback already answered
    // is a task of its own, which drumsd's shutdown waits for
    // (SessionApi::drain).
    crate::bounded::serve(listener, "session api", bounds, make, shutdown).await
}

/// Names the caller by its source address alone (see the module's comment),
/// before any route: an address that is no session's gets 403 for anything.
async fn identify(
    State(api): State<Arc<SessionApi>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    let SocketAddr::V4(peer) = peer else {
        return forbidden(&peer.ip().to_string());
    };
    match api.manager.session_at(*peer.ip()) {
        Ok(Some(s)) => {
            req.extensions_mut().insert(Caller(s));
            next.run(req).await
        }
        Ok(None) => forbidden(&peer.ip().to_string()),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// 429 with a Retry-After (whole seconds, rounded up) and what the budget is.
fn too_many(session: &str, budget: &Budget, wait: Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut r = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_requests",
        format!(
            "session {session} asked for more than {} self rollbacks in {} s: try again in {secs} s",
            budget.limit(),
            budget.window().as_secs()
        ),
    )
    .into_response();
    r.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(secs.max(1)),
    );
    r
}

fn forbidden(ip: &str) -> Response {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("{ip} is no session's address"),
    )
    .into_response()
}

async fn versions(
    State(api): State<Arc<SessionApi>>,
    Extension(Caller(s)): Extension<Caller>,
) -> Result<Json<SessionVersions>, ApiError> {
    Ok(Json(SessionVersions {
        versions: api.manager.session_versions(&s.id)?,
    }))
}

/// Removes the session from the rollbacks under way when dropped.
struct Rolling {
    api: Arc<SessionApi>,
    session: String,
}

impl Drop for Rolling {
    fn drop(&mut self) {
        self.api
            .rolling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.session);
    }
}

async fn rollback(
    State(api): State<Arc<SessionApi>>,
    Extension(Caller(s)): Extension<Caller>,
    OptionalJsonBody(req): OptionalJsonBody<SelfRollback>,
) -> Result<Response, ApiError> {
    let to = req.and_then(|r| r.to).map(|t| t.to_string());
    let inserted = api
        .rolling
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(s.id.clone());
    if !inserted {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("a rollback of session {} is already under way", s.name),
        ));
    }
    let guard = Rolling {
        api: api.clone(),
        session: s.id.clone(),
    };
    // Checked before the answer: an unknown version (400), one not done or
    // without processes (409), a session that is not running (409).
    let target = api.manager.rollback_target(&s.id, to.as_deref())?;
    // Charged only for a rollback that will run: a refused one cost nothing.
    if let Err(wait) = api.rollbacks.take(&s.id, std::time::Instant::now()) {
        return Ok(too_many(&s.name, &api.rollbacks, wait));
    }
    let m = api.manager.clone();
    let (id, name, version) = (s.id.clone(), s.name.clone(), target.id.clone());
    let number = target.number;
    api.tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .spawn(async move {
            let _guard = guard;
            tokio::time::sleep(ROLLBACK_GRACE).await;
            match m.rollback(&id, Some(&version)).await {
                Ok(_) => info!(session = %name, version = number, "session rolled itself back"),
                Err(e) => warn!(
                    "self rollback of {name} to version {number}: {}",
                    drums_api::error_chain(&e)
                ),
            }
        });
    // Reap the finished ones, so the set holds only what runs.
    while api
        .tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .try_join_next()
        .is_some()
    {}
    info!(session = %s.name, version = number, "self rollback answered");
    Ok((
        StatusCode::ACCEPTED,
        Json(RollingBack {
            rolling_back_to: number,
            version: target.id,
        }),
    )
        .into_response())
}
