//! The coordinator: drumsd's proxy between agents and their LLM APIs
//! (docs/coordinator.md).
//!
//! An agent changes one base URL. Each request that asks a model for an
//! answer (`POST /v1/chat/completions`, `/v1/responses`, `/v1/messages`) from
//! a session is a turn boundary: it goes upstream at once, and meanwhile the
//! session's turn is ended and its version submitted to the engine. The
//! answer streams back event by event; only its end (the final event of a
//! stream, the last bytes of a plain answer) is held, and only if the
//! version is not durable by then, after promoting its job. When the answer
//! is released, the session's next turn begins. Every other request passes
//! through untouched.
//!
//! A request belongs to a session by its source address when it comes
//! through the bridge (an agent inside a session), or by a `/s/SESSION`
//! path prefix or an `x-drums-session` header (an agent outside).

mod sse;
mod turns;
pub mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use drums_api::{CoordinatedTurn, EndTurn, Session};
use drums_inspect::InspectError;
use drums_session::{Manager, SessionError};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::sync::mpsc;
use tracing::{debug, warn};

pub use turns::Boundary;
pub use upstream::{Style, Upstreams};

/// The body of every answer: the upstream's, passed through or gated.
pub type ProxyBody = BoxBody<Bytes, std::io::Error>;

/// The largest request body the proxy takes (a model's context with images
/// fits; more is refused with 413).
pub const MAX_REQUEST_BYTES: usize = 32 << 20;

/// The header naming an outside agent's session.
pub const SESSION_HEADER: &str = "x-drums-session";

/// Headers that belong to one connection, not to the request (RFC 9110
/// 7.6.1), and ours.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    SESSION_HEADER,
];

/// Where a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The bridge address: from sessions (or the host's own connections).
    Bridge,
    /// 127.0.0.1: agents on the host.
    Local,
}

pub struct Coordinator {
    manager: Arc<Manager>,
    upstreams: Upstreams,
    client: upstream::HttpsClient,
    turns: turns::Turns,
}

#[derive(Debug, thiserror::Error)]
enum ProxyError {
    #[error("no session named {0:?}")]
    UnknownSession(String),
    #[error("a request from session {from} cannot act for session {named}")]
    NotYours { from: String, named: String },
    #[error("no upstream for {0} requests: start drumsd with --llm-upstream {0}=URL")]
    NoUpstream(&'static str),
    #[error("request body over {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    #[error("read the request body: {0}")]
    Body(String),
    #[error("upstream {upstream} did not answer: {why}")]
    Upstream { upstream: String, why: String },
}

impl ProxyError {
    fn status(&self) -> StatusCode {
        match self {
            ProxyError::UnknownSession(_) => StatusCode::NOT_FOUND,
            ProxyError::NotYours { .. } => StatusCode::FORBIDDEN,
            ProxyError::NoUpstream(_) | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::Body(_) => StatusCode::BAD_REQUEST,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ProxyError::UnknownSession(_) => "not_found",
            ProxyError::NotYours { .. } => "forbidden",
            ProxyError::NoUpstream(_) => "no_upstream",
            ProxyError::Upstream { .. } => "upstream_unavailable",
            ProxyError::TooLarge => "too_large",
            ProxyError::Body(_) => "bad_request",
        }
    }

    /// An error both SDKs parse: OpenAI's reads `error.message`, Anthropic's
    /// `type: error` and `error.type`/`error.message`; drums' own clients
    /// read `error.kind`.
    fn response(&self) -> Response<ProxyBody> {
        let body = serde_json::json!({
            "type": "error",
            "error": {"type": self.kind(), "kind": self.kind(), "message": self.to_string()},
        });
        Response::builder()
            .status(self.status())
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-drums-proxy-error", self.kind())
            .body(full(Bytes::from(body.to_string())))
            .expect("a valid response")
    }
}

fn full(b: Bytes) -> ProxyBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What the pump needs to finish a turn request.
struct Pending {
    session: Session,
    /// The turn's end: its effects, or none if no turn was open after all
    /// (the session was rolled back or recovered since, which starts its
    /// turns again).
    ending: Option<tokio::task::JoinHandle<Result<Option<drums_api::TurnEffects>, String>>>,
    record: CoordinatedTurn,
    started: Instant,
}

impl Coordinator {
    pub fn new(manager: Arc<Manager>, upstreams: Upstreams) -> std::io::Result<Arc<Coordinator>> {
        Ok(Arc::new(Coordinator {
            manager,
            upstreams,
            client: upstream::client()?,
            turns: turns::Turns::default(),
        }))
    }

