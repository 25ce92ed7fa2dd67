//! A fake of the sessions the coordinator needs (`drums_coordinator::Sessions`),
//! a mock upstream, and the coordinator served on loopback: the coordinator's
//! own logic, tested without a drumsd, namespaces or root.
#![allow(dead_code)] // each test file uses its part

use std::collections::HashMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use drums_api::{
    AgentMarked, CoordinatedTurn, EndTurn, Job, Policy, Session, SessionVersion, TurnBegun,
    TurnCheckpoint, TurnClass, TurnEffects,
};
use drums_catalog::Catalog;
use drums_coordinator::{Coordinator, Limits, Listener, Sessions, StreamGuard, Upstreams};
use drums_session::SessionError;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// What the fake was asked, in order, and what the test saw, in the same
/// log, so a test can assert what happened before what.
pub type Events = Arc<Mutex<Vec<String>>>;

pub fn push(e: &Events, what: impl Into<String>) {
    e.lock().unwrap().push(what.into());
}

pub struct Fake {
    pub sessions: Vec<Session>,
    /// Per session, the versions it has (the base version is taken only
    /// where there are none).
    pub versions: Mutex<HashMap<String, Vec<SessionVersion>>>,
    /// The class and job each turn end returns, in order.
    pub ends: Mutex<Vec<(TurnClass, Option<String>)>>,
    /// A waited-for job finishes when the test says so (the oneshot), or
    /// at once where none is set.
    pub release: Mutex<HashMap<String, oneshot::Receiver<()>>>,
    pub turn: Mutex<u64>,
    /// What `processes_died` and `oom_kills` answer (the watch's inputs).
    pub died: Mutex<bool>,
    pub ooms: Mutex<u64>,
    pub published: Mutex<Vec<CoordinatedTurn>>,
    pub events: Events,
}

pub struct NoStream;
impl StreamGuard for NoStream {}

pub fn session(id: &str, ip: &str) -> Session {
    serde_json::from_value(serde_json::json!({
        "id": id, "name": format!("{id}-name"), "profile": "headless", "image": "default",
        "state": "running", "hostname": id, "network": "bridge", "egress": "none",
        "ip": ip, "mac": null, "limits": {}, "init_pid": null, "created_at_ms": 0,
    }))
    .expect("a session parses")
}

impl Fake {
    fn new(events: &Events) -> Fake {
        Fake {
            sessions: vec![session("s1", "10.9.0.2"), session("s2", "10.9.0.3")],
            versions: Mutex::default(),
            ends: Mutex::default(),
            release: Mutex::default(),
            turn: Mutex::new(0),
            died: Mutex::new(false),
            ooms: Mutex::new(0),
            published: Mutex::default(),
            events: events.clone(),
        }
    }
    fn job_state(&self, id: &str, state: &str) -> Job {
        Job {
            id: id.to_owned(),
            state: state.parse().expect("a job state"),
            priority: drums_api::Priority::Normal,
            version: (state == "done").then(|| format!("version-of-{id}")),
            queued_ms: None,
            ran_ms: None,
            started_as: None,
            error: None,
        }
    }
}

pub fn not_found(id: &str) -> SessionError {
    SessionError::NotFound(id.to_owned())
}

