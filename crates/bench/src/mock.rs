//! The mock LLM upstream: OpenAI's chat completions, answering each request
//! with the tool calls of the trace's next turn after the turn's latency.
//! The evaluation's model; [`spawn_server`] serves the proxy bench's too.
//!
//! It is stateless, as a model is: the trace is the request's `model`
//! (`trace/NAME`, or `trace/NAME@RUN` to tell runs apart), and the turn is
//! the number of assistant messages the conversation already holds. An agent that replays its history after a
//! fresh start, or drumsd's fast-forward of an agent in a session, so gets
//! the same answers again.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// What the mock answers for one trace (the evaluation makes it of its
/// trace format): its turns, in order.
#[derive(Debug, Clone)]
pub struct Script {
    pub name: String,
    pub turns: Vec<Step>,
}

/// One turn of a [`Script`]: how long the model takes, and the shell
/// commands it calls.
#[derive(Debug, Clone)]
pub struct Step {
    pub latency_ms: u64,
    pub commands: Vec<String>,
}

/// The `model` prefix naming a trace.
pub const MODEL_PREFIX: &str = "trace/";

/// The tool the mock's answers call: one shell command per call.
pub const TOOL: &str = "shell";

/// How long the mock takes to answer a turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// The trace's own latency times this factor.
    Scaled(f64),
    /// The same for every turn.
    Fixed(Duration),
    /// Drawn from the corpus's latencies, by a hash of the seed, the trace
    /// and the turn: the same turn waits the same time in every run.
    Sampled { seed: u64 },
}

/// The error is clap's message for `--latency` (no source to keep).
impl std::str::FromStr for Latency {
    type Err = String;
    fn from_str(s: &str) -> Result<Latency, String> {
        let bad = || format!("latency {s:?}: use trace, trace*F, fixed:MS or sampled");
        if s == "trace" {
            return Ok(Latency::Scaled(1.0));
        }
        if let Some(f) = s.strip_prefix("trace*") {
            let f: f64 = f.parse().map_err(|_| bad())?;
            return (f > 0.0 && f <= 10.0)
                .then_some(Latency::Scaled(f))
                .ok_or_else(bad);
        }
        if let Some(ms) = s.strip_prefix("fixed:") {
            let ms: u64 = ms.parse().map_err(|_| bad())?;
            return Ok(Latency::Fixed(Duration::from_millis(ms)));
        }
        if s == "sampled" {
            return Ok(Latency::Sampled { seed: 0 });
        }
        Err(bad())
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Latency::Scaled(x) if *x == 1.0 => write!(f, "the traces' own"),
            Latency::Scaled(x) => write!(f, "the traces' own x{x}"),
            Latency::Fixed(d) => write!(f, "fixed {} ms", d.as_millis()),
            Latency::Sampled { seed } => write!(f, "sampled from the corpus (seed {seed})"),
        }
    }
}

/// A request of a model, as it arrived at the mock or was answered.
#[derive(Debug, Clone)]
pub struct Event {
    pub model: String,
    /// The turn it asks for (0-based).
    pub turn: usize,
    pub answered: bool,
}

pub struct Mock {
    traces: HashMap<String, Script>,
    /// Each request as it arrives and as it is answered (how the eval
    /// times a fault for an agent it does not drive).
    arrivals: tokio::sync::broadcast::Sender<Event>,
    latency: Latency,
    /// Every latency of the corpus, sorted, for `Latency::Sampled`.
    pool: Vec<u64>,
    /// How long the mock itself took over each (model, turn), from the
    /// request's head to its answer: the model's time in the proxy's
    /// overhead, timer slack included. The last request of each wins.
    served: std::sync::Mutex<HashMap<(String, usize), Duration>>,
}

impl Mock {
    pub fn new(traces: &[Script], latency: Latency) -> Mock {
        let mut pool: Vec<u64> = traces
            .iter()
            .flat_map(|t| t.turns.iter().map(|u| u.latency_ms))
            .collect();
        pool.sort_unstable();
        Mock {
            traces: traces.iter().map(|t| (t.name.clone(), t.clone())).collect(),
            arrivals: tokio::sync::broadcast::channel(1024).0,
            latency,
            pool,
            served: Default::default(),
        }
    }

    /// The requests that arrive, and are answered, from now on.
    pub fn arrivals(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.arrivals.subscribe()
    }

    /// How long turn `turn` (0-based; `turns.len()` is the final answer) of
    /// the trace named `name` takes.
    pub fn latency(&self, name: &str, turn: usize) -> Duration {
        match self.traces.get(name) {
            Some(trace) => self.latency_of(trace, turn),
            None => self.latency_of(
                &Script {
                    name: name.to_owned(),
                    turns: Vec::new(),
                },
                turn,
            ),
        }
    }

