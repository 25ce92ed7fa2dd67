//! A request id for every API call: the caller's `x-request-id` when it sends
//! one (so a client's log and drumsd's can be joined), else a fresh one. Each
//! request runs in a `request` span carrying it, so every log line of the
//! request names it, and the response echoes it back.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub const HEADER: &str = "x-request-id";

/// The longest caller-given id kept; a longer or non-printable one is replaced,
/// so a caller cannot write arbitrary text into the log.
const MAX_LEN: usize = 128;

pub async fn layer(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= MAX_LEN && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| drums_session::create::random_hex(8));
    let value = HeaderValue::from_str(&id).expect("printable ASCII is a valid header value");
    req.headers_mut().insert(HEADER, value.clone());
    let span = tracing::info_span!("request", id = %id);
    let mut resp = next.run(req).instrument(span).await;
    resp.headers_mut().insert(HEADER, value);
    resp
}
