//! Warm pools against a real drumsd (as root, with real CRIU): members are
//! hygienic siblings handed out once under concurrency, replaced in the
//! background, adopted again after drumsd is killed mid-refill, bounded by
//! `--max-sessions` with a take that waits and then says why; and bad input
//! is refused without changing anything. Every test ends by proving nothing
//! is left on the host.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{run, TestDaemon};
use drums_api::{ClientError, CreatePool, CreateSession, Pool, PoolList, Session, TakeRequest};
use hyper::Method;

/// A running session checkpointed (left running): what the pool restores.
async fn warm_checkpoint(d: &TestDaemon) -> (Session, drums_api::Checkpoint) {
    let s = d
        .create(&CreateSession::default())
        .await
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()));
    // A Python process registered for hygiene, so the audit has RNG state
    // to compare between siblings.
    let (code, _, err) = d.sh(
        &s.id,
        "nohup python3 -c 'import time, random; time.sleep(100000)' >/dev/null 2>&1 & sleep 0.3",
    );
    assert_eq!(code, 0, "{err}");
    let ck = d.checkpoint(&s.id, false, true).await;
    (s, ck)
}

async fn create_pool(d: &TestDaemon, ck: &str, size: u32, name: Option<&str>) -> Pool {
    d.client
        .json(
            Method::POST,
            "/v1/pools",
            Some(&CreatePool {
                checkpoint: ck.into(),
                size,
                name: name.map(str::to_owned),
            }),
        )
        .await
        .unwrap_or_else(|e| panic!("create pool: {e}\n{}", d.log()))
}

async fn get_pool(d: &TestDaemon, p: &str) -> Result<Pool, ClientError> {
    d.client
        .json(Method::GET, &format!("/v1/pools/{p}"), None::<&()>)
        .await
}

async fn take(d: &TestDaemon, p: &str, timeout_ms: u64) -> Result<Session, ClientError> {
    d.client
        .json(
            Method::POST,
            &format!("/v1/pools/{p}/take"),
            Some(&TakeRequest {
                timeout_ms: Some(timeout_ms),
            }),
        )
        .await
}

async fn remove_pool(d: &TestDaemon, p: &str) -> Result<(), ClientError> {
    d.client
        .call(Method::DELETE, &format!("/v1/pools/{p}"), None::<&()>)
        .await
        .map(|_| ())
}

async fn sessions(d: &TestDaemon) -> Vec<Session> {
    let l: drums_api::SessionList = d
        .client
        .json(Method::GET, "/v1/sessions", None::<&()>)
        .await
        .unwrap();
    l.sessions
}

