//! `POST /v1/sessions/{s}/exec` from a client: the NDJSON stream of output
//! frames, decoded as it arrives, up to the exit status. The CLI's
//! `drums exec` and `drums eval`'s agents share it.

use base64::Engine;
use http_body_util::BodyExt;
use hyper::Method;

use crate::{Client, ClientError, ExecFrame, ExecRequest, ExitStatus};

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// drumsd refused the exec, or could not be reached.
    #[error("exec in session {session}")]
    Start {
        session: String,
        #[source]
        source: ClientError,
    },
    /// The stream broke, or ended before an exit status (the session or
    /// drumsd went away while the command ran).
    #[error("exec stream of session {session} broke: {why}")]
    Broke { session: String, why: String },
    #[error("exec frame from session {session}")]
    Frame {
        session: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Which of the command's streams a chunk of output is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Percent-encodes a session's id or name for a path segment.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs `req` in `session`, handing each chunk of output to `out` as it
/// arrives, and returns the command's exit status.
pub async fn exec(
    c: &Client,
    session: &str,
    req: &ExecRequest,
    mut out: impl FnMut(Stream, &[u8]),
) -> Result<ExitStatus, ExecError> {
    let resp = c
        .call(
            Method::POST,
            &format!("/v1/sessions/{}/exec", enc(session)),
            Some(req),
        )
        .await
        .map_err(|source| ExecError::Start {
            session: session.into(),
            source,
        })?;
    let frame_err = |source: Box<dyn std::error::Error + Send + Sync>| ExecError::Frame {
        session: session.into(),
        source,
    };
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ExecError::Broke {
            session: session.into(),
            why: e.to_string(),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            match serde_json::from_slice(&line).map_err(|e| frame_err(e.into()))? {
                ExecFrame::Output { stream, data } => {
                    let bytes = b64.decode(data).map_err(|e| frame_err(e.into()))?;
                    let s = if stream == "stderr" {
                        Stream::Stderr
                    } else {
                        Stream::Stdout
                    };
                    out(s, &bytes);
                }
                ExecFrame::Exit { exit } => return Ok(exit),
            }
        }
    }
    Err(ExecError::Broke {
        session: session.into(),
        why: "the stream ended without an exit status".into(),
    })
}