    /// `GET /v1/sessions/{session}/coordinator`: what the proxy saw of a session.
    pub fn turns(
        &self,
        id_or_name: &str,
    ) -> Result<Vec<CoordinatedTurn>, drums_session::SessionError> {
        let s = self.manager.get(id_or_name)?;
        Ok(self.turns.records(&s.id))
    }

    /// A session was rolled back, recovered or removed: its turns start
    /// again from its next request.
    pub fn forget(&self, session_id: &str) {
        self.turns.forget(session_id);
    }

    /// Answer one request.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        listener: Listener,
    ) -> Response<ProxyBody> {
        match self.proxy(req, peer, listener).await {
            Ok(r) => r,
            Err(e) => {
                debug!("proxy: {e}");
                e.response()
            }
        }
    }

    /// The session a request belongs to, and its path without a `/s/NAME`
    /// prefix. From inside a session only that session can be named.
    fn who(
        &self,
        parts: &hyper::http::request::Parts,
        peer: SocketAddr,
        listener: Listener,
    ) -> Result<(Option<Session>, String), ProxyError> {
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let (named, pq) = match pq.strip_prefix("/s/") {
            Some(rest) => {
                let (name, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let tail = if tail.is_empty() { "/" } else { tail };
                (Some(name.to_owned()), tail.to_owned())
            }
            None => (
                parts
                    .headers
                    .get(SESSION_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                pq,
            ),
        };
        let from = match (listener, peer.ip()) {
            (Listener::Bridge, IpAddr::V4(ip)) => self.manager.session_at(ip).ok().flatten(),
            _ => None,
        };
        let lookup = |n: &str| {
            self.manager
                .get(n)
                .map_err(|_| ProxyError::UnknownSession(n.to_owned()))
        };
        let session = match (from, named) {
            (Some(f), Some(n)) => {
                if n != f.id && n != f.name {
                    return Err(ProxyError::NotYours {
                        from: f.name,
                        named: n,
                    });
                }
                Some(f)
            }
            (Some(f), None) => Some(f),
            (None, Some(n)) => Some(lookup(&n)?),
            (None, None) => None,
        };
        Ok((session, pq))
    }

    async fn proxy(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        listener: Listener,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let started = Instant::now();
        let started_at_ms = now_ms();
        let (parts, body) = req.into_parts();
        let (session, pq) = self.who(&parts, peer, listener)?;
        let path = pq.split('?').next().unwrap_or("/").to_owned();
        let (style, asks_model) = Style::of(&parts.method, &path, &parts.headers);
        let base = self
            .upstreams
            .of(style)
            .ok_or(ProxyError::NoUpstream(style.as_str()))?
            .clone();
        // A declared length over the limit is refused before any of it is
        // read (the client may not have sent it yet).
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_REQUEST_BYTES as u64) {
            return Err(ProxyError::TooLarge);
        }
        let body = Limited::new(body, MAX_REQUEST_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ProxyError::TooLarge
                } else {
                    ProxyError::Body(e.to_string())
                }
            })?
            .to_bytes();
        let turn = asks_model.then_some(session).flatten();

        let mut up = Request::builder()
            .method(parts.method.clone())
            .uri(base.join(&pq));
        let headers = up.headers_mut().expect("a valid builder");
        copy_headers(&parts.headers, headers);
        headers.insert(
            header::HOST,
            HeaderValue::from_str(base.authority().as_str())
                .expect("an authority is a header value"),
        );
        if turn.is_some() {
            // The gate reads the stream's events: no compression of it.
            headers.remove(header::ACCEPT_ENCODING);
        }
        let request_bytes = body.len() as u64;
        let stream = turn.is_some() && asks_stream(&body);
        let up = up.body(Full::new(body)).expect("a valid request");

