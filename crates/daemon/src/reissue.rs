//! `exec` in a session whose agent talks through the coordinator from
//! outside (an agent *with* a sandbox; docs/coordinator.md).
//!
//! The command is logged before it runs (`drums_coordinator::commands`).
//! If the session fails while it runs (its processes killed, the OOM
//! killer), the coordinator's watch recovers the session and runs the
//! commands since the version again; then the command is re-issued once,
//! and its output joins what the caller already has: the bytes it had on
//! each stream must come again first, and only the rest goes on. A command
//! whose output differs the second time (not deterministic, or its effects
//! outside the session differ) breaks the stream off (drumsd logs why) rather than
//! hand the caller a mix of two runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use drums_api::{CommandState, ExecFrame, ExecRequest, Session};
use drums_coordinator::Coordinator;
use drums_session::Manager;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::error::ApiError;

/// An exec request is small (argv, env, cwd).
const MAX_REQUEST: usize = 1 << 20;
/// The longest frame line the guest may send (its chunks are 64 KiB).
const MAX_LINE: usize = 4 << 20;
/// How long a broken stream waits to see whether its session failed.
const FAILURE_WAIT: Duration = Duration::from_secs(3);
/// How long it waits for the coordinator to recover the session (then for
/// its commands to run again, within the coordinator's limits).
const RECOVERY_WAIT: Duration = Duration::from_secs(120);

type Line = Result<Bytes, std::io::Error>;

pub async fn exec(
    m: Arc<Manager>,
    c: Arc<Coordinator>,
    session: Session,
    req: Request,
) -> Result<Response, ApiError> {
    let body = http_body_util::Limited::new(req.into_body(), MAX_REQUEST)
        .collect()
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("exec request: {e}"),
            )
        })?
        .to_bytes();
    serde_json::from_slice::<ExecRequest>(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("exec request: {e}"),
        )
    })?;
    // Not beside the commands a recovery runs again: after them.
    replayed(&c, &session).await?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let seq = c.command_begins(&session.id, &text).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("log the command: {e}"),
        )
    })?;
    let recoveries = c.recoveries(&session.id);
    // The first attempt answers as an exec without the log would: a refusal
    // by the guest (a bad argv) is the caller's.
    let first = match start(&m, &session, &body).await {
        Ok(a) => a,
        Err(e) => {
            c.command_ends(&session.id, seq, CommandState::Failed);
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::channel::<Line>(16);
    tokio::spawn(
        Run {
            m,
            c,
            session,
            body,
            seq,
            recoveries,
            tx,
        }
        .go(first),
    );
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|l| (l, rx)) });
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .expect("a valid response"))
}

/// Until session `s` is not being recovered, nor having its commands since
/// the version run again: what its agent does next sees the state it had
/// (drums_coordinator's `replays`). Bounded as a re-issue's wait is.
pub async fn replayed(c: &Coordinator, s: &Session) -> Result<(), ApiError> {
    tokio::time::timeout(RECOVERY_WAIT, c.replayed(&s.id))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                format!(
                    "session {} is still being recovered after {RECOVERY_WAIT:?}: its commands since the version have not all run again",
                    s.name
                ),
            )
        })
}

/// One attempt: the guest's answer, and the count that keeps versions with
/// processes from dumping while it is open.
struct Attempt {
    body: Incoming,
    _open: drums_session::manager::GuestStream,
}

async fn start(m: &Manager, s: &Session, body: &Bytes) -> Result<Attempt, ApiError> {
    let client = m.guest_proxy(s)?;
    let open = m.guest_stream(&s.id);
    let req = hyper::Request::builder()
        .method(hyper::Method::POST)
        .uri("/v1/exec")
        .header("host", "guest")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))
        .expect("a valid request");
    let resp = client
        .send(req)
        .await
        .map_err(|e| crate::server::guest_failed(m, s, e))?;
    let resp = client
        .check(resp)
        .await
        .map_err(|e| crate::server::guest_failed(m, s, e))?;
    Ok(Attempt {
        body: resp.into_body(),
        _open: open,
    })
}

/// What the caller has had of one output stream.
#[derive(Clone, Default)]
struct Given {
    bytes: u64,
    sha: Sha256,
}

