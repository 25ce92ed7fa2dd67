//! /start_recording and /end_recording: one ffmpeg x11grab at a time.
//!
//! ffmpeg runs as the agent, not as the desktop user: the video is the
//! agent's artifact, written to the agent's recordings directory, and the
//! user has no business stopping or replacing it.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use tokio::io::AsyncReadExt as _;

use crate::reply;
use crate::State;

/// ffmpeg that dies within this long failed to start (the original's check).
const STARTUP_GRACE: Duration = Duration::from_secs(2);
/// How long ffmpeg gets to finish the file after SIGINT.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// ffmpeg's stderr kept for error messages; it prints progress forever, so
/// only the tail is kept (and the pipe is always drained, or ffmpeg would
/// block once it fills).
const STDERR_TAIL: usize = 16 * 1024;

pub(crate) struct Recording {
    child: tokio::process::Child,
    path: PathBuf,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Recording {
    fn stderr_text(&self) -> String {
        let buf = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }
}

fn error(status: StatusCode, message: String) -> Response {
    reply::json(status, json!({"status": "error", "message": message}))
}

/// POST /start_recording.
pub(crate) async fn start(st: State) -> Response {
    let mut slot = st.recording.lock().await;
    if let Some(rec) = slot.as_mut() {
        if matches!(rec.child.try_wait(), Ok(None)) {
            return error(
                StatusCode::BAD_REQUEST,
                "Recording is already in progress.".into(),
            );
        }
    }
    *slot = None;

    let dir = st.cfg.recordings_dir.clone();
    let path = dir.join("recording.mp4");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "Failed to create recordings directory: {}",
                reply::py_os_error(&e, &dir.to_string_lossy())
            ),
        );
    }
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Failed to remove old recording file: {}",
                    reply::py_os_error(&e, &path.to_string_lossy())
                ),
            )
        }
    }
    let (w, h) = match crate::screen::with_screen(&st.0, |s| Ok(s.size())).await {
        Ok(size) => size,
        Err(r) => return r,
    };
    let display = &st.cfg.display;
    let input = if display.contains('.') {
        display.clone()
    } else {
        format!("{display}.0")
    };
    let mut cmd = tokio::process::Command::new("ffmpeg");
    cmd.args(["-nostdin", "-y", "-f", "x11grab", "-draw_mouse", "1", "-s"])
        .arg(format!("{w}x{h}"))
        .args(["-i", &input, "-c:v", "libx264", "-r", "30"])
        .arg(&path)
        .env_clear()
        .env("PATH", st.cfg.env_var("PATH").unwrap_or("/usr/bin:/bin"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Failed to start recording: {}",
                    reply::py_os_error(&e, "ffmpeg")
                ),
            )
        }
    };
    let stderr = Arc::new(Mutex::new(Vec::new()));
    if let Some(mut pipe) = child.stderr.take() {
        let tail = stderr.clone();
        tokio::spawn(async move {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                t.extend_from_slice(&chunk[..n]);
                if t.len() > STDERR_TAIL {
                    let cut = t.len() - STDERR_TAIL;
                    t.drain(..cut);
                }
            }
        });
    }
    let mut rec = Recording {
        child,
        path,
        stderr,
    };
    match tokio::time::timeout(STARTUP_GRACE, rec.child.wait()).await {
        Err(_) => {
            *slot = Some(rec);
            reply::json(
                StatusCode::OK,
                json!({"status": "success", "message": "Started recording successfully."}),
            )
        }
        Ok(_) => {
            // Let the drain task collect what ffmpeg said before dying.
            tokio::time::sleep(Duration::from_millis(50)).await;
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Failed to start recording. ffmpeg terminated unexpectedly. Error: {}",
                    rec.stderr_text()
                ),
            )
        }
    }
}

/// POST /end_recording: stops ffmpeg gracefully and returns the video.
pub(crate) async fn end(st: State) -> Response {
    let mut slot = st.recording.lock().await;
    let Some(mut rec) = slot.take() else {
        return error(
            StatusCode::BAD_REQUEST,
            "No recording in progress to stop.".into(),
        );
    };
    if !matches!(rec.child.try_wait(), Ok(None)) {
        return error(
            StatusCode::BAD_REQUEST,
            "No recording in progress to stop.".into(),
        );
    }
    // SIGINT makes ffmpeg write the MP4 index; SIGKILL would leave an
    // unplayable file.
    if let Some(pid) = rec.child.id() {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGINT);
    }
    if tokio::time::timeout(STOP_GRACE, rec.child.wait())
        .await
        .is_err()
    {
        let _ = rec.child.kill().await;
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "Recording process was unresponsive and had to be killed. Stderr: {}",
                rec.stderr_text()
            ),
        );
    }
    let len = std::fs::metadata(&rec.path).map(|m| m.len()).unwrap_or(0);
    let file = if len > 0 {
        tokio::fs::File::open(&rec.path).await.ok()
    } else {
        None
    };
    match file {
        Some(f) => reply::attachment(
            "recording.mp4",
            len,
            Body::from_stream(tokio_util::io::ReaderStream::new(f)),
        ),
        None => reply::http_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "Recording failed. The output file is missing or empty. ffmpeg stderr: {}",
                rec.stderr_text()
            ),
        ),
    }
}
