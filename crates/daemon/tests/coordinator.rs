//! The coordinator's LLM proxy, through drumsd: the official `openai` and
//! `anthropic` Python SDKs (in the virtualenv scripts/setup.sh makes) talk
//! through it to a mock upstream (tests/proxy/mock_llm.py), unchanged but
//! for their base URL; each request from a session ends its turn and takes
//! the turn's version; an answer's end is held exactly while that version is
//! not durable; bad input gets a clear error or passes through as the
//! upstream answered, and leaves the turns in order. As root, with real
//! CRIU, btrfs and eBPF; every test ends by proving nothing is left.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::llm::{model_call, Mock};
use common::{exec_in, TestDaemon};
use drums_api::{CoordinatedTurn, CoordinatedTurns, CreateSession, SessionVersions};
use hyper::Method;
use serde_json::Value;

fn proxy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy")
}

/// The SDKs' virtualenv, made by scripts/setup.sh.
fn sdk_python() -> PathBuf {
    let state = std::env::var("DRUMS_STATE_DIR").unwrap_or_else(|_| "/var/lib/drums".into());
    let py = Path::new(&state).join("cache/llm-sdks/bin/python");
    assert!(
        py.exists(),
        "{} missing: run scripts/setup.sh (it installs the openai and anthropic SDKs into a \
         virtualenv). NOT SKIPPED",
        py.display()
    );
    py
}

