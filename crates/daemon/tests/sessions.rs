//! Sessions end to end, against a real drumsd, as root. Every test ends by
//! stopping its daemon and proving nothing of it is left on the host.

mod common;

use common::{assert_schema, run, TestDaemon};
use drums_api::{CreateSession, Limits};
use hyper::Method;

/// 20 sessions created, used and removed in a loop, two alive at a time: each
/// sees only its own processes, hostname, network and files.
#[test]
fn twenty_sessions_are_isolated_and_leave_nothing() {
    let mut d = TestDaemon::start();
    run(async {
        let mut prev: Option<drums_api::Session> = None;
        for i in 0..20 {
            let network = if i % 5 == 4 { "none" } else { "bridge" };
            let s = d
                .create(&CreateSession {
                    network: Some(network.into()),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("create {i}: {e}\n{}", d.log()));
            assert_schema("Session", &serde_json::to_value(&s).unwrap());
            assert_eq!(s.state, drums_api::SessionState::Running);
            let (code, host, _) = d.sh(&s.id, "hostname");
            assert_eq!((code, host.as_str()), (0, s.hostname.as_str()));
            // Processes: PID 1 is the session's init, and only this session's guest exists.
            let (_, comm1, _) = d.sh(&s.id, "cat /proc/1/comm");
            assert_eq!(comm1, "drums-init");
            let (_, guests, _) = d.sh(&s.id, "grep -l drums-guest /proc/[0-9]*/comm | wc -l");
            assert_eq!(
                guests, "1",
                "session {i} sees another session's guest agent"
            );
            // Network: its own address only (or loopback only).
            let (_, addrs, _) = d.sh(
                &s.id,
                "ip -o -4 addr show | awk '{print $2\" \"$4}' | sort | tr '\\n' ,",
            );
            match &s.ip {
                Some(ip) => assert_eq!(addrs, format!("eth0 {ip}/24,lo 127.0.0.1/8,")),
                None => assert_eq!(addrs, "lo 127.0.0.1/8,"),
            }
            // Files: its own marker, none of the previous session's.
            let (code, _, _) = d.sh(&s.id, &format!("echo {i} > /root/marker-{i} && ls /root"));
            assert_eq!(code, 0);
            if let Some(p) = &prev {
                let (_, ls, _) = d.sh(&s.id, "ls /root");
                assert_eq!(
                    ls,
                    format!("marker-{i}"),
                    "session {i} sees another session's files"
                );
                let (code, ..) = d.sh(&p.id, &format!("test -e /root/marker-{i}"));
                assert_ne!(code, 0, "previous session sees session {i}'s file");
                d.rm(&p.id).await.unwrap();
            }
            prev = Some(s);
        }
        d.rm(&prev.unwrap().id).await.unwrap();
        let l: drums_api::SessionList = d
            .client
            .json(Method::GET, "/v1/sessions", None::<&()>)
            .await
            .unwrap();
        assert!(l.sessions.is_empty());
        assert!(
            d.store_subvolumes().is_empty(),
            "subvolumes left: {:?}",
            d.store_subvolumes()
        );
        assert!(
            d.processes().is_empty(),
            "processes left: {:?}",
            d.processes()
        );
        assert!(
            d.session_links().is_empty(),
            "veths left: {:?}",
            d.session_links()
        );
    });
    d.stop_and_check_leaks();
}

/// Creation fails at each step in turn; after each, nothing of the session
/// remains, and the daemon still creates sessions afterwards.
#[test]
fn failure_at_every_create_step_leaves_nothing() {
    let mut d = TestDaemon::start();
    run(async {
        for point in drums_session::faults::CREATE_POINTS {
            d.arm(Some(point)).await;
            let e = d.create(&CreateSession::default()).await.expect_err(point);
            assert!(
                e.to_string()
                    .contains(&format!("injected fault at {point}")),
                "{point}: {e}"
            );
            d.arm(None).await;
            d.assert_no_session_left(point).await;
            let dirs: Vec<_> = std::fs::read_dir(d.state.path().join("sessions"))
                .unwrap()
                .flatten()
                .collect();
            assert!(dirs.is_empty(), "{point}: session dirs left {dirs:?}");
            for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
                let parent = h.path().join(&d.cgroup_parent);
                let children: Vec<_> = std::fs::read_dir(&parent)
                    .map(|rd| {
                        rd.flatten()
                            .filter(|e| e.path().is_dir())
                            .map(|e| e.path())
                            .collect()
                    })
                    .unwrap_or_default();
                assert!(children.is_empty(), "{point}: cgroups left {children:?}");
            }
        }
        // The daemon is still healthy.
        let s = d.create(&CreateSession::default()).await.unwrap();
        assert_eq!(d.sh(&s.id, "true").0, 0);
        d.rm(&s.id).await.unwrap();
    });
    d.stop_and_check_leaks();
}

