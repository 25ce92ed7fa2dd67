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

mod agent;
mod budget;
pub mod commands;
mod limits;
mod replay;
mod replays;
pub mod replicas;
mod sessions;
mod sse;
mod turns;
pub mod upstream;
mod watch;
mod writer;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use drums_api::{CoordinatedTurn, EndTurn, Policy, Session};
use drums_catalog::{Catalog, Exchange};
use drums_inspect::InspectError;
use drums_session::{Manager, SessionError};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

pub use limits::{Backoff, Limits};
pub use replay::JournalBudget;
pub use sessions::{Sessions, StreamGuard};
pub use turns::Boundary;
pub use upstream::{Style, Upstreams};

/// The body of every answer: the upstream's, passed through or gated.
pub type ProxyBody = BoxBody<Bytes, std::io::Error>;

/// The largest request body the proxy takes (a model's context with images
/// fits; more is refused with 413).
pub const MAX_REQUEST_BYTES: usize = 32 << 20;

/// The largest answer the exchange log keeps; a larger one is passed on but
/// not logged (a fast-forward asks upstream for it again).
pub const MAX_LOGGED_BYTES: usize = 64 << 20;

/// Records `GET /v1/sessions/{session}/coordinator` shows (the newest).
const RECORDS_SHOWN: u64 = 1000;

/// Four requests of the largest size at once, or one answer of the largest
/// that is logged and a request beside it; an agent's usual requests are
/// well under a MiB, so hundreds of them at once.
pub const DEFAULT_SESSION_MEMORY: usize = 128 << 20;
/// A 32 MiB body needs only ~4.5 Mbit/s to arrive in time.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Rows after pruning, i.e. model calls since the oldest version the
/// session can still go back to (retention keeps 8 and the pinned ones).
pub const DEFAULT_JOURNAL_ROWS: u64 = 10_000;
pub const DEFAULT_JOURNAL_BYTES: u64 = 256 << 20;

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

