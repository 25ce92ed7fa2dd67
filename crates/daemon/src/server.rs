//! Routes: one handler per resource and verb, each a few lines that call the
//! session manager. The router is built from one table, which must match
//! `api/openapi.yaml` both ways (tested).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::handler::Handler;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use bytes::Bytes;
use drums_api::{Capacity, CreateSession, Fault, SessionList, Version};
use drums_session::Manager;
use tracing::{info, warn};

use crate::error::ApiError;
use crate::json::{JsonBody, OptionalJsonBody};

type AppState = Arc<Manager>;
type Result<T> = std::result::Result<T, ApiError>;

/// One route: its method, its path (in the OpenAPI document's syntax, which
/// axum's shares) and its handler, routed for that method alone.
struct Route {
    method: Method,
    path: &'static str,
    handler: MethodRouter<AppState>,
}

fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: Handler<T, AppState>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a method axum routes");
    Route {
        method,
        path,
        handler: on(filter, handler),
    }
}

/// Every route served. The router is built from this table and nothing else,
/// and [`routes`] lists it, so the list the spec is tested against is the
/// router's own.
fn table() -> Vec<Route> {
    use Method as M;
    vec![
        route(M::GET, "/v1/version", version),
        route(M::GET, "/v1/images", crate::images::list),
        route(M::POST, "/v1/images/pull", crate::images::pull),
        route(M::POST, "/v1/images/import", crate::images::import),
        route(M::DELETE, "/v1/images/{image}", crate::images::remove),
        route(M::POST, "/v1/images/{image}/tag", crate::images::tag),
        route(M::GET, "/v1/sessions", list),
        route(M::POST, "/v1/sessions", create),
        route(M::GET, "/v1/sessions/{session}", show),
        route(M::DELETE, "/v1/sessions/{session}", remove),
        route(M::GET, "/v1/sessions/{session}/stats", stats),
        route(M::POST, "/v1/sessions/{session}/exec", exec),
        route(M::GET, "/v1/sessions/{session}/files", to_guest),
        route(M::PUT, "/v1/sessions/{session}/files", to_guest),
        route(M::GET, "/v1/sessions/{session}/dir", to_guest),
        route(M::POST, "/v1/sessions/{session}/fork", fork),
        route(M::POST, "/v1/sessions/{session}/turn/begin", turn_begin),
        route(M::POST, "/v1/sessions/{session}/turn/end", turn_end),
        route(
            M::GET,
            "/v1/sessions/{session}/coordinator",
            coordinated_turns,
        ),
        route(M::GET, "/v1/sessions/{session}/versions", versions),
        route(
            M::PUT,
            "/v1/sessions/{session}/replication",
            crate::replication::on,
        ),
        route(
            M::GET,
            "/v1/sessions/{session}/replication",
            crate::replication::show,
        ),
        route(
            M::DELETE,
            "/v1/sessions/{session}/replication",
            crate::replication::off,
        ),
        route(
            M::GET,
            "/v1/sessions/{session}/replication/next",
            crate::replication::next,
        ),
        route(
            M::POST,
            "/v1/sessions/{session}/replication/ack",
            crate::replication::ack,
        ),
        route(M::POST, "/v1/sessions/{session}/rollback", rollback),
        route(M::POST, "/v1/sessions/{session}/recover", recover),
        route(M::GET, "/v1/jobs/{job}", job),
        route(M::POST, "/v1/jobs/{job}/promote", promote_job),
        route(M::GET, "/v1/sessions/{session}/turns", turns),
        route(M::DELETE, "/v1/sessions/{session}/turns", stop_inspecting),
        route(M::POST, "/v1/sessions/{session}/agent", mark_agent),
        route(M::GET, "/v1/checkpoints", checkpoints),
        route(M::POST, "/v1/checkpoints", checkpoint),
        route(M::GET, "/v1/checkpoints/{checkpoint}", show_checkpoint),
        route(M::DELETE, "/v1/checkpoints/{checkpoint}", remove_checkpoint),
        route(M::POST, "/v1/checkpoints/{checkpoint}/restore", restore),
        route(M::GET, "/v1/checkpoints/{checkpoint}/export", export),
        route(M::POST, "/v1/checkpoints/import", import),
        route(M::GET, "/v1/pools", crate::pools::list),
        route(M::POST, "/v1/pools", crate::pools::create),
        route(M::GET, "/v1/pools/{pool}", crate::pools::show),
        route(M::DELETE, "/v1/pools/{pool}", crate::pools::remove),
        route(M::POST, "/v1/pools/{pool}/take", crate::pools::take),
        route(M::GET, "/v1/keys/host", host_key),
        route(M::GET, "/v1/capacity", capacity),
        route(M::GET, "/v1/audit", audit),
        route(M::POST, "/v1/debug/faults", fault),
        route(M::GET, "/openapi.yaml", openapi),
    ]
}