/// Why a re-issue gives up on the session coming back.
#[derive(Debug, thiserror::Error)]
enum NotRecovered {
    /// The coordinator's words (it keeps them for `drums inspect` too).
    #[error("its commands since the version did not run again: {0}")]
    Commands(String),
    #[error(transparent)]
    Session(Box<drums_session::SessionError>),
    #[error("not recovered within {0:?}")]
    Timeout(Duration),
}

/// How an attempt ended.
enum End {
    Exit,
    ClientGone,
    Diverged(String),
    Broken(String),
}

struct Run {
    m: Arc<Manager>,
    c: Arc<Coordinator>,
    session: Session,
    body: Bytes,
    seq: u64,
    recoveries: u64,
    tx: mpsc::Sender<Line>,
}

impl Run {
    async fn go(mut self, first: Attempt) {
        let id = self.session.id.clone();
        // stdout, stderr: what the caller has had; on a re-issue, what the
        // new run must give again before anything goes on.
        let mut given = [Given::default(), Given::default()];
        let mut again: Option<[Given; 2]> = None;
        let mut attempt = first;
        loop {
            match self.pump(&mut attempt, &mut given, &mut again).await {
                End::Exit => {
                    let state = if again.is_some() {
                        CommandState::Reissued
                    } else {
                        CommandState::Done
                    };
                    self.c.command_ends(&id, self.seq, state);
                    return;
                }
                End::ClientGone => {
                    // Dropping the guest's answer stops the command.
                    self.c.command_ends(&id, self.seq, CommandState::Cancelled);
                    return;
                }
                End::Diverged(why) => {
                    self.c.command_ends(&id, self.seq, CommandState::Diverged);
                    self.fail(why).await;
                    return;
                }
                End::Broken(why) => {
                    if again.is_some() || !self.session_failed().await {
                        self.c.command_ends(&id, self.seq, CommandState::Failed);
                        self.fail(why).await;
                        return;
                    }
                    match self.recovered().await {
                        Ok(s) => self.session = s,
                        Err(e) => {
                            self.c.command_ends(&id, self.seq, CommandState::Failed);
                            self.fail(format!(
                                "{why}; and the session did not come back: {}",
                                drums_api::error_chain(&e)
                            ))
                            .await;
                            return;
                        }
                    }
                    info!(session = %self.session.name, command = self.seq, "re-issuing the command that was running when the session failed");
                    attempt = match start(&self.m, &self.session, &self.body).await {
                        Ok(a) => a,
                        Err(e) => {
                            self.c.command_ends(&id, self.seq, CommandState::Failed);
                            self.fail(format!("re-issue after the recovery: {}", e.message))
                                .await;
                            return;
                        }
                    };
                    again = Some(std::mem::take(&mut given));
                    given = again.clone().expect("just set");
                }
            }
        }
    }

    async fn fail(&self, why: String) {
        warn!(session = %self.session.name, command = self.seq, "exec: {why}");
        let _ = self.tx.send(Err(std::io::Error::other(why))).await;
    }

