//! Issue 23's hostile corpus, the LLM proxy's part: a real drumsd, real
//! sessions, the mock upstream (tests/proxy/mock_llm.py). What a hostile
//! session does to the proxy is refused or contained, drumsd's memory is
//! measured before and after, other sessions are still served, and nothing
//! is left behind. As root; every test ends with the leak check.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::llm::{proxy_dir, Mock};
use common::TestDaemon;
use drums_api::CreateSession;
use serde_json::Value;

/// The sessions' gateway, where the proxy listens for agents inside them.
fn gateway(d: &TestDaemon) -> String {
    d.subnet().replace(".0/24", ".1")
}

/// A field of drumsd's /proc/PID/status, in bytes (`VmRSS`, `VmHWM`).
fn vm(d: &TestDaemon, field: &str) -> u64 {
    let pid = d.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    kib << 10
}

/// drumsd's open file descriptors.
fn fds(d: &TestDaemon) -> usize {
    let pid = d.child.as_ref().unwrap().id();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// One model call from inside session `s` through its gateway: the status,
/// the answer's body, and the seconds it took, as the caller saw them.
fn call_inside(d: &TestDaemon, s: &str, text: &str) -> (u16, String, f64) {
    let gw = gateway(d);
    let script = format!(
        "python3 -c \"import http.client,json,time;t=time.time();\
         c=http.client.HTTPConnection('{gw}',{},timeout=60);\
         c.request('POST','/v1/chat/completions',json.dumps({{'model':'m','messages':[{{'role':'user','content':'{text}'}}]}}),\
         {{'content-type':'application/json'}});r=c.getresponse();b=r.read().decode();\
         print(r.status, round(time.time()-t,3), b)\"",
        drums_api::LLM_PROXY_PORT
    );
    let (code, out, err) = d.sh(s, &script);
    assert_eq!(code, 0, "a model call from {s}: {err}");
    let mut it = out.splitn(3, ' ');
    let status = it.next().unwrap().parse().unwrap();
    let secs = it.next().unwrap().parse().unwrap();
    (status, it.next().unwrap_or("").to_owned(), secs)
}

const MIB: u64 = 1 << 20;

/// 64 connections (the most drumsd takes from one address) from inside a
/// session, each a model request whose body comes fast up to 8 MiB and then a
/// byte every half second: 512 MiB offered, and connections held forever.
/// Without the proxy's controls drumsd buffered all of it, and held every
/// connection as long as the session liked. Now:
/// - the session's bodies together stay within its memory budget
///   (`--llm-proxy-session-memory`, 128 MiB by default): requests past it are
///   refused at once (429 `over_budget`), and drumsd's peak RSS grows by at
///   most the budget and 64 MiB more (hyper's buffers, allocator slack);
/// - the rest are cut off at the body deadline (`--llm-proxy-body-timeout`,
///   8 s here) with 408 `too_slow`;
/// - meanwhile another session's model call is answered in under 5 s;
/// - afterwards drumsd holds no more descriptors than before, the flooding
///   session's budget is all given back (its own next call is served), and
///   nothing is left on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_flooding_the_proxy_with_64_slow_uploads_is_contained() {
    const CONNS: usize = 64;
    const FAST_MIB: u64 = 8;
    const BUDGET: u64 = drums_coordinator::DEFAULT_SESSION_MEMORY as u64;
    const DEADLINE_S: f64 = 8.0;
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&[
        "--llm-upstream",
        &format!("openai={}", mock.url()),
        "--llm-proxy-body-timeout",
        "8",
    ]);
    for name in ["flood", "calm"] {
        d.create(&CreateSession {
            name: Some(name.into()),
            ..Default::default()
        })
        .await
        .unwrap();
        // The first call of each: its base version, and whatever drumsd
        // allocates once, before the measurement.
        let (status, body, _) = call_inside(&d, name, "warm");
        assert_eq!(status, 200, "{body}");
    }
    // The peak from here on: 5 resets VmHWM to the current RSS (proc(5)).
    let pid = d.child.as_ref().unwrap().id();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let rss_before = vm(&d, "VmRSS");
    let fds_before = fds(&d);

    let script = std::fs::read_to_string(proxy_dir().join("flood.py")).unwrap();
    let (code, _, err) = d.sh(
        "flood",
        &format!(
            "cat > /root/flood.py <<'PYEOF'\n{script}\nPYEOF\n\
             nohup python3 /root/flood.py {} {} {CONNS} {FAST_MIB} /root/flood.json > /root/flood.log 2>&1 &",
            gateway(&d),
            drums_api::LLM_PROXY_PORT
        ),
    );
    assert_eq!(code, 0, "{err}");
    let wait_for = |file: &'static str, secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if d.sh("flood", &format!("test -e /root/{file}")).0 == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no /root/{file} after {secs} s: {}",
                d.sh("flood", "cat /root/flood.log").1
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for("flood.json.ready", 60);

    // Every connection has sent its fast part or was refused; those within
    // the budget are held until their deadline. Another session meanwhile:
    let (status, body, secs) = call_inside(&d, "calm", "still served");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("echo: still served"), "{body}");
    assert!(
        secs < 5.0,
        "the calm session waited {secs} s during the flood"
    );

    wait_for("flood.json", 120);
    let (_, out, _) = d.sh("flood", "cat /root/flood.json");
    let results: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(results.len(), CONNS);
    let status = |r: &Value| r["status"].clone();
    let cut_off: Vec<&Value> = results.iter().filter(|r| status(r) == 408).collect();
    let refused: Vec<&Value> = results.iter().filter(|r| status(r) == 429).collect();
    // A chunked body refused part-way is closed on with its rest unread:
    // the kernel may reset the connection before the 429 is read.
    let reset: Vec<&Value> = results
        .iter()
        .filter(|r| status(r) == "reset" && r["chunked"] == true)
        .collect();
    assert_eq!(
        cut_off.len() + refused.len() + reset.len(),
        CONNS,
        "every connection is refused or cut off: {results:#?}"
    );
    assert!(!cut_off.is_empty() && !refused.is_empty(), "{results:#?}");
    for r in &cut_off {
        let s = r["seconds"].as_f64().unwrap();
        assert!(
            (DEADLINE_S - 1.0..DEADLINE_S + 10.0).contains(&s),
            "cut off after {s} s, the deadline is {DEADLINE_S} s: {r}"
        );
    }
    // What the proxy read of the held ones fits the budget.
    let held: u64 = cut_off.iter().map(|r| r["sent"].as_u64().unwrap()).sum();
    assert!(
        held <= BUDGET + CONNS as u64 * MIB,
        "{held} bytes held: {results:#?}"
    );

    let hwm = vm(&d, "VmHWM");
    let rss_after = vm(&d, "VmRSS");
    let grew = hwm.saturating_sub(rss_before);
    eprintln!(
        "drumsd: VmRSS {} MiB before, {} MiB after, peak {} MiB during the flood (offered {} MiB)",
        rss_before / MIB,
        rss_after / MIB,
        hwm / MIB,
        CONNS as u64 * FAST_MIB
    );
    let bound = BUDGET + 64 * MIB;
    assert!(
        grew <= bound,
        "drumsd's peak RSS grew by {} MiB, the bound is {} MiB",
        grew / MIB,
        bound / MIB
    );
    assert!(
        rss_after.saturating_sub(rss_before) <= bound,
        "drumsd's RSS grew by {} MiB and stayed",
        rss_after.saturating_sub(rss_before) / MIB
    );

    // Nothing held: drumsd's descriptors are back (connections may take a
    // moment to close), and the flooding session's budget is all given back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fds(&d) > fds_before + 2 {
        assert!(
            Instant::now() < deadline,
            "drumsd holds {} descriptors, {fds_before} before the flood",
            fds(&d)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body, _) = call_inside(&d, "flood", "after");
    assert_eq!(status, 200, "{body}");

    for name in ["flood", "calm"] {
        d.rm(name).await.unwrap();
    }
    d.stop_and_check_leaks();
}

