//! Warm-pool routes (docs/pools.md): each a few lines over
//! `drums_session::pools::Pools`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::{Extension, Json};
use drums_api::{CreatePool, Pool, PoolList, Session, TakeRequest};
use drums_session::pools::{Pools, DEFAULT_TAKE_TIMEOUT};
use tracing::info;

use crate::error::ApiError;
use crate::json::{JsonBody, OptionalJsonBody};

type Result<T> = std::result::Result<T, ApiError>;

pub async fn list(Extension(p): Extension<Arc<Pools>>) -> Result<Json<PoolList>> {
    Ok(Json(PoolList { pools: p.list()? }))
}

pub async fn create(
    Extension(p): Extension<Arc<Pools>>,
    JsonBody(req): JsonBody<CreatePool>,
) -> Result<(StatusCode, Json<Pool>)> {
    Ok((StatusCode::CREATED, Json(p.create(req).await?)))
}

pub async fn show(
    Extension(p): Extension<Arc<Pools>>,
    Path(id): Path<String>,
) -> Result<Json<Pool>> {
    Ok(Json(p.get(&id)?))
}

pub async fn remove(
    Extension(p): Extension<Arc<Pools>>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    p.remove(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn take(
    Extension(p): Extension<Arc<Pools>>,
    Path(id): Path<String>,
    OptionalJsonBody(req): OptionalJsonBody<TakeRequest>,
) -> Result<Json<Session>> {
    let timeout = req
        .and_then(|r| r.timeout_ms)
        .map_or(DEFAULT_TAKE_TIMEOUT, Duration::from_millis);
    let s = p.take(&id, timeout).await?;
    info!(pool = %id, session = %s.id, "pool member taken");
    Ok(Json(s))
}
