//! Replication-gate routes (docs/cluster.md, "Sessions that survive their
//! node"): each a few lines over `drums_coordinator::replicas::Replicas`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use drums_api::{ReplicaVersion, Replication, ReplicationRequest};
use drums_coordinator::replicas::GateState;
use drums_coordinator::Coordinator;
use drums_session::Manager;
use tracing::info;

use crate::error::ApiError;
use crate::json::{JsonBody, OptionalJsonBody};

type Result<T> = std::result::Result<T, ApiError>;

/// How long an answer is held for a replica unless the gate says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest hold a gate may ask for, and the longest `next` waits.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const MAX_NEXT_WAIT: Duration = Duration::from_secs(30);

fn view(session: &str, g: GateState) -> Replication {
    Replication {
        session: session.to_owned(),
        timeout_ms: g.timeout.as_millis() as u64,
        pending: g.pending,
        last_acked: g.last_acked,
    }
}

fn no_gate(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("session {name} has no replication gate"),
    )
}

pub async fn on(
    State(m): State<Arc<Manager>>,
    Extension(c): Extension<Arc<Coordinator>>,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<ReplicationRequest>,
) -> Result<Json<Replication>> {
    let s = m.get(&id)?;
    let timeout = match req.and_then(|r| r.timeout_ms) {
        None => DEFAULT_TIMEOUT,
        Some(ms) if ms > 0 && Duration::from_millis(ms) <= MAX_TIMEOUT => Duration::from_millis(ms),
        Some(ms) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "timeout_ms {ms} is out of range: 1 to {}",
                    MAX_TIMEOUT.as_millis()
                ),
            ))
        }
    };
    let g = c.replicas().on(&s.id, timeout);
    m.versions_exported(&s.id, true);
    info!(session = %s.id, ?timeout, "replication gate on");
    Ok(Json(view(&s.id, g)))
}

pub async fn show(
    State(m): State<Arc<Manager>>,
    Extension(c): Extension<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<Replication>> {
    let s = m.get(&id)?;
    let g = c.replicas().state(&s.id).ok_or_else(|| no_gate(&s.name))?;
    Ok(Json(view(&s.id, g)))
}

pub async fn off(
    State(m): State<Arc<Manager>>,
    Extension(c): Extension<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let s = m.get(&id)?;
    if !c.replicas().off(&s.id) {
        return Err(no_gate(&s.name));
    }
    m.versions_exported(&s.id, false);
    info!(session = %s.id, "replication gate off");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextQuery {
    /// How long to wait for a version, in ms (default 0: answer at once).
    #[serde(default)]
    wait_ms: u64,
}

pub async fn next(
    State(m): State<Arc<Manager>>,
    Extension(c): Extension<Arc<Coordinator>>,
    Path(id): Path<String>,
    q: std::result::Result<Query<NextQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let q = q.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("next takes ?wait_ms=MS: {e}"),
        )
    })?;
    let wait = Duration::from_millis(q.wait_ms);
    if wait > MAX_NEXT_WAIT {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!(
                "wait_ms {} is over {}",
                q.wait_ms,
                MAX_NEXT_WAIT.as_millis()
            ),
        ));
    }
    let s = m.get(&id)?;
    if c.replicas().state(&s.id).is_none() {
        return Err(no_gate(&s.name));
    }
    Ok(match c.replicas().next(&s.id, wait).await {
        Some(version) => Json(ReplicaVersion { version }).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

pub async fn ack(
    State(m): State<Arc<Manager>>,
    Extension(c): Extension<Arc<Coordinator>>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ReplicaVersion>,
) -> Result<StatusCode> {
    let s = m.get(&id)?;
    // Only the session's own versions: an id from elsewhere is a mistake
    // the copier should hear about.
    if !m
        .session_versions(&s.id)?
        .iter()
        .any(|v| v.id == req.version)
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session {} has no version {:?}", s.name, req.version),
        ));
    }
    if !c.replicas().ack(&s.id, &req.version) {
        return Err(no_gate(&s.name));
    }
    Ok(StatusCode::NO_CONTENT)
}