/// `kill -9` of drumsd with 3 live sessions, one of which then dies, then a
/// new drumsd: it adopts the two live ones as they are (same processes,
/// usable, with their firewall ports) and sweeps the dead one, which had no
/// version to recover from. A graceful stop then removes everything.
#[test]
fn a_restarted_daemon_adopts_live_sessions_and_sweeps_dead_ones() {
    let mut d = TestDaemon::start();
    let subnet = d.subnet();
    let sessions = run(async {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(d.create(&CreateSession::default()).await.unwrap());
        }
        v
    });
    let pids: Vec<i32> = sessions.iter().map(|s| s.init_pid.unwrap()).collect();
    // A process of the first session whose memory is the only record of it.
    let (code, _, err) = d.sh(
        &sessions[0].id,
        "echo kept > /root/f; nohup sleep 1000 >/dev/null 2>&1 &",
    );
    assert_eq!(code, 0, "{err}");
    d.kill9();
    // The sessions outlive their daemon...
    for p in &pids {
        assert!(
            drums_session::process::alive(*p),
            "session init {p} died with the daemon"
        );
    }
    assert_eq!(d.session_links().len(), 3);
    // ...and one dies while no daemon runs.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[2]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(common::gone(|| !drums_session::process::alive(pids[2])));
    d.restart(&subnet);

    let log = d.log();
    assert!(log.contains("adopting a live session"), "{log}");
    assert!(
        log.contains("sweep: removing a session left by a previous daemon"),
        "{log}"
    );
    run(async {
        let l: drums_api::SessionList = d
            .client
            .json(Method::GET, "/v1/sessions", None::<&()>)
            .await
            .unwrap();
        let mut ids: Vec<&str> = l.sessions.iter().map(|s| s.id.as_str()).collect();
        ids.sort();
        let mut want = vec![sessions[0].id.as_str(), sessions[1].id.as_str()];
        want.sort();
        assert_eq!(ids, want, "the live sessions are kept, the dead one is not");
        for s in &l.sessions {
            let before = sessions.iter().find(|b| b.id == s.id).unwrap();
            assert_eq!(s.init_pid, before.init_pid, "adopted as it was");
            assert_eq!(s.ip, before.ip);
        }
    });
    // Adopted sessions work: exec, their files and processes are there, and
    // their firewall port is back.
    let (code, out, err) = d.sh(
        &sessions[0].id,
        "cat /root/f; pgrep -x sleep >/dev/null && echo sleeping",
    );
    assert_eq!((code, out.as_str()), (0, "kept\nsleeping"), "{err}");
    let ports = drums_net::firewall::ports(&d.bridge).unwrap();
    for s in &sessions[..2] {
        let ip: std::net::Ipv4Addr = s.ip.as_deref().unwrap().parse().unwrap();
        assert!(
            ports.iter().any(|(_, p)| *p == ip),
            "{ip} has no firewall port: {ports:?}"
        );
    }
    assert!(!drums_session::process::alive(pids[2]));
    assert_eq!(d.session_links().len(), 2, "the dead session's veth went");
    d.stop_and_check_leaks();
}

