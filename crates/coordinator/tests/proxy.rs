//! The coordinator's proxy, gating and turn logic, without a drumsd: the
//! coordinator runs over a fake of the `Sessions` it needs, its journal in a
//! catalog of its own, its upstream a mock on loopback. No root, no
//! namespaces: what these tests prove is the coordinator's own logic; the
//! daemon's tests (crates/daemon/tests/coordinator.rs) prove it with real
//! sessions.

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
type Events = Arc<Mutex<Vec<String>>>;

fn push(e: &Events, what: impl Into<String>) {
    e.lock().unwrap().push(what.into());
}

struct Fake {
    sessions: Vec<Session>,
    /// Per session, the versions it has (the base version is taken only
    /// where there are none).
    versions: Mutex<HashMap<String, Vec<SessionVersion>>>,
    /// The class and job each turn end returns, in order.
    ends: Mutex<Vec<(TurnClass, Option<String>)>>,
    /// A waited-for job finishes when the test says so (the oneshot), or
    /// at once where none is set.
    release: Mutex<HashMap<String, oneshot::Receiver<()>>>,
    turn: Mutex<u64>,
    published: Mutex<Vec<CoordinatedTurn>>,
    events: Events,
}

struct NoStream;
impl StreamGuard for NoStream {}

fn session(id: &str, ip: &str) -> Session {
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
            published: Mutex::default(),
            events: events.clone(),
        }
    }
    fn job_state(&self, id: &str, state: &str) -> Job {
        Job {
            id: id.to_owned(),
            state: state.to_owned(),
            priority: "normal".into(),
            version: (state == "done").then(|| format!("version-of-{id}")),
            queued_ms: None,
            ran_ms: None,
            started_as: None,
            error: None,
        }
    }
}

fn not_found(id: &str) -> SessionError {
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
        let r = self.get(id_or_name);
        async move { r }
    }
    fn processes_died(&self, _id_or_name: &str) -> Result<bool, SessionError> {
        Ok(false)
    }
    fn session_pids(&self, _id: &str) -> Result<Vec<i32>, SessionError> {
        Ok(vec![])
    }
    fn oom_kills(&self, _id: &str) -> Option<u64> {
        Some(0)
    }
    fn kill_processes(&self, _id: &str) -> Result<(), SessionError> {
        Ok(())
    }
}

/// A mock of the model's API on loopback: every call is answered at once
/// with a chat completion, and counted.
async fn upstream(calls: Arc<Mutex<u32>>) -> SocketAddr {
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
async fn serve(c: Arc<Coordinator<Fake>>, peer: SocketAddr, listener: Listener) -> SocketAddr {
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
async fn call(addr: SocketAddr, session: Option<&str>) -> (StatusCode, String) {
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

struct Setup {
    fake: Arc<Fake>,
    events: Events,
    upstream_calls: Arc<Mutex<u32>>,
    _dir: tempfile::TempDir,
    coordinator: Arc<Coordinator<Fake>>,
}

async fn setup() -> Setup {
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
        catalog,
        Policy::Selective,
        Limits::default(),
    )
    .unwrap();
    Setup {
        fake,
        events,
        upstream_calls,
        _dir: dir,
        coordinator,
    }
}

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 40000))
}