/// Until the pool has `ready` members ready (and none being restored), or
/// fail with what it shows.
async fn wait_full(d: &TestDaemon, p: &str, ready: u32) -> Pool {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pool = get_pool(d, p).await.unwrap();
        if pool.ready == ready && pool.restoring == 0 {
            return pool;
        }
        assert!(
            Instant::now() < deadline,
            "pool {p} never had {ready} ready: {pool:?}\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn api_status(e: &ClientError) -> u16 {
    match e {
        ClientError::Api { status, .. } => *status,
        other => panic!("not an API error: {other}"),
    }
}

/// 16 takers at once on a pool of 4: each gets a distinct, running,
/// ordinary session; the pool refills to 4; two taken siblings pass the
/// audit (not clones); a member removed by hand or killed from the host is
/// replaced and never handed out; removing the pool removes its members,
/// not the taken sessions.
#[test]
fn takes_hand_each_member_out_once_and_the_pool_refills() {
    let mut d = TestDaemon::start();
    run(async {
        let (src, ck) = warm_checkpoint(&d).await;
        let pool = create_pool(&d, &ck.id, 4, Some("warm")).await;
        assert_eq!((pool.name.as_str(), pool.size), ("warm", 4));
        assert_eq!(pool.checkpoint, ck.id);
        wait_full(&d, "warm", 4).await;
        let members: Vec<Session> = sessions(&d)
            .await
            .into_iter()
            .filter(|s| s.pool.as_deref() == Some(pool.id.as_str()))
            .collect();
        assert_eq!(members.len(), 4);

        let takers = (0..16).map(|_| take(&d, "warm", 120_000));
        let taken: Vec<Session> = futures::future::join_all(takers)
            .await
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("take: {e}\n{}", d.log())))
            .collect();
        let ids: HashSet<&str> = taken.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids.len(), 16, "a member was handed out twice");
        for s in &taken {
            assert_eq!(s.pool, None, "a taken session is its taker's");
            assert_eq!(s.state, drums_api::SessionState::Running);
            assert_eq!(s.origin.as_deref(), Some(ck.id.as_str()));
        }
        // Every taken session answers.
        for s in &taken[..3] {
            let (code, out, _) = d.sh(&s.id, "hostname");
            assert_eq!((code, out.trim()), (0, s.hostname.as_str()));
        }
        let full = wait_full(&d, "warm", 4).await;
        assert_eq!(full.taken, 16);

        let audit: drums_api::AuditReport = d.audit(&taken[0].id, &taken[1].id).await;
        assert!(audit.passed, "two taken siblings: {audit:#?}");

        // A member removed by hand, and one whose processes die, are replaced;
        // the dead one is never handed out.
        let members: Vec<Session> = sessions(&d)
            .await
            .into_iter()
            .filter(|s| s.pool.is_some())
            .collect();
        d.rm(&members[0].id).await.unwrap();
        let pid = members[1].init_pid.unwrap();
        let (dead, dead_pid) = (members[1].id.clone(), pid);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(dead_pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now: Vec<Session> = sessions(&d).await;
            let pooled: Vec<&Session> = now.iter().filter(|s| s.pool.is_some()).collect();
            let dead_gone = !now.iter().any(|s| s.id == dead);
            if dead_gone
                && pooled.len() == 4
                && pooled
                    .iter()
                    .all(|s| s.state == drums_api::SessionState::Running)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not replaced: {pooled:#?}\n{}",
                d.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..4 {
            let s = take(&d, "warm", 60_000).await.unwrap();
            assert_ne!(s.id, dead, "a dead member was handed out");
            let (code, _, _) = d.sh(&s.id, "true");
            assert_eq!(code, 0, "a taken member answers");
            d.rm(&s.id).await.unwrap();
        }

        // The pool's checkpoint stays while the pool does.
        let e = d
            .client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", ck.id),
                None::<&()>,
            )
            .await
            .unwrap_err();
        assert_eq!(api_status(&e), 409, "{e}");
        assert!(e.to_string().contains("warm"), "{e}");

        remove_pool(&d, "warm").await.unwrap();
        let left = sessions(&d).await;
        assert!(left.iter().all(|s| s.pool.is_none()), "{left:#?}");
        let left: HashSet<String> = left.into_iter().map(|s| s.id).collect();
        let mut expected: HashSet<String> = taken.iter().map(|s| s.id.clone()).collect();
        expected.insert(src.id.clone());
        assert_eq!(left, expected, "taken sessions stay; members go");
        assert_eq!(api_status(&get_pool(&d, "warm").await.unwrap_err()), 404);
        for s in left {
            d.rm(&s).await.unwrap();
        }
        d.client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", ck.id),
                None::<&()>,
            )
            .await
            .unwrap();
        d.assert_no_session_left("after the pool").await;
    });
    d.stop_and_check_leaks();
}

/// drumsd is SIGKILLed while a pool restores a replacement: the next drumsd
/// sweeps the half-made member, adopts the ready ones, and refills the pool
/// to its size; then a clean stop leaves nothing on the host.
#[test]
fn a_pool_refills_after_drumsd_is_killed_mid_refill() {
    let mut d = TestDaemon::start();
    let subnet = d.subnet();
    let (pool_id, kept) = run(async {
        let (_src, ck) = warm_checkpoint(&d).await;
        let pool = create_pool(&d, &ck.id, 3, None).await;
        wait_full(&d, &pool.id, 3).await;
        // Take until a replacement is seen being restored, then kill.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = take(&d, &pool.id, 60_000).await.unwrap();
            d.rm(&s.id).await.unwrap();
            let p = get_pool(&d, &pool.id).await.unwrap();
            if p.restoring > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "never saw a refill under way");
        }
        let kept: Vec<String> = sessions(&d)
            .await
            .into_iter()
            .filter(|s| s.pool.is_some() && s.state == drums_api::SessionState::Running)
            .map(|s| s.id)
            .collect();
        (pool.id, kept)
    });
    d.kill9();
    d.restart(&subnet);
    run(async {
        let p = wait_full(&d, &pool_id, 3).await;
        assert_eq!(p.size, 3);
        let now: HashSet<String> = sessions(&d)
            .await
            .into_iter()
            .filter(|s| s.pool.as_deref() == Some(pool_id.as_str()))
            .map(|s| s.id)
            .collect();
        for id in &kept {
            // Ready members were adopted, not restored again (unless one
            // finished and another was swept in the same instant).
            assert!(
                now.contains(id),
                "ready member {id} was not adopted: {now:?}"
            );
        }
        let s = take(&d, &pool_id, 60_000).await.unwrap();
        let (code, _, _) = d.sh(&s.id, "true");
        assert_eq!(code, 0);
    });
    // The pool and its members go with a clean stop, and leave nothing.
    d.stop_and_check_leaks();
}