/// One SDK call (tests/proxy/sdk_client.py): what it returned.
fn sdk(base: &str, kind: &str, model: &str, text: &str, headers: &[&str]) -> Value {
    let o = Command::new(sdk_python())
        .arg(proxy_dir().join("sdk_client.py"))
        .args([base, kind, model, text])
        .args(headers)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{kind} via {base}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A drumsd whose proxy sends OpenAI requests to `mock` and Anthropic ones
/// to `anthropic` (the mock too by default), with one session, "agent".
async fn daemon(mock: &Mock, anthropic: Option<&str>) -> TestDaemon {
    let openai = format!("openai={}", mock.url());
    let anthropic = format!("anthropic={}", anthropic.map_or(mock.url(), str::to_owned));
    let d = TestDaemon::start_with(&["--llm-upstream", &openai, "--llm-upstream", &anthropic]);
    d.create(&CreateSession {
        name: Some("agent".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    d
}

async fn records(d: &TestDaemon, s: &str) -> Vec<CoordinatedTurn> {
    let t: CoordinatedTurns = d
        .client
        .json(
            Method::GET,
            &format!("/v1/sessions/{s}/coordinator"),
            None::<&()>,
        )
        .await
        .unwrap();
    t.turns
}

/// The records once `n` are there (a record is written when its answer has
/// been released, a moment after the client read it).
async fn wait_records(d: &TestDaemon, s: &str, n: usize) -> Vec<CoordinatedTurn> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = records(d, s).await;
        if r.len() >= n {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} records: {r:#?}",
            r.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn touch(d: &TestDaemon, s: &str, name: &str) {
    let (code, _, err) = d.sh(s, &format!("echo {name} > /root/{name}"));
    assert_eq!(code, 0, "{err}");
}

/// A raw HTTP/1.1 exchange with `Connection: close`: status and body (not
/// de-chunked).
fn raw(
    at: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut c = TcpStream::connect(at).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes()).unwrap();
    // A refused body may be closed on before it is all sent.
    let _ = c.write_all(body);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

const KINDS: [&str; 6] = [
    "chat",
    "chat-stream",
    "responses",
    "responses-stream",
    "messages",
    "messages-stream",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_talk_through_the_proxy_and_each_request_ends_a_turn() {
    let mock = Mock::start();
    let mut d = daemon(&mock, None).await;
    let proxy = format!("http://{}", d.proxy_local);
    let prefixed = format!("{proxy}/s/agent");

    let mut n = 0;
    for kind in KINDS {
        let text = format!("hello {kind}");
        let direct = sdk(&mock.url(), kind, "m", &text, &[]);
        assert_eq!(direct["text"], format!("echo: {text}"), "{direct}");
        // Both ways an outside agent names its session: a path prefix, a
        // header. Each request is a turn boundary; the turn between two
        // writes a file.
        for (base, headers) in [
            (prefixed.as_str(), vec![]),
            (proxy.as_str(), vec!["x-drums-session=agent"]),
        ] {
            touch(&d, "agent", &format!("{kind}-{n}"));
            let got = sdk(base, kind, "m", &text, &headers);
            assert_eq!(got["text"], direct["text"], "{kind} via {base}");
            n += 1;
        }
    }
    // A path of neither API passes through, and is no turn.
    let (status, body) = raw(d.proxy_local, "GET", "/s/agent/v1/models", &[], b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"mock\""), "{body}");

    let r = wait_records(&d, "agent", n).await;
    assert_eq!(r.len(), n, "{r:#?}");
    // The first request takes the session's base version: what a failure
    // before any turn changed something recovers to.
    assert_eq!(r[0].decision, "base", "{:#?}", r[0]);
    assert!(
        r[0].version.is_some() && r[0].error.is_none(),
        "{:#?}",
        r[0]
    );
    for (i, t) in r.iter().enumerate() {
        let kind = KINDS[i / 2];
        assert_eq!(t.status, 200, "{t:#?}");
        assert_eq!(t.stream, kind.ends_with("-stream"), "{t:#?}");
        assert_eq!(
            t.style,
            if kind.starts_with("messages") {
                "anthropic"
            } else {
                "openai"
            }
        );
        assert!(t.response_bytes > 0 && t.request_bytes > 0, "{t:#?}");
        if i > 0 {
            // Consecutive turns, each of which wrote a file: a version each.
            assert_eq!(t.turn, Some(i as u64), "{t:#?}");
            assert!(["files", "full"].contains(&t.decision.as_str()), "{t:#?}");
            assert!(t.version.is_some() && t.error.is_none(), "{t:#?}");
        }
    }
    let v: SessionVersions = d
        .client
        .json(Method::GET, "/v1/sessions/agent/versions", None::<&()>)
        .await
        .unwrap();
    // The base and one version per ended turn, the newest kept by
    // retention.
    let kept = n.min(drums_session::versions::DEFAULT_KEEP);
    assert_eq!(v.versions.len(), kept);
    let newest: Vec<_> = r[n - kept..]
        .iter()
        .map(|t| t.version.clone().unwrap())
        .collect();
    let listed: Vec<_> = v.versions.iter().map(|v| v.id.clone()).collect();
    assert_eq!(listed, newest);
    assert!(v
        .versions
        .iter()
        .all(|v| v.state == drums_api::VersionState::Done));

    // A rollback starts the session's turns again: the next request has no
    // turn to end (recorded as the first), the one after ends a turn again.
    let o = d.drums(&["rollback", "agent"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The inspector's live stream carries the records too, until the
    // session goes (a rollback ends it too: the inspector starts again).
    let live = d
        .client
        .call(Method::GET, "/v1/sessions/agent/turns", None::<&()>)
        .await
        .unwrap();
    let live = tokio::spawn(async move {
        use http_body_util::BodyExt;
        let body = live.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    sdk(&prefixed, "chat", "m", "after the rollback", &[]);
    touch(&d, "agent", "after");
    sdk(&prefixed, "chat", "m", "and on", &[]);
    let r = wait_records(&d, "agent", n + 2).await;
    let (again, on) = (&r[n], &r[n + 1]);
    assert_eq!(
        (again.decision.as_str(), again.error.as_deref()),
        ("first", None),
        "{again:#?}"
    );
    assert!(
        on.turn.is_some() && on.version.is_some() && on.error.is_none(),
        "{on:#?}"
    );

    d.rm("agent").await.unwrap();
    let lines = live.await.unwrap();
    let streamed: Vec<CoordinatedTurn> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| serde_json::from_value(v.get("coordinated")?.clone()).ok())
        .collect();
    assert_eq!(streamed, r[n..n + 2], "{lines}");
    d.stop_and_check_leaks();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_held_exactly_while_its_version_is_not_durable() {
    let mock = Mock::start();
    let mut d = daemon(&mock, None).await;
    let base = format!("http://{}/s/agent", d.proxy_local);
    sdk(&base, "chat-stream", "m", "first", &[]);

    // A slow version and a fast model: a process whose 400 MiB of memory the
    // version must dump. The answer's end comes after the version is done:
    // right after the SDK returned, the version is already durable.
    let (code, _, err) = d.sh(
        "agent",
        "cd / && nohup python3 -c \"import time;b=bytearray(400<<20);b[::4096]=b'x'*(len(b)//4096);time.sleep(3600)\" >/dev/null 2>&1 & sleep 2",
    );
    assert_eq!(code, 0, "{err}");
    let got = sdk(&base, "chat-stream", "m", "slow version", &[]);
    let r = wait_records(&d, "agent", 2).await;
    let slow = &r[1];
    let version = slow.version.clone().unwrap_or_else(|| panic!("{slow:#?}"));
    let v: SessionVersions = d
        .client
        .json(Method::GET, "/v1/sessions/agent/versions", None::<&()>)
        .await
        .unwrap();
    let made = v.versions.iter().find(|x| x.id == version).unwrap();
    assert_eq!(made.state, drums_api::VersionState::Done, "{made:#?}");
    let process_ms = made.process.as_ref().map_or(0.0, |c| c.total_ms);
    assert!(
        slow.held_ms > 100.0 && process_ms > slow.held_ms * 0.5,
        "held {} ms for a version of {} ms: {slow:#?}",
        slow.held_ms,
        process_ms
    );
    assert!(
        got["took_s"].as_f64().unwrap() * 1e3 >= slow.held_ms,
        "{got} {slow:#?}"
    );

    // A fast version and a slow model: nothing is held.
    touch(&d, "agent", "quick");
    sdk(&base, "chat-stream", "delay-1500", "slow model", &[]);
    let r = wait_records(&d, "agent", 3).await;
    let fast = &r[2];
    assert_eq!(fast.decision, "files", "{fast:#?}");
    assert!(fast.version.is_some(), "{fast:#?}");
    assert_eq!(fast.held_ms, 0.0, "{fast:#?}");
    assert!(fast.upstream_ms >= 1500.0, "{fast:#?}");

    d.rm("agent").await.unwrap();
    d.stop_and_check_leaks();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_answer_and_the_turns_stay_in_order() {
    let mock = Mock::start();
    // Anthropic's upstream is down: nothing listens there.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut d = daemon(&mock, Some(&down)).await;
    let at = d.proxy_local;
    let chat = |model: &str| {
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
    };
    let json = [("content-type", "application/json")];

    // An unknown session, by prefix and by header: 404, nothing forwarded.
    let (status, body) = raw(
        at,
        "POST",
        "/s/ghost/v1/chat/completions",
        &json,
        chat("m").as_bytes(),
    );
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no session named \\\"ghost\\\""), "{body}");
    let (status, _) = raw(
        at,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-drums-session", "ghost"),
        ],
        chat("m").as_bytes(),
    );
    assert_eq!(status, 404);
    // Too large, declared or sent: 413, before anything is forwarded.
    {
        let mut c = TcpStream::connect(at).unwrap();
        write!(
            c,
            "POST /s/agent/v1/chat/completions HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\
             content-length: {}\r\n\r\n",
            drums_coordinator::MAX_REQUEST_BYTES + 1
        )
        .unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        assert!(out.contains("too_large"), "{out}");
    }
    assert!(
        records(&d, "agent").await.is_empty(),
        "refused requests are no turns"
    );

    // The first turn request; then the upstream's own errors pass through
    // exactly as it sent them, a malformed body included.
    let (status, _) = raw(
        at,
        "POST",
        "/s/agent/v1/chat/completions",
        &json,
        chat("m").as_bytes(),
    );
    assert_eq!(status, 200);
    let (status, body) = raw(
        at,
        "POST",
        "/s/agent/v1/chat/completions",
        &json,
        chat("status-429").as_bytes(),
    );
    assert_eq!(status, 429);
    assert_eq!(
        body,
        r#"{"type": "error", "error": {"message": "mock error", "type": "api_error"}}"#
    );
    let (status, body) = raw(
        at,
        "POST",
        "/s/agent/v1/chat/completions",
        &json,
        b"{not json",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("bad json"), "{body}");
    // The upstream down: 502, saying which upstream.
    let (status, body) = raw(
        at,
        "POST",
        "/s/agent/v1/messages",
        &[
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
        ],
        chat("m").as_bytes(),
    );
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("upstream_unavailable") && body.contains(&down[7..]),
        "{body}"
    );
    // A client that goes away mid-stream.
    {
        let mut c = TcpStream::connect(at).unwrap();
        let body =
            r#"{"model":"delay-2000","stream":true,"messages":[{"role":"user","content":"bye"}]}"#;
        write!(
            c,
            "POST /s/agent/v1/chat/completions HTTP/1.1\r\nHost: p\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut first = [0u8; 256];
        let n = c.read(&mut first).unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    }
    // Its turn finishes as soon as it is gone (the upstream's answer is
    // dropped); then a good request: still a boundary, the next turn.
    wait_records(&d, "agent", 5).await;
    let (status, _) = raw(
        at,
        "POST",
        "/s/agent/v1/chat/completions",
        &json,
        chat("m").as_bytes(),
    );
    assert_eq!(status, 200);

    let r = wait_records(&d, "agent", 6).await;
    let statuses: Vec<u16> = r.iter().map(|t| t.status).collect();
    assert_eq!(statuses, [200, 429, 400, 502, 200, 200], "{r:#?}");
    let turns: Vec<Option<u64>> = r.iter().map(|t| t.turn).collect();
    assert_eq!(
        turns,
        [None, Some(1), Some(2), Some(3), Some(4), Some(5)],
        "{r:#?}"
    );
    assert!(
        r[3].error
            .as_deref()
            .is_some_and(|e| e.contains("did not answer")),
        "{:#?}",
        r[3]
    );
    assert!(r[4].client_gone, "{:#?}", r[4]);
    // The exchange log holds the answers given in full, at consecutive
    // places; the others gave their place back.
    let logged: Vec<(&str, Option<u64>)> = r.iter().map(|t| (t.log.as_str(), t.seq)).collect();
    assert_eq!(
        logged,
        [
            ("live", Some(0)),
            ("none", None),
            ("none", None),
            ("none", None),
            ("none", None),
            ("live", Some(1))
        ],
        "{r:#?}"
    );

    // From inside the session: known by its address, with nothing to set;
    // naming another session from there is refused.
    let gw = d.subnet().replace(".0/24", ".1");
    let call = |header: &str| {
        format!(
            "python3 -c \"import http.client,json;c=http.client.HTTPConnection('{gw}',{},timeout=20);\
             c.request('POST','/v1/chat/completions',json.dumps({{'model':'m','messages':[{{'role':'user','content':'inside'}}]}}),\
             {{'content-type':'application/json'{header}}});r=c.getresponse();print(r.status, r.read().decode())\"",
            drums_api::LLM_PROXY_PORT
        )
    };
    let (code, out, err) = d.sh("agent", &call(""));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("200 ") && out.contains("echo: inside"),
        "{out}"
    );
    let (_, out, _) = d.sh("agent", &call(",'x-drums-session':'someone-else'"));
    assert!(out.starts_with("403 "), "{out}");
    // An agent outside coordinates this session, so the session's own call
    // was answered but is none of that agent's turns (docs/security.md, "A
    // session cannot move an outside agent's commands"): the agent's next
    // call is its turn 6, and the record after its 5th.
    let (status, _) = raw(
        at,
        "POST",
        "/s/agent/v1/chat/completions",
        &json,
        chat("m").as_bytes(),
    );
    assert_eq!(status, 200);
    let r = wait_records(&d, "agent", 7).await;
    assert_eq!(r.len(), 7, "{r:#?}");
    assert_eq!(r[6].turn, Some(6), "{:#?}", r[6]);
    assert_eq!(r[6].session, "agent");

    // The session is coordinated: its commands are logged. A malformed exec
    // request is refused and logs nothing; the two above were logged, done.
    let bad = d
        .client
        .call(
            Method::POST,
            "/v1/sessions/agent/exec",
            Some(&serde_json::json!({"argv": 5})),
        )
        .await;
    assert!(
        matches!(bad, Err(drums_api::ClientError::Api { status: 400, .. })),
        "{bad:?}"
    );
    let s: drums_api::Session = d
        .client
        .json(Method::GET, "/v1/sessions/agent", None::<&()>)
        .await
        .unwrap();
    let journal = drums_catalog::Catalog::open(&d.state.path().join("catalog.db")).unwrap();
    let states: Vec<_> = journal
        .commands(&s.id)
        .unwrap()
        .into_iter()
        .map(|c| c.state)
        .collect();
    assert_eq!(states, [drums_api::CommandState::Done; 2]);

    d.rm("agent").await.unwrap();
    d.stop_and_check_leaks();
}

/// The sessions' gateway, where the proxy listens for agents inside them.
fn gateway(subnet: &str) -> String {
    let net = subnet.split('/').next().unwrap();
    let (head, _) = net.rsplit_once('.').unwrap();
    format!("{head}.1:7080")
}

/// Put the scripted agent (tests/proxy/agent_in_session.py) into session
/// `s` and start it there, talking to the proxy at `proxy`.
fn start_agent(d: &TestDaemon, s: &str, proxy: &str, turns: u32) {
    let script = std::fs::read_to_string(proxy_dir().join("agent_in_session.py")).unwrap();
    let (code, _, err) = d.sh(
        s,
        &format!("cat > /root/agent.py <<'PYEOF'\n{script}\nPYEOF\ncd / && nohup python3 /root/agent.py {proxy} {turns} > /root/agent.log 2>&1 &"),
    );
    assert_eq!(code, 0, "{err}");
}

/// The highest place in the exchange log answered in full so far.
async fn logged_up_to(d: &TestDaemon, s: &str) -> Option<u64> {
    records(d, s)
        .await
        .iter()
        .filter(|t| t.status == 200 && t.log != "none")
        .filter_map(|t| t.seq)
        .max()
}

/// Wait until the log of `s` reaches `seq` (bounded; the agent's log on failure).
async fn wait_logged(d: &TestDaemon, s: &str, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !matches!(logged_up_to(d, s).await, Some(m) if m >= seq) {
        assert!(
            Instant::now() < deadline,
            "{s} never logged request {seq}: {:#?}\n{}",
            records(d, s).await,
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The files the agent made (with their hashes) and the session's processes
/// (their command lines: pids differ between runs), once it is done.
async fn final_state(d: &TestDaemon, s: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, _, _) = d.sh(s, "test -e /root/work/done");
        if code == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{s}: the agent never finished: {}",
            d.sh(s, "cat /root/agent.log").1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, out, err) = d.sh(
        s,
        "cd /root/work && sha256sum $(ls | sort) && for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -v '^$' | sort",
    );
    assert_eq!(code, 0, "{err}");
    // Without the listing's own processes (which of them run when /proc is
    // read is a race).
    out.lines()
        .map(str::trim)
        .filter(|l| {
            !(*l == "sort"
                || l.starts_with("tr ")
                || l.starts_with("grep ")
                || l.contains("sha256sum"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Run a process in session `id`'s memory cgroup that asks for more than
/// the session may have: the OOM killer kills in the session's cgroup.
fn exhaust_memory(d: &TestDaemon, id: &str) {
    let procs = format!(
        "/sys/fs/cgroup/memory/{}/{id}/cgroup.procs",
        d.cgroup_parent
    );
    let o = Command::new("python3")
        .args([
            "-c",
            "import os,sys\nopen(sys.argv[1],'w').write(str(os.getpid()))\nb=bytearray(1<<30)\nb[::4096]=b'x'*(len(b)//4096)",
            &procs,
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), None, "the OOM killer ended it: {o:?}");
}

/// Wait until a process of session `id` runs `argv`: the command that
/// starts it is under way then, however slow the host (a fixed sleep was
/// not always long enough under load, and the failure then came before the
/// command, not during it).
async fn until_running(d: &TestDaemon, id: &str, argv: &[&str]) {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let top = PathBuf::from(format!("/sys/fs/cgroup/memory/{}/{id}", d.cgroup_parent));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut dirs = vec![top.clone()];
        let mut found = false;
        while let Some(dir) = dirs.pop() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            found |= procs
                .lines()
                .any(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want));
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                }
            }
        }
        if found {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no process of session {id} runs {argv:?}:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sessions "clean" (the run without failures) and "faulty", with little
/// memory (256 MiB), so that the OOM killer can be made to kill in one.
async fn two_runs(d: &TestDaemon) {
    for name in ["clean", "faulty"] {
        d.create(&CreateSession {
            name: Some(name.into()),
            limits: drums_api::Limits {
                memory_bytes: Some(256 << 20),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Every process of the session (its init, so its pid namespace).
    Processes,
    /// The session's memory runs out: the OOM killer kills in its cgroup.
    Oom,
    /// drumsd, then a new one on the same state.
    Daemon,
}

/// An agent living in a session, 20 turns, five failures injected while it
/// runs: its session's processes killed twice, its memory exhausted twice
/// (the OOM killer), drumsd killed and restarted once. The coordinator recovers the session
/// each time (from the newest version with the agent's own image) and
/// fast-forwards the agent from its exchange log; the run ends with exactly
/// the files and processes of the same run without failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_in_a_session_is_recovered_from_five_failures_and_ends_as_without_them() {
    const TURNS: u32 = 20;
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&["--llm-upstream", &format!("openai={}", mock.url())]);
    let subnet = d.subnet();
    let proxy = gateway(&subnet);
    two_runs(&d).await;

    // The run without failures.
    start_agent(&d, "clean", &proxy, TURNS);
    wait_logged(&d, "clean", TURNS as u64).await;
    let clean = final_state(&d, "clean").await;
    assert!(
        clean.contains("sleep 100014") && !clean.contains("sleep 100001"),
        "{clean}"
    );
    let r = records(&d, "clean").await;
    assert!(
        r.iter().all(|t| t.log == "live" && t.status == 200),
        "{r:#?}"
    );
    // The agent was found from its connection: its own changes are not a
    // turn's, so turns that only wrote files took files versions.
    assert!(
        d.log().contains("the agent lives in the session"),
        "{}",
        d.log()
    );
    assert!(r.iter().any(|t| t.decision == "files"), "{r:#?}");

    // The same run, with failures.
    let faulty: drums_api::Session = d
        .client
        .json(Method::GET, "/v1/sessions/faulty", None::<&()>)
        .await
        .unwrap();
    start_agent(&d, "faulty", &proxy, TURNS);
    // The failure at 12 comes after more versions than retention keeps
    // since the agent's last own image (turn 1): that one must be kept.
    let plan = [
        (3, Fault::Processes),
        (7, Fault::Oom),
        (12, Fault::Processes),
        (15, Fault::Daemon),
        (18, Fault::Oom),
    ];
    let mut recovered = 0;
    for (at, fault) in plan {
        wait_logged(&d, "faulty", at).await;
        match fault {
            Fault::Processes => {
                let s: drums_api::Session = d
                    .client
                    .json(Method::GET, "/v1/sessions/faulty", None::<&()>)
                    .await
                    .unwrap();
                let init = s.init_pid.unwrap();
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(init),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
            }
            Fault::Oom => exhaust_memory(&d, &faulty.id),
            Fault::Daemon => {
                d.kill9();
                d.restart(&subnet);
            }
        }
        // Recovered (the agent may go on before a recovery after the OOM
        // killer took another process), and on past where it was.
        if !matches!(fault, Fault::Daemon) {
            recovered += 1;
            let deadline = Instant::now() + Duration::from_secs(60);
            while d.log().matches("recovered by the coordinator").count() < recovered {
                assert!(
                    Instant::now() < deadline,
                    "{fault:?} at {at} never recovered:\n{}",
                    d.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        wait_logged(&d, "faulty", at + 1).await;
    }
    wait_logged(&d, "faulty", TURNS as u64).await;
    let after = final_state(&d, "faulty").await;
    assert_eq!(after, clean, "the run with failures ended elsewhere");

    let log = d.log();
    assert_eq!(
        log.matches("recovered by the coordinator").count(),
        4,
        "each killed session recovered once:\n{log}"
    );
    assert!(log.contains("adopting a live session"), "{log}");
    let r = records(&d, "faulty").await;
    // Fast-forwards answered from the log; no request differed from it; the
    // model was asked again only for answers that had not been logged.
    let replayed = r.iter().filter(|t| t.log == "replayed").count();
    let upstream = r.iter().filter(|t| t.log == "live").count();
    assert!(replayed >= 4, "{replayed} replayed: {r:#?}");
    assert!(r.iter().all(|t| t.log != "forked"), "{r:#?}");
    assert!(
        upstream <= TURNS as usize + 1 + plan.len(),
        "{upstream} asked upstream: {r:#?}"
    );

    for s in ["clean", "faulty"] {
        d.rm(s).await.unwrap();
    }
    d.stop_and_check_leaks();
}

/// An agent outside its session, 20 turns of a model call (through the
/// proxy, by header) and a command in the session (`drums exec`), with five
/// failures: the session's processes killed twice and its memory exhausted
/// twice while a command runs, drumsd killed and restarted once while the
/// model thinks. Each command's answer is what it would have been without
/// failures (the coordinator recovers the session and re-issues the
/// command for its waiting caller), and the files end as the run's without
/// failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_outside_its_session_never_sees_five_failures() {
    const TURNS: u64 = 20;
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&["--llm-upstream", &format!("openai={}", mock.url())]);
    let subnet = d.subnet();
    two_runs(&d).await;
    let faulty: drums_api::Session = d
        .client
        .json(Method::GET, "/v1/sessions/faulty", None::<&()>)
        .await
        .unwrap();
    let plan: [(u64, Option<Fault>); 5] = [
        (3, Some(Fault::Processes)),
        (7, Some(Fault::Oom)),
        (10, Some(Fault::Daemon)),
        (13, Some(Fault::Processes)),
        (16, Some(Fault::Oom)),
    ];
    // The command of turn t: not idempotent (it appends), and its answer
    // says how many turns the log has. Those the failures hit run long
    // enough (in both runs) for the session to fail while they run.
    let command = |t: u64| {
        let secs = if plan.iter().any(|(at, _)| *at == t) {
            3.0
        } else {
            0.4
        };
        format!("mkdir -p /root/work && sleep {secs} && echo turn {t} >> /root/work/log && echo {t} > /root/work/f{t} && wc -l < /root/work/log")
    };
    for s in ["clean", "faulty"] {
        for t in 0..=TURNS {
            let fault = plan
                .iter()
                .find(|(at, _)| *at == t && s == "faulty")
                .and_then(|(_, f)| *f);
            let at = d.proxy_local;
            let (name, text) = (s.to_owned(), format!("turn {t}"));
            let call =
                tokio::task::spawn_blocking(move || model_call(at, &name, "with-delay-300", &text));
            if let Some(Fault::Daemon) = fault {
                // While the model thinks.
                tokio::time::sleep(Duration::from_millis(100)).await;
                d.kill9();
                d.restart(&subnet);
            }
            assert_eq!(call.await.unwrap(), format!("echo: turn {t}"));
            if t == TURNS {
                break;
            }
            let (state, name, script) = (d.state.path().to_owned(), s.to_owned(), command(t));
            let run = tokio::task::spawn_blocking(move || exec_in(&state, &name, &script));
            match fault {
                Some(Fault::Processes) => {
                    until_running(&d, &faulty.id, &["sleep", "3"]).await;
                    let now: drums_api::Session = d
                        .client
                        .json(Method::GET, "/v1/sessions/faulty", None::<&()>)
                        .await
                        .unwrap();
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(now.init_pid.unwrap()),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .unwrap();
                }
                Some(Fault::Oom) => {
                    until_running(&d, &faulty.id, &["sleep", "3"]).await;
                    exhaust_memory(&d, &faulty.id);
                }
                _ => {}
            }
            let (code, out, err) = run.await.unwrap();
            assert_eq!(
                (code, out.as_str()),
                (0, (t + 1).to_string().as_str()),
                "{s}: turn {t}'s command: {err}\n{}",
                d.log()
            );
        }
    }
    let files = |s: &str| d.sh(s, "cd /root/work && sha256sum $(ls | sort)");
    let (clean, faulty_files) = (files("clean"), files("faulty"));
    assert_eq!(clean.0, 0, "{}", clean.2);
    assert_eq!(faulty_files, clean, "the run with failures ended elsewhere");
    let log = d.log();
    assert_eq!(
        log.matches("recovered by the coordinator").count(),
        4,
        "each failed session recovered once:\n{log}"
    );
    assert_eq!(
        log.matches("re-issuing the command").count(),
        4,
        "each command the failures broke re-issued:\n{log}"
    );
    assert!(log.contains("adopting a live session"), "{log}");

    // A command in the session that answers differently the second time
    // (as hostile or nondeterministic code would): its re-issue after a
    // failure does not hand the caller a mix of two runs but a broken
    // stream, and the command is logged `diverged`.
    let state = d.state.path().to_owned();
    let run = tokio::task::spawn_blocking(move || {
        exec_in(
            &state,
            "faulty",
            "head -c 8 /dev/urandom | od -An -tx1; sleep 3; echo end",
        )
    });
    until_running(&d, &faulty.id, &["sleep", "3"]).await;
    let now: drums_api::Session = d
        .client
        .json(Method::GET, "/v1/sessions/faulty", None::<&()>)
        .await
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(now.init_pid.unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (code, out, err) = run.await.unwrap();
    assert_ne!(code, 0, "{out}");
    // A stream cut short carries no message: the caller sees it broken,
    // drumsd's log says why.
    assert!(
        !out.contains("end") && err.contains("stream broke"),
        "{out}\n{err}"
    );
    assert!(
        d.log().contains("differs from what the caller had"),
        "{}",
        d.log()
    );
    let journal = drums_catalog::Catalog::open(&d.state.path().join("catalog.db")).unwrap();
    let last = journal.commands(&faulty.id).unwrap().pop().unwrap();
    assert_eq!(last.state, drums_api::CommandState::Diverged, "{last:?}");

    for s in ["clean", "faulty"] {
        d.rm(s).await.unwrap();
    }
    d.stop_and_check_leaks();
}

/// After a recovery, an agent outside its session does not act beside the
/// commands the coordinator runs again (the agent's since the version):
/// its exec and its file read, sent as soon as the session is back, wait
/// for them, and see the state the agent had. The command run again
/// sleeps 3 s before its write, so that both requests arrive in the
/// middle of it; an exec that ran at once found no file (a state the agent
/// never had), which `drums eval` caught as a stray process in 1 run of 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_after_a_recovery_waits_for_the_commands_run_again() {
    let mock = Mock::start();
    let d = TestDaemon::start_with(&["--llm-upstream", &format!("openai={}", mock.url())]);
    let s = d
        .create(&CreateSession {
            name: Some("gated".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    // An agent outside: its first model call takes the base version.
    assert_eq!(
        model_call(d.proxy_local, "gated", "with-delay-100", "go"),
        "echo: go"
    );
    let now_s = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    // Quick now; slow when run again, after `at`.
    let at = now_s() + 2;
    let (code, out, err) = d.sh(
        "gated",
        &format!(
            "mkdir -p /root/work && if [ $(date +%s) -gt {at} ]; then sleep 3; fi; echo line >> /root/work/log && wc -l < /root/work/log"
        ),
    );
    assert_eq!((code, out.as_str()), (0, "1"), "{err}");
    while now_s() <= at + 1 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old = s.init_pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Back: a new init (the coordinator's watch recovered it from the base
    // version, which has no /root/work); its command is being run again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: drums_api::Session = d
            .client
            .json(Method::GET, "/v1/sessions/gated", None::<&()>)
            .await
            .unwrap();
        if now.state == drums_api::SessionState::Running && now.init_pid.is_some_and(|p| p != old) {
            break;
        }
        assert!(Instant::now() < deadline, "not recovered:\n{}", d.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !d.log().contains("ran the commands since the version again"),
        "the command ran again before the requests were sent: the test proves nothing\n{}",
        d.log()
    );
    let state = d.state.path().to_owned();
    let exec = tokio::task::spawn_blocking(move || {
        exec_in(
            &state,
            "gated",
            "cat /root/work/log; wc -l < /root/work/log",
        )
    });
    let read = async {
        let req = hyper::Request::builder()
            .method(Method::GET)
            .uri(format!("/v1/sessions/{}/files?path=/root/work/log", s.id))
            .header("host", "drums")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let resp = d.client.send(req).await.unwrap();
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let (exec, read) = tokio::join!(exec, read);
    let (code, out, err) = exec.unwrap();
    assert_eq!(
        (code, out.as_str()),
        (0, "line\n1"),
        "the exec after the recovery: {err}\n{}",
        d.log()
    );
    assert_eq!(
        (read.0.as_u16(), read.1.as_str()),
        (200, "line\n"),
        "the file read after the recovery\n{}",
        d.log()
    );
    assert_eq!(
        d.log()
            .matches("ran the commands since the version again")
            .count(),
        1,
        "{}",
        d.log()
    );
    let mut d = d;
    d.rm("gated").await.unwrap();
    d.stop_and_check_leaks();
}