/// Wait (bounded) until `what` is in the events; a test that never sees it
/// fails with the events it saw.
async fn seen(e: &Events, what: &str) {
    for _ in 0..500 {
        if e.lock().unwrap().iter().any(|x| x == what) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never saw {what:?}; saw {:?}", e.lock().unwrap());
}

fn position(e: &Events, what: &str) -> usize {
    let all = e.lock().unwrap();
    all.iter()
        .position(|x| x == what)
        .unwrap_or_else(|| panic!("no {what:?} in {all:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_first_call_begins_a_turn_and_its_answer_waits_for_the_base_version() {
    let t = setup().await;
    let (tx, rx) = oneshot::channel();
    t.fake.release.lock().unwrap().insert("job-base".into(), rx);
    let addr = serve(t.coordinator.clone(), local(), Listener::Local).await;
    let events = t.events.clone();
    let client = tokio::spawn(async move {
        let r = call(addr, Some("s1-name")).await;
        push(&events, "client has the answer");
        r
    });
    // The base version is being waited for: the answer is held meanwhile.
    seen(&t.events, "job wait job-base").await;
    assert!(
        !t.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e == "client has the answer"),
        "the answer ended before its version was durable: {:?}",
        t.events.lock().unwrap()
    );
    tx.send(()).unwrap();
    let (status, body) = client.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("chat.completion"), "{body}");
    assert_eq!(*t.upstream_calls.lock().unwrap(), 1);
    // The order: the turn began before the base version was asked for,
    // the job was promoted while held, the answer came after it was done.
    assert!(position(&t.events, "turn_begin s1 1") < position(&t.events, "base_version s1"));
    assert!(position(&t.events, "promote_job job-base") < position(&t.events, "job done job-base"));
    assert!(
        position(&t.events, "job done job-base") < position(&t.events, "client has the answer")
    );
    seen(&t.events, "published base").await;
    let rec = t.fake.published.lock().unwrap()[0].clone();
    assert_eq!(rec.decision, "base");
    assert_eq!(rec.job.as_deref(), Some("job-base"));
    assert_eq!(rec.version.as_deref(), Some("version-of-job-base"));
    assert_eq!(rec.status, 200);
    assert!(rec.held_ms > 0.0, "{rec:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_call_ends_the_turn_and_the_next_turn_begins_after_its_answer() {
    let t = setup().await;
    // Versions exist: the first call takes no base version.
    t.fake.versions.lock().unwrap().insert(
        "s1".into(),
        vec![serde_json::from_value(serde_json::json!({
            "id": "v1", "session_id": "s1", "number": 1, "state": "done", "pinned": false,
            "name": "", "parent": null, "turn": null, "class": "manual", "policy": "full",
            "took": "full", "created_at_ms": 0,
        }))
        .expect("a version parses")],
    );
    t.fake
        .ends
        .lock()
        .unwrap()
        .push((TurnClass::Files, Some("job-2".into())));
    let addr = serve(t.coordinator.clone(), local(), Listener::Local).await;
    let (status, _) = call(addr, Some("s1")).await;
    assert_eq!(status, StatusCode::OK);
    seen(&t.events, "published first").await;
    assert!(!t
        .events
        .lock()
        .unwrap()
        .iter()
        .any(|e| e.starts_with("base_version")));
    let (status, _) = call(addr, Some("s1")).await;
    assert_eq!(status, StatusCode::OK);
    seen(&t.events, "published files").await;
    // Turn 1 ended with the second call; turn 2 began after it.
    assert!(position(&t.events, "end_model_turn s1") < position(&t.events, "turn_begin s1 2"));
    let recs = t.fake.published.lock().unwrap().clone();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[1].class, Some(TurnClass::Files));
    assert_eq!(recs[1].job.as_deref(), Some("job-2"));
    assert_eq!(recs[1].version.as_deref(), Some("version-of-job-2"));
    assert_eq!(*t.upstream_calls.lock().unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_act_for_another_and_an_unknown_name_is_refused() {
    let t = setup().await;
    // From s1's bridge address, naming s2: refused before anything goes
    // upstream or touches a turn.
    let from_s1 = SocketAddr::from(([10, 9, 0, 2], 40000));
    let addr = serve(t.coordinator.clone(), from_s1, Listener::Bridge).await;
    let (status, body) = call(addr, Some("s2")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("cannot act for session s2"), "{body}");
    // On the host, a name no session has.
    let addr = serve(t.coordinator.clone(), local(), Listener::Local).await;
    let (status, body) = call(addr, Some("nobody")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains(r#"no session named \"nobody\""#), "{body}");
    assert_eq!(*t.upstream_calls.lock().unwrap(), 0);
    assert!(
        !t.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.starts_with("turn_begin")),
        "{:?}",
        t.events.lock().unwrap()
    );
}