/// An upstream that counts its connections and answers each request 200.
struct Counting {
    at: SocketAddr,
    seen: Arc<AtomicUsize>,
}

impl Counting {
    fn start() -> Counting {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let n = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                n.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                );
            }
        });
        Counting { at, seen }
    }
}

/// A raw request to the proxy: its status and body.
fn raw(at: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut c = TcpStream::connect(at).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {out:?}"));
    (status, out)
}

/// Only the LLM APIs' methods and paths under /v1/ are forwarded: dot
/// segments, percent-encoded ones, other methods and other paths get a
/// clear 400/404/405 and nothing reaches the upstream (issue 23, item 8e).
/// An upstream with a path prefix is where `..` would have climbed out.
#[test]
fn only_the_llm_apis_paths_reach_the_upstream() {
    let up = Counting::start();
    let mut d =
        TestDaemon::start_with(&["--llm-upstream", &format!("openai=http://{}/api", up.at)]);
    let at = d.proxy_local;
    // The proxy listens a moment after the API socket.
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(at).is_err() {
        assert!(
            Instant::now() < deadline,
            "the proxy never listened on {at}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (method, path, status, kind) in [
        ("GET", "/v1/../admin", 400, "bad_path"),
        ("GET", "/v1/models/..", 400, "bad_path"),
        ("GET", "/v1/./models", 400, "bad_path"),
        ("GET", "/v1/%2e%2e/admin", 400, "bad_path"),
        ("GET", "/v1/%2E%2e/%2e%2E/admin", 400, "bad_path"),
        ("POST", "/v1/chat%2fcompletions", 400, "bad_path"),
        ("GET", "/v1//models", 400, "bad_path"),
        ("GET", "/admin", 404, "not_found"),
        ("GET", "/", 404, "not_found"),
        ("GET", "/v2/models", 404, "not_found"),
        ("PUT", "/v1/models", 405, "method_not_allowed"),
        ("PATCH", "/v1/chat/completions", 405, "method_not_allowed"),
        ("OPTIONS", "/v1/models", 405, "method_not_allowed"),
    ] {
        let (got, out) = raw(at, method, path);
        assert_eq!(got, status, "{method} {path}: {out}");
        assert!(
            out.contains(&format!("x-drums-proxy-error: {kind}")),
            "{method} {path}: {out}"
        );
    }
    assert_eq!(
        up.seen.load(Ordering::SeqCst),
        0,
        "a refused request reached the upstream"
    );
    // What the APIs use still goes, so the counter does count.
    let (got, out) = raw(at, "GET", "/v1/models");
    assert_eq!(got, 200, "{out}");
    assert_eq!(up.seen.load(Ordering::SeqCst), 1);
    d.stop_and_check_leaks();
}

/// A session's exchange log is held to its budget (`--llm-journal-rows`,
/// here 4): an agent outside (by header) makes model calls, each turn
/// writing a file, so each turn's end becomes a version. Exchanges before
/// the oldest version left are pruned, never one a rollback or recovery can
/// still fast-forward through; once the versions retention keeps (8) need
/// more rows than the budget, new calls are refused with 429 `journal_full`,
/// and nothing was pruned that a version needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exchange_log_is_held_to_its_budget_without_losing_a_recoverable_version() {
    const ROWS: u64 = 4;
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&[
        "--llm-upstream",
        &format!("openai={}", mock.url()),
        "--llm-journal-rows",
        &ROWS.to_string(),
    ]);
    let s = d
        .create(&CreateSession {
            name: Some("agent".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let journal = drums_catalog::Catalog::open(&d.state.path().join("catalog.db")).unwrap();
    let call = |text: &str| {
        let mut c = TcpStream::connect(d.proxy_local).unwrap();
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}]}}"#);
        write!(
            c,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\
             x-drums-session: agent\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    };
    let mut refused = None;
    for i in 0..20 {
        let out = call(&format!("turn {i}"));
        if out.starts_with("HTTP/1.1 429") {
            refused = Some((i, out));
            break;
        }
        assert!(out.starts_with("HTTP/1.1 200"), "call {i}: {out}");
        let (code, _, err) = d.sh("agent", &format!("echo {i} > /root/f{i}"));
        assert_eq!(code, 0, "{err}");
        // Every version the session has that the log knows is still there
        // to fast-forward from: nothing from its place on was pruned.
        let len = journal.exchanges_len(&s.id).unwrap();
        let versions: drums_api::SessionVersions = d
            .client
            .json(
                hyper::Method::GET,
                &format!("/v1/sessions/{}/versions", s.id),
                None::<&()>,
            )
            .await
            .unwrap();
        for v in &versions.versions {
            if let Some(at) = journal.exchange_of_version(&s.id, &v.id).unwrap() {
                for seq in at..len {
                    assert!(
                        journal.exchange(&s.id, seq).unwrap().is_some(),
                        "call {i}: exchange {seq} of version {} was pruned",
                        v.id
                    );
                }
            }
        }
        let (rows, _) = journal.exchanges_size(&s.id).unwrap();
        assert!(rows <= 8 + 1, "call {i}: {rows} rows kept");
    }
    let (i, out) = refused.expect("the journal never filled: no call was refused");
    assert!(i > ROWS as usize, "refused already at call {i}");
    assert!(
        out.contains("x-drums-proxy-error: journal_full") && out.contains("--llm-journal-rows"),
        "{out}"
    );
    d.rm("agent").await.unwrap();
    d.stop_and_check_leaks();
}