/// Every (method, path) the router serves, the method in lowercase as the
/// OpenAPI document spells it.
pub fn routes() -> Vec<(String, String)> {
    table()
        .into_iter()
        .map(|r| (r.method.as_str().to_lowercase(), r.path.to_owned()))
        .collect()
}

pub fn router(
    m: AppState,
    coordinator: Arc<drums_coordinator::Coordinator>,
    pools: Arc<drums_session::pools::Pools>,
) -> Router {
    // Two rows on one path merge into one method router.
    table()
        .into_iter()
        .fold(Router::new(), |r, row| r.route(row.path, row.handler))
        .fallback(|uri: Uri| async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route {}", uri.path()),
            )
        })
        // axum's own answer is an empty body; every error here is an ErrorBody.
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} does not take {method}", uri.path()),
            )
        })
        .with_state(m)
        .layer(axum::Extension(coordinator))
        .layer(axum::Extension(pools))
        .layer(axum::middleware::from_fn(uri_limit))
        .layer(axum::middleware::from_fn(crate::request_id::layer))
}

/// The longest request target (path and query) served; no route needs more
/// than a few hundred bytes. hyper answers a target over 65534 bytes itself,
/// with an empty 414, before any of this runs (that limit is fixed in
/// hyper); up to there, this gives the ErrorBody every other error has.
pub const MAX_URI: usize = 8 << 10;

pub(crate) async fn uri_limit(req: Request, next: axum::middleware::Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request target is {len} bytes, more than the {MAX_URI} served"),
        )
        .into_response();
    }
    next.run(req).await
}

async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        drums_api::OPENAPI_YAML,
    )
}

async fn version(
    State(m): State<AppState>,
    axum::Extension(c): axum::Extension<Arc<drums_coordinator::Coordinator>>,
) -> Json<Version> {
    Json(Version {
        version: env!("CARGO_PKG_VERSION").into(),
        api: "v1".into(),
        pid: std::process::id(),
        state_dir: m.config().state_dir.display().to_string(),
        llm_proxy_local: c.local_address().map(|a| a.to_string()),
    })
}

async fn capacity(State(m): State<AppState>) -> Result<Json<Capacity>> {
    let sessions = m.list()?;
    let cfg = m.config();
    Ok(Json(Capacity {
        sessions: sessions.len() as u64,
        max_sessions: cfg.max_sessions,
        sessions_memory_bytes: cfg.sessions_caps.memory_bytes,
        memory_committed_bytes: sessions
            .iter()
            .filter_map(|s| s.limits.memory_bytes)
            .fold(0u64, u64::saturating_add),
        default_memory_bytes: cfg.default_limits.memory_bytes,
        memory_available_bytes: drums_cgroup::host_memory_available_bytes().unwrap_or(0),
        cpus: drums_cgroup::host_cpus(),
    }))
}

async fn list(State(m): State<AppState>) -> Result<Json<SessionList>> {
    Ok(Json(SessionList {
        sessions: m.list()?,
    }))
}

async fn create(
    State(m): State<AppState>,
    JsonBody(req): JsonBody<CreateSession>,
) -> Result<impl IntoResponse> {
    let s = m.create(&req).await?;
    info!(session = %s.id, name = %s.name, "session created");
    Ok((StatusCode::CREATED, Json(s)))
}

