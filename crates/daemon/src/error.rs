//! Every API error becomes `{"error":{"kind","message"}}` with a fitting status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use drums_api::{ClientError, ErrorBody, ErrorDetail};
use drums_session::{ErrorKind, SessionError};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind: kind.into(),
            message: message.into(),
        }
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> ApiError {
        let (status, kind) = match e.kind() {
            ErrorKind::BadRequest => (StatusCode::BAD_REQUEST, "bad_request"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
            ErrorKind::Forbidden => (StatusCode::FORBIDDEN, "untrusted"),
            ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status.is_server_error() {
            tracing::warn!("{}", drums_api::error_chain(&e));
        }
        ApiError::new(status, kind, drums_api::error_chain(&e))
    }
}

/// Errors from a session's guest agent keep their status and kind, so the
/// caller sees "command not found" rather than a proxy error.
impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> ApiError {
        match e {
            ClientError::Api {
                status,
                kind,
                message,
            } => ApiError {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                kind,
                message,
            },
            e => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "guest_unavailable",
                format!(
                    "the session's guest agent did not answer: {}",
                    drums_api::error_chain(&e)
                ),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind,
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}