/// Run SQL on drumsd's catalog from outside (python3's sqlite3, as an
/// operator's tool or a failing disk would change it under drumsd).
fn catalog_sql(d: &TestDaemon, sql: &str) {
    let o = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1],timeout=10)\nc.execute(sys.argv[2])\nc.commit()",
        ])
        .arg(d.state.path().join("catalog.db"))
        .arg(sql)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A caller on the bridge whose address the catalog cannot look up is
/// refused (500 `lookup_failed`), not served as the host (issue 23, item
/// 8a). The lookup is made to fail by a session row drumsd cannot read
/// (an `init_pid` that is no number), then the row is put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_the_catalog_cannot_place_is_refused_not_served_as_the_host() {
    let mock = Mock::start();
    let mut d = TestDaemon::start_with(&["--llm-upstream", &format!("openai={}", mock.url())]);
    let s = d
        .create(&CreateSession {
            name: Some("agent".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let pid = s.init_pid.expect("a running session has an init");
    // The call runs in the session while the row is unreadable: started
    // before the row is broken would need the catalog to start it.
    let gw = gateway(&d);
    let (code, _, err) = d.sh(
        "agent",
        &format!(
            "cat > /root/call.sh <<'EOF'\n\
             sleep 2; python3 -c \"import http.client,json;c=http.client.HTTPConnection('{gw}',{},timeout=30);\
             c.request('POST','/v1/chat/completions',json.dumps({{'model':'m','messages':[{{'role':'user','content':'who'}}]}}),{{'content-type':'application/json'}});\
             r=c.getresponse();print(r.status, r.getheader('x-drums-proxy-error'), r.read().decode())\" > /root/call.out 2>&1\n\
             EOF\n\
             nohup sh /root/call.sh > /dev/null 2>&1 &",
            drums_api::LLM_PROXY_PORT
        ),
    );
    assert_eq!(code, 0, "{err}");
    catalog_sql(
        &d,
        &format!(
            "UPDATE sessions SET init_pid = 'not-a-pid' WHERE id = '{}'",
            s.id
        ),
    );
    std::thread::sleep(Duration::from_secs(5));
    catalog_sql(
        &d,
        &format!("UPDATE sessions SET init_pid = {pid} WHERE id = '{}'", s.id),
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let out = loop {
        let (_, out, _) = d.sh("agent", "cat /root/call.out 2>/dev/null");
        if !out.is_empty() {
            break out;
        }
        assert!(Instant::now() < deadline, "the call never ended");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(out.starts_with("500 lookup_failed "), "{out}");
    assert!(out.contains("look up the session of address"), "{out}");
    // Readable again: the same call is the session's own.
    let (status, body, _) = call_inside(&d, "agent", "me");
    assert_eq!(status, 200, "{body}");
    d.rm("agent").await.unwrap();
    d.stop_and_check_leaks();
}