    fn latency_of(&self, trace: &Script, turn: usize) -> Duration {
        let own = trace
            .turns
            .get(turn)
            .or(trace.turns.last())
            .map_or(0, |t| t.latency_ms);
        match self.latency {
            Latency::Scaled(f) => Duration::from_secs_f64(own as f64 * f / 1000.0),
            Latency::Fixed(d) => d,
            Latency::Sampled { seed } => {
                let h = fnv(&[
                    &seed.to_le_bytes(),
                    trace.name.as_bytes(),
                    &turn.to_le_bytes(),
                ]);
                let ms = self.pool.get(h as usize % self.pool.len().max(1)).copied();
                Duration::from_millis(ms.unwrap_or(own))
            }
        }
    }

    /// How long the mock took to answer the last request of `model` for
    /// `turn`.
    pub fn served(&self, model: &str, turn: usize) -> Option<Duration> {
        let served = self.served.lock().expect("served map");
        served.get(&(model.to_owned(), turn)).copied()
    }

    async fn answer(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let head = std::time::Instant::now();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let (status, v) = match serde_json::from_slice::<Value>(&body) {
            Ok(v) => match self.reply(&v) {
                Ok((wait, answer)) => {
                    let event = |answered| Event {
                        model: v["model"].as_str().unwrap_or_default().to_owned(),
                        turn: answer["id"]
                            .as_str()
                            .and_then(|i| i.rsplit_once('-'))
                            .and_then(|(_, t)| t.parse().ok())
                            .unwrap_or(0),
                        answered,
                    };
                    let e = event(false);
                    let _ = self.arrivals.send(e.clone());
                    tokio::time::sleep(wait).await;
                    let _ = self.arrivals.send(event(true));
                    self.served
                        .lock()
                        .expect("served map")
                        .insert((e.model, e.turn), head.elapsed());
                    (StatusCode::OK, answer)
                }
                Err(why) => (StatusCode::NOT_FOUND, error(&why)),
            },
            Err(e) => (StatusCode::BAD_REQUEST, error(&format!("body: {e}"))),
        };
        Ok(Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .expect("response"))
    }

    /// The answer to a chat completions request, and how long to wait. The
    /// error is the text of the mock model's 404 body, as a model's API
    /// says it: a wire message, not a failure of the bench.
    pub fn reply(&self, v: &Value) -> Result<(Duration, Value), String> {
        let model = v["model"].as_str().unwrap_or_default();
        let name = model
            .strip_prefix(MODEL_PREFIX)
            .map(|n| n.split_once('@').map_or(n, |(n, _)| n))
            .ok_or_else(|| format!("model {model:?} names no trace ({MODEL_PREFIX}NAME)"))?;
        let trace = self
            .traces
            .get(name)
            .ok_or_else(|| format!("no trace {name:?}"))?;
        let turn = v["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
        let message = match trace.turns.get(turn) {
            Some(t) => {
                let calls: Vec<Value> = t
                    .commands
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        json!({"id": format!("call_{turn}_{i}"), "type": "function",
                               "function": {"name": TOOL,
                                            "arguments": json!({"command": c}).to_string()}})
                    })
                    .collect();
                json!({"role": "assistant", "content": null, "tool_calls": calls})
            }
            None => json!({"role": "assistant", "content": "done"}),
        };
        let finish = if message["tool_calls"].is_array() {
            "tool_calls"
        } else {
            "stop"
        };
        let answer = json!({
            "id": format!("chatcmpl-{name}-{turn}"), "object": "chat.completion",
            "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        });
        Ok((self.latency_of(trace, turn), answer))
    }
}

/// Serves `mock` on 127.0.0.1 (an ephemeral port) until the runtime ends.
pub async fn serve(mock: Arc<Mock>) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(("127.0.0.1", 0)).await?;
    let at = l.local_addr()?;
    spawn_server(l, move |r| {
        let me = mock.clone();
        async move { me.answer(r).await }
    });
    Ok(at)
}

/// Answers each connection to `l` with `answer`, HTTP/1.1, until the
/// runtime ends. No Nagle: a mock's answers are small, and a delayed one
/// would be counted as the model's or the proxy's time.
pub fn spawn_server<F, Fut, B>(l: TcpListener, answer: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            let answer = answer.clone();
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), hyper::service::service_fn(answer)),
            );
        }
    });
}

fn error(message: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "code": null}})
}

/// [`fnv`] of a string.
pub fn fnv_str(s: &str) -> u64 {
    fnv(&[s.as_bytes()])
}

/// FNV-1a: a stable hash (std's is randomly keyed per process).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
    }
    h
}
