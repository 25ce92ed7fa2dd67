//! Windows through wmctrl, as the original does on Linux:
//! /setup/activate_window, /setup/close_window and /setup/open_file.

use std::path::Path;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;

use crate::exec::{expand_path, run, spawn_detached, which};
use crate::reply::{self, json_object, py_list, py_quote, py_str, truthy};
use crate::State;
use drums_api::error_chain;

/// How long the original waits for an opened file's window, by default.
const OPEN_FILE_TIMEOUT_SECS: f64 = 1800.0;
const WMCTRL_TIMEOUT: Duration = Duration::from_secs(10);

/// `wmctrl -{x}{F}{action} NAME`: x matches WM_CLASS, F the exact title.
async fn wmctrl_named(
    st: &State,
    action: char,
    data: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<(), Response> {
    let flags = format!(
        "-{}{}{action}",
        if truthy(data.get("by_class")) {
            "x"
        } else {
            ""
        },
        if truthy(data.get("strict")) { "F" } else { "" },
    );
    // The original ignores wmctrl's exit status (a missing window is not an
    // error), but not a missing wmctrl.
    match run(
        &st.cfg,
        "wmctrl",
        &[flags, name.to_string()],
        None,
        Some(WMCTRL_TIMEOUT),
        false,
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(reply::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_chain(&e),
        )),
    }
}

/// POST /setup/activate_window: `{window_name, strict, by_class}`.
pub(crate) async fn activate_window(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let data = match json_object(&headers, &body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let name = match data.get("window_name") {
        n if !truthy(n) => return reply::text(StatusCode::BAD_REQUEST, "window_name required"),
        Some(n) => py_str(n),
        None => unreachable!("None is not truthy"),
    };
    match wmctrl_named(&st, 'a', &data, &name).await {
        Ok(()) => reply::text(StatusCode::OK, "Window activated successfully"),
        Err(r) => r,
    }
}

/// POST /setup/close_window: `{window_name, strict, by_class}`.
pub(crate) async fn close_window(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let data = match json_object(&headers, &body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let Some(name) = data.get("window_name").map(py_str) else {
        return reply::text(StatusCode::BAD_REQUEST, "window_name required");
    };
    match wmctrl_named(&st, 'c', &data, &name).await {
        Ok(()) => reply::text(StatusCode::OK, "Window closed successfully."),
        Err(r) => r,
    }
}

/// `float(x)` in Python, for `timeout_seconds`.
fn py_float(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// POST /setup/open_file: `{path, window_name, timeout_seconds}`. Opens a
/// file with xdg-open (or starts an application by name), then waits for
/// a window whose wmctrl line contains the expected title and raises it.
pub(crate) async fn open_file(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let data = match json_object(&headers, &body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let path = match data.get("path") {
        p if !truthy(p) => return reply::text(StatusCode::BAD_REQUEST, "Path not supplied!"),
        Some(p) => py_str(p),
        None => unreachable!("None is not truthy"),
    };
    let timeout_value = data
        .get("timeout_seconds")
        .cloned()
        .unwrap_or(Value::from(OPEN_FILE_TIMEOUT_SECS));
    let Some(timeout) = py_float(&timeout_value) else {
        return reply::text(
            StatusCode::BAD_REQUEST,
            format!("Invalid timeout_seconds: {}", py_str(&timeout_value)),
        );
    };
    let window_name = data
        .get("window_name")
        .filter(|v| truthy(Some(v)))
        .map(py_str);

    let expanded = expand_path(&st.cfg, &path);
    let target = Path::new(&expanded);
    let is_file = target.exists();
    if !is_file && !which(&st.cfg, &path) {
        return reply::text(
            StatusCode::NOT_FOUND,
            format!("Application/file not found: {path}"),
        );
    }
    let candidates: Vec<String> = match window_name {
        Some(w) => vec![w],
        None if is_file => {
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stem = match name.rfind('.') {
                Some(i) if i > 0 => name[..i].to_string(),
                _ => name.clone(),
            };
            vec![name, stem]
        }
        None => vec![path.clone(), path.clone()],
    };
    let candidates: Vec<String> = candidates.into_iter().filter(|c| !c.is_empty()).collect();

    let started = if is_file {
        spawn_detached(&st.cfg, "xdg-open", std::slice::from_ref(&expanded))
    } else {
        spawn_detached(&st.cfg, &path, &[])
    };
    if let Err(e) = started {
        return reply::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to open {path}. Error: {}", e.python_message()),
        );
    }

    // Polling once a second is the protocol's own contract (the client
    // waits up to 1810 s for this request).
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < timeout {
        if let Ok(list) = run(
            &st.cfg,
            "wmctrl",
            &["-l".to_string()],
            None,
            Some(WMCTRL_TIMEOUT),
            false,
        )
        .await
        {
            if list.returncode == 0 {
                let hit = list
                    .stdout
                    .lines()
                    .find(|line| candidates.iter().any(|c| line.contains(c.as_str())));
                if let Some(line) = hit {
                    let id = line.split_whitespace().next().unwrap_or("").to_string();
                    let _ = run(
                        &st.cfg,
                        "wmctrl",
                        &["-i".into(), "-a".into(), id],
                        None,
                        Some(WMCTRL_TIMEOUT),
                        false,
                    )
                    .await;
                    return reply::text(
                        StatusCode::OK,
                        "File opened and window activated successfully",
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    reply::text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "Failed to find window for {} within {} seconds.",
            py_list(candidates.iter().map(|c| py_quote(c))),
            reply::py_g(timeout)
        ),
    )
}
