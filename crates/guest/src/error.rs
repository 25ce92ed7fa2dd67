//! The JSON error body every endpoint answers with, and the glue that turns each
//! module's error enum into it.
//!
//! Module errors stay ordinary `thiserror` enums (useful in logs and to library
//! callers); only here do they acquire an HTTP status and a stable `kind` string,
//! which is the part of an error that clients are expected to match on.

use std::error::Error as StdError;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// An error as the API reports it:
/// `{"error":{"kind":"<snake_case>","message":"<lowercase text>"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    /// Builds an API error whose message is the whole source chain of `err`,
    /// so the client sees the underlying cause (e.g. the errno text) and not just
    /// the outermost "failed to open …".
    pub fn from_error(status: StatusCode, kind: &'static str, err: &dyn StdError) -> Self {
        Self::new(status, kind, lowercase_chain(err))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    kind: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(kind = self.kind, "{}", self.message);
        } else {
            tracing::debug!(kind = self.kind, status = %self.status, "{}", self.message);
        }
        let body = Body {
            error: Inner {
                kind: self.kind,
                message: &self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

/// An error and its sources on one line, each part's first letter
/// lowercased: the API promises lowercase messages, and the OS texts that end
/// such chains ("No such file or directory") are capitalised.
pub fn lowercase_chain(err: &dyn StdError) -> String {
    drums_api::error_chain_map(err, lower_first)
}

pub(crate) fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        // Only lowercase a capitalised *word*; an acronym such as "EOF" or
        // "UTF-8" reads wrong when half-lowercased.
        Some(c) if c.is_uppercase() && !chars.clone().next().is_some_and(char::is_uppercase) => {
            c.to_lowercase().chain(chars).collect()
        }
        _ => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_includes_sources_in_lowercase() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to open /x")]
        struct Outer(#[source] std::io::Error);
        let err = Outer(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            lowercase_chain(&err),
            "failed to open /x: no such file or directory (os error 2)"
        );
    }

    #[test]
    fn acronyms_are_left_alone() {
        assert_eq!(lower_first("EOF while parsing"), "EOF while parsing");
        assert_eq!(lower_first("Invalid"), "invalid");
        assert_eq!(lower_first(""), "");
    }
}
