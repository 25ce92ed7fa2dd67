//! `drums bench proxy`: what the coordinator's LLM proxy costs an agent
//! (docs/coordinator.md).
//!
//! The bench serves its own mock of OpenAI's chat completions on
//! 127.0.0.1:`--mock-port` (7090 by default), in this process, so both arms
//! talk to the very same server; drumsd must send OpenAI requests there
//! (`drumsd --llm-upstream openai=http://127.0.0.1:7090`), which the bench
//! checks first. Each arm keeps one HTTP/1.1 connection open, as SDKs do.
//!
//! - Added latency: `n` requests directly to the mock and `n` through the
//!   proxy, interleaved: plain (the whole answer), streamed (time to the
//!   first event), and plain from a session, each request then a turn
//!   boundary (the turn changed nothing, so no version).
//! - Requests per second, 16 sessions at once for 3 s, each request a turn
//!   boundary; and the same 16 workers directly to the mock.
//! - Exposed delay: 16 sessions at once each run `turns` turns (work in the
//!   session, then a streamed answer whose latency follows a log-normal with
//!   Crab's median of 3.34 s); half the sessions' work writes a file (files
//!   versions), the other half's also replaces a process (versions with a
//!   CRIU dump of the session). The time each answer's end was held for its version, from
//!   drumsd's records, and its share of the turns' time.
//!
//! JSON keys, seconds: `plain.{direct,proxy}.{p50,p95}`, `plain.added.p50`
//! (the median of paired differences), the same for `stream` (first event)
//! and `session`; `rps.16.{direct,proxy}`; for `W` in `files` and
//! `processes`: `held.W.{p50,p95}`, `held.W.exposed_share` (held /
//! (upstream + held), all its turns), `held.W.turns`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use drums_api::{Client, CoordinatedTurns, Session};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::net::{TcpListener, TcpStream};

use super::{create, sh, Made};
use crate::exit::{self, Failure};
use crate::stats::put_p50_p95 as put;
use crate::table;
use drums_api::exec::enc;

/// The mock's marker header: the proxy's answer carries it only if drumsd
/// sends OpenAI requests to this bench's mock.
const MARKER: &str = "x-drums-bench-mock";
const SESSIONS: usize = 16;
/// How long the requests-per-second part runs; `DRUMS_BENCH_RPS_SECS`
/// makes it longer for a profile of it (scripts/profile-proxy.sh rps).
fn rps_for() -> Duration {
    let secs = std::env::var("DRUMS_BENCH_RPS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(3);
    Duration::from_secs(secs)
}
/// Crab's median LLM turn.
const MEDIAN_TURN_S: f64 = 3.34;

pub async fn proxy(
    c: &Client,
    n: usize,
    turns: usize,
    at: SocketAddr,
    mock_port: u16,
    as_json: bool,
) -> Result<i32, Failure> {
    let mock = start_mock(mock_port).await?;
    let out = measure(c, n, turns, at, mock, as_json).await?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
    } else {
        print_tables(n, turns, &out);
    }
    Ok(exit::OK)
}

/// The bench's parts against the proxy at `at`, whose drumsd sends OpenAI
/// requests to the mock at `mock` ([`start_mock`]), and then what they made
/// removed, however they ended; also `--ab`'s segments (ab.rs).
pub(crate) async fn measure(
    c: &Client,
    n: usize,
    turns: usize,
    at: SocketAddr,
    mock: SocketAddr,
    as_json: bool,
) -> Result<Value, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    let m = Made::new(c);
    let r = run(&m, n, turns, at, mock, as_json).await;
    m.finish(r).await
}

