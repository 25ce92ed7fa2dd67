//! Hostile sessions against drumsd's recoveries (issue 23, items 4 and 8):
//! a coordinated session whose logged commands, run again after a
//! recovery, never end or print forever cannot stop the recovery of
//! another session, at a recovery by the watch or at drumsd's start, nor
//! grow drumsd's memory; a session cannot move an outside agent's commands
//! by making model calls of its own; and a session's self rollbacks and the
//! versions its turn ends take have budgets. As root, with real CRIU, btrfs and a mock upstream
//! (tests/proxy/mock_llm.py); every test ends by proving nothing is left.

mod common;

use std::time::{Duration, Instant};

use common::llm::{model_call, Mock};
use common::{exec_in, TestDaemon};
use drums_api::{CreateSession, EndTurn, Policy, TurnEffects};
use hyper::Method;

/// The mock's model the outside agents call: it answers after 100 ms.
const MODEL: &str = "with-delay-100";

async fn session(d: &TestDaemon, s: &str) -> drums_api::Session {
    d.client
        .json(Method::GET, &format!("/v1/sessions/{s}"), None::<&()>)
        .await
        .unwrap_or_else(|e| panic!("get {s}: {e}\n{}", d.log()))
}

fn kill_init(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// drumsd's resident memory, in KiB.
fn rss_kib(d: &TestDaemon) -> u64 {
    let pid = d.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Wait until `f` holds, or panic with `what` after `within`.
async fn until(within: Duration, what: &str, d: &TestDaemon, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The re-issue limits the daemons of this file run with: small, so a
/// hostile re-issue fails quickly, and the test's bounds below stay far
/// from them.
const COMMAND_TIMEOUT_S: u64 = 10;
const LIMIT_FLAGS: [&str; 6] = [
    "--reissue-command-timeout",
    "10",
    "--reissue-timeout",
    "20",
    "--reissue-output-max",
    "1M",
];

/// How long a good session's recovery, with its command run again, may
/// take while two hostile ones hang theirs. It takes a few seconds on this
/// 2-core machine; the bound is generous and only there so that a watch
/// stuck behind a hostile session (which before this fix it was, forever)
/// fails the test instead of hanging it.
const GOOD_RECOVERS_WITHIN: Duration = Duration::from_secs(60);

/// Two coordinated sessions whose logged command, once run again after a
/// recovery, never ends (`sleep infinity`) or prints forever (`yes`), and a
/// good one: all three killed at once, the good one is back with its
/// command run again within the bound above, the hostile re-issues fail
/// (one by its deadline, one by its output cap), drumsd's memory stays
/// bounded, and every session is still served. Then the same at drumsd's
/// start: drumsd killed, the sessions' processes killed, a new drumsd
/// recovers them all and the good one is back as fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_hangs_its_reissue_holds_up_no_other_recovery() {
    let mock = Mock::start();
    let upstream = format!("openai={}", mock.url());
    let mut flags = vec!["--llm-upstream", upstream.as_str()];
    flags.extend(LIMIT_FLAGS);
    let mut d = TestDaemon::start_with(&flags);
    let subnet = d.subnet();
    // Hostile first: the watch looks at sessions in the order they became
    // coordinated, so before the fix the good one waited behind them.
    let names = ["flood", "hang", "good"];
    for s in names {
        d.create(&CreateSession {
            name: Some(s.into()),
            ..Default::default()
        })
        .await
        .unwrap();
        // An agent outside: its first model call takes the base version.
        assert_eq!(model_call(d.proxy_local, s, MODEL, "go"), "echo: go");
    }
    // Commands that behave now and turn hostile once run again: after
    // `at`, which the recovery's re-run comes after and the first run
    // before.
    let at = now_s() + 10;
    let commands = [
        format!("if [ $(date +%s) -ge {at} ]; then yes; fi; echo ok"),
        format!("if [ $(date +%s) -ge {at} ]; then sleep infinity; fi; echo ok"),
        "mkdir -p /root/work && echo good >> /root/work/log && wc -l < /root/work/log".to_owned(),
    ];
    for (s, c) in names.iter().zip(&commands) {
        let (code, out, err) = d.sh(s, c);
        assert_eq!(code, 0, "{s}: {out} {err}");
    }
    while now_s() <= at {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let rss_before = rss_kib(&d);
    let inits: Vec<i32> = {
        let mut v = Vec::new();
        for s in names {
            v.push(session(&d, s).await.init_pid.unwrap());
        }
        v
    };
    for pid in &inits {
        kill_init(*pid);
    }
    let killed = Instant::now();
    // The good session is back, with its command run again on its version
    // (which had no log yet): one line, not two, not none.
    let state = d.state.path().to_owned();
    until(
        GOOD_RECOVERS_WITHIN,
        "the good session recovered",
        &d,
        || exec_in(&state, "good", "cat /root/work/log").1 == "good",
    )
    .await;
    eprintln!(
        "the good session was back in {:?} while two hostile ones hung",
        killed.elapsed()
    );
    // The hostile re-issues fail, each for its own reason, in about the
    // per-command deadline.
    let within = Duration::from_secs(COMMAND_TIMEOUT_S * 4);
    until(within, "the endless command's re-issue failed", &d, || {
        d.log()
            .contains(&format!("not done within {COMMAND_TIMEOUT_S}s"))
    })
    .await;
    until(within, "the flooding command's re-issue failed", &d, || {
        d.log().contains("over 1048576 bytes of output")
    })
    .await;
    // `yes` printed at gigabytes a second into drumsd before the cap, which
    // kept it all; now it is counted and dropped.
    let rss_after = rss_kib(&d);
    assert!(
        rss_after < rss_before + 64 * 1024,
        "drumsd's RSS went from {rss_before} KiB to {rss_after} KiB"
    );
    // Every session is served: the hostile ones too, their commands stopped.
    for s in names {
        let (code, out, err) = d.sh(s, "echo served");
        assert_eq!((code, out.as_str()), (0, "served"), "{s}: {err}");
    }
    // The endless command is stopped in its session (its stream dropped).
    until(within, "the endless command stopped", &d, || {
        d.sh("hang", "grep -ls '^sleep' /proc/[0-9]*/cmdline | wc -l")
            .1
            == "0"
    })
    .await;

    // At drumsd's start: the sessions die with no drumsd to see it, and the
    // next drumsd recovers them and runs their commands again, each in a
    // task of its own with the same bounds.
    let mut inits = Vec::new();
    for s in names {
        inits.push(session(&d, s).await.init_pid.unwrap());
    }
    d.kill9();
    for pid in &inits {
        kill_init(*pid);
    }
    let restarted = Instant::now();
    d.restart(&subnet);
    let rss_restart = rss_kib(&d);
    until(
        GOOD_RECOVERS_WITHIN,
        "the good session recovered at start",
        &d,
        || exec_in(&state, "good", "cat /root/work/log").1 == "good",
    )
    .await;
    eprintln!(
        "at drumsd's start, the good session was back in {:?}",
        restarted.elapsed()
    );
    until(within, "the re-issues at start failed", &d, || {
        let log = d.log();
        log.matches(&format!("not done within {COMMAND_TIMEOUT_S}s"))
            .count()
            >= 2
            && log.matches("over 1048576 bytes of output").count() >= 2
    })
    .await;
    let rss_end = rss_kib(&d);
    assert!(
        rss_end < rss_restart + 64 * 1024,
        "the restarted drumsd's RSS went from {rss_restart} KiB to {rss_end} KiB"
    );
    for s in names {
        let (code, out, err) = d.sh(s, "echo served");
        assert_eq!(
            (code, out.as_str()),
            (0, "served"),
            "{s} after the restart: {err}"
        );
    }
    for s in names {
        d.rm(s).await.unwrap();
    }
    d.stop_and_check_leaks();
}

/// The gateway's address in `subnet`.
fn gateway(subnet: &str) -> String {
    let net = subnet.split('/').next().unwrap();
    let (head, _) = net.rsplit_once('.').unwrap();
    format!("{head}.1")
}

/// A model call the session makes itself, through the bridge, from a
/// process that stays in the session (as an agent living there would):
/// started in the background, it writes /root/called when answered.
fn call_from_inside(gw: &str) -> String {
    format!(
        "cd / && nohup python3 -c \"import http.client,json;\
c=http.client.HTTPConnection('{gw}',7080,timeout=30);\
c.request('POST','/v1/chat/completions',body=json.dumps({{'model':'with-delay-500','messages':[{{'role':'user','content':'mine'}}]}}),headers={{'content-type':'application/json'}});\
r=c.getresponse();r.read();open('/root/called','w').write(str(r.status))\" >/dev/null 2>&1 &"
    )
}

/// An agent outside a session runs commands in it; the session makes a
/// model call of its own through the bridge between them. Before the fix
/// that call counted as one of the agent's (and claimed an agent inside):
/// after a recovery, the agent's commands since the version were not run
/// again, and its waiting command was re-issued on a state without them.
/// Now the session's own calls are none of the outside agent's turns, and
/// the waiting command answers as without the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_move_its_outside_agents_commands() {
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&["--llm-upstream", &format!("openai={}", mock.url())]);
    let gw = gateway(&d.subnet());
    let s = d
        .create(&CreateSession {
            name: Some("s".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        model_call(d.proxy_local, "s", MODEL, "turn 0"),
        "echo: turn 0"
    );
    let (code, _, err) = d.sh("s", "mkdir -p /root/work && echo A >> /root/work/log");
    assert_eq!(code, 0, "{err}");
    // The session's own call, from a process that holds its connection.
    let (code, _, err) = d.sh("s", &call_from_inside(&gw));
    assert_eq!(code, 0, "{err}");
    until(
        Duration::from_secs(30),
        "the session's own call answered",
        &d,
        || d.sh("s", "cat /root/called 2>/dev/null").1 == "200",
    )
    .await;
    let journal = drums_catalog::Catalog::open(&d.state.path().join("catalog.db")).unwrap();
    assert!(journal.coordinated_outside(&s.id).unwrap());
    assert_eq!(journal.agent_of(&s.id).unwrap(), None, "no agent inside");
    assert_eq!(
        journal.exchanges_len(&s.id).unwrap(),
        1,
        "only the outside agent's call is in its log"
    );

    // A command that the session's failure breaks.
    let state = d.state.path().to_owned();
    let run = tokio::task::spawn_blocking(move || {
        exec_in(
            &state,
            "s",
            "sleep 3 && echo B >> /root/work/log && cat /root/work/log",
        )
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    kill_init(session(&d, "s").await.init_pid.unwrap());
    let (code, out, err) = run.await.unwrap();
    assert_eq!(
        (code, out.as_str()),
        (0, "A\nB"),
        "the waiting command answers as without the failure: {err}\n{}",
        d.log()
    );
    assert_eq!(d.log().matches("re-issuing the command").count(), 1);
    drop(journal);
    d.rm("s").await.unwrap();
    d.stop_and_check_leaks();
}

/// What a process inside the session runs to call drumsd's session API on
/// the gateway: prints the status, the Retry-After header, then the body.
fn self_rollback(gw: &str) -> String {
    format!(
        "python3 -c \"import http.client;\
c=http.client.HTTPConnection('{gw}',{port},timeout=30);\
c.request('POST','/v1/self/rollback');r=c.getresponse();\
print(r.status);print(r.getheader('retry-after'));print(r.read().decode())\"",
        port = drums_api::SESSION_API_PORT
    )
}

/// A session may roll itself back `--self-rollbacks-per-minute` times a
/// minute; the next is 429 with a Retry-After and says why, and nothing
/// rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_has_a_budget_of_self_rollbacks() {
    let mut d = TestDaemon::start_with(&["--self-rollbacks-per-minute", "1"]);
    let gw = gateway(&d.subnet());
    d.create(&CreateSession {
        name: Some("s".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    // A version to go back to.
    d.client
        .call(Method::POST, "/v1/sessions/s/turn/begin", None::<&()>)
        .await
        .unwrap();
    let e: TurnEffects = d
        .client
        .json(
            Method::POST,
            "/v1/sessions/s/turn/end",
            Some(&EndTurn {
                checkpoint: true,
                policy: Some(Policy::Full),
                wait: true,
            }),
        )
        .await
        .unwrap();
    assert!(e.checkpoint.and_then(|c| c.version).is_some());

    let (code, out, err) = d.sh("s", &self_rollback(&gw));
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("202"), "{out}");
    // Done in place or with CRIU (nothing ran since the version, and the
    // caller has exited: in place, with the same init).
    let rolled = |d: &TestDaemon| d.log().matches("session rolled itself back").count();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = session(&d, "s").await;
        if now.state == drums_api::SessionState::Running && rolled(&d) == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first rollback: {now:?}\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rebuilt = session(&d, "s").await.init_pid;
    let (code, out, err) = d.sh("s", &self_rollback(&gw));
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("429"), "{out}");
    let retry: u64 = lines.next().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{out}");
    let body: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(body["error"]["kind"], "too_many_requests", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than 1 self rollbacks in 60 s"),
        "{body}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = session(&d, "s").await;
    assert_eq!(now.init_pid, rebuilt, "the refused rollback did nothing");
    assert_eq!(rolled(&d), 1, "the refused rollback did nothing");
    assert!(!d.log().contains("self rollback of s"), "{}", d.log());
    d.rm("s").await.unwrap();
    d.stop_and_check_leaks();
}

/// A session's turn ends (one per model call through the proxy) take a
/// version each; past `--turn-versions-per-minute` they take none, and say
/// so in their record, and the next version taken is whole. A turn end the
/// host asks for through the API is not held to the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_turn_ends_have_a_budget_of_versions() {
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&[
        "--llm-upstream",
        &format!("openai={}", mock.url()),
        "--turn-versions-per-minute",
        "2",
    ]);
    d.create(&CreateSession {
        name: Some("s".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    // Each turn writes a file, so each turn end asks for a files version.
    for t in 0..5 {
        if t > 0 {
            let (code, _, err) = d.sh("s", &format!("echo {t} > /root/f{t}"));
            assert_eq!(code, 0, "{err}");
        }
        let text = format!("turn {t}");
        assert_eq!(
            model_call(d.proxy_local, "s", MODEL, &text),
            format!("echo: {text}")
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let t: drums_api::CoordinatedTurns = d
            .client
            .json(Method::GET, "/v1/sessions/s/coordinator", None::<&()>)
            .await
            .unwrap();
        if t.turns.len() == 5 {
            break t.turns;
        }
        assert!(Instant::now() < deadline, "{:#?}", t.turns);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let decisions: Vec<&str> = records.iter().map(|r| r.decision.as_str()).collect();
    assert_eq!(
        decisions,
        ["base", "files", "files", "over_budget", "over_budget"],
        "{records:#?}"
    );
    assert!(records[3].job.is_none() && records[4].job.is_none());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = versions(&d, "s").await;
        if v.len() == 3 && v.iter().all(|v| v.state == drums_api::VersionState::Done) {
            break;
        }
        assert!(Instant::now() < deadline, "{v:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The host's own turn end, after a turn that changed a file: taken,
    // and whole (the two turns past the budget changed files that no
    // version holds), where a files version would do otherwise: light, as
    // only drums' own processes run (every file, no process artifact).
    let (code, _, err) = d.sh("s", "echo 5 > /root/f5");
    assert_eq!(code, 0, "{err}");
    let e: TurnEffects = d
        .client
        .json(
            Method::POST,
            "/v1/sessions/s/turn/end",
            Some(&EndTurn {
                checkpoint: true,
                policy: Some(Policy::Selective),
                wait: true,
            }),
        )
        .await
        .unwrap();
    let v = e.checkpoint.and_then(|c| c.version).expect("a version");
    assert_eq!(
        (v.took.as_str(), v.process_of.as_deref()),
        ("files", None),
        "{v:#?}"
    );
    assert!(
        v.reason
            .as_deref()
            .unwrap_or_default()
            .contains("drums' own"),
        "{v:#?}"
    );
    assert_eq!(versions(&d, "s").await.len(), 4);
    d.rm("s").await.unwrap();
    d.stop_and_check_leaks();
}

async fn versions(d: &TestDaemon, s: &str) -> Vec<drums_api::SessionVersion> {
    let v: drums_api::SessionVersions = d
        .client
        .json(
            Method::GET,
            &format!("/v1/sessions/{s}/versions"),
            None::<&()>,
        )
        .await
        .unwrap();
    v.versions
}
