//! The coordinator's proxy, gating and turn logic, without a drumsd: the
//! coordinator runs over a fake of the `Sessions` it needs (fake/mod.rs),
//! its journal in a catalog of its own, its upstream a mock on loopback. No
//! root, no namespaces: what these tests prove is the coordinator's own
//! logic; the daemon's tests (crates/daemon/tests/coordinator.rs) prove it
//! with real sessions.

mod fake;

use std::net::SocketAddr;

use drums_api::TurnClass;
use drums_coordinator::Listener;
use hyper::StatusCode;
use tokio::sync::oneshot;

use fake::{call, local, position, push, seen, serve, setup};

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