/// exec's options, streaming and exit codes; cp both ways; limits applied.
#[test]
fn exec_files_and_limits() {
    let mut d = TestDaemon::start();
    let s = run(d.create(&CreateSession {
        name: Some("tools".into()),
        limits: Limits {
            memory_bytes: Some(256 << 20),
            pids_max: Some(64),
            cpus: Some(0.5),
            disk_bytes: None,
        },
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(s.hostname, "tools");
    assert_eq!(d.sh("tools", "exit 7").0, 7);
    let o = d.drums(&[
        "exec",
        "tools",
        "--user",
        "nobody",
        "--cwd",
        "/tmp",
        "--env",
        "X=42",
        "--",
        "sh",
        "-c",
        "id -u; pwd; echo $X; echo err >&2",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "65534\n/tmp\n42\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err\n");
    let o = d.drums(&["exec", "tools", "--timeout", "0.5", "--", "sleep", "30"]);
    assert_eq!(
        o.status.code(),
        Some(124),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (_, left, _) = d.sh("tools", "pgrep -c sleep || true");
    assert_eq!(left, "0", "timed-out command still running");
    // The cgroup limits are the session's.
    let cg = format!(
        "/sys/fs/cgroup/memory/{}/{}/memory.limit_in_bytes",
        d.cgroup_parent, s.id
    );
    assert_eq!(
        std::fs::read_to_string(cg).unwrap().trim(),
        (256u64 << 20).to_string()
    );
    let cg = format!("/sys/fs/cgroup/pids/{}/{}/pids.max", d.cgroup_parent, s.id);
    assert_eq!(std::fs::read_to_string(cg).unwrap().trim(), "64");
    // Stats come from the session's cgroup.
    let st: serde_json::Value =
        run(d
            .client
            .json(Method::GET, "/v1/sessions/tools/stats", None::<&()>))
        .unwrap();
    assert_schema("SessionStats", &st);
    assert!(
        st["pids"].as_u64().unwrap() >= 2,
        "init and guest at least: {st}"
    );
    assert!(st["memory_bytes"].as_u64().unwrap() > 0, "{st}");
    // cp, binary-safe, both ways.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("blob");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let o = d.drums(&["cp", src.to_str().unwrap(), "tools:/root/blob"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(d.sh("tools", "wc -c < /root/blob").1, "200000");
    let back = dir.path().join("back");
    let o = d.drums(&["cp", "tools:/root/blob", back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&back).unwrap(), data);
    d.stop_and_check_leaks();
}

/// Bad input gets a clear error and a distinct exit code, and changes nothing.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mut d = TestDaemon::start();
    let o = d.drums(&["create", "--name", "only", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in ["id", "ip", "hostname", "profile"] {
        assert!(s.get(k).is_some(), "create --json lacks {k}");
    }
    let expect = |args: &[&str], code: i32, msg: &str| {
        let o = d.drums(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "drums {args:?}: {err}");
        assert!(err.contains(msg), "drums {args:?}: {err:?} lacks {msg:?}");
    };
    expect(&["create", "--name", "only"], 4, "already exists");
    expect(&["create", "--name", "bad/name"], 2, "invalid session name");
    expect(&["create", "--memory", "1K"], 2, "below the minimum");
    expect(&["create", "--memory", "lots"], 2, "invalid size");
    expect(&["create", "--pids", "0"], 2, "pids limit 0");
    expect(&["create", "--cpus", "1000"], 2, "cpu limit");
    expect(&["create", "--network", "host"], 2, "use bridge or none");
    expect(&["create", "--profile", "gpu"], 2, "unknown profile");
    expect(&["create", "--image", "nope"], 3, "no image named");
    expect(&["exec", "ghost", "--", "true"], 3, "no session named");
    expect(
        &["exec", "only", "--", "no-such-command"],
        127,
        "no-such-command",
    );
    expect(&["cp", "only:/../../etc/shadow", "/tmp/x"], 2, "escapes");
    expect(&["cp", "only:/no/such/file", "/tmp/x"], 3, "");
    expect(&["rm", "ghost"], 3, "no session named");
    // Nothing changed: still exactly one session, and its files are intact.
    let o = d.drums(&["ps", "--json"]);
    let l: drums_api::SessionList = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(l.sessions.len(), 1);
    assert_eq!(l.sessions[0].name, "only");
    assert_eq!(d.session_links().len(), 1);
    // rm twice: the second is not-found.
    assert!(d.drums(&["rm", "only"]).status.success());
    expect(&["rm", "only"], 3, "no session named");
    // A second daemon on the same state directory refuses to start, and says why.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_drumsd"))
        .arg("--state-dir")
        .arg(d.state.path())
        .args([
            "--bridge",
            "drtnever",
            "--cgroup-parent",
            "drums-test-never",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already uses state directory"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A CLI that cannot reach a daemon says so with its own code.
    let o = std::process::Command::new(common::bin_dir().join("drums"))
        .args([
            "--socket",
            "/nonexistent/drumsd.sock",
            "--no-autostart",
            "ps",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5));
    d.stop_and_check_leaks();
}

/// Responses carry what the OpenAPI document requires.
/// A session that is being created or removed exists but cannot take a
/// session operation: each answers 409 `conflict` (the session's state
/// refuses it, the request was fine), not 400, and `drums` exits 4. A real
/// create or remove holds these states for milliseconds to a few seconds, so
/// the test holds them open by writing the state into the catalog, as
/// drumsd's own steps do, and puts the session back before removing it.
#[test]
fn a_session_being_created_or_removed_answers_409() {
    let mut d = TestDaemon::start();
    let id = {
        let o = d.drums(&["create", "--name", "busy", "--network", "none"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let other = {
        let o = d.drums(&["create", "--network", "none"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let catalog = drums_catalog::Catalog::open(&d.state.path().join("catalog.db")).unwrap();
    let pid = catalog.session(&id).unwrap().unwrap().init_pid;
    let exec = serde_json::json!({"argv": ["true"]});
    let pid_body = serde_json::json!({"pid": 1});
    let ck = serde_json::json!({"session": "busy"});
    let fork = serde_json::json!({"count": 1});
    let audit = format!("/v1/audit?a=busy&b={other}");
    let calls: [(Method, &str, Option<&serde_json::Value>); 10] = [
        (Method::POST, "/v1/sessions/busy/exec", Some(&exec)),
        (Method::POST, "/v1/sessions/busy/fork", Some(&fork)),
        (Method::POST, "/v1/checkpoints", Some(&ck)),
        (Method::POST, "/v1/sessions/busy/turn/begin", None),
        (Method::POST, "/v1/sessions/busy/agent", Some(&pid_body)),
        (
            Method::GET,
            "/v1/sessions/busy/files?path=/etc/hostname",
            None,
        ),
        (Method::PUT, "/v1/sessions/busy/files?path=/tmp/x", None),
        (Method::GET, "/v1/sessions/busy/dir?path=/", None),
        (Method::GET, &audit, None),
        (Method::GET, "/v1/sessions/busy", None),
    ];
    for state in [
        drums_api::SessionState::Creating,
        drums_api::SessionState::Removing,
    ] {
        catalog.set_session_state(&id, state, None).unwrap();
        run(async {
            for (method, uri, body) in &calls {
                let r = d.client.call(method.clone(), uri, *body).await;
                if uri.ends_with("/busy") {
                    // Reading the session is fine in any state.
                    assert!(r.is_ok(), "{state}: GET {uri}: {r:?}");
                    continue;
                }
                match r {
                    Err(drums_api::ClientError::Api {
                        status,
                        kind,
                        message,
                    }) => {
                        assert_eq!(
                            (status, kind.as_str()),
                            (409, "conflict"),
                            "{state}: {method} {uri}: {message}"
                        );
                        assert!(
                            message.contains(&format!("session busy is {state}, not running")),
                            "{state}: {method} {uri}: {message}"
                        );
                    }
                    other => panic!("{state}: {method} {uri}: {other:?}"),
                }
            }
        });
        for args in [
            &["exec", "busy", "--", "true"][..],
            &["fork", "busy"][..],
            &["checkpoint", "busy"][..],
            &["turn", "begin", "busy"][..],
        ] {
            let o = d.drums(args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(4), "{state}: drums {args:?}: {err}");
            assert!(
                err.contains("not running"),
                "{state}: drums {args:?}: {err}"
            );
        }
    }
    // Nothing was made by the refused calls: no checkpoint, no sibling.
    let ps = d.drums(&["ps", "--json"]);
    let l: drums_api::SessionList = serde_json::from_slice(&ps.stdout).unwrap();
    assert_eq!(l.sessions.len(), 2, "a refused fork made a sibling");
    assert!(
        catalog.versions().unwrap().is_empty(),
        "a refused checkpoint was kept"
    );
    catalog
        .set_session_state(&id, drums_api::SessionState::Running, pid)
        .unwrap();
    drop(catalog);
    run(async {
        d.rm(&id).await.unwrap();
        d.rm(&other).await.unwrap();
        d.assert_no_session_left("after the 409s").await;
    });
    d.stop_and_check_leaks();
}

/// A session removed while a file is being uploaded to it: the upload
/// answers 409 `conflict` ("was removed during the request"), not 502 as if
/// its guest agent were broken, and nothing is left.
#[test]
fn a_session_removed_during_an_upload_answers_409() {
    use futures::StreamExt;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    let mut d = TestDaemon::start();
    run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        let body = StreamBody::new(
            tokio_stream_of(rx)
                .map(|chunk| Ok::<_, std::io::Error>(Frame::data(bytes::Bytes::from(chunk)))),
        );
        let req = hyper::Request::builder()
            .method(Method::PUT)
            .uri(format!("/v1/sessions/{}/files?path=/tmp/upload", s.id))
            .header("host", "drums")
            .header("content-type", "application/octet-stream")
            .body(body)
            .unwrap();
        let upload = d.client.send(req);
        let remove = async {
            // The upload has begun: its first bytes are through.
            tx.send(vec![b'x'; 1 << 16]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            d.rm(&s.id).await.unwrap();
            // More bytes, then the end: the request finishes either way.
            let _ = tx.send(vec![b'y'; 1 << 16]).await;
            drop(tx);
        };
        let (resp, ()) = tokio::join!(upload, remove);
        match resp {
            Ok(r) => {
                let status = r.status().as_u16();
                let body = http_body_util::BodyExt::collect(r.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                let e: drums_api::ErrorBody = serde_json::from_slice(&body)
                    .unwrap_or_else(|_| panic!("{status}: {}", String::from_utf8_lossy(&body)));
                assert_eq!(
                    (status, e.error.kind.as_str()),
                    (409, "conflict"),
                    "{}",
                    e.error.message
                );
                assert!(
                    e.error.message.contains("was removed during the request"),
                    "{}",
                    e.error.message
                );
            }
            Err(e) => panic!("the upload: {e}"),
        }
        d.assert_no_session_left("after the upload").await;
    });
    d.stop_and_check_leaks();
}

/// A stream of what arrives on `rx`, until its sender is dropped.
fn tokio_stream_of(
    rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> impl futures::Stream<Item = Vec<u8>> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

#[test]
fn responses_follow_the_openapi_document() {
    let mut d = TestDaemon::start();
    run(async {
        let c = &d.client;
        let v: serde_json::Value = c
            .json(Method::GET, "/v1/version", None::<&()>)
            .await
            .unwrap();
        assert_schema("Version", &v);
        let v: serde_json::Value = c
            .json(Method::GET, "/v1/images", None::<&()>)
            .await
            .unwrap();
        assert_schema("ImageList", &v);
        assert_schema("Image", &v["images"][0]);
        let v: serde_json::Value = c
            .json(Method::GET, "/v1/sessions", None::<&()>)
            .await
            .unwrap();
        assert_schema("SessionList", &v);
        let r = c
            .call(Method::GET, "/v1/sessions/nope", None::<&()>)
            .await
            .unwrap_err();
        assert!(
            matches!(r, drums_api::ClientError::Api { status: 404, ref kind, .. } if kind == "not_found"),
            "{r:?}"
        );
        let resp = c
            .send(
                hyper::Request::post("/v1/sessions")
                    .header("host", "d")
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(
                        b"{\"nme\":1}",
                    )))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        let body = c.read_body(resp).await.unwrap();
        assert_schema("ErrorBody", &serde_json::from_slice(&body).unwrap());
    });
    d.stop_and_check_leaks();
}