    /// Pass an attempt's frames on, from the point the caller has reached.
    async fn pump(
        &self,
        a: &mut Attempt,
        given: &mut [Given; 2],
        again: &mut Option<[Given; 2]>,
    ) -> End {
        // To check on a re-issue: bytes of each stream still to come again,
        // and their hash so far.
        let mut check: Option<[(u64, Sha256); 2]> = again
            .as_ref()
            .map(|g| [(g[0].bytes, Sha256::new()), (g[1].bytes, Sha256::new())]);
        let mut lines = Lines::default();
        // A re-issue must give again what the caller had within the
        // per-command deadline, and no more of it than the output cap is
        // compared: a guest that stops, or a command that never gets there,
        // fails this re-issue rather than hold its caller and the session.
        let limits = *self.c.limits();
        if let Some(g) = again.as_ref() {
            let had = g[0].bytes + g[1].bytes;
            if had > limits.reissue_output {
                return End::Broken(format!(
                    "the caller had {had} bytes of output, over the {} bytes a re-issue compares (--reissue-output-max)",
                    limits.reissue_output
                ));
            }
        }
        let catch_up = tokio::time::sleep(limits.reissue_command);
        tokio::pin!(catch_up);
        loop {
            let checking = check
                .as_ref()
                .is_some_and(|c| c.iter().any(|(left, _)| *left > 0));
            let frame = tokio::select! {
                f = a.body.frame() => f,
                _ = self.tx.closed() => return End::ClientGone,
                _ = &mut catch_up, if checking => return End::Broken(format!(
                    "the re-issued command did not give again what the caller had within {:?} (--reissue-command-timeout)",
                    limits.reissue_command
                )),
            };
            let data = match frame {
                None => return End::Broken("the command's stream ended without its exit".into()),
                Some(Err(e)) => return End::Broken(format!("the command's stream broke: {e}")),
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => d,
                    Err(_) => continue,
                },
            };
            lines.push(&data);
            while let Some(line) = lines.next_line() {
                let frame: ExecFrame = match serde_json::from_slice(lines.get(line)) {
                    Ok(f) => f,
                    Err(e) => return End::Broken(format!("the guest sent a bad frame: {e}")),
                };
                match frame {
                    ExecFrame::Output { stream, data } => {
                        let k = usize::from(stream == "stderr");
                        let Ok(mut bytes) = base64::engine::general_purpose::STANDARD.decode(&data)
                        else {
                            return End::Broken("the guest sent bad base64".into());
                        };
                        if let Some(c) = &mut check {
                            let (left, sha) = &mut c[k];
                            let n = (*left).min(bytes.len() as u64) as usize;
                            sha.update(&bytes[..n]);
                            *left -= n as u64;
                            if n > 0 && *left == 0 {
                                let before =
                                    again.as_ref().expect("checking")[k].sha.clone().finalize();
                                if sha.clone().finalize() != before {
                                    return End::Diverged(format!(
                                        "the re-issued command's {stream} differs from what the caller had"
                                    ));
                                }
                            }
                            bytes.drain(..n);
                            if bytes.is_empty() {
                                continue;
                            }
                        }
                        given[k].bytes += bytes.len() as u64;
                        given[k].sha.update(&bytes);
                        let out = ExecFrame::Output {
                            stream,
                            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
                        };
                        if self.send(&out).await.is_err() {
                            return End::ClientGone;
                        }
                    }
                    exit @ ExecFrame::Exit { .. } => {
                        if let Some(c) = &check {
                            if c.iter().any(|(left, _)| *left > 0) {
                                return End::Diverged(
                                    "the re-issued command gave less output than the caller had"
                                        .into(),
                                );
                            }
                        }
                        let _ = self.send(&exit).await;
                        return End::Exit;
                    }
                }
            }
            if lines.pending() > MAX_LINE {
                return End::Broken("the guest sent a frame over 4 MiB".into());
            }
        }
    }

    async fn send(&self, f: &ExecFrame) -> Result<(), ()> {
        let mut line = serde_json::to_vec(f).expect("API types serialize");
        line.push(b'\n');
        self.tx.send(Ok(Bytes::from(line))).await.map_err(|_| ())
    }

    /// Whether the stream broke because the session failed: it is being
    /// recovered, was recovered, or its processes died.
    async fn session_failed(&self) -> bool {
        let deadline = Instant::now() + FAILURE_WAIT;
        while Instant::now() < deadline {
            match self.m.get(&self.session.id) {
                Err(_) => return false,
                Ok(now)
                    if now.state != drums_api::SessionState::Running
                        || now.init_pid != self.session.init_pid =>
                {
                    return true
                }
                Ok(_) => {}
            }
            if self.c.recoveries(&self.session.id) > self.recoveries
                || self.m.processes_died(&self.session.id).unwrap_or(false)
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The session once the coordinator recovered it and ran its commands
    /// since the version again. If they could not all run again (the
    /// re-issue limits), the command is not re-issued on such a state.
    async fn recovered(&self) -> Result<Session, NotRecovered> {
        // The recovery itself, then its commands, which the re-issue limits
        // bound; the recovery's backoff comes on top.
        let wait = RECOVERY_WAIT + self.c.limits().reissue_total + self.c.limits().backoff.max;
        let deadline = Instant::now() + wait;
        loop {
            let r = self.c.recovery(&self.session.id);
            if r.count > self.recoveries {
                if let Some(why) = r.failed {
                    return Err(NotRecovered::Commands(why));
                }
                return self
                    .m
                    .get(&self.session.id)
                    .map_err(|e| NotRecovered::Session(Box::new(e)));
            }
            if Instant::now() > deadline {
                return Err(NotRecovered::Timeout(wait));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The guest's frames, split into lines as they arrive, each byte looked at
/// once: a line is searched for only in bytes not searched yet, and what is
/// consumed is dropped once per chunk, not once per line. Searching the
/// whole buffer again for each chunk, and draining it for each line, made a
/// long line sent in small pieces, or many lines in one chunk, quadratic in
/// the guest's output, a cost a hostile guest chooses.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
    /// Where the first line not yet handed out starts.
    start: usize,
    /// Bytes from `start` up to here hold no newline.
    searched: usize,
    /// Bytes looked at or moved, over the whole stream: read by the unit
    /// tests, which hold the splitter to linear work.
    #[cfg_attr(not(test), allow(dead_code))]
    work: usize,
}

impl Lines {
    fn push(&mut self, data: &[u8]) {
        if self.start > 0 {
            // Each byte is moved at most once: after this, `start` stays 0
            // until a line is handed out, which takes the bytes moved.
            self.work += self.buf.len() - self.start;
            self.buf.drain(..self.start);
            self.searched -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next whole line (with its newline), as a range for [`Lines::get`].
    fn next_line(&mut self) -> Option<std::ops::Range<usize>> {
        let rest = &self.buf[self.searched..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.work += i + 1;
                let line = self.start..self.searched + i + 1;
                self.start = line.end;
                self.searched = line.end;
                Some(line)
            }
            None => {
                self.work += rest.len();
                self.searched = self.buf.len();
                None
            }
        }
    }

    fn get(&self, r: std::ops::Range<usize>) -> &[u8] {
        &self.buf[r]
    }

    /// Bytes of a line not yet whole.
    fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    fn all(l: &mut Lines) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(r) = l.next_line() {
            out.push(l.get(r).to_vec());
        }
        out
    }

    #[test]
    fn many_lines_in_one_chunk_cost_their_length() {
        let line = b"{\"type\":\"output\"}\n";
        let n = 200_000;
        let chunk: Vec<u8> = line.iter().copied().cycle().take(line.len() * n).collect();
        let mut l = Lines::default();
        l.push(&chunk);
        let got = all(&mut l);
        assert_eq!(got.len(), n);
        assert!(got.iter().all(|g| g == line));
        assert_eq!(l.pending(), 0);
        // Linear: every byte looked at about once (the old drain per line
        // moved the rest of the chunk each time: n²/2 lines' worth).
        assert!(l.work <= 2 * chunk.len(), "{} for {}", l.work, chunk.len());
    }

    #[test]
    fn a_long_line_in_small_pieces_is_searched_once() {
        let total = 4 << 20;
        let mut l = Lines::default();
        let piece = vec![b'a'; 16];
        for _ in 0..total / piece.len() {
            l.push(&piece);
            assert!(l.next_line().is_none());
        }
        assert_eq!(l.pending(), total);
        l.push(b"\nrest");
        let line = l.next_line().expect("a whole line");
        assert_eq!(line.len(), total + 1);
        assert!(l.next_line().is_none());
        assert_eq!(l.pending(), 4);
        l.push(b"\n");
        let r = l.next_line().unwrap();
        assert_eq!(l.get(r), b"rest\n");
        // Searching the whole buffer again per piece was total²/32 bytes.
        assert!(l.work <= 3 * (total + 6), "{}", l.work);
    }

    #[test]
    fn lines_split_across_chunks_anywhere_come_out_whole() {
        let text: Vec<u8> = (0..5000)
            .flat_map(|i| format!("line {i} {}\n", "x".repeat(i % 97)).into_bytes())
            .collect();
        for step in [1, 2, 7, 64, 4096, text.len()] {
            let mut l = Lines::default();
            let mut out = Vec::new();
            for c in text.chunks(step) {
                l.push(c);
                out.extend(all(&mut l));
            }
            assert_eq!(out.concat(), text, "chunks of {step}");
            assert_eq!(out.len(), 5000);
        }
    }
}