async fn show(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::Session>> {
    Ok(Json(m.get(&id)?))
}

async fn remove(State(m): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    m.remove(&id).await?;
    info!(session = %id, "session removed");
    Ok(StatusCode::NO_CONTENT)
}

async fn checkpoints(State(m): State<AppState>) -> Result<Json<drums_api::CheckpointList>> {
    Ok(Json(drums_api::CheckpointList {
        checkpoints: m.checkpoints()?,
    }))
}

async fn checkpoint(
    State(m): State<AppState>,
    JsonBody(req): JsonBody<drums_api::CreateCheckpoint>,
) -> Result<impl IntoResponse> {
    let ck = m.checkpoint(&req).await?;
    info!(checkpoint = %ck.id, name = %ck.name, session = %req.session, "checkpoint created");
    Ok((StatusCode::CREATED, Json(ck)))
}

async fn show_checkpoint(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::Checkpoint>> {
    Ok(Json(m.get_checkpoint(&id)?))
}

async fn remove_checkpoint(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    m.remove_checkpoint(&id).await?;
    info!(checkpoint = %id, "checkpoint removed");
    Ok(StatusCode::NO_CONTENT)
}

async fn restore(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<drums_api::RestoreRequest>,
) -> Result<impl IntoResponse> {
    let req = req.unwrap_or_else(one_sibling);
    let r = m.restore(&id, req.count, req.name.as_deref()).await?;
    log_restored(&id, &r);
    Ok((StatusCode::CREATED, Json(r)))
}

fn log_restored(checkpoint: &str, r: &drums_api::RestoreResult) {
    let ids: Vec<&str> = r.sessions.iter().map(|s| s.id.as_str()).collect();
    info!(checkpoint, sessions = %ids.join(","), "checkpoint restored");
}

/// What an empty restore or fork body means: one unnamed sibling.
fn one_sibling() -> drums_api::RestoreRequest {
    drums_api::RestoreRequest {
        count: 1,
        name: None,
    }
}

/// Checkpoint (leaving the session running), then restore `count` siblings.
async fn fork(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<drums_api::ForkRequest>,
) -> Result<impl IntoResponse> {
    let req = req.unwrap_or(drums_api::ForkRequest {
        count: 1,
        name: None,
        at: None,
        keep: false,
    });
    // Refused before the checkpoint, which would otherwise be left behind.
    drums_session::restore::check_siblings(req.count, req.name.as_deref())?;
    if let Some(at) = &req.at {
        let v = m.version_of_session(&id, at)?;
        let r = m.restore(&v, req.count, req.name.as_deref()).await?;
        log_restored(&v, &r);
        return Ok((StatusCode::CREATED, Json(r)));
    }
    let ck = m
        .checkpoint(&drums_api::CreateCheckpoint {
            session: id.clone(),
            name: None,
            clean: false,
            leave_running: true,
        })
        .await?;
    info!(checkpoint = %ck.id, session = %id, keep = req.keep, "checkpoint created for a fork");
    // The checkpoint exists for its siblings: it goes with the last of them
    // (docs/checkpoints.md), and with a restore that failed.
    if !req.keep {
        m.checkpoint_goes_with_siblings(&ck.id)?;
    }
    let mut r = match m.restore(&ck.id, req.count, req.name.as_deref()).await {
        Ok(r) => r,
        Err(e) => {
            if !req.keep {
                if let Err(rm) = m.remove_checkpoint(&ck.id).await {
                    warn!(checkpoint = %ck.id, "remove the checkpoint of a fork whose restore failed: {}", drums_api::error_chain(&rm));
                }
            }
            return Err(e.into());
        }
    };
    r.checkpoint_kept = req.keep;
    log_restored(&ck.id, &r);
    Ok((StatusCode::CREATED, Json(r)))
}

async fn turn_begin(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::TurnBegun>> {
    Ok(Json(m.turn_begin(&id)?))
}

async fn turn_end(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<drums_api::EndTurn>,
) -> Result<Json<drums_api::TurnEffects>> {
    Ok(Json(m.end_turn(&id, &req.unwrap_or_default()).await?))
}

/// What the coordinator's LLM proxy saw of a session's turns.
async fn coordinated_turns(
    axum::Extension(c): axum::Extension<Arc<drums_coordinator::Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::CoordinatedTurns>> {
    Ok(Json(drums_api::CoordinatedTurns {
        turns: c.turns(&id)?,
    }))
}

async fn versions(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::SessionVersions>> {
    Ok(Json(drums_api::SessionVersions {
        versions: m.session_versions(&id)?,
    }))
}

async fn rollback(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<drums_api::Rollback>,
) -> Result<Json<drums_api::Session>> {
    let req = req.unwrap_or_default();
    let s = m.rollback(&id, req.to.as_deref()).await?;
    info!(session = %s.id, to = ?req.to, "session rolled back");
    Ok(Json(s))
}

async fn recover(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::Session>> {
    let s = m.recover(&id).await?;
    info!(session = %s.id, "session recovered");
    Ok(Json(s))
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JobQuery {
    /// Answer once the job has finished.
    #[serde(default)]
    wait: bool,
}

async fn job(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: std::result::Result<
        axum::extract::Query<JobQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Json<drums_api::Job>> {
    let axum::extract::Query(q) = q.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("job query: {e}"),
        )
    })?;
    Ok(Json(m.job(&id, q.wait).await?))
}

async fn promote_job(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::Job>> {
    Ok(Json(m.promote_job(&id).await?))
}

async fn mark_agent(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<drums_api::MarkAgent>,
) -> Result<Json<drums_api::AgentMarked>> {
    Ok(Json(m.mark_agent(&id, req.pid)?))
}

async fn stop_inspecting(State(m): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    m.stop_inspecting(&id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Each turn's effects as it ends, one JSON line each, until the session is
/// removed or the client goes away.
async fn turns(State(m): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    use drums_session::inspect::TurnNews;
    use tokio::sync::broadcast::error::RecvError;
    let name = m.get(&id)?.name;
    let rx = m.subscribe_turns();
    let stream = futures::stream::unfold((rx, name), |(mut rx, name)| async move {
        loop {
            match rx.recv().await {
                Ok(TurnNews::Ended(e)) if e.session == name => {
                    let mut line = serde_json::to_vec(&e).expect("API types serialize");
                    line.push(b'\n');
                    return Some((Ok::<_, std::io::Error>(Bytes::from(line)), (rx, name)));
                }
                // The coordinator's records, as `{"coordinated": RECORD}`.
                Ok(TurnNews::Coordinated(c)) if c.session == name => {
                    let mut line = serde_json::to_vec(&serde_json::json!({ "coordinated": c }))
                        .expect("API types serialize");
                    line.push(b'\n');
                    return Some((Ok(Bytes::from(line)), (rx, name)));
                }
                Ok(TurnNews::Gone(n)) if n == name => return None,
                Ok(TurnNews::Closing) => return None,
                Ok(_) => {}
                // A reader too slow for 256 turns misses some: say so in-band
                // rather than pretend the stream is complete.
                Err(RecvError::Lagged(k)) => {
                    let line = format!("{{\"lagged\":{k}}}\n");
                    return Some((Ok(Bytes::from(line)), (rx, name)));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(serde::Deserialize)]
struct AuditQuery {
    a: String,
    b: String,
}

async fn audit(
    State(m): State<AppState>,
    q: std::result::Result<
        axum::extract::Query<AuditQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Json<drums_api::AuditReport>> {
    let q = q.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("audit needs ?a=SESSION&b=SESSION: {e}"),
        )
    })?;
    Ok(Json(m.audit(&q.a, &q.b).await?))
}

/// The archive streams from tar through drumsd (which signs it): a large
/// checkpoint is never held in memory. A failure part-way ends the body with
/// an error, so the client sees a broken transfer, not a short archive.
async fn export(State(m): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    let rx = m.export(&id).await?;
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(serde::Deserialize)]
struct ImportQuery {
    /// Accept an unsigned archive, or one signed by a key not trusted here.
    #[serde(default)]
    trust_unsigned: bool,
    /// Publish it under this name instead of the archive's.
    name: Option<String>,
}

async fn import(
    State(m): State<AppState>,
    q: std::result::Result<
        axum::extract::Query<ImportQuery>,
        axum::extract::rejection::QueryRejection,
    >,
    body: Body,
) -> Result<impl IntoResponse> {
    let mut body = body.into_data_stream();
    let ck = match q {
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("import takes ?trust_unsigned=true|false and ?name=NAME: {e}"),
        )),
        Ok(axum::extract::Query(q)) => m
            .import(&mut body, q.trust_unsigned, q.name.as_deref())
            .await
            .map_err(ApiError::from),
    };
    if ck.is_err() {
        crate::upload::drain_refused(&mut body).await;
    }
    let ck = ck?;
    info!(checkpoint = %ck.id, name = %ck.name, "checkpoint imported");
    Ok((StatusCode::CREATED, Json(ck)))
}

/// This host's public key, in the form another host's trusted-keys takes.
async fn host_key(State(m): State<AppState>) -> Result<Json<drums_api::HostKey>> {
    let k = m.host_key()?;
    let key = drums_checkpoint::keys::public_key_text(&k.public());
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    Ok(Json(drums_api::HostKey {
        trusted_keys_line: format!("{key} drums@{host}"),
        key,
    }))
}

async fn stats(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<drums_api::SessionStats>> {
    Ok(Json(m.stats(&id)?))
}

/// A session whose agent talks through the coordinator has its commands
/// logged and re-issued after a recovery (reissue.rs); any other's pass
/// straight through to its guest.
async fn exec(
    State(m): State<AppState>,
    axum::Extension(c): axum::Extension<Arc<drums_coordinator::Coordinator>>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response> {
    let session = m.get(&id)?;
    let req = crate::images::with_defaults(&m, &session.image, req).await?;
    if c.coordinates(&session.id) {
        return crate::reissue::exec(m, c, session, req).await;
    }
    proxy(&m, &id, "/v1/exec".into(), req).await
}

/// Files and directory listings: the guest agent's routes have the same shape
/// without the session prefix.
async fn to_guest(
    State(m): State<AppState>,
    axum::Extension(c): axum::Extension<Arc<drums_coordinator::Coordinator>>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response> {
    // An agent outside reads its files after a recovery's commands ran
    // again, as its execs run after them (reissue.rs). Only a coordinated
    // session is ever gated, so no need to ask whether this one is (a read
    // of the journal); the guest's session is read again after the wait,
    // as a recovery may have changed it.
    crate::reissue::replayed(&c, &m.get(&id)?).await?;
    let tail = req
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let uri = match req.uri().query() {
        Some(q) => format!("/v1/{tail}?{q}"),
        None => format!("/v1/{tail}"),
    };
    proxy(&m, &id, uri, req).await
}

/// Pass a request through to the session's guest agent and stream its answer
/// back. Dropping the response (the client went away) closes the guest
/// connection, which is how a cancelled exec stops its command.
async fn proxy(m: &Manager, id: &str, uri: String, req: Request) -> Result<Response> {
    let session = m.get(id)?;
    let client = m.guest_proxy(&session)?;
    // Open until the answer's body is dropped: a checkpoint meanwhile is
    // refused (409) rather than failed by CRIU.
    let open = m.guest_stream(&session.id);
    let (parts, body) = req.into_parts();
    let mut out = hyper::Request::builder()
        .method(parts.method)
        .uri(uri)
        .header("host", "guest");
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        out = out.header(header::CONTENT_TYPE, ct);
    }
    let out = out
        .body(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    let resp = client
        .send(out)
        .await
        .map_err(|e| guest_failed(m, &session, e))?;
    let resp = client
        .check(resp)
        .await
        .map_err(|e| guest_failed(m, &session, e))?;
    let (parts, body) = resp.into_parts();
    let body = http_body_util::BodyExt::map_frame(body, move |frame| {
        let _held = &open;
        frame
    });
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// A guest agent that stops answering mid-request because its session is
/// being removed, or is gone, is the session's state, not a broken guest: 409,
/// as the request would have got a moment later (502 before). The catalog
/// says "removing" before the teardown kills anything, so this is not a race.
pub(crate) fn guest_failed(
    m: &Manager,
    s: &drums_api::Session,
    e: drums_api::ClientError,
) -> ApiError {
    if matches!(e, drums_api::ClientError::Api { .. }) {
        return e.into();
    }
    match m.get(&s.id) {
        Ok(now) if now.state == drums_api::SessionState::Running && now.init_pid == s.init_pid => {
            e.into()
        }
        _ => ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("session {} was removed during the request", s.name),
        ),
    }
}

async fn fault(State(m): State<AppState>, JsonBody(f): JsonBody<Fault>) -> Result<StatusCode> {
    if !m.config().fault_injection {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "fault injection is off (start drumsd with --enable-fault-injection)",
        ));
    }
    m.faults().arm_hold(f.point, f.hold)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `drumsd image build`.
#[derive(Debug, thiserror::Error)]
pub enum BuildImageError {
    #[error(transparent)]
    Name(drums_image::ImageError),
    #[error("find a Debian mirror")]
    Mirror(#[source] drums_image::ImageError),
    #[error("create {}", path.display())]
    Cache {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("build image {name}")]
    Build {
        name: String,
        #[source]
        source: drums_image::ImageError,
    },
}

/// `drumsd image build`: offline, since building takes minutes and needs no
/// session.
pub fn build_image(
    args: &crate::DaemonArgs,
    name: &str,
    mirror: Option<String>,
) -> std::result::Result<(), BuildImageError> {
    drums_image::validate_name(name).map_err(BuildImageError::Name)?;
    let mirror = match mirror {
        Some(m) => m,
        None => {
            drums_image::mirror_from_apt_sources("bookworm").map_err(BuildImageError::Mirror)?
        }
    };
    let store = drums_image::ImageStore::new(args.images_dir());
    let cache = args.state_dir.join("cache/debootstrap");
    std::fs::create_dir_all(&cache).map_err(|source| BuildImageError::Cache {
        path: cache.clone(),
        source,
    })?;
    let info = store
        .build(
            name,
            &drums_image::Recipe::for_image(name),
            &mirror,
            &cache,
            &mut |msg| eprintln!("image {name}: {msg}"),
        )
        .map_err(|source| BuildImageError::Build {
            name: name.to_owned(),
            source,
        })?;
    eprintln!(
        "image {name}: ready at {} ({} MiB)",
        info.rootfs.display(),
        info.size_bytes >> 20
    );
    Ok(())
}