impl Sessions for Fake {
    fn get(&self, id_or_name: &str) -> Result<Session, SessionError> {
        self.sessions
            .iter()
            .find(|s| s.id == id_or_name || s.name == id_or_name)
            .cloned()
            .ok_or_else(|| not_found(id_or_name))
    }
    fn session_at(&self, ip: Ipv4Addr) -> Result<Option<Session>, SessionError> {
        let ip = ip.to_string();
        Ok(self
            .sessions
            .iter()
            .find(|s| s.ip.as_deref() == Some(&ip))
            .cloned())
    }
    fn session_versions(&self, id_or_name: &str) -> Result<Vec<SessionVersion>, SessionError> {
        let id = self.get(id_or_name)?.id;
        Ok(self
            .versions
            .lock()
            .unwrap()
            .get(&id)
            .cloned()
            .unwrap_or_default())
    }
    fn end_model_turn(
        self: &Arc<Self>,
        id: &str,
        _name: &str,
        _req: &EndTurn,
    ) -> impl Future<Output = Result<TurnEffects, SessionError>> + Send {
        let (me, id) = (self.clone(), id.to_owned());
        async move {
            push(&me.events, format!("end_model_turn {id}"));
            let (class, job) = me.ends.lock().unwrap().remove(0);
            Ok(TurnEffects {
                session: id,
                turn: *me.turn.lock().unwrap(),
                class,
                files: vec![],
                processes: vec![],
                dirtied: vec![],
                latency_us: 0,
                checkpoint: Some(TurnCheckpoint {
                    decision: if job.is_some() { "files" } else { "skip" }.into(),
                    job,
                    version: None,
                }),
            })
        }
    }
    fn base_version(
        self: &Arc<Self>,
        id: &str,
        _policy: Policy,
    ) -> impl Future<Output = Result<Option<String>, SessionError>> + Send {
        let (me, id) = (self.clone(), id.to_owned());
        async move {
            push(&me.events, format!("base_version {id}"));
            Ok(Some("job-base".to_owned()))
        }
    }
    fn turn_begin(&self, id_or_name: &str) -> Result<TurnBegun, SessionError> {
        let s = self.get(id_or_name)?;
        let mut t = self.turn.lock().unwrap();
        *t += 1;
        push(&self.events, format!("turn_begin {} {}", s.id, *t));
        Ok(TurnBegun {
            session: s.name,
            turn: *t,
        })
    }
    fn turn_begin_watched(&self, id: &str, _name: &str) -> Option<Result<TurnBegun, SessionError>> {
        // As drumsd's: the first begin takes the whole path.
        let watched = *self.turn.lock().unwrap() > 0;
        watched.then(|| self.turn_begin(id))
    }
    fn open_turn(&self, _id_or_name: &str) -> Option<u64> {
        Some(*self.turn.lock().unwrap())
    }
    fn take_restored(&self, _id: &str) -> Option<String> {
        None
    }
    fn at_version(&self, _id: &str) -> Option<String> {
        None
    }
    fn changed_outside_turns(&self, id: &str) {
        push(&self.events, format!("changed_outside_turns {id}"));
    }
    fn guest_proxy(&self, s: &Session) -> Result<drums_api::Client, SessionError> {
        Err(SessionError::Conflict(format!(
            "no guest in the fake for {}",
            s.id
        )))
    }
    fn guest_stream(&self, _id: &str) -> impl StreamGuard {
        NoStream
    }
    fn mark_agent(&self, id_or_name: &str, _pid: i32) -> Result<AgentMarked, SessionError> {
        Err(not_found(id_or_name))
    }
    fn job(&self, id: &str, wait: bool) -> impl Future<Output = Result<Job, SessionError>> + Send {
        let id = id.to_owned();
        let gate = if wait {
            self.release.lock().unwrap().remove(&id)
        } else {
            None
        };
        let held = self.release.lock().unwrap().contains_key(&id);
        let (events, done, queued) = (
            self.events.clone(),
            self.job_state(&id, "done"),
            self.job_state(&id, "queued"),
        );
        async move {
            match (wait, gate) {
                (true, Some(rx)) => {
                    push(&events, format!("job wait {id}"));
                    let _ = rx.await;
                    push(&events, format!("job done {id}"));
                    Ok(done)
                }
                (false, _) if held => Ok(queued),
                _ => Ok(done),
            }
        }
    }
    fn promote_job(&self, id: &str) -> impl Future<Output = Result<Job, SessionError>> + Send {
        push(&self.events, format!("promote_job {id}"));
        let j = self.job_state(id, "queued");
        async move { Ok(j) }
    }
    fn publish_coordinated(&self, record: CoordinatedTurn) {
        push(&self.events, format!("published {}", record.decision));
        self.published.lock().unwrap().push(record);
    }
    fn recover(
        &self,
        id_or_name: &str,
    ) -> impl Future<Output = Result<Session, SessionError>> + Send {
        push(&self.events, format!("recover {id_or_name}"));
        let r = self.get(id_or_name);
        async move { r }
    }
    fn processes_died(&self, _id_or_name: &str) -> Result<bool, SessionError> {
        Ok(*self.died.lock().unwrap())
    }
    fn session_pids(&self, _id: &str) -> Result<Vec<i32>, SessionError> {
        Ok(vec![])
    }
    fn oom_kills(&self, id: &str) -> Option<u64> {
        push(&self.events, format!("oom_kills {id}"));
        Some(*self.ooms.lock().unwrap())
    }
    fn kill_processes(&self, id: &str) -> Result<(), SessionError> {
        push(&self.events, format!("kill_processes {id}"));
        Ok(())
    }
}

