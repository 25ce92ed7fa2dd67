//! The inspector through drumsd: the live turns stream, the agent-in-the-
//! sandbox mode, and a checkpoint between turns. As root, against a real
//! session; every test ends by proving nothing is left on the host. (The
//! labelled corpus and the error cases are in inspect.rs.)

mod common;

use common::{assert_schema, TestDaemon};
use drums_api::{AgentMarked, CreateSession, MarkAgent, TurnClass, TurnEffects};
use http_body_util::BodyExt;
use hyper::Method;

async fn turn(d: &TestDaemon, s: &str, script: &str) -> TurnEffects {
    d.client
        .call(
            Method::POST,
            &format!("/v1/sessions/{s}/turn/begin"),
            None::<&()>,
        )
        .await
        .unwrap();
    let (code, out, err) = d.sh(s, script);
    assert_eq!(code, 0, "{script}: {out} {err}");
    let e: TurnEffects = d
        .client
        .json(
            Method::POST,
            &format!("/v1/sessions/{s}/turn/end"),
            None::<&()>,
        )
        .await
        .unwrap();
    assert_schema("TurnEffects", &serde_json::to_value(&e).unwrap());
    e
}

// Multi-threaded: the stream reader runs while the test blocks on the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_turns_excludes_the_agent_and_survives_a_checkpoint() {
    {
        let mut d = TestDaemon::start();
        let s = d
            .create(&CreateSession {
                name: Some("insp".into()),
                ..Default::default()
            })
            .await
            .unwrap();

        // `drums inspect --json` follows the session's turns.
        let follower = std::process::Command::new(common::bin_dir().join("drums"))
            .arg("--state-dir")
            .arg(d.state.path())
            .args(["--no-autostart", "inspect", "insp", "--json"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The raw stream too, to see it end when the session goes.
        let resp = d
            .client
            .call(Method::GET, "/v1/sessions/insp/turns", None::<&()>)
            .await
            .unwrap();
        let reader = tokio::spawn(async move {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(body.to_vec()).unwrap()
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;

        let first = turn(&d, "insp", "echo hi > /root/a").await;
        assert_eq!(first.class, TurnClass::Files, "{first:#?}");
        assert_eq!(first.turn, 1);
        assert!(first
            .files
            .iter()
            .any(|f| f.path == "/root/a" && f.change == "created"));

        // An agent living in the session: a process that wakes every 50 ms.
        let agent = "nohup python3 -c \"exec('import time\\nwhile True: time.sleep(0.05)')\" >/dev/null 2>&1 & echo $! > /run/agent.pid; sleep 0.5";
        let e = turn(&d, "insp", agent).await;
        assert_eq!(
            e.class,
            TurnClass::Both,
            "the agent was started, and its pid file: {e:#?}"
        );
        // Longer than the agent's period, so it surely wakes in the turn.
        let e = turn(&d, "insp", "sleep 0.2").await;
        assert_eq!(e.class, TurnClass::Processes, "the agent ran: {e:#?}");
        assert_eq!(e.dirtied.len(), 1, "{e:#?}");
        let (_, pid, _) = d.sh("insp", "cat /run/agent.pid");
        let pid: i32 = pid.parse().unwrap();
        assert_eq!(e.dirtied[0].pid, pid, "pids are the session's own");
        let marked: AgentMarked = d
            .client
            .json(
                Method::POST,
                "/v1/sessions/insp/agent",
                Some(&MarkAgent { pid }),
            )
            .await
            .unwrap();
        assert_schema("AgentMarked", &serde_json::to_value(&marked).unwrap());
        assert_eq!(marked.pids, vec![pid]);
        let e = turn(&d, "insp", "sleep 0.2").await;
        assert_eq!(
            e.class,
            TurnClass::None,
            "the agent is excluded now: {e:#?}"
        );
        // What the agent starts is still tracked: only the agent is excluded.
        let e = turn(&d, "insp", "nohup sleep 100000 >/dev/null 2>&1 & sleep 0.3").await;
        assert_eq!(e.class, TurnClass::Processes, "{e:#?}");
        assert_eq!(e.processes[0].comm, "sleep");
        let e = turn(&d, "insp", "cat /root/a >/dev/null").await;
        assert_eq!(
            e.class,
            TurnClass::None,
            "a sleeping process does not run: {e:#?}"
        );

        // A checkpoint between turns runs CRIU's parasite in every process;
        // the next turn must not count that as the processes' own work.
        d.checkpoint("insp", false, true).await;
        let e = turn(&d, "insp", "ls / >/dev/null").await;
        assert_eq!(e.class, TurnClass::None, "after a checkpoint: {e:#?}");

        // A checkpoint that fails after the inspector set its events aside:
        // the inspector cannot vouch for that window, so the turn says both.
        for point in ["checkpoint.criu", "checkpoint.snapshot"] {
            d.arm(Some(point)).await;
            let req = drums_api::CreateCheckpoint {
                session: "insp".into(),
                name: None,
                clean: false,
                leave_running: true,
            };
            d.client
                .call(Method::POST, "/v1/checkpoints", Some(&req))
                .await
                .expect_err(point);
            let e = turn(&d, "insp", "ls / >/dev/null").await;
            assert_eq!(
                e.class,
                TurnClass::Both,
                "after a failed checkpoint ({point}): {e:#?}"
            );
            assert!(
                e.files.iter().any(|f| f.path.contains("checkpoint failed")),
                "{e:#?}"
            );
            let e = turn(&d, "insp", "ls / >/dev/null").await;
            assert_eq!(e.class, TurnClass::None, "and then back to normal: {e:#?}");
        }

        let err = d
            .client
            .json::<AgentMarked>(
                Method::POST,
                "/v1/sessions/insp/agent",
                Some(&MarkAgent { pid: 99999 }),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), Some("not_found"), "{err}");

        d.rm(&s.id).await.unwrap();
        let streamed = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
            .await
            .expect("the stream ends when the session is removed")
            .unwrap();
        let lines: Vec<TurnEffects> = streamed
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 11, "{streamed}");
        assert_eq!(lines[0], first);
        let out = follower.wait_with_output().unwrap();
        assert!(out.status.success());
        let followed: Vec<TurnEffects> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            followed, lines,
            "drums inspect --json prints the same turns"
        );

        d.stop_and_check_leaks();
    }
}