/// With `--max-sessions 3`, a source session and a pool of 2 fill the host:
/// a take succeeds, the refill waits (and says so), and a take with none
/// ready waits its timeout and answers 503 naming the limit; once a session
/// goes, the pool refills and a take succeeds.
#[test]
fn a_take_on_a_full_host_waits_then_says_why() {
    let mut d = TestDaemon::start_with(&["--max-sessions", "3"]);
    run(async {
        let (_src, ck) = warm_checkpoint(&d).await;
        create_pool(&d, &ck.id, 2, Some("p")).await;
        wait_full(&d, "p", 2).await;
        let first = take(&d, "p", 60_000).await.unwrap();
        let second = take(&d, "p", 60_000).await.unwrap();
        // No room for a replacement: a create is refused, naming the limit.
        let e = d.create(&CreateSession::default()).await.unwrap_err();
        assert_eq!(api_status(&e), 409, "{e}");
        assert!(e.to_string().contains("--max-sessions 3"), "{e}");
        let started = Instant::now();
        let e = take(&d, "p", 700).await.unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(700));
        assert_eq!(api_status(&e), 503, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("no ready member") && msg.contains("--max-sessions 3"),
            "{msg}"
        );
        let p = get_pool(&d, "p").await.unwrap();
        assert!(
            p.waiting_on
                .as_deref()
                .unwrap_or("")
                .contains("out of room"),
            "{p:?}"
        );
        // Room again: the waiting take gets the replacement.
        let waiter = take(&d, "p", 60_000);
        let freer = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            d.rm(&first.id).await.unwrap();
        };
        let (got, ()) = tokio::join!(waiter, freer);
        let got = got.unwrap_or_else(|e| panic!("take after room: {e}\n{}", d.log()));
        assert_ne!(got.id, first.id);
        assert_ne!(got.id, second.id);
        // Full again: a take that waits is answered as soon as drumsd is
        // told to stop, not after its timeout.
        let pid: i32 = std::fs::read_to_string(d.state.path().join("drumsd.lock"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let waiter = take(&d, "p", 600_000);
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
        };
        let started = Instant::now();
        let (e, ()) = tokio::join!(waiter, stopper);
        let e = e.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(60), "{e}");
        assert_eq!(api_status(&e), 503, "{e}");
        assert!(e.to_string().contains("drumsd is stopping"), "{e}");
    });
    // Stopping, already: the pool stays recorded, every session goes.
    d.stop_and_check_leaks();
}

/// Bad pool requests get a clear error and change nothing.
#[test]
fn bad_pool_requests_are_refused_and_change_nothing() {
    let mut d = TestDaemon::start();
    run(async {
        let (_src, ck) = warm_checkpoint(&d).await;
        let raw = |body: serde_json::Value| {
            let c = d.client.clone();
            async move {
                c.json::<Pool>(Method::POST, "/v1/pools", Some(&body))
                    .await
                    .unwrap_err()
            }
        };
        for (body, status, says) in [
            (
                serde_json::json!({"checkpoint": ck.id, "size": 0}),
                400,
                "size 0",
            ),
            (
                serde_json::json!({"checkpoint": ck.id, "size": 65}),
                400,
                "size 65",
            ),
            (
                serde_json::json!({"checkpoint": "nope"}),
                404,
                "no checkpoint named",
            ),
            (
                serde_json::json!({"checkpoint": ck.id, "name": "../x"}),
                400,
                "invalid pool name",
            ),
            (
                serde_json::json!({"checkpoint": ck.id, "bogus": 1}),
                400,
                "bogus",
            ),
            (serde_json::json!({"size": 1}), 400, "checkpoint"),
        ] {
            let e = raw(body.clone()).await;
            assert_eq!(api_status(&e), status, "{body}: {e}");
            assert!(e.to_string().contains(says), "{body}: {e}");
        }
        create_pool(&d, &ck.id, 1, Some("one")).await;
        let e = raw(serde_json::json!({"checkpoint": ck.id, "name": "one"})).await;
        assert_eq!(api_status(&e), 409, "{e}");
        for (method, path) in [
            (Method::GET, "/v1/pools/nope"),
            (Method::DELETE, "/v1/pools/nope"),
            (Method::POST, "/v1/pools/nope/take"),
        ] {
            let e = d
                .client
                .call(method.clone(), path, None::<&()>)
                .await
                .unwrap_err();
            assert_eq!(api_status(&e), 404, "{method} {path}: {e}");
            assert!(e.to_string().contains("no pool named \"nope\""), "{e}");
        }
        let e = take(&d, "one", 3_600_001).await.unwrap_err();
        assert_eq!(api_status(&e), 400, "{e}");
        // Nothing changed: one pool, one member (once ready), none taken.
        let l: PoolList = d
            .client
            .json(Method::GET, "/v1/pools", None::<&()>)
            .await
            .unwrap();
        assert_eq!(l.pools.len(), 1, "{l:?}");
        let p = wait_full(&d, "one", 1).await;
        assert_eq!(p.taken, 0);
        remove_pool(&d, "one").await.unwrap();
    });
    d.stop_and_check_leaks();
}