        let pending = turn.map(|s| {
            let boundary = self.turns.enter(&s.id);
            let ending = (boundary == Boundary::End).then(|| {
                let (m, id) = (self.manager.clone(), s.id.clone());
                let handover = self.turns.handover(&s.id);
                tokio::spawn(async move {
                    // After the begin of the turn this ends.
                    let _h = handover.lock_owned().await;
                    m.end_turn(
                        &id,
                        &EndTurn {
                            checkpoint: true,
                            policy: None,
                            wait: false,
                        },
                    )
                    .await
                    .map(Some)
                    .or_else(|e| match e {
                        SessionError::Inspect(InspectError::NoTurn(_)) => Ok(None),
                        e => Err(drums_session::error_chain(&e)),
                    })
                })
            });
            Pending {
                record: CoordinatedTurn {
                    session: s.name.clone(),
                    turn: None,
                    style: style.as_str().into(),
                    path: path.clone(),
                    status: 0,
                    stream,
                    decision: match boundary {
                        Boundary::End => "none",
                        Boundary::First => "first",
                        Boundary::Concurrent => "concurrent",
                    }
                    .into(),
                    job: None,
                    version: None,
                    version_bytes: None,
                    upstream_ms: 0.0,
                    held_ms: 0.0,
                    request_bytes,
                    response_bytes: 0,
                    client_gone: false,
                    error: None,
                    started_at_ms,
                },
                session: s,
                ending,
                started,
            }
        });

