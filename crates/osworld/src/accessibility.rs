//! /accessibility and /terminal, read from AT-SPI by a python3 + pyatspi
//! script run as the desktop user in the session. AT-SPI has no stable
//! C-free Rust client, and the original's XML is defined by what pyatspi
//! returns, so the script is the most faithful reader. Without pyatspi or
//! a session bus the endpoints answer with an error naming what is
//! missing; they never invent a tree.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use crate::error::RunError;
use crate::exec::run;
use crate::reply;
use crate::State;

/// Reading AT-SPI through the script.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("AT-SPI reader exited with {code}: {tail}")]
    Exited { code: i32, tail: String },
    #[error("AT-SPI reader printed no JSON")]
    NoJson(#[source] serde_json::Error),
}

const SCRIPT: &str = include_str!("accessibility.py");
/// Walking a large LibreOffice or Chrome tree takes seconds; a hung
/// AT-SPI call must not hold the request forever.
const TIMEOUT: Duration = Duration::from_secs(120);

async fn read(st: &State, mode: &str) -> Result<Value, ReadError> {
    let python = st.cfg.python.to_string_lossy().into_owned();
    let args = vec!["-c".to_string(), SCRIPT.to_string(), mode.to_string()];
    let f = run(&st.cfg, &python, &args, None, Some(TIMEOUT), false).await?;
    if f.returncode != 0 {
        let why = f.stderr.trim();
        return Err(ReadError::Exited {
            code: f.returncode,
            tail: why[why.len().saturating_sub(2000)..].to_owned(),
        });
    }
    // The JSON is the last line: AT-SPI daemons that the session bus
    // starts on demand can inherit stdout and chatter before it.
    let last = f
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(last).map_err(ReadError::NoJson)
}

/// GET /accessibility: `{"AT": "<desktop-frame ...>...</desktop-frame>"}`.
pub(crate) async fn accessibility(st: State) -> Response {
    match read(&st, "tree").await {
        Ok(v) => reply::json(StatusCode::OK, v),
        Err(e) => reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": format!("accessibility tree unavailable: {}", drums_api::error_chain(&e))}),
        ),
    }
}

/// GET /terminal: `{"output": text-or-null, "status": "success"}`.
/// OSWorld's SetupController also polls it to learn that the server is up;
/// any answer serves that purpose.
pub(crate) async fn terminal(st: State) -> Response {
    match read(&st, "terminal").await {
        Ok(v) => reply::json(StatusCode::OK, v),
        Err(e) => reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"status": "error", "message": format!("terminal output unavailable: {}", drums_api::error_chain(&e))}),
        ),
    }
}
