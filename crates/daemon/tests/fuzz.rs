//! The API fuzzed from its spec: schemathesis (installed by scripts/setup.sh)
//! generates requests from `api/openapi.yaml`, valid and invalid, sends them
//! to a real drumsd, and checks every answer against the spec: status codes,
//! content types, bodies, no 5xx for a client's mistake, invalid input
//! refused and valid input accepted. Afterwards everything the fuzzer made is
//! removed through the API, and nothing may be left: no session, checkpoint,
//! catalog row or host resource.
//!
//! Bounded: a fixed number of examples per operation (tests/fuzz/schemathesis.toml)
//! and a time limit; a fixed seed, so a run is repeatable and CI does not fail
//! on a newly drawn input. Explore further with DRUMS_FUZZ_SEED=N,
//! DRUMS_FUZZ_EXAMPLES=N and DRUMS_FUZZ_WORKERS=2; the known failures are
//! listed, each with its reason, in tests/fuzz/drums_fuzz_hooks.py.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{run, TestDaemon};
use hyper::Method;

/// The seed CI runs with.
const SEED: &str = "1";
/// Seconds the fuzzer runs: its fuzzing phase repeats until they are spent.
const MAX_TIME: &str = "180";

#[test]
fn the_api_answers_as_its_spec_says_under_fuzzing() {
    let st = schemathesis();
    // All sessions together get 2 GiB and 8192 tasks, whatever limits the
    // fuzzer asks for; each one gets drumsd's defaults unless it asks.
    // Pulls reach no registry but a closed port on loopback: the fuzzer's
    // references name hosts on the internet.
    let mut d = TestDaemon::start_with(&[
        "--sessions-memory",
        "2G",
        "--sessions-pids",
        "8192",
        "--allowed-registries",
        "127.0.0.1:1",
    ]);
    let proxy = Loopback::start(d.client.socket());
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../api/openapi.yaml");
    let work = tempfile::tempdir().unwrap();
    let tally_path = work.path().join("tally.json");
    let seed = std::env::var("DRUMS_FUZZ_SEED").unwrap_or_else(|_| SEED.into());
    let mut cmd = Command::new(&st);
    cmd.arg("--config-file")
        .arg(here.join("schemathesis.toml"))
        .arg("run")
        .arg(&spec)
        .args(["--url", &format!("http://{}", proxy.addr)])
        .args(["--seed", &seed, "--max-time", MAX_TIME, "--no-color"])
        .args(["--report", "ndjson", "--report-dir"])
        .arg(work.path())
        .env("PYTHONPATH", &here)
        .env("DRUMS_FUZZ_TALLY", &tally_path)
        .env("DRUMS_FUZZ_URL", format!("http://{}", proxy.addr))
        .current_dir(work.path());
    if let Ok(n) = std::env::var("DRUMS_FUZZ_EXAMPLES") {
        cmd.args(["--max-examples", &n]);
    }
    if let Ok(n) = std::env::var("DRUMS_FUZZ_WORKERS") {
        cmd.args(["--workers", &n]);
    }
    let started = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tally: serde_json::Value = std::fs::read_to_string(&tally_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    eprintln!(
        "fuzz: seed {seed}, {:.0} s, {} requests to {} operations; by status {}; \
         pruned {}; known failures dropped {}",
        started.elapsed().as_secs_f64(),
        tally["requests"],
        tally["by_operation"].as_object().map_or(0, |o| o.len()),
        tally["by_status"],
        tally["pruned"],
        tally["known_dropped"],
    );
    assert!(
        out.status.success(),
        "schemathesis found failures (seed {seed}):\n{stdout}\n{}\n--- drumsd log (tail) ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&d.log(), 80)
    );
    assert_eq!(
        tally["prune_failures"],
        serde_json::json!([]),
        "removing the fuzzer's oldest sessions or checkpoints failed"
    );
    // Every operation of the spec was reached, but the stream that only ends
    // with its session (excluded in schemathesis.toml).
    let reached = tally["by_operation"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let missed: Vec<_> = common::spec_operations()
        .into_iter()
        .filter(|(_, _, op)| op["operationId"].as_str() != Some("streamTurns"))
        .map(|(m, p, _)| format!("{} {p}", m.to_uppercase()))
        .filter(|label| !reached.contains_key(label))
        .collect();
    assert!(
        missed.is_empty(),
        "the fuzzer never sent {missed:?}\n{stdout}"
    );

    run(async { remove_everything(&d).await });
    assert_nothing_left(&d);
    drop(proxy);
    d.stop_and_check_leaks();
}

/// The fuzzer's sessions and checkpoints, removed through the API: each
/// removal must succeed.
async fn remove_everything(d: &TestDaemon) {
    let sessions: drums_api::SessionList = d
        .client
        .json(Method::GET, "/v1/sessions", None::<&()>)
        .await
        .unwrap();
    for s in &sessions.sessions {
        d.rm(&s.id)
            .await
            .unwrap_or_else(|e| panic!("remove session {}: {e}\n{}", s.id, d.log()));
    }
    let cks: drums_api::CheckpointList = d
        .client
        .json(Method::GET, "/v1/checkpoints", None::<&()>)
        .await
        .unwrap();
    for c in &cks.checkpoints {
        d.client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", c.id),
                None::<&()>,
            )
            .await
            .unwrap_or_else(|e| panic!("remove checkpoint {}: {e}\n{}", c.id, d.log()));
    }
    eprintln!(
        "fuzz: removed {} session(s) and {} checkpoint(s) the fuzzer left",
        sessions.sessions.len(),
        cks.checkpoints.len()
    );
    d.assert_no_session_left("after the fuzz").await;
}

/// With the daemon still running: no row in the catalog (hidden ones too),
/// no checkpoint directory, nothing in the store, no ledger entry but the
/// daemon's own.
fn assert_nothing_left(d: &TestDaemon) {
    let state = d.state.path();
    let c = drums_catalog::Catalog::open(&state.join("catalog.db")).unwrap();
    let sessions: Vec<_> = c.sessions().unwrap().into_iter().map(|s| s.id).collect();
    assert!(sessions.is_empty(), "session rows left: {sessions:?}");
    let cks: Vec<_> = c
        .versions()
        .unwrap()
        .into_iter()
        .map(|c| format!("{} {} ({})", c.id, c.name, c.state))
        .collect();
    assert!(cks.is_empty(), "checkpoint rows left: {cks:?}");
    let rows: Vec<_> = c
        .all_resources()
        .unwrap()
        .into_iter()
        .filter(|r| r.owner != drums_session::manager::DAEMON)
        .collect();
    assert!(rows.is_empty(), "ledger rows left: {rows:?}");
    for dir in [
        "checkpoints",
        "store/checkpoints",
        "store/sessions",
        "sessions",
    ] {
        let left: Vec<_> = std::fs::read_dir(state.join(dir))
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{dir} not empty: {left:?}");
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<_> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// schemathesis in the virtualenv scripts/setup.sh makes.
fn schemathesis() -> PathBuf {
    let state = std::env::var("DRUMS_STATE_DIR").unwrap_or_else(|_| "/var/lib/drums".into());
    let st = Path::new(&state).join("cache/schemathesis/bin/st");
    assert!(
        st.exists(),
        "{} missing: run scripts/setup.sh (it installs schemathesis into a virtualenv). NOT SKIPPED",
        st.display()
    );
    st
}

/// A loopback TCP port that forwards each connection to drumsd's unix socket:
/// schemathesis speaks TCP only, and drumsd serves its root-only socket alone.
/// The forward lives as long as the test, on a port it picks.
struct Loopback {
    addr: std::net::SocketAddr,
    _rt: tokio::runtime::Runtime,
}

impl Loopback {
    fn start(socket: &Path) -> Loopback {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let socket = socket.to_owned();
        rt.spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let socket = socket.clone();
                tokio::spawn(async move {
                    if let Ok(unix) = tokio::net::UnixStream::connect(&socket).await {
                        forward(&mut tcp, unix).await;
                    }
                });
            }
        });
        Loopback { addr, _rt: rt }
    }
}

/// Both directions of one connection, each on its own. drumsd may answer
/// (a 404, say) without reading a request's body and close: writing the rest
/// of the body then fails with EPIPE, and `copy_bidirectional` gave up on the
/// whole connection, answer unsent, which schemathesis reported as "connection
/// aborted". The answer is in the socket's buffer all the same.
async fn forward(tcp: &mut tokio::net::TcpStream, unix: tokio::net::UnixStream) {
    use tokio::io::AsyncWriteExt;
    let (mut tcp_r, mut tcp_w) = tcp.split();
    let (mut unix_r, mut unix_w) = unix.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut tcp_r, &mut unix_w).await;
        let _ = unix_w.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut unix_r, &mut tcp_w).await;
        let _ = tcp_w.shutdown().await;
    };
    tokio::join!(up, down);
}
