//! The display: /screenshot, /cursor_position, /screen_size, /window_size.
//! X calls block, so each runs on tokio's blocking pool.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use drums_screen::{Screen, ScreenError};
use serde_json::json;

use crate::files::form_field;
use crate::reply;
use crate::{AppState, State};
use drums_api::error_chain;

/// Runs `f` with the shared X connection on the blocking pool; an X error
/// drops the connection (the server may have restarted) and becomes a 500
/// that names the failing X operation.
pub(crate) async fn with_screen<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(&Screen) -> Result<T, ScreenError> + Send + 'static,
) -> Result<T, Response> {
    let st = st.clone();
    let res = tokio::task::spawn_blocking(move || {
        let r = st.screen().and_then(|s| f(&s));
        if r.is_err() {
            st.forget_screen();
        }
        r
    })
    .await;
    match res {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": error_chain(&e)}),
        )),
        Err(_) => Err(reply::internal_error()),
    }
}

/// GET /screenshot: a PNG of the screen with the cursor drawn.
pub(crate) async fn screenshot(st: State) -> Response {
    match with_screen(&st.0, |s| Ok(s.capture(true)?.to_png())).await {
        Ok(png) => ([(header::CONTENT_TYPE, "image/png")], png).into_response(),
        Err(r) => r,
    }
}

/// GET /cursor_position: `[x, y]`.
pub(crate) async fn cursor_position(st: State) -> Response {
    match with_screen(&st.0, |s| s.cursor_position()).await {
        Ok((x, y)) => reply::json(StatusCode::OK, json!([x, y])),
        Err(r) => r,
    }
}

/// POST /screen_size: `{width, height}`.
pub(crate) async fn screen_size(st: State) -> Response {
    match with_screen(&st.0, |s| Ok(s.size())).await {
        Ok((w, h)) => reply::json(StatusCode::OK, json!({"width": w, "height": h})),
        Err(r) => r,
    }
}

/// POST /window_size, form field `app_class_name`: the size of the first
/// managed window of that WM_CLASS.
pub(crate) async fn window_size(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let Some(class) = form_field(&headers, &body, "app_class_name") else {
        return reply::json(
            StatusCode::BAD_REQUEST,
            json!({"error": "app_class_name is required"}),
        );
    };
    match with_screen(&st.0, move |s| s.window_size_by_class(&class)).await {
        Ok(Some((w, h))) => reply::json(StatusCode::OK, json!({"width": w, "height": h})),
        // The original's view returns None here, which Flask turns into a
        // 500; clients treat any non-200 as "no such window".
        Ok(None) => reply::internal_error(),
        Err(r) => r,
    }
}
