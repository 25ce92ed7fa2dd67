//! Versions of a session, through drumsd: what each turn's end takes under
//! each policy, the pairing rule, rollback to every version (files and a
//! server's in-memory state come back exactly), and bad input. As root with
//! real CRIU, btrfs and eBPF; every test ends by proving nothing is left.

mod common;

use common::{assert_schema, TestDaemon};
use drums_api::{CreateSession, EndTurn, Policy, SessionVersion, SessionVersions, TurnEffects};
use hyper::Method;

/// A server that keeps a counter in memory only: `inc` adds one, anything
/// else reads it. Started with no open file of the session's.
const SERVER: &str = "cd / && nohup python3 -c \"exec('import socket\\ns=socket.socket()\\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\\ns.bind((\\'127.0.0.1\\',7000))\\ns.listen()\\nn=0\\nwhile True:\\n c,_=s.accept()\\n m=c.recv(16)\\n n+=m==b\\'inc\\'\\n c.sendall(str(n).encode())\\n c.close()')\" >/dev/null 2>&1 & sleep 0.5";

fn ask(d: &TestDaemon, s: &str, what: &str) -> String {
    let (code, out, err) = d.sh(
        s,
        &format!("python3 -c \"import socket;c=socket.create_connection(('127.0.0.1',7000));c.sendall(b'{what}');print(c.recv(16).decode())\""),
    );
    assert_eq!(code, 0, "ask {what}: {out} {err}");
    out
}

async fn turn(d: &TestDaemon, s: &str, script: &str, policy: Policy) -> TurnEffects {
    if let Err(e) = d
        .client
        .call(
            Method::POST,
            &format!("/v1/sessions/{s}/turn/begin"),
            None::<&()>,
        )
        .await
    {
        panic!("turn begin before {script:?}: {e}\n{}", d.log());
    }
    let (code, out, err) = d.sh(s, script);
    assert_eq!(code, 0, "{script}: {out} {err}");
    let e: TurnEffects = d
        .client
        .json(
            Method::POST,
            &format!("/v1/sessions/{s}/turn/end"),
            Some(&EndTurn {
                checkpoint: true,
                policy: Some(policy),
                wait: true,
            }),
        )
        .await
        .unwrap();
    assert_schema("TurnEffects", &serde_json::to_value(&e).unwrap());
    e
}

fn took(e: &TurnEffects) -> SessionVersion {
    e.checkpoint
        .as_ref()
        .and_then(|c| c.version.clone())
        .unwrap_or_else(|| panic!("turn {} took no version: {e:#?}", e.turn))
}

async fn versions(d: &TestDaemon, s: &str) -> Vec<SessionVersion> {
    let l: SessionVersions = d
        .client
        .json(
            Method::GET,
            &format!("/v1/sessions/{s}/versions"),
            None::<&()>,
        )
        .await
        .unwrap();
    assert_schema("SessionVersions", &serde_json::to_value(&l).unwrap());
    l.versions
}