pub struct Coordinator<S: Sessions = Manager> {
    manager: Arc<S>,
    upstreams: Upstreams,
    /// What each turn's end takes (drumsd's `--turn-policy`).
    policy: Policy,
    client: upstream::HttpsClient,
    turns: turns::Turns,
    log: replay::Log,
    /// Per session: recoveries done, and how the last one's commands ran
    /// again (commands.rs).
    recovered: std::sync::Mutex<std::collections::HashMap<String, commands::Recovered>>,
    /// Per session: the recovery under way, and the task running its
    /// commands again after it, off the watch's path (commands.rs); execs
    /// wait for both (replays.rs).
    replays: replays::Replays,
    /// What one session may make the coordinator do (drumsd's flags).
    limits: Limits,
    /// Per session: whether an agent outside coordinates it (the journal's
    /// `outside`, read once; this drumsd is its only writer).
    outside: std::sync::Mutex<std::collections::HashMap<String, bool>>,
    /// Bytes held per session (or address) of request and answer bodies.
    memory: budget::Budgets,
    /// Per session: the answers held for a replica of their version on
    /// another host (replicas.rs).
    replicas: replicas::Replicas,
    /// Where the proxy listens on the host, once bound (`GET /v1/version`
    /// says it: a cluster points an agent outside at its session's node).
    local_address: std::sync::OnceLock<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
enum ProxyError {
    #[error("no session named {0:?}")]
    UnknownSession(String),
    /// Never taken for "no session": a caller the proxy cannot place is
    /// refused, not served as the host.
    #[error("look up the session of {who}: {}", drums_api::error_chain(.source))]
    Lookup {
        who: String,
        #[source]
        source: Box<SessionError>,
    },
    #[error("the proxy forwards only GET, POST and DELETE (the LLM APIs' methods), not {0}")]
    Method(hyper::Method),
    #[error("the proxy forwards only the LLM APIs' paths under /v1/, not {0:?}")]
    NotProxied(String),
    #[error("path {path:?} refused: {why}")]
    BadPath { path: String, why: &'static str },
    #[error("the request body did not arrive within {secs} s ({got} bytes came)")]
    SlowBody { secs: u64, got: usize },
    #[error(
        "{who} holds {held} bytes of bodies in the proxy already; with this request's it \
         would pass its budget of {limit} bytes (drumsd --llm-proxy-session-memory)"
    )]
    OverBudget {
        who: String,
        held: usize,
        limit: usize,
    },
    #[error(
        "session {session}'s exchange log holds {rows} rows and {bytes} bytes, over its budget of \
         {max_rows} rows and {max_bytes} bytes even without what no rollback or recovery can \
         reach (drumsd --llm-journal-rows, --llm-journal-bytes): remove old versions of it, or \
         raise the budget"
    )]
    JournalFull {
        session: String,
        rows: u64,
        bytes: u64,
        max_rows: u64,
        max_bytes: u64,
    },
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
            ProxyError::UnknownSession(_) | ProxyError::NotProxied(_) => StatusCode::NOT_FOUND,
            ProxyError::Lookup { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::BadPath { .. } => StatusCode::BAD_REQUEST,
            ProxyError::SlowBody { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::OverBudget { .. } | ProxyError::JournalFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ProxyError::NotYours { .. } => StatusCode::FORBIDDEN,
            ProxyError::NoUpstream(_) | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::Body(_) => StatusCode::BAD_REQUEST,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ProxyError::UnknownSession(_) | ProxyError::NotProxied(_) => "not_found",
            ProxyError::Lookup { .. } => "lookup_failed",
            ProxyError::Method(_) => "method_not_allowed",
            ProxyError::BadPath { .. } => "bad_path",
            ProxyError::SlowBody { .. } => "too_slow",
            ProxyError::OverBudget { .. } => "over_budget",
            ProxyError::JournalFull { .. } => "journal_full",
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
        let mut r = Response::builder()
            .status(self.status())
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-drums-proxy-error", self.kind());
        if matches!(
            self,
            ProxyError::SlowBody { .. } | ProxyError::OverBudget { .. } | ProxyError::TooLarge
        ) {
            // The rest of the body is not read: the connection cannot carry
            // another request.
            r = r.header(header::CONNECTION, "close");
        }
        r.body(full(Bytes::from(body.to_string())))
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

/// An answer as it went out: status, headers, body.
type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// What the pump needs to finish a turn request.
/// What a request's arrival ended: the session's turn, or nothing (its
/// first request, with the job of its base version if one was taken).
enum Ending {
    Turn(Box<drums_api::TurnEffects>),
    First(Option<String>),
}

struct Pending {
    session: Session,
    /// How the request met the session's exchange log, and its hash.
    met: Option<replay::Met>,
    sha: String,
    /// The session recorded as coordinated, and the agent living in it looked
    /// for (its first request).
    seeking: Option<tokio::task::JoinHandle<()>>,
    /// The answer as it went out, to log: status, headers, body (`None` once
    /// over [`MAX_LOGGED_BYTES`] or the session's memory budget, or not a
    /// 2xx).
    answer: Option<Answer>,
    /// The kept answer's bytes, charged to the session's memory budget.
    kept: budget::Charge,
    /// The upstream broke off.
    broken: bool,
    /// The turn's end: its effects, or none if no turn was open after all
    /// (the session was rolled back or recovered since, which starts its
    /// turns again).
    ending: Option<tokio::task::JoinHandle<Result<Ending, SessionError>>>,
    record: CoordinatedTurn,
    started: Instant,
}

impl<S: Sessions> Coordinator<S> {
    /// `catalog` is the coordinator's own connection to drumsd's catalog,
    /// for its journal; `policy` is what each turn's end takes.
    pub fn new(
        manager: Arc<S>,
        upstreams: Upstreams,
        catalog: Arc<Catalog>,
        policy: Policy,
        limits: Limits,
    ) -> std::io::Result<Arc<Coordinator<S>>> {
        match catalog.interrupt_running_commands() {
            Ok(0) => {}
            Ok(n) => warn!("{n} command(s) were running when the previous drumsd stopped: marked interrupted, not re-issued"),
            Err(e) => warn!("journal: {e}"),
        }
        Ok(Arc::new(Coordinator {
            manager,
            upstreams,
            policy,
            client: upstream::client()?,
            turns: turns::Turns::default(),
            log: replay::Log::new(catalog),
            memory: budget::Budgets::new(limits.session_memory),
            recovered: Default::default(),
            replays: Default::default(),
            limits,
            outside: Default::default(),
            replicas: Default::default(),
            local_address: Default::default(),
        }))
    }

    /// `GET /v1/sessions/{session}/coordinator`: what the proxy saw of a
    /// session, durably (the newest 1000 requests).
    pub fn turns(
        &self,
        id_or_name: &str,
    ) -> Result<Vec<CoordinatedTurn>, drums_session::SessionError> {
        let s = self.manager.get(id_or_name)?;
        let rows = self
            .log
            .catalog()
            .turn_records(&s.id, RECORDS_SHOWN)
            .map_err(drums_session::SessionError::from)?;
        // Written by this module from the same type: a row that does not
        // parse (a newer drums' field) is left out rather than fail all.
        Ok(rows
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }

    /// The proxy's host listener is bound at `at`.
    pub fn listening_locally(&self, at: SocketAddr) {
        let _ = self.local_address.set(at);
    }

    /// Where the proxy listens on the host, if it does.
    pub fn local_address(&self) -> Option<SocketAddr> {
        self.local_address.get().copied()
    }

    /// The replication gates (replicas.rs), by session id.
    pub fn replicas(&self) -> &replicas::Replicas {
        &self.replicas
    }

    /// Watch the coordinated sessions and recover the ones that fail
    /// (watch.rs), until drumsd stops.
    /// Sessions this drumsd recovered at its start (their processes died
    /// with the previous one) are gated before it returns, so before
    /// drumsd serves an exec of theirs (replays.rs).
    pub fn spawn_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        watch::restored_at_start(self);
        tokio::spawn(watch::run(Arc::downgrade(self)))
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
        // A failed lookup is refused: taken as "no session", a caller the
        // catalog could not place would be served as the host.
        let from = match (listener, peer.ip()) {
            (Listener::Bridge, IpAddr::V4(ip)) => {
                self.manager
                    .session_at(ip)
                    .map_err(|source| ProxyError::Lookup {
                        who: format!("address {ip}"),
                        source: Box::new(source),
                    })?
            }
            _ => None,
        };
        let lookup = |n: &str| {
            self.manager.get(n).map_err(|source| match source {
                SessionError::NotFound(_) => ProxyError::UnknownSession(n.to_owned()),
                source => ProxyError::Lookup {
                    who: format!("name {n:?}"),
                    source: Box::new(source),
                },
            })
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
        // From the session's own address, through the bridge: the session
        // itself calls, not an agent on the host.
        let inside = listener == Listener::Bridge
            && session.as_ref().and_then(|s| s.ip.clone()) == Some(peer.ip().to_string());
        let path = pq.split('?').next().unwrap_or("/").to_owned();
        // Before anything is read or sent: only what the LLM APIs use goes
        // upstream.
        check_route(&parts.method, &path)?;
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
        let who = match &session {
            Some(s) => format!("session {}", s.name),
            None => format!("address {}", peer.ip()),
        };
        let account = session
            .as_ref()
            .map_or_else(|| format!("address {}", peer.ip()), |s| s.id.clone());
        // Held until the upstream's answer begins: by then the body was sent.
        let mut charge = self.memory.open(account);
        let over = |b: budget::OverBudget| ProxyError::OverBudget {
            who: who.clone(),
            held: b.held,
            limit: b.limit,
        };
        if let Some(n) = declared {
            charge.grow_to(n as usize).map_err(over)?;
        }
        let secs = self.limits.body_timeout.as_secs();
        let mut buf = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
        let read = tokio::time::timeout(
            self.limits.body_timeout,
            read_body(body, &mut buf, &mut charge),
        )
        .await;
        match read {
            Ok(read) => read.map_err(|e| match e {
                BodyError::Over(b) => over(b),
                BodyError::TooLarge => ProxyError::TooLarge,
                BodyError::Read(why) => ProxyError::Body(why),
            })?,
            Err(_) => {
                return Err(ProxyError::SlowBody {
                    secs,
                    got: buf.len(),
                })
            }
        }
        let body = buf.freeze();
        let turn = asks_model
            .then_some(session)
            .flatten()
            .and_then(|s| self.turn_of(s, inside));
        if let Some(s) = &turn {
            self.journal_room(s)?;
        }

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
        // Only a session's model calls are logged, so only they are hashed.
        let sha = turn
            .as_ref()
            .map(|_| replay::request_sha(parts.method.as_str(), &path, &body))
            .unwrap_or_default();
        let up = up.body(Full::new(body)).expect("a valid request");

        let mut pending = turn.map(|s| {
            self.begin(
                s,
                Begin {
                    peer,
                    listener,
                    style,
                    path: path.clone(),
                    stream,
                    request_bytes,
                    sha,
                    started,
                    started_at_ms,
                },
            )
        });

        // A fast-forward: the logged answer, without asking upstream.
        let replayed = pending.as_mut().and_then(|p| match &mut p.met {
            Some(replay::Met::Replayed { logged, .. }) => Some(std::mem::replace(
                logged,
                Exchange {
                    seq: logged.seq,
                    request_sha: String::new(),
                    status: 0,
                    headers: Vec::new(),
                    body: Vec::new(),
                    version: None,
                },
            )),
            _ => None,
        });
        let (mut rparts, rbody) = match replayed {
            Some(x) => {
                let mut b = Response::builder().status(x.status);
                for (n, v) in &x.headers {
                    b = b.header(n.as_str(), v.as_str());
                }
                b.body(full(Bytes::from(x.body)))
                    .map_err(|e| ProxyError::Body(format!("a logged answer: {e}")))?
                    .into_parts()
            }
            None => match self.client.request(up).await.inspect(|_| drop(charge)) {
                Ok(r) => {
                    let (parts, body) = r.into_parts();
                    (parts, body.map_err(std::io::Error::other).boxed())
                }
                Err(e) => {
                    let err = ProxyError::Upstream {
                        upstream: base.authority().to_string(),
                        why: drums_api::error_chain(&e),
                    };
                    if let Some(mut p) = pending {
                        p.record.status = err.status().as_u16();
                        p.record.error = Some(err.to_string());
                        p.broken = true;
                        // The turn still ended: finish it as any answer, before
                        // the agent can send its next request.
                        self.clone().finish(p, false, false).await;
                    }
                    return Err(err);
                }
            },
        };
        strip_hop_by_hop(&mut rparts.headers);
        let Some(mut p) = pending else {
            return Ok(Response::from_parts(rparts, rbody));
        };
        p.record.status = rparts.status.as_u16();
        if rparts.status.is_success() && p.met.is_some() {
            let headers = rparts
                .headers
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect();
            p.answer = Some((rparts.status.as_u16(), headers, Vec::new()));
        }
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

    /// Whose turn a model call of session `s` is: the session's, or none.
    /// An agent outside owns the session's turns and exchange log from its
    /// first call on: the session's own calls through the bridge are then
    /// forwarded as any request is, and are none of its turns. Otherwise
    /// the session could end the outside agent's turns, take versions
    /// between its commands, fork its log, claim an agent inside, and move
    /// the places its commands are logged at (counted in model calls), so
    /// that a recovery ran some of them twice or skipped them
    /// (docs/security.md, "drumsd against hostile input").
    fn turn_of(&self, s: Session, inside: bool) -> Option<Session> {
        let catalog = self.log.catalog();
        let known = self.outside().get(&s.id).copied();
        if !inside {
            if known != Some(true) {
                match catalog.coordinate_outside(&s.id) {
                    Ok(()) => {
                        self.outside().insert(s.id.clone(), true);
                    }
                    Err(e) => warn!(session = %s.name, "journal: {e}"),
                }
            }
            return Some(s);
        }
        let outside = match known {
            Some(o) => o,
            None => match catalog.coordinated_outside(&s.id) {
                Ok(o) => {
                    self.outside().insert(s.id.clone(), o);
                    o
                }
                // Unknown: not the session's to decide, so no turn.
                Err(e) => {
                    warn!(session = %s.name, "journal: {e}");
                    return None;
                }
            },
        };
        if outside {
            debug!(session = %s.name, "a model call of the session itself, which an agent outside coordinates: forwarded, no turn");
            return None;
        }
        Some(s)
    }

    fn outside(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, bool>> {
        self.outside.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A model call of session `s` arrives: what it is for the session's
    /// turns, its place in the exchange log, and (its first) the search for
    /// the agent that sent it.
    /// Ends the session's turn and submits its version, while the request
    /// goes upstream.
    fn end_turn(&self, s: &Session) -> tokio::task::JoinHandle<Result<Ending, SessionError>> {
        let (m, id, name, policy) = (
            self.manager.clone(),
            s.id.clone(),
            s.name.clone(),
            self.policy,
        );
        let handover = self.turns.handover(&s.id);
        tokio::spawn(async move {
            // After the begin of the turn this ends.
            let _h = handover.lock_owned().await;
            m.end_model_turn(
                &id,
                &name,
                &EndTurn {
                    checkpoint: true,
                    policy: Some(policy),
                    wait: false,
                },
            )
            .await
            .map(|e| Ending::Turn(Box::new(e)))
            .or_else(|e| match e {
                SessionError::Inspect(InspectError::NoTurn(_)) => Ok(Ending::First(None)),
                e => Err(e),
            })
        })
    }

    /// A session's first request: if it has no version yet, its first turn
    /// begins now and its base version is taken (so that a failure before
    /// any turn changed something has a version to recover to), while the
    /// request goes upstream. The turn begun first makes the version's dump
    /// a boundary the inspector knows (docs/inspector.md).
    fn base(&self, s: &Session) -> tokio::task::JoinHandle<Result<Ending, SessionError>> {
        let (m, id, policy) = (self.manager.clone(), s.id.clone(), self.policy);
        let handover = self.turns.handover(&s.id);
        tokio::spawn(async move {
            let _h = handover.lock_owned().await;
            let none = m
                .session_versions(&id)
                .map(|v| v.is_empty())
                .unwrap_or(false);
            if policy == Policy::Off || !none {
                return Ok(Ending::First(None));
            }
            match begin_turn(&m, &id).await {
                Ok(_) | Err(SessionError::Inspect(InspectError::TurnOpen { .. })) => {}
                Err(e) => return Err(e),
            }
            m.base_version(&id, policy).await.map(Ending::First)
        })
    }

    fn begin(self: &Arc<Self>, s: Session, b: Begin) -> Pending {
        // Taken back to a version since its last request: its turns start
        // again, and an agent living in it is fast-forwarded from there.
        if let Some(v) = self.manager.take_restored(&s.id) {
            self.turns.forget(&s.id);
            let lives_in = self.log.catalog().agent_of(&s.id).ok().flatten().is_some();
            let at = match lives_in {
                true => self.log.restored(&s.id, &v),
                false => {
                    self.log.forget(&s.id);
                    Ok(None)
                }
            };
            match at {
                Ok(at) => {
                    debug!(session = %s.name, version = %v, fast_forward_from = ?at, "restored")
                }
                Err(e) => warn!(session = %s.name, "the exchange log after a restore: {e}"),
            }
        }
        let boundary = self.turns.enter(&s.id);
        let ending = match boundary {
            Boundary::End => Some(self.end_turn(&s)),
            Boundary::First => Some(self.base(&s)),
            Boundary::Concurrent => None,
        };
        let met = match self.log.meet(&s.id, &b.sha) {
            Ok(m) => {
                if let replay::Met::Forked { seq, branch } = &m {
                    info!(session = %s.name, seq, branch, "the agent diverged from its log: the rest of the log is branch {branch}");
                }
                Some(m)
            }
            Err(e) => {
                warn!(session = %s.name, "the exchange log: {e}");
                None
            }
        };
        let seeking = self
            .turns
            .seek_agent(&s.id)
            .then(|| self.seek_agent(&s, b.peer, b.listener));
        Pending {
            record: CoordinatedTurn {
                session: s.name.clone(),
                turn: None,
                seq: met.as_ref().map(replay::Met::seq),
                log: met.as_ref().map_or("none", replay::Met::as_str).into(),
                style: b.style.as_str().into(),
                path: b.path,
                status: 0,
                stream: b.stream,
                decision: match boundary {
                    Boundary::End => "none",
                    Boundary::First => "first",
                    Boundary::Concurrent => "concurrent",
                }
                .into(),
                class: None,
                job: None,
                version: None,
                version_bytes: None,
                version_shared_bytes: None,
                upstream_ms: 0.0,
                held_ms: 0.0,
                release_ms: 0.0,
                replica_ms: 0.0,
                replica: None,
                request_bytes: b.request_bytes,
                response_bytes: 0,
                client_gone: false,
                error: None,
                started_at_ms: b.started_at_ms,
            },
            met,
            sha: b.sha,
            seeking,
            answer: None,
            kept: self.memory.open(s.id.clone()),
            broken: false,
            session: s,
            ending,
            started: b.started,
        }
    }

    /// Find the process of session `s` that holds the connection from
    /// `peer`: the agent living in the session, excluded from its process
    /// tracking from now on (agent.rs).
    fn seek_agent(
        self: &Arc<Self>,
        s: &Session,
        peer: SocketAddr,
        listener: Listener,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let (id, name, init) = (s.id.clone(), s.name.clone(), s.init_pid);
        tokio::task::spawn_blocking(move || {
            // Coordinated from now on: watched, and its commands logged.
            if let Err(e) = me.log.catalog().coordinate(&id, None) {
                warn!(session = %name, "journal: {e}");
            }
            if listener != Listener::Bridge {
                return;
            }
            let (Some(init), Some(from)) = (init, agent::v4(peer)) else {
                return;
            };
            let pids = me.manager.session_pids(&id).unwrap_or_default();
            let Some(found) = agent::holder(init, from, &pids) else {
                // The host's own connection through the bridge, or one
                // that closed already: no agent in the session.
                debug!(session = %name, "no process of the session holds {peer}");
                return;
            };
            match me.manager.mark_agent(&id, found.ns_pid) {
                Ok(_) => {
                    info!(session = %name, pid = found.ns_pid, "the agent lives in the session: not tracked")
                }
                Err(e) => {
                    warn!(session = %name, "mark the agent: {}", drums_api::error_chain(&e))
                }
            }
            if let Err(e) = me.log.catalog().coordinate(&id, Some(found.ns_pid)) {
                warn!(session = %name, "journal: {e}");
            }
        })
    }

    /// Pass the answer (upstream's or the log's) to the client, holding its
    /// end until the turn's version is durable (when `gate`), then finish
    /// the turn.
    async fn pump(
        self: Arc<Self>,
        mut p: Pending,
        mut body: ProxyBody,
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
                        drums_api::error_chain(&e)
                    ));
                    p.broken = true;
                    let _ = tx.send(Err(e)).await;
                    gone = true;
                    break;
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            p.record.response_bytes += data.len() as u64;
            if let Some((_, _, kept)) = &mut p.answer {
                let need = kept.len() + data.len();
                // Charged before it is allocated, as a request's body is.
                let room = need <= MAX_LOGGED_BYTES
                    && (need <= kept.capacity() || {
                        let cap = need.max(kept.capacity() * 2).min(MAX_LOGGED_BYTES);
                        p.kept.grow_to(cap).is_ok() && {
                            kept.reserve_exact(cap - kept.len());
                            true
                        }
                    });
                if room {
                    kept.extend_from_slice(&data);
                } else {
                    // Passed on, not logged: a fast-forward asks upstream.
                    debug!(session = %p.session.name, "answer over {} bytes or the session's memory budget: not logged", MAX_LOGGED_BYTES);
                    p.answer = None;
                    p.kept = self.memory.open(p.session.id.clone());
                }
            }
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
    /// yet; the exchange logged; the release; the next turn; the record.
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
        // Everything from here to the release is delay the agent sees.
        let arrived = Instant::now();
        p.record.client_gone = gone;
        if let Some(ending) = p.ending.take() {
            match ending.await {
                Ok(Ok(Ending::First(job))) => {
                    p.record.decision = if job.is_some() { "base" } else { "first" }.into();
                    p.record.job = job;
                }
                Ok(Ok(Ending::Turn(effects))) => {
                    p.record.turn = Some(effects.turn);
                    p.record.class = Some(effects.class);
                    if let Some(ck) = effects.checkpoint {
                        p.record.decision = ck.decision;
                        p.record.job = ck.job;
                    }
                }
                Ok(Err(e)) => {
                    p.record.decision = "error".into();
                    p.record.error.get_or_insert(drums_api::error_chain(&e));
                }
                Err(e) => {
                    p.record.decision = "error".into();
                    p.record.error.get_or_insert(e.to_string());
                }
            }
        }
        if let Some(job) = p.record.job.clone() {
            let done = |j: &drums_api::Job| {
                matches!(
                    j.state,
                    drums_api::JobState::Done | drums_api::JobState::Failed
                )
            };
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
        // A version also copied to another host holds the answer until its
        // replica is acknowledged (or the gate's timeout).
        if let (true, Some(v)) = (gate, p.record.version.clone()) {
            let held = Instant::now();
            let outcome = match self.replicas.wait(&p.session.id, &v).await {
                replicas::Waited::Ungated => None,
                replicas::Waited::Acked => Some("acked"),
                replicas::Waited::Off => Some("off"),
                replicas::Waited::TimedOut(t) => {
                    warn!(session = %p.session.name, version = %v, "replica not acknowledged within {t:?}: the answer goes on");
                    Some("timed_out")
                }
            };
            if let Some(o) = outcome {
                p.record.replica_ms = held.elapsed().as_secs_f64() * 1e3;
                p.record.replica = Some(o.into());
            }
        }
        // An exchange whose turn end became a version is logged before the
        // agent has its answer's end: an agent taken back to that version
        // finds it. Any other is logged after: one lost to a crash in
        // between only ends a fast-forward there (it asks upstream).
        let exchange = self.exchange_of(&mut p, gone);
        let log_first = p.record.version.is_some();
        if let (true, Some(x)) = (log_first, &exchange) {
            self.write_exchange(&mut p, x, None).await;
        }
        if let Some(seeking) = p.seeking.take() {
            let _ = seeking.await;
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
        if !gone {
            p.record.release_ms = arrived.elapsed().as_secs_f64() * 1e3;
        }
        let released = tokio::spawn(release(rest));
        if last {
            // A watched session's begin is the inspector's lock and a
            // counter, done here. Any other is off this worker
            // (`begin_turn`): loading a watch takes tens of ms, and the
            // release just spawned would wait behind it in the worker's
            // LIFO slot, which no other worker steals.
            let begun = match self
                .manager
                .turn_begin_watched(&p.session.id, &p.session.name)
            {
                Some(begun) => begun,
                None => begin_turn(&self.manager, &p.session.id).await,
            };
            match begun {
                // Begun, or begun already (by hand, `drums turn begin`).
                Ok(_) | Err(SessionError::Inspect(InspectError::TurnOpen { .. })) => {}
                Err(e) => {
                    self.turns.not_open(&p.session.id);
                    warn!(
                    session = %p.session.name,
                        "begin the next turn: {}",
                        drums_api::error_chain(&e)
                    );
                }
            }
        }
        drop(handover);
        let _ = released.await;
        // With no version, the record is whole now: it goes in the
        // exchange's commit (one commit a request, not two).
        let mut recorded = false;
        if let (false, Some(x)) = (log_first, &exchange) {
            let line = serde_json::to_string(&p.record).expect("API types serialize");
            recorded = self.write_exchange(&mut p, x, Some(line)).await;
        }
        if let Some(v) = &p.record.version {
            let costs = self
                .manager
                .session_versions(&p.session.id)
                .ok()
                .and_then(|all| all.into_iter().find(|x| &x.id == v))
                .map(|x| [x.files, x.process]);
            let sum = |of: fn(&drums_api::ArtifactCost) -> u64| {
                costs.map(|cs| cs.iter().flatten().map(of).sum::<u64>())
            };
            p.record.version_bytes = sum(|c| c.bytes);
            p.record.version_shared_bytes = sum(|c| c.shared_bytes);
        }
        if !recorded {
            let line = serde_json::to_string(&p.record).expect("API types serialize");
            let kept = self
                .log
                .record(&p.session.id, line, self.limits.records)
                .await;
            if let Err(e) = kept {
                warn!(session = %p.session.name, "journal: {e}");
            }
        }
        self.manager.publish_coordinated(p.record);
        if self.turns.prune_due() {
            let m = self.manager.clone();
            self.turns.prune(|id| m.get(id).is_ok());
            self.log.prune(|id| m.get(id).is_ok());
            self.outside().retain(|id, _| m.get(id).is_ok());
        }
    }

    /// What of a model call is logged: the exchange if it was answered in
    /// full; else nothing, and its place is given back at once (the agent
    /// asks again, and must find the same place).
    fn exchange_of(&self, p: &mut Pending, gone: bool) -> Option<Exchange> {
        let seq = p.met.as_ref()?.seq();
        match p.answer.take() {
            Some((status, headers, body)) if !gone && !p.broken => Some(Exchange {
                seq,
                request_sha: std::mem::take(&mut p.sha),
                status,
                headers,
                body,
                version: p.record.version.clone(),
            }),
            _ => {
                self.log.give_back(&p.session.id, seq);
                p.record.log = "none".into();
                p.record.seq = None;
                None
            }
        }
    }

    /// Log the exchange, with the request's record `record` (JSON) in the
    /// same commit if given; whether it was logged.
    async fn write_exchange(&self, p: &mut Pending, x: &Exchange, record: Option<String>) -> bool {
        let replayed = matches!(p.met, Some(replay::Met::Replayed { .. }));
        let record = record.map(|r| (r, self.limits.records));
        let kept = self.log.keep(&p.session.id, x, replayed, record).await;
        if let Err(e) = &kept {
            // Its place stays taken: a fast-forward through it forks there.
            warn!(session = %p.session.name, "log the exchange: {e}");
            p.record.log = "none".into();
        }
        match self.enforce_journal(&p.session.id) {
            Ok(None) => {}
            Ok(Some(o)) => warn!(
                session = %p.session.name,
                rows = o.rows,
                bytes = o.bytes,
                "the exchange log is over its budget with nothing left to prune: the next new model call is refused"
            ),
            Err(e) => warn!(session = %p.session.name, "hold the exchange log to its budget: {e}"),
        }
        kept.is_ok()
    }

    /// Hold session `id`'s exchange log to its budget (replay.rs).
    fn enforce_journal(
        &self,
        id: &str,
    ) -> Result<Option<replay::Over>, drums_catalog::CatalogError> {
        self.log
            .enforce(id, self.limits.journal, || self.recoverable_floor(id))
    }

    /// The place in session `id`'s exchange log of the oldest version it can
    /// still be taken back to (rolled back, recovered); nothing before it is
    /// ever replayed. 0 when that cannot be told: nothing is pruned then.
    fn recoverable_floor(&self, id: &str) -> u64 {
        let Ok(versions) = self.manager.session_versions(id) else {
            return 0;
        };
        let mut floor = u64::MAX;
        for v in versions {
            match self.log.catalog().exchange_of_version(id, &v.id) {
                Ok(Some(seq)) => floor = floor.min(seq),
                Ok(None) => {}
                Err(_) => return 0,
            }
        }
        floor
    }

    /// A new model call of session `s`: refused if its exchange log is over
    /// its budget with nothing left to prune. A fast-forward is not refused:
    /// it replaces rows rather than add them, and it is how the session
    /// recovers.
    fn journal_room(&self, s: &Session) -> Result<(), ProxyError> {
        if !self.log.is_full(&s.id) || self.log.replaying(&s.id) {
            return Ok(());
        }
        // Versions may have gone since (retention, `drums` by hand).
        match self.enforce_journal(&s.id) {
            Ok(None) => Ok(()),
            Ok(Some(o)) => Err(ProxyError::JournalFull {
                session: s.name.clone(),
                rows: o.rows,
                bytes: o.bytes,
                max_rows: self.limits.journal.rows,
                max_bytes: self.limits.journal.bytes,
            }),
            Err(e) => {
                warn!(session = %s.name, "hold the exchange log to its budget: {e}");
                Ok(())
            }
        }
    }
}

/// What a model call brings to [`Coordinator::begin`].
struct Begin {
    peer: SocketAddr,
    listener: Listener,
    style: Style,
    path: String,
    stream: bool,
    request_bytes: u64,
    sha: String,
    started: Instant,
    started_at_ms: i64,
}

enum BodyError {
    Over(budget::OverBudget),
    TooLarge,
    Read(String),
}

/// Read a request's body into `buf`, charging each byte to `charge` before
/// it is allocated (so what the budget says is what drumsd holds).
async fn read_body(
    mut body: Incoming,
    buf: &mut BytesMut,
    charge: &mut budget::Charge,
) -> Result<(), BodyError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let need = buf.len() + data.len();
        if need > MAX_REQUEST_BYTES {
            return Err(BodyError::TooLarge);
        }
        if need > buf.capacity() {
            let cap = need.max(buf.capacity() * 2).min(MAX_REQUEST_BYTES);
            charge.grow_to(cap).map_err(BodyError::Over)?;
            buf.reserve(cap - buf.len());
        } else {
            charge.grow_to(need).map_err(BodyError::Over)?;
        }
        buf.extend_from_slice(&data);
    }
    Ok(())
}

/// Only what the LLM APIs use goes upstream: their methods, and paths under
/// `/v1/` of plain segments. A `.` or `..` segment, or any percent-encoded
/// octet (`%2e%2e`, `%2f`: no LLM API path needs one), is refused: the
/// upstream, or a proxy in front of it, might resolve it to a path drums
/// never meant to reach (an upstream with a path prefix, `/prefix/../admin`).
fn check_route(method: &hyper::Method, path: &str) -> Result<(), ProxyError> {
    use hyper::Method;
    if ![Method::GET, Method::POST, Method::DELETE].contains(method) {
        return Err(ProxyError::Method(method.clone()));
    }
    let bad = |why| ProxyError::BadPath {
        path: path.to_owned(),
        why,
    };
    if path.contains('%') {
        return Err(bad("percent-encoded octets are not forwarded"));
    }
    let Some(rest) = path.strip_prefix("/v1/") else {
        return Err(ProxyError::NotProxied(path.to_owned()));
    };
    for seg in rest.split('/') {
        match seg {
            "" => return Err(bad("an empty segment")),
            "." | ".." => return Err(bad("a dot segment")),
            _ if !seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~:@".contains(&b)) =>
            {
                return Err(bad("a character outside A-Z a-z 0-9 - . _ ~ : @"))
            }
            _ => {}
        }
    }
    Ok(())
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

/// Begins the session's next turn on a blocking thread: a session's first
/// begin loads its watch (tens of ms), and many sessions starting at once
/// must not stall the runtime's workers, and every answer, behind them.
async fn begin_turn<S: Sessions>(
    m: &Arc<S>,
    id: &str,
) -> Result<drums_api::TurnBegun, SessionError> {
    let (m, id) = (m.clone(), id.to_owned());
    tokio::task::spawn_blocking(move || m.turn_begin(&id))
        .await
        .expect("turn begin does not panic")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::Method;

    #[test]
    fn only_the_llm_apis_paths_and_methods_are_forwarded() {
        for (m, p) in [
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/responses"),
            (Method::GET, "/v1/responses/resp_123/input_items"),
            (Method::DELETE, "/v1/responses/resp_123"),
            (Method::POST, "/v1/messages"),
            (Method::POST, "/v1/messages/count_tokens"),
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/models/ft:gpt-4o:org:x~1"),
        ] {
            assert!(check_route(&m, p).is_ok(), "{m} {p}");
        }
        let kind = |m: Method, p: &str| check_route(&m, p).unwrap_err().kind();
        assert_eq!(kind(Method::PUT, "/v1/models"), "method_not_allowed");
        assert_eq!(kind(Method::PATCH, "/v1/models"), "method_not_allowed");
        assert_eq!(kind(Method::OPTIONS, "/v1/models"), "method_not_allowed");
        assert_eq!(kind(Method::CONNECT, "/v1/models"), "method_not_allowed");
        for p in ["/", "/v2/chat", "/admin", "/v1", "/v10/x"] {
            assert_eq!(kind(Method::GET, p), "not_found", "{p}");
        }
        for p in [
            "/v1/../admin",
            "/v1/./models",
            "/v1/models/..",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2E/admin",
            "/v1/models%2f..%2fadmin",
            "/v1/.%2e/admin",
            "/v1//models",
            "/v1/models/",
            "/v1/a\\..\\b",
            "/v1/a;b",
        ] {
            assert_eq!(kind(Method::GET, p), "bad_path", "{p}");
        }
        // 404 and 400 both: nothing is sent upstream.
        assert_eq!(
            check_route(&Method::GET, "/v1/../x").unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }
}