        let resp = match self.client.request(up).await {
            Ok(r) => r,
            Err(e) => {
                let err = ProxyError::Upstream {
                    upstream: base.authority().to_string(),
                    why: drums_session::error_chain(&e),
                };
                if let Some(mut p) = pending {
                    p.record.status = err.status().as_u16();
                    p.record.error = Some(err.to_string());
                    // The turn still ended: finish it as any answer, before
                    // the agent can send its next request.
                    self.clone().finish(p, false, false).await;
                }
                return Err(err);
            }
        };
        let (mut rparts, rbody) = resp.into_parts();
        strip_hop_by_hop(&mut rparts.headers);
        let Some(mut p) = pending else {
            let body = rbody.map_err(std::io::Error::other).boxed();
            return Ok(Response::from_parts(rparts, body));
        };
        p.record.status = rparts.status.as_u16();
        let sse = rparts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
        let gate = rparts.status.is_success();
        tokio::spawn(self.clone().pump(p, rbody, sse, gate, tx));
        let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|f| (f, rx))
        }));
        Ok(Response::from_parts(rparts, BodyExt::boxed(body)))
    }

    /// Pass the upstream's answer to the client, holding its end until the
    /// turn's version is durable (when `gate`), then finish the turn.
    async fn pump(
        self: Arc<Self>,
        mut p: Pending,
        mut body: Incoming,
        sse: bool,
        gate: bool,
        tx: mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
    ) {
        let mut events = sse.then(sse::Splitter::default);
        // Without events, the last chunk is the end: each chunk goes when
        // the next arrives.
        let mut last: Option<Bytes> = None;
        let mut gone = false;
        loop {
            // A client that went away is not waited for: the upstream's
            // answer is dropped (which cancels it) and the turn finishes.
            let next = tokio::select! {
                f = body.frame() => f,
                _ = tx.closed() => {
                    gone = true;
                    break;
                }
            };
            let frame = match next {
                None => break,
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    p.record.error = Some(format!(
                        "upstream broke off: {}",
                        drums_session::error_chain(&e)
                    ));
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    gone = true;
                    break;
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            p.record.response_bytes += data.len() as u64;
            let now = match &mut events {
                Some(s) => s.push(&data),
                None => last.replace(data).unwrap_or_default(),
            };
            if !now.is_empty() && !gone && tx.send(Ok(Frame::data(now))).await.is_err() {
                gone = true;
            }
        }
        p.record.upstream_ms = p.started.elapsed().as_secs_f64() * 1e3;
        let rest = match &mut events {
            Some(s) => s.finish(),
            None => last.take().unwrap_or_default(),
        };
        let release = move |rest: Bytes| async move {
            if !rest.is_empty() {
                let _ = tx.send(Ok(Frame::data(rest))).await;
            }
        };
        self.finish_with(p, gate && !gone, gone, release, rest)
            .await;
    }

    async fn finish(self: Arc<Self>, p: Pending, gate: bool, gone: bool) {
        self.finish_with(p, gate, gone, |_| async {}, Bytes::new())
            .await;
    }

    /// The turn's end: what it took; the hold, if the version is not durable
    /// yet; the release; the next turn; the record.
    async fn finish_with<F, Fut>(
        self: Arc<Self>,
        mut p: Pending,
        gate: bool,
        gone: bool,
        release: F,
        rest: Bytes,
    ) where
        F: FnOnce(Bytes) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        p.record.client_gone = gone;
        if let Some(ending) = p.ending.take() {
            match ending.await {
                Ok(Ok(None)) => p.record.decision = "first".into(),
                Ok(Ok(Some(effects))) => {
                    p.record.turn = Some(effects.turn);
                    if let Some(ck) = effects.checkpoint {
                        p.record.decision = ck.decision;
                        p.record.job = ck.job;
                    }
                }
                Ok(Err(e)) => {
                    p.record.decision = "error".into();
                    p.record.error.get_or_insert(e);
                }
                Err(e) => {
                    p.record.decision = "error".into();
                    p.record.error.get_or_insert(e.to_string());
                }
            }
        }
        if let Some(job) = p.record.job.clone() {
            let done = |j: &drums_api::Job| j.state == "done" || j.state == "failed";
            let mut state = self.manager.job(&job, false).await.ok();
            if gate && !state.as_ref().is_some_and(done) {
                let held = Instant::now();
                let _ = self.manager.promote_job(&job).await;
                state = self.manager.job(&job, true).await.ok();
                p.record.held_ms = held.elapsed().as_secs_f64() * 1e3;
            }
            if let Some(j) = state.filter(done) {
                if let Some(e) = j.error {
                    p.record.error.get_or_insert(format!("version: {e}"));
                }
                p.record.version = j.version;
            }
        }
        // The next turn begins as the agent gets the end of the answer: the
        // handover is taken before this request stops counting, so the end
        // of the turn by any request that then counts as a boundary waits
        // for this begin, and the agent does not.
        let handover = self.turns.handover(&p.session.id).lock_owned().await;
        let last = self.turns.leave(&p.session.id);
        // The answer's end goes on its own: a client slow to read it holds
        // up nothing of its session's (the handover is held only for the
        // begin).
        let released = tokio::spawn(release(rest));
        if last {
            match self.manager.turn_begin(&p.session.id) {
                // Begun, or begun already (by hand, `drums turn begin`).
                Ok(_) | Err(SessionError::Inspect(InspectError::TurnOpen { .. })) => {}
                Err(e) => {
                    self.turns.not_open(&p.session.id);
                    warn!(
                    session = %p.session.name,
                        "begin the next turn: {}",
                        drums_session::error_chain(&e)
                    );
                }
            }
        }
        drop(handover);
        let _ = released.await;
        if let Some(v) = &p.record.version {
            p.record.version_bytes = self
                .manager
                .session_versions(&p.session.id)
                .ok()
                .and_then(|all| all.into_iter().find(|x| &x.id == v))
                .map(|x| x.files.map_or(0, |c| c.bytes) + x.process.map_or(0, |c| c.bytes));
        }
        self.turns.record(&p.session.id, p.record);
        if self.turns.prune_due() {
            let m = self.manager.clone();
            self.turns.prune(|id| m.get(id).is_ok());
        }
    }
}

/// `"stream": true` in a JSON request body.
fn asks_stream(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Stream {
        #[serde(default)]
        stream: bool,
    }
    serde_json::from_slice::<Stream>(body).is_ok_and(|s| s.stream)
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !is_hop_by_hop(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let names: Vec<HeaderName> = h.keys().filter(|n| is_hop_by_hop(n)).cloned().collect();
    for n in names {
        h.remove(n);
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}