/// Its sessions are removed by the caller, with what `m` recorded.
async fn run(
    m: &Made<'_>,
    n: usize,
    turns: usize,
    at: SocketAddr,
    mock: SocketAddr,
    as_json: bool,
) -> Result<Value, Failure> {
    let c = m.client();
    let progress = |m: &str| super::progress(as_json, m);
    // The proxy must reach this mock.
    let mut probe = Conn::open(at).await?;
    let (_, marked) = probe.ask("/v1/chat/completions", None, false, 0).await?;
    if !marked {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "drumsd's OpenAI upstream is not this bench's mock: start drumsd with \
                 --llm-upstream openai=http://{mock}"
            ),
        ));
    }
    let mut out = Map::new();
    out.insert("n".into(), json!(n));

    progress("creating sessions");
    let mut live = Vec::new();
    for _ in 0..SESSIONS {
        live.push(create(m, "headless").await?.0);
    }
    let first = live[0].name.clone();

    // Added latency, arms interleaved, the first of each warm-up only.
    for (key, stream, session) in [
        ("plain", false, None),
        ("stream", true, None),
        ("session", false, Some(first.as_str())),
    ] {
        progress(&format!("added latency: {key}"));
        let (mut direct, mut proxied) = (Conn::open(mock).await?, Conn::open(at).await?);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..=n {
            let (x, _) = direct.ask("/v1/chat/completions", None, stream, 0).await?;
            let (y, _) = proxied
                .ask("/v1/chat/completions", session, stream, 0)
                .await?;
            if i > 0 {
                a.push(x.as_secs_f64());
                b.push(y.as_secs_f64());
            }
        }
        let added: Vec<f64> = a.iter().zip(&b).map(|(x, y)| y - x).collect();
        put(&mut out, &format!("{key}.direct"), &a);
        put(&mut out, &format!("{key}.proxy"), &b);
        put(&mut out, &format!("{key}.added"), &added);
    }

    // Requests per second: 16 sessions at once.
    let rps_for = rps_for();
    for (key, via) in [("direct", mock), ("proxy", at)] {
        progress(&format!("requests per second: {key}"));
        let workers = live.iter().map(|s| {
            let name = s.name.clone();
            async move {
                let mut conn = Conn::open(via).await?;
                let (t, mut k) = (Instant::now(), 0u64);
                while t.elapsed() < rps_for {
                    let session = (via == at).then_some(name.as_str());
                    conn.ask("/v1/chat/completions", session, false, 0).await?;
                    k += 1;
                }
                Ok::<u64, Failure>(k)
            }
        });
        let done = futures::future::join_all(workers).await;
        let total: u64 = done
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .sum();
        out.insert(
            format!("rps.{SESSIONS}.{key}"),
            json!(total as f64 / rps_for.as_secs_f64()),
        );
    }

    // Exposed delay: real turns, model latencies drawn from a log-normal
    // around Crab's median. Half the sessions' turns write a file (a files
    // version, milliseconds), the other half's also replace a process (a
    // version with a CRIU dump of the session); both run at once, so
    // they share the engine as agents would.
    progress("exposed delay");
    // This part's records are those of requests it started: drumsd shows
    // only a session's newest 1,000, which the parts before may have
    // filled.
    let since_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let plans: Vec<Vec<u64>> = (0..SESSIONS)
        .map(|_| (0..turns).map(|_| lognormal_ms(&mut rng)).collect())
        .collect();
    let runs = live
        .iter()
        .zip(&plans)
        .enumerate()
        .map(|(k, (s, plan))| async move {
            let mut conn = Conn::open(at).await?;
            for (i, ms) in plan.iter().enumerate() {
                let work = match Work::of(k) {
                    Work::Files => format!("echo {i} > /root/turn"),
                    // The previous turn's process goes, a new one comes.
                    Work::Processes => format!(
                        "echo {i} > /root/turn; kill $(cat /root/worker 2>/dev/null) 2>/dev/null; \
                     sleep 100000 >/dev/null 2>&1 & echo $! > /root/worker"
                    ),
                };
                sh(c, s, &work).await?;
                conn.ask("/v1/chat/completions", Some(&s.name), true, *ms)
                    .await?;
            }
            Ok::<(), Failure>(())
        });
    for r in futures::future::join_all(runs).await {
        r?;
    }
    let mut held: [(Vec<f64>, f64); 2] = Default::default();
    for (k, s) in live.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let r = loop {
            let mut r = records(c, s).await?;
            r.retain(|t| t.started_at_ms >= since_ms);
            if r.len() >= turns || Instant::now() > deadline {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (h, upstream) = &mut held[Work::of(k) as usize];
        for t in r {
            h.push(t.held_ms / 1e3);
            *upstream += t.upstream_ms / 1e3;
        }
    }
    for (w, (h, upstream)) in [Work::Files, Work::Processes].into_iter().zip(&held) {
        let key = format!("held.{}", w.as_str());
        put(&mut out, &key, h);
        let sum: f64 = h.iter().sum();
        out.insert(
            format!("{key}.exposed_share"),
            json!(sum / (upstream + sum)),
        );
        out.insert(format!("{key}.turns"), json!(h.len()));
    }
    if !as_json {
        eprintln!();
    }
    Ok(Value::Object(out))
}