/// A mock of the model's API on loopback: every call is answered at once
/// with a chat completion, and counted.
pub async fn upstream(calls: Arc<Mutex<u32>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let calls = calls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |_req: Request<hyper::body::Incoming>| {
                        *calls.lock().unwrap() += 1;
                        async {
                            Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(
                                    br#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#,
                                )))
                                .unwrap(),
                        )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// The coordinator served on loopback; each connection is handed to it as
/// if from `peer` on `listener` (the test plays the bridge's addresses).
pub async fn serve(c: Arc<Coordinator<Fake>>, peer: SocketAddr, listener: Listener) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let c = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let c = c.clone();
                    async move { Ok::<_, std::convert::Infallible>(c.handle(req, peer, listener).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// One POST of a chat completion; the status and the whole body.
pub async fn call(addr: SocketAddr, session: Option<&str>) -> (StatusCode, String) {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::post("/v1/chat/completions")
        .header("host", "proxy")
        .header("content-type", "application/json");
    if let Some(s) = session {
        req = req.header("x-drums-session", s);
    }
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let r = send
        .send_request(
            req.body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = r.status();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

pub struct Setup {
    pub catalog: Arc<Catalog>,
    pub fake: Arc<Fake>,
    pub events: Events,
    pub upstream_calls: Arc<Mutex<u32>>,
    pub _dir: tempfile::TempDir,
    pub coordinator: Arc<Coordinator<Fake>>,
}

pub async fn setup() -> Setup {
    setup_with(Limits::default()).await
}

pub async fn setup_with(limits: Limits) -> Setup {
    let events = Events::default();
    let fake = Arc::new(Fake::new(&events));
    let upstream_calls = Arc::new(Mutex::new(0));
    let up = upstream(upstream_calls.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let catalog = Arc::new(Catalog::open(&dir.path().join("catalog.db")).unwrap());
    let upstreams = Upstreams::parse(&[format!("openai=http://{up}")]).unwrap();
    let coordinator = Coordinator::new(
        fake.clone(),
        upstreams,
        catalog.clone(),
        Policy::Selective,
        limits,
    )
    .unwrap();
    Setup {
        catalog,
        fake,
        events,
        upstream_calls,
        _dir: dir,
        coordinator,
    }
}

pub fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 40000))
}

/// Wait (bounded) until `what` is in the events; a test that never sees it
/// fails with the events it saw.
pub async fn seen(e: &Events, what: &str) {
    for _ in 0..500 {
        if e.lock().unwrap().iter().any(|x| x == what) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let saw = e.lock().unwrap().clone();
    panic!("never saw {what:?}; saw {saw:?}");
}

/// How many times `what` is in the events.
pub fn count(e: &Events, what: &str) -> usize {
    e.lock().unwrap().iter().filter(|x| *x == what).count()
}

pub fn position(e: &Events, what: &str) -> usize {
    let all = e.lock().unwrap();
    all.iter()
        .position(|x| x == what)
        .unwrap_or_else(|| panic!("no {what:?} in {all:?}"))
}
