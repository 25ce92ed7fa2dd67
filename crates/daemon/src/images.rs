//! Image routes (docs/oci.md): list drums' own images and OCI images, pull
//! with progress, import an archive, remove; and an OCI image's defaults on
//! every command run in its sessions.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use drums_api::PullEvent;
use drums_api::{ExecRequest, Image, ImageList, ImageRef, PullRequest};
use drums_session::Manager;
use http_body_util::BodyExt;
use tracing::info;

use crate::error::ApiError;
use crate::json::JsonBody;

type AppState = Arc<Manager>;
type Result<T> = std::result::Result<T, ApiError>;

/// The largest exec request rewritten with an image's defaults; an argv
/// and environment are a few KiB.
const MAX_EXEC: usize = 1 << 20;

fn internal(e: &dyn std::error::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        drums_api::error_chain(e),
    )
}

pub async fn list(State(m): State<AppState>) -> Result<Json<ImageList>> {
    let built = m.images().list().map_err(|e| internal(&e))?;
    let mut images: Vec<Image> = built
        .into_iter()
        .map(|i| Image {
            name: i.name,
            kind: "drums".into(),
            id: None,
            names: vec![],
            suite: i.suite,
            variant: i.variant,
            packages: i.packages,
            size_bytes: i.size_bytes,
            shared_bytes: 0,
            layers: 0,
            created_at: i.created_at as i64,
        })
        .collect();
    let m2 = m.clone();
    let oci = tokio::task::spawn_blocking(move || m2.oci().list())
        .await
        .expect("no panic")
        .map_err(|e| internal(&e))?;
    images.extend(oci.into_iter().map(|s| {
        Image {
            name: s
                .image
                .names
                .first()
                .cloned()
                .unwrap_or_else(|| s.image.id.clone()),
            kind: "oci".into(),
            id: Some(s.image.id.clone()),
            names: s.image.names.clone(),
            suite: String::new(),
            variant: String::new(),
            packages: vec![],
            size_bytes: s.size,
            shared_bytes: s.shared,
            layers: s.image.layers.len() as u32,
            created_at: s.image.created_at_ms / 1000,
        }
    }));
    Ok(Json(ImageList { images }))
}

/// Pulls, answering with one JSON line per step (`application/x-ndjson`)
/// and a last line `{"event":"done",...}` or `{"event":"error",...}`.
/// What fails before the first layer (a bad reference, a registry that is
/// down or refuses, an image for another platform) is an HTTP error instead.
pub async fn pull(
    State(m): State<AppState>,
    JsonBody(req): JsonBody<PullRequest>,
) -> Result<Response> {
    let opts = drums_oci::PullOptions {
        insecure: req.insecure,
        auth: match (req.username, req.password) {
            (Some(username), Some(password)) => Some(drums_oci::Credentials { username, password }),
            _ => None,
        },
        max_blob_bytes: m.oci().limits.max_bytes,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PullEvent>();
    let reference = req.reference.clone();
    let m2 = m.clone();
    let mut task = tokio::spawn(async move { m2.pull(&reference, opts, tx).await });
    // Up to the first event, an error has its status code.
    let first = tokio::select! {
        ev = rx.recv() => ev,
        r = &mut task => {
            let row = r.expect("no panic")?;
            return Ok(Json(ImageRef { id: Some(row.id), names: row.names }).into_response());
        }
    };
    // The channel closed before any event: the pull ended before it
    // resolved, so its answer (an error, above all) has its status.
    let Some(first) = first else {
        let row = task.await.expect("no panic")?;
        return Ok(Json(ImageRef {
            id: Some(row.id),
            names: row.names,
        })
        .into_response());
    };
    let first = Some(first);
    let lines = futures::stream::unfold(
        (first, rx, Some(task)),
        |(pending, mut rx, task)| async move {
            if let Some(ev) = pending {
                return Some((line(&ev), (None, rx, task)));
            }
            if let Some(ev) = rx.recv().await {
                return Some((line(&ev), (None, rx, task)));
            }
            // The sender is gone: the pull ended.
            let result = task?.await.expect("no panic");
            let last = match result {
                Ok(row) => {
                    info!(image = %row.id, names = ?row.names, "image pulled");
                    PullEvent::Done {
                        id: row.id,
                        names: row.names,
                    }
                }
                Err(e) => PullEvent::Error {
                    message: drums_api::error_chain(&e),
                },
            };
            Some((line(&last), (None, rx, None)))
        },
    );
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

fn line(ev: &PullEvent) -> std::result::Result<Bytes, std::io::Error> {
    let mut s = serde_json::to_string(ev).expect("events serialize");
    s.push('\n');
    Ok(Bytes::from(s))
}

/// An archive in the body: `docker save`'s or an oci-archive (the client
/// sends an OCI layout directory as an oci-archive).
/// `?name=REF`: the imported image's name instead of the archive's.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    name: Option<String>,
}

pub async fn import(
    State(m): State<AppState>,
    q: std::result::Result<Query<ImportQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<(StatusCode, Json<ImageRef>)> {
    let mut body = body.into_data_stream();
    // Every error is an ErrorBody, a query's too.
    let row = match q {
        Err(e) => Err(bad(format!("import takes ?name=REFERENCE: {e}"))),
        Ok(Query(q)) => m
            .import_image(&mut body, q.name.as_deref())
            .await
            .map_err(ApiError::from),
    };
    if row.is_err() {
        crate::upload::drain_refused(&mut body).await;
    }
    let row = row?;
    info!(image = %row.id, names = ?row.names, "image imported");
    Ok((
        StatusCode::CREATED,
        Json(ImageRef {
            id: Some(row.id),
            names: row.names,
        }),
    ))
}

/// `POST /v1/images/{image}/tag {name}`: `podman tag`.
pub async fn tag(
    State(m): State<AppState>,
    Path(image): Path<String>,
    JsonBody(req): JsonBody<drums_api::TagImage>,
) -> Result<Json<ImageRef>> {
    let m2 = m.clone();
    let row = tokio::task::spawn_blocking(move || m2.tag_image(&image, &req.name))
        .await
        .expect("no panic")?;
    info!(image = %row.id, names = ?row.names, "image tagged");
    Ok(Json(ImageRef {
        id: Some(row.id),
        names: row.names,
    }))
}

pub async fn remove(
    State(m): State<AppState>,
    Path(image): Path<String>,
) -> Result<Json<ImageRef>> {
    let m2 = m.clone();
    let removed = tokio::task::spawn_blocking(move || m2.remove_image(&image))
        .await
        .expect("no panic")?;
    Ok(Json(ImageRef {
        id: removed,
        names: vec![],
    }))
}

/// An exec request for a session of an OCI image, with the image's
/// defaults applied ([`drums_session::images::apply_defaults`]); any other
/// passes as it came.
pub async fn with_defaults(m: &Manager, image: &str, req: Request) -> Result<Request> {
    let Some(config) = m.exec_defaults(image) else {
        return Ok(req);
    };
    let (parts, body) = req.into_parts();
    let bytes = http_body_util::Limited::new(body, MAX_EXEC)
        .collect()
        .await
        .map_err(|e| bad(format!("exec request: {e}")))?
        .to_bytes();
    let mut exec: ExecRequest =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("exec request: {e}")))?;
    drums_session::images::apply_defaults(&mut exec, &config);
    let bytes = serde_json::to_vec(&exec).expect("serializes");
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

fn bad(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
}