/// What a session's turns do in the exposed-delay part.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// Write a file: a files version.
    Files = 0,
    /// Write a file and replace a process: a version with a CRIU dump.
    Processes = 1,
}

impl Work {
    /// Every other session.
    fn of(session: usize) -> Work {
        if session.is_multiple_of(2) {
            Work::Files
        } else {
            Work::Processes
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Work::Files => "files",
            Work::Processes => "processes",
        }
    }
}

async fn records(c: &Client, s: &Session) -> Result<Vec<drums_api::CoordinatedTurn>, Failure> {
    let t: CoordinatedTurns = c
        .json(
            Method::GET,
            &format!("/v1/sessions/{}/coordinator", enc(&s.id)),
            None::<&()>,
        )
        .await?;
    Ok(t.turns)
}

/// A log-normal draw (σ 0.6) with median [`MEDIAN_TURN_S`], in ms; xorshift
/// and Box–Muller, seeded, so runs compare.
fn lognormal_ms(state: &mut u64) -> u64 {
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 11) as f64 / (1u64 << 53) as f64
    };
    let (u1, u2) = (next().max(1e-12), next());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (MEDIAN_TURN_S * (0.6 * z).exp() * 1e3) as u64
}

/// One kept-alive HTTP/1.1 connection.
struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    async fn open(at: SocketAddr) -> Result<Conn, Failure> {
        let stream = TcpStream::connect(at)
            .await
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("connect to {at}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::new(exit::INTERNAL, format!("handshake with {at}: {e}")))?;
        tokio::spawn(conn);
        Ok(Conn { sender })
    }

    /// A chat completion; how long until the whole answer (plain) or its
    /// first event (`stream`), and whether the mock answered. The rest of a
    /// stream is read too, untimed.
    async fn ask(
        &mut self,
        path: &str,
        session: Option<&str>,
        stream: bool,
        latency_ms: u64,
    ) -> Result<(Duration, bool), Failure> {
        let body = json!({
            "model": format!("latency-{latency_ms}"),
            "stream": stream,
            "messages": [{"role": "user", "content": "hello"}],
        });
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("host", "bench")
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-bench");
        if let Some(s) = session {
            req = req.header("x-drums-session", s);
        }
        let req = req
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let fail = |e: String| Failure::new(exit::INTERNAL, format!("bench request: {e}"));
        let t = Instant::now();
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(fail(format!("answered {}", resp.status())));
        }
        let marked = resp.headers().contains_key(MARKER);
        let mut body = resp.into_body();
        let mut took = None;
        while let Some(f) = body.frame().await {
            let f = f.map_err(|e| fail(e.to_string()))?;
            if f.is_data() && stream && took.is_none() {
                took = Some(t.elapsed());
            }
        }
        Ok((took.unwrap_or_else(|| t.elapsed()), marked))
    }
}

