//! The one way a route reads a JSON body: the Content-Type must say JSON (415
//! otherwise), the body must fit [`MAX_BODY`] (413) and be one JSON object
//! (400), each refusal an ErrorBody like every other error. serde alone would
//! accept `[]` for a struct whose fields all have defaults, and would parse a
//! form-encoded body it happened to read as JSON.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// The largest JSON body read (the largest real one is a few hundred bytes).
pub const MAX_BODY: usize = 1 << 20;

/// A JSON object body, parsed as `T`.
pub struct JsonBody<T>(pub T);

/// A JSON object body, or `None` when the body is empty (routes whose body
/// is optional, such as restore).
pub struct OptionalJsonBody<T>(pub Option<T>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        match read(req).await? {
            Some(v) => Ok(JsonBody(v)),
            None => Err(bad("the request needs a JSON object body")),
        }
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        read(req).await.map(OptionalJsonBody)
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
}

/// `None` for an empty body (whatever its Content-Type).
async fn read<T: DeserializeOwned>(req: Request) -> Result<Option<T>, ApiError> {
    let (parts, body): (_, Body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body is larger than {MAX_BODY} bytes or could not be read: {}",
                drums_api::error_chain(&e)
            ),
        )
    })?;
    if bytes.is_empty() {
        return Ok(None);
    }
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !is_json(ct) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("the request body must be application/json, not {ct:?}"),
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(bad("the request body must be a JSON object"));
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| bad(format!("invalid request: {e}")))
}

/// `application/json`, or a `+json` type, with any parameters.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/merge-patch+json"));
        for no in [
            "",
            "text/plain",
            "application/x-www-form-urlencoded",
            "json",
        ] {
            assert!(!is_json(no), "{no:?}");
        }
    }
}