fn rollback(d: &TestDaemon, s: &str, to: &str) {
    let o = d.drums(&["rollback", s, "--to", to]);
    assert!(
        o.status.success(),
        "rollback {s} to {to}: {}{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        d.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selective_versions_pair_as_specified_and_rollback_restores_each_exactly() {
    let mut d = TestDaemon::start();
    let s = d
        .create(&CreateSession {
            name: Some("ver".into()),
            ..Default::default()
        })
        .await
        .unwrap();

    // 1: a server and a file: the first version is full whatever the class.
    let v1 = took(
        &turn(
            &d,
            "ver",
            &format!("echo one > /root/f1; {SERVER}"),
            Policy::Selective,
        )
        .await,
    );
    assert_eq!((v1.number, v1.took.as_str()), (1, "full"), "{v1:#?}");
    assert_eq!(v1.state, "done");

    // 2: a file only (the server sleeps in accept): files, paired with 1's
    // processes.
    let e2 = turn(&d, "ver", "echo a > /root/data", Policy::Selective).await;
    assert_eq!(e2.class, drums_api::TurnClass::Files, "{e2:#?}");
    let v2 = took(&e2);
    assert_eq!(v2.took, "files", "{v2:#?}");
    assert_eq!(v2.files_of.as_deref(), Some(v2.id.as_str()));
    assert_eq!(v2.process_of.as_deref(), Some(v1.id.as_str()));
    assert!(v2.process.is_none() && v2.files.is_some());

    // 3: the server's memory changes, no file does: processes, paired with
    // 2's files.
    let e3 = turn(
        &d,
        "ver",
        &format!("{}; true", ask_script("inc")),
        Policy::Selective,
    )
    .await;
    assert_eq!(e3.class, drums_api::TurnClass::Processes, "{e3:#?}");
    let v3 = took(&e3);
    assert_eq!(v3.took, "process", "{v3:#?}");
    assert_eq!(v3.files_of.as_deref(), Some(v2.id.as_str()));
    assert_eq!(v3.process_of.as_deref(), Some(v3.id.as_str()));

    // 4: nothing changes: no version.
    let e4 = turn(&d, "ver", "true", Policy::Selective).await;
    assert_eq!(e4.checkpoint.as_ref().unwrap().decision, "none", "{e4:#?}");
    assert!(e4.checkpoint.as_ref().unwrap().job.is_none());
    assert_eq!(versions(&d, "ver").await.len(), 3);

    // 5: a sleeper holding a file open (both: full); 6: the file changes
    // under it, a files turn, but the pairing would restore the sleeper
    // with a file it never saw: full, and it says why.
    let v5 = took(&turn(&d, "ver", "echo x > /root/held; cd /root && (nohup sleep 1000 < /root/held >/dev/null 2>&1 &) ; sleep 0.2", Policy::Selective).await);
    assert_eq!(v5.took, "full", "{v5:#?}");
    let e6 = turn(&d, "ver", "echo more >> /root/held", Policy::Selective).await;
    assert_eq!(e6.class, drums_api::TurnClass::Files, "{e6:#?}");
    let v6 = took(&e6);
    assert_eq!(v6.took, "full", "{v6:#?}");
    assert!(
        v6.reason
            .as_deref()
            .unwrap_or_default()
            .contains("/root/held"),
        "{v6:#?}"
    );

    // The policies: full takes both at a turn that changed nothing; files
    // takes files without processes; off takes nothing, and the next
    // selective version is then full.
    let v7 = took(&turn(&d, "ver", "true", Policy::Full).await);
    assert_eq!(v7.took, "full");
    let v8 = took(&turn(&d, "ver", "echo f > /root/f8", Policy::Files).await);
    assert_eq!(
        (v8.took.as_str(), v8.process_of.as_deref()),
        ("files", None)
    );
    let e9 = turn(&d, "ver", "echo g > /root/f9", Policy::Off).await;
    assert_eq!(e9.checkpoint.as_ref().unwrap().decision, "none");
    let v10 = took(&turn(&d, "ver", "echo h > /root/f10", Policy::Selective).await);
    assert_eq!(v10.took, "full", "{v10:#?}");
    assert!(v10.reason.is_some(), "{v10:#?}");

    // Rollback to each version: its files and the server's memory, exactly,
    // under the same identity.
    let files = |d: &TestDaemon| {
        d.sh(
            "ver",
            "cat /root/f1 /root/data /root/held 2>/dev/null; true",
        )
        .1
    };
    let cases = [
        (&v1, "one", "0"),
        (&v2, "one\na", "0"),
        (&v3, "one\na", "1"),
        (&v5, "one\na\nx", "1"),
        (&v6, "one\na\nx\nmore", "1"),
        (&v10, "one\na\nx\nmore", "1"),
    ];
    for (v, want_files, want_count) in cases {
        rollback(&d, "ver", &v.number.to_string());
        assert_eq!(files(&d), want_files, "files at version {}", v.number);
        assert_eq!(
            ask(&d, "ver", "get"),
            want_count,
            "server at version {}",
            v.number
        );
        let now: drums_api::Session = d
            .client
            .json(Method::GET, "/v1/sessions/ver", None::<&()>)
            .await
            .unwrap();
        assert_eq!(
            (&now.id, &now.ip, &now.hostname),
            (&s.id, &s.ip, &s.hostname),
            "a rollback keeps the session's identity"
        );
    }
    // The files policy's version has no processes to restore.
    let o = d.drums(&["rollback", "ver", "--to", &v8.number.to_string()]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // After a rollback the history goes on from there.
    let v11 = took(&turn(&d, "ver", "echo after > /root/f11", Policy::Selective).await);
    assert_eq!(v11.parent.as_deref(), Some(v10.id.as_str()), "{v11:#?}");

    d.rm(&s.id).await.unwrap();
    d.stop_and_check_leaks();
}

fn ask_script(what: &str) -> String {
    format!("python3 -c \"import socket;c=socket.create_connection(('127.0.0.1',7000));c.sendall(b'{what}');print(c.recv(16).decode())\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let mut d = TestDaemon::start();
    let s = d
        .create(&CreateSession {
            name: Some("bad".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let v1 = took(&turn(&d, "bad", "echo 1 > /root/a", Policy::Selective).await);
    let before = versions(&d, "bad").await;

    // An unknown version, by number and by id: 400, exit 2.
    for to in ["99", "nosuchid"] {
        let o = d.drums(&["rollback", "bad", "--to", to]);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{to}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // A policy that does not exist: refused by the CLI and by the API.
    let o = d.drums(&[
        "turn",
        "end",
        "bad",
        "--checkpoint",
        "--policy",
        "sometimes",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let r = d
        .client
        .call(
            Method::POST,
            "/v1/sessions/bad/turn/end",
            Some(&serde_json::json!({"checkpoint": true, "policy": "sometimes"})),
        )
        .await;
    assert!(
        matches!(r, Err(drums_api::ClientError::Api { status: 400, .. })),
        "{r:?}"
    );
    // A job that does not exist, or is not a job id.
    for (id, status) in [("12345678", 404), ("x", 400)] {
        let r = d
            .client
            .call(Method::GET, &format!("/v1/jobs/{id}"), None::<&()>)
            .await;
        assert!(
            matches!(r, Err(drums_api::ClientError::Api { status: s, .. }) if s == status),
            "{id}: {r:?}"
        );
    }
    assert_eq!(versions(&d, "bad").await, before, "nothing changed");

    // A rollback of a removed session: 404, exit 3.
    d.rm(&s.id).await.unwrap();
    let o = d.drums(&["rollback", "bad", "--to", &v1.number.to_string()]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    d.stop_and_check_leaks();
}