/// The mock: chat completions, plain or streamed (3 events and `[DONE]`,
/// each its own chunk), after the latency its model name asks for.
pub(crate) async fn start_mock(port: u16) -> Result<SocketAddr, Failure> {
    let l = TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("bind the mock to 127.0.0.1:{port}: {e}"),
        )
    })?;
    let at = l.local_addr().expect("bound");
    crate::mock::spawn_server(l, answer);
    Ok(at)
}

type MockBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(req: Request<Incoming>) -> Result<Response<MockBody>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
    let latency = v["model"]
        .as_str()
        .and_then(|m| m.strip_prefix("latency-"))
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let chunk = |content: &str| {
        json!({"id": "b", "object": "chat.completion.chunk", "created": 0, "model": "mock",
               "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    };
    let resp = Response::builder().header(MARKER, "1");
    let resp = if v["stream"].as_bool() == Some(true) {
        let events: Vec<Result<Frame<Bytes>, Infallible>> = ["hel", "lo", "!"]
            .iter()
            .map(|c| format!("data: {}\n\n", chunk(c)))
            .chain(["data: [DONE]\n\n".to_owned()])
            .map(|e| Ok(Frame::data(Bytes::from(e))))
            .collect();
        resp.header("content-type", "text/event-stream")
            .body(BodyExt::boxed(StreamBody::new(futures::stream::iter(
                events,
            ))))
    } else {
        let answer = json!({"id": "b", "object": "chat.completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "hello!"}}]});
        resp.header("content-type", "application/json")
            .body(Full::new(Bytes::from(answer.to_string())).boxed())
    };
    Ok(resp.expect("a valid response"))
}

fn print_tables(n: usize, turns: usize, v: &Value) {
    let s = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let us = |x: f64| format!("{:.0} µs", x * 1e6);
    println!("drums bench proxy -n {n} (direct and through the proxy, interleaved, kept-alive)");
    let rows: Vec<Vec<String>> = [
        ("plain", "plain answer"),
        ("stream", "stream: first event"),
        ("session", "plain, from a session (a turn boundary)"),
    ]
    .iter()
    .map(|(k, what)| {
        vec![
            what.to_string(),
            us(s(&format!("{k}.direct.p50"))),
            us(s(&format!("{k}.proxy.p50"))),
            us(s(&format!("{k}.proxy.p95"))),
            us(s(&format!("{k}.added.p50"))),
            us(s(&format!("{k}.added.p95"))),
        ]
    })
    .collect();
    print!(
        "{}",
        table::render(
            &[
                "request",
                "direct p50",
                "proxy p50",
                "proxy p95",
                "added p50",
                "added p95"
            ],
            &rows
        )
    );
    println!("target: added p50 <= 100 µs");
    println!();
    println!(
        "requests/s, {SESSIONS} sessions at once for {} s: direct {:.0}, through the proxy {:.0} (each a turn boundary)",
        rps_for().as_secs(),
        s(&format!("rps.{SESSIONS}.direct")),
        s(&format!("rps.{SESSIONS}.proxy")),
    );
    println!(
        "exposed delay, {SESSIONS} sessions x {turns} turns at once (model latency log-normal, median {MEDIAN_TURN_S} s):"
    );
    for (w, what) in [
        ("files", "a file written (files versions)"),
        (
            "processes",
            "a file written, a process replaced (versions with a CRIU dump)",
        ),
    ] {
        println!(
            "  {what}: held p50 {:.1} ms, p95 {:.1} ms over {} turns; {:.3}% of the turns' time",
            s(&format!("held.{w}.p50")) * 1e3,
            s(&format!("held.{w}.p95")) * 1e3,
            v[format!("held.{w}.turns")],
            s(&format!("held.{w}.exposed_share")) * 100.0,
        );
    }
}
