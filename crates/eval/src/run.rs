//! One trace run: the scripted agent outside the sandbox asks the mock model
//! through drumsd's LLM proxy (`/s/SESSION/v1/chat/completions`), runs each
//! tool call with drumsd's exec API, and meets the faults of its plan while
//! the model thinks; the operator then recovers as the strategy says. At
//! the end the run's state is observed: the files under /root/task, the
//! session's live processes, the trace's `observe` and its `check`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use drums_api::{Client, CoordinatedTurn, CoordinatedTurns, ExecRequest, Session, TurnClass};
use http_body_util::{BodyExt, Full};
use hyper::Method;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{json, Value};

use crate::daemon::{Drumsd, Handle};
use crate::fault::{Fault, Kind};
use crate::strategy::Strategy;
use crate::trace::{Needs, Trace};
use crate::upstream::{Mock, MODEL_PREFIX, TOOL};
use crate::EvalError;

/// The task's directory in the session.
pub const TASK_DIR: &str = "/root/task";

/// How long a recovery, a restart or a retried request may take.
const PATIENCE: Duration = Duration::from_secs(120);

/// One request of the agent to its model, as the agent and drumsd saw it.
#[derive(Debug, Clone, Serialize)]
pub struct TurnRow {
    /// The model's turn it asked for (0-based); it ended turn `request - 1`
    /// of the trace, whose label is `label`.
    pub request: usize,
    pub label: Option<TurnClass>,
    /// The inspector's class of the turn it ended, from drumsd's record.
    pub class: Option<TurnClass>,
    /// What the turn's end took (`none`, `files`, `process`, `full`, ...).
    pub decision: Option<String>,
    pub version_bytes: u64,
    /// Of the version's bytes, those shared with an earlier version's
    /// images rather than written.
    pub version_shared_bytes: u64,
    /// How long its answer was held for the version.
    pub held_ms: f64,
    /// From the upstream's end to the answer's release: the hold and the
    /// rest of the turn's end (the delay drums added after the model's).
    pub release_ms: f64,
    /// The model's own time (the mock's wait).
    pub latency_ms: f64,
    /// The mock's time for it as the mock measured it: the wait and the
    /// timer's slack.
    pub upstream_ms: f64,
    /// From sending it to its whole answer, at the agent.
    pub rtt_ms: f64,
    /// What the proxy added besides the release: `rtt - upstream - release`.
    pub overhead_us: f64,
    /// From sending it to sending the next request (the turn's time).
    pub turn_ms: f64,
    /// The fault injected while the model thought about it.
    pub fault: Option<Kind>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub request: usize,
    pub kind: Kind,
    /// The session's processes died (a drumsd killed leaves them running).
    pub lost: bool,
    /// A checkpoint fault: drumsd was killed with a version in flight
    /// (otherwise at the same moment without one).
    pub mid_checkpoint: bool,
    /// From the fault to the session running again.
    pub recovery_ms: f64,
}

/// What the run left, compared with the fault-free run's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Observation {
    pub files: String,
    pub processes: String,
    pub observe: String,
    pub check: String,
}

impl Observation {
    /// The first line where `self` differs from `reference`, and in which
    /// part (None when they are equal).
    pub fn first_difference(&self, reference: &Observation) -> Option<String> {
        let parts = [
            ("files", &self.files, &reference.files),
            ("processes", &self.processes, &reference.processes),
            ("observe", &self.observe, &reference.observe),
            ("check", &self.check, &reference.check),
        ];
        parts.into_iter().find_map(|(part, got, want)| {
            let mut got_lines = got.lines();
            let mut want_lines = want.lines();
            for n in 1.. {
                match (want_lines.next(), got_lines.next()) {
                    (None, None) => return None,
                    (w, g) if w == g => continue,
                    (w, g) => {
                        let show = |l: Option<&str>| {
                            l.map_or("(nothing)".to_owned(), |l| format!("`{}`", clip(l)))
                        };
                        return Some(format!(
                            "{part}, line {n}: the fault-free run has {}, this run {}",
                            show(w),
                            show(g)
                        ));
                    }
                }
            }
            None
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// `reference` (fault-free, checkpoint-free) or the strategy's name.
    pub phase: String,
    pub trace: String,
    pub needs: Needs,
    pub seed: u64,
    pub faults: Vec<FaultRecord>,
    pub turns: Vec<TurnRow>,
    pub wall_s: f64,
    /// Checkpoint bytes of every version its sessions took: written.
    pub bytes: u64,
    /// And shared on disk with an earlier version's images instead.
    pub shared_bytes: u64,
    /// Times the agent started over (restart).
    pub restarts: usize,
    pub observed: Option<Observation>,
    /// The check passed and the state equals the fault-free run's.
    pub correct: Option<bool>,
    pub error: Option<String>,
    /// Where the state it left first differs from the fault-free run's,
    /// when it does: why a run whose check passed is still not correct.
    pub differs: Option<String>,
}

/// One run to make: a trace, under a strategy (none: the reference), with
/// the faults of its plan.
pub struct Job<'a> {
    pub trace: &'a Trace,
    pub strategy: Option<Strategy>,
    pub seed: u64,
    pub faults: Vec<Fault>,
    /// The agent lives in the session (the `openai` SDK one) instead of
    /// acting through the API from outside.
    pub inside: bool,
}

impl Job<'_> {
    fn phase(&self) -> String {
        let p = self.strategy.map_or("reference", Strategy::name);
        if self.inside {
            format!("{p} (agent inside)")
        } else {
            p.into()
        }
    }

    fn session_name(&self) -> String {
        let tag = self.strategy.map_or("rf", Strategy::tag);
        let inside = if self.inside { "i" } else { "" };
        let mut n = format!("{inside}{tag}{}-{}", self.seed, self.trace.name);
        n.truncate(63);
        n
    }
}

/// Runs `job` through drumsd `h` (whose policy is the strategy's); `d`, the
/// daemon itself, is needed for the faults that kill it.
pub async fn run(mock: &Mock, h: &Handle, d: Option<&mut Drumsd>, job: &Job<'_>) -> RunResult {
    let t0 = Instant::now();
    let mut r = RunResult {
        phase: job.phase(),
        trace: job.trace.name.clone(),
        needs: job.trace.needs,
        seed: job.seed,
        faults: Vec::new(),
        turns: Vec::new(),
        wall_s: 0.0,
        bytes: 0,
        shared_bytes: 0,
        restarts: 0,
        observed: None,
        correct: None,
        error: None,
        differs: None,
    };
    let mut cx = Ctx {
        mock,
        h,
        d,
        name: job.session_name(),
    };
    let mut records = Vec::new();
    let out = if job.inside {
        drive_inside(&mut cx, job, &mut r).await
    } else {
        drive(&mut cx, job, &mut r, &mut records).await
    };
    let name = cx.name;
    // Whatever happened, the run's records, then its session, go.
    if let Ok(mut rs) = coordinator_records(&h.client, &name).await {
        records.append(&mut rs);
    }
    if let Err(e) = remove(&h.client, &name).await {
        r.error.get_or_insert(format!("remove session {name}: {e}"));
    }
    if let Err(e) = out {
        r.error = Some(drums_api::error_chain(&e));
    }
    r.wall_s = t0.elapsed().as_secs_f64();
    if job.inside {
        r.turns = rows_of(&records, job.trace);
    } else {
        join_records(&mut r.turns, &records);
    }
    r.bytes = records.iter().filter_map(|t| t.version_bytes).sum();
    r.shared_bytes = records.iter().filter_map(|t| t.version_shared_bytes).sum();
    r
}

/// What a run works with: the mock model, the drumsd
/// of its worker (and, for the faults that kill it, the daemon itself), and
/// its session's name.
struct Ctx<'a> {
    mock: &'a Mock,
    h: &'a Handle,
    d: Option<&'a mut Drumsd>,
    name: String,
}

/// The agent's loop, and the operator's recoveries.
async fn drive(
    cx: &mut Ctx<'_>,
    job: &Job<'_>,
    r: &mut RunResult,
    records: &mut Vec<CoordinatedTurn>,
) -> Result<(), EvalError> {
    let trace = job.trace;
    let (h, mock, name) = (cx.h, cx.mock, cx.name.clone());
    let name = name.as_str();
    fresh_session(&h.client, name, trace, None).await?;
    let mut messages = opening(trace);
    let mut fired = vec![false; job.faults.len()];
    // (row index, send time) of the previous request, for its turn time.
    let mut previous: Option<(usize, Instant)> = None;
    loop {
        let request = messages.iter().filter(|m| m["role"] == "assistant").count();
        let fault = job
            .faults
            .iter()
            .enumerate()
            .find(|(i, f)| f.request == request && !fired[*i])
            .map(|(i, f)| {
                fired[i] = true;
                *f
            });
        let checkpointing = job.strategy.is_some_and(Strategy::drumsd_recovers);
        if let (Some(f), true) = (fault, checkpointing) {
            if f.kind == Kind::Checkpoint {
                arm_hold(&h.client, &trace.turns[request - 1].class).await?;
            }
        }
        let latency = mock.latency(&trace.name, request);
        // The session's name tells this run's requests from another's of
        // the same trace at the mock (which times them).
        let model = format!("{MODEL_PREFIX}{}@{name}", trace.name);
        let body = json!({"model": model, "messages": messages, "tools": [tool()]});
        let sent = Instant::now();
        if let Some((i, at)) = previous {
            r.turns[i].turn_ms = ms(sent - at);
        }
        let proxy = h.proxy;
        let (answer, injected) = match fault {
            None => (ask(proxy, name, &body).await, None),
            Some(f) => {
                let (a, i) = tokio::join!(
                    ask(proxy, name, &body),
                    inject(cx, f, latency, checkpointing)
                );
                (a, Some(i?))
            }
        };
        let rtt = sent.elapsed();
        let answer = answer?;
        r.turns.push(TurnRow {
            request,
            label: request
                .checked_sub(1)
                .and_then(|t| trace.turns.get(t))
                .map(|t| t.class),
            class: None,
            decision: None,
            version_bytes: 0,
            version_shared_bytes: 0,
            held_ms: 0.0,
            release_ms: 0.0,
            latency_ms: ms(latency),
            upstream_ms: mock.served(&model, request).map_or(ms(latency), ms),
            rtt_ms: ms(rtt),
            overhead_us: 0.0,
            turn_ms: ms(rtt),
            fault: fault.map(|f| f.kind),
        });
        previous = Some((r.turns.len() - 1, sent));
        if let Some(rec) = injected {
            let lost = rec.lost;
            r.faults.push(rec);
            if lost && !checkpointing {
                // The operator's recovery without versions: a new sandbox.
                records.append(
                    &mut coordinator_records(&h.client, name)
                        .await
                        .unwrap_or_default(),
                );
                remove(&h.client, name).await?;
                fresh_session(&h.client, name, trace, None).await?;
                if job.strategy == Some(Strategy::Restart) {
                    messages = opening(trace);
                    r.restarts += 1;
                    continue;
                }
            }
        }
        let message = answer["choices"][0]["message"].clone();
        let calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages.push(message);
        if calls.is_empty() {
            break;
        }
        for call in calls {
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("{}"))
                    .unwrap_or_default();
            let cmd = args["command"].as_str().unwrap_or_default();
            let (code, out) = sh(&h.client, name, cmd, TASK_DIR).await?;
            messages.push(json!({"role": "tool", "tool_call_id": call["id"],
                                 "content": format!("exit {code}\n{}", clip(&out))}));
        }
    }
    r.observed = Some(observe(&h.client, name, trace).await?);
    Ok(())
}

/// The conversation's start: the system prompt and the task.
fn opening(trace: &Trace) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a shell agent. Use the shell tool; the task is in /root/task."}),
        json!({"role": "user", "content": trace.summary}),
    ]
}

fn tool() -> Value {
    json!({"type": "function", "function": {"name": TOOL,
        "description": "Run a shell command in /root/task",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}})
}

/// Creates the session (of `image`, the default one if none) and lays out
/// the task.
async fn fresh_session(
    c: &Client,
    name: &str,
    trace: &Trace,
    image: Option<&str>,
) -> Result<Session, EvalError> {
    let s: Session = c
        .json(
            Method::POST,
            "/v1/sessions",
            Some(&drums_api::CreateSession {
                name: Some(name.into()),
                image: image.map(Into::into),
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| EvalError::api(format!("create session {name}"), e))?;
    for cmd in &trace.setup {
        let (code, out) = sh(c, name, cmd, "/root").await?;
        if code != 0 {
            return Err(EvalError::Trace(format!(
                "trace {}: setup command failed with {code}: {cmd}\n{}",
                trace.name,
                clip(&out)
            )));
        }
    }
    Ok(s)
}

/// The agent that lives in its session (`agent/agent.py`).
const AGENT: &str = include_str!("../agent/agent.py");
/// Where the inside agent says it is done, in its session.
const DONE_FILE: &str = "/opt/drums-eval/done";

/// How long an agent inside may take for its whole trace.
const INSIDE_PATIENCE: Duration = Duration::from_secs(1800);

/// The agent inside: the eval puts it into the session and starts it, then
/// only watches the mock model for its requests, to inject the run's
/// faults while the model thinks, until the agent says it is done.
async fn drive_inside(cx: &mut Ctx<'_>, job: &Job<'_>, r: &mut RunResult) -> Result<(), EvalError> {
    let trace = job.trace;
    let (h, mock, name) = (cx.h, cx.mock, cx.name.clone());
    let name = name.as_str();
    let s = fresh_session(&h.client, name, trace, Some("agent")).await?;
    // The proxy listens on the bridge's address, the first of the subnet.
    let ip =
        s.ip.as_deref()
            .and_then(|ip| ip.rsplit_once('.'))
            .map(|(net, _)| format!("{net}.1:{}", drums_api::LLM_PROXY_PORT))
            .ok_or_else(|| EvalError::Trace(format!("session {name} has no address")))?;
    let model = format!("{MODEL_PREFIX}{}@{name}", trace.name);
    let install = format!(
        "mkdir -p /opt/drums-eval && cat > /opt/drums-eval/agent.py <<'PYEOF'\n{AGENT}\nPYEOF"
    );
    let (code, out) = sh(&h.client, name, &install, "/").await?;
    if code != 0 {
        return Err(EvalError::Trace(format!(
            "install the agent: {}",
            clip(&out)
        )));
    }
    let mut arrivals = mock.arrivals();
    let start = format!(
        "cd / && setsid python3 /opt/drums-eval/agent.py {ip} {model} {} \
         > /opt/drums-eval/agent.log 2>&1 < /dev/null &",
        quote(&trace.summary)
    );
    sh(&h.client, name, &start, "/").await?;
    let mut fired = vec![false; job.faults.len()];
    let deadline = Instant::now() + INSIDE_PATIENCE;
    let mut poll = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            e = arrivals.recv() => {
                let e = match e {
                    Ok(e) => e,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                };
                if e.model != model {
                    continue;
                }
                // The request after this answer's turn gets a checkpoint
                // fault: armed now, before its version is submitted.
                let next = e.turn + 1;
                if e.answered {
                    if let Some(f) = job.faults.iter().find(|f| f.request == next) {
                        if f.kind == Kind::Checkpoint {
                            arm_hold(&h.client, &trace.turns[next - 1].class).await?;
                        }
                    }
                    continue;
                }
                let Some(i) = job
                    .faults
                    .iter()
                    .enumerate()
                    .position(|(i, f)| f.request == e.turn && !fired[i])
                else {
                    continue;
                };
                fired[i] = true;
                let latency = mock.latency(&trace.name, e.turn);
                let rec = inject(cx, job.faults[i], latency, true).await?;
                r.faults.push(rec);
            }
            _ = poll.tick() => {
                // Looked for from the host, through the session's root: an
                // exec would be a request to drumsd open while a version
                // is dumped, which CRIU cannot checkpoint.
                let init = session(&h.client, name).await.ok().and_then(|s| s.init_pid);
                if init.is_some_and(|p| agent_done(Path::new(&format!("/proc/{p}/root")))) {
                    break;
                }
                if Instant::now() > deadline {
                    let log = sh(&h.client, name, "tail -20 /opt/drums-eval/agent.log", "/").await?.1;
                    return Err(EvalError::Model(format!(
                        "the agent in {name} did not finish within {INSIDE_PATIENCE:?}: {log}"
                    )));
                }
            }
        }
    }
    r.observed = Some(observe(&h.client, name, trace).await?);
    Ok(())
}

/// The inside agent's done-file is in the session whose root is `root`,
/// resolved as the session would (its symlinks stay inside it: the session
/// is not trusted with a path on the host).
fn agent_done(root: &Path) -> bool {
    drums_sys::open_in_root(root, Path::new(DONE_FILE), nix::fcntl::OFlag::O_PATH).is_ok()
}

/// A string as one word of `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The rows of an agent the eval did not drive: one per answered request
/// drumsd recorded, by its place in the exchange log.
fn rows_of(records: &[CoordinatedTurn], trace: &Trace) -> Vec<TurnRow> {
    records
        .iter()
        .filter(|t| t.status == 200 && !t.client_gone)
        .map(|t| {
            let request = t.seq.unwrap_or(0) as usize;
            TurnRow {
                request,
                label: request
                    .checked_sub(1)
                    .and_then(|i| trace.turns.get(i))
                    .map(|u| u.class),
                class: t.class,
                decision: Some(t.decision.clone()),
                version_bytes: t.version_bytes.unwrap_or(0),
                version_shared_bytes: t.version_shared_bytes.unwrap_or(0),
                held_ms: t.held_ms,
                release_ms: t.release_ms,
                latency_ms: 0.0,
                upstream_ms: t.upstream_ms,
                rtt_ms: t.upstream_ms + t.release_ms,
                overhead_us: 0.0,
                turn_ms: 0.0,
                fault: None,
            }
        })
        .collect()
}

async fn remove(c: &Client, name: &str) -> Result<(), EvalError> {
    match c
        .call(
            Method::DELETE,
            &format!("/v1/sessions/{}", drums_api::exec::enc(name)),
            None::<&()>,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(drums_api::ClientError::Api { status: 404, .. }) => Ok(()),
        Err(e) => Err(EvalError::api(format!("remove session {name}"), e)),
    }
}

async fn coordinator_records(c: &Client, name: &str) -> Result<Vec<CoordinatedTurn>, EvalError> {
    let t: CoordinatedTurns = c
        .json(
            Method::GET,
            &format!("/v1/sessions/{}/coordinator", drums_api::exec::enc(name)),
            None::<&()>,
        )
        .await
        .map_err(|e| EvalError::api(format!("coordinator records of {name}"), e))?;
    Ok(t.turns)
}

/// The environment every command of a trace runs with (docs/eval.md).
fn env() -> BTreeMap<String, String> {
    [
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("LC_ALL", "C"),
        ("HOME", "/root"),
        ("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z"),
        ("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z"),
        ("SOURCE_DATE_EPOCH", "1767225600"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// `sh -c cmd` in the session: exit code and output (stdout then stderr).
pub async fn sh(c: &Client, name: &str, cmd: &str, cwd: &str) -> Result<(i32, String), EvalError> {
    run_argv(c, name, &["sh", "-c", cmd], cwd).await
}

async fn run_argv(
    c: &Client,
    name: &str,
    argv: &[&str],
    cwd: &str,
) -> Result<(i32, String), EvalError> {
    let req = ExecRequest {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env: env(),
        cwd: Some(cwd.into()),
        user: None,
        timeout_ms: Some(120_000),
        ..Default::default()
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let st = drums_api::exec(c, name, &req, |s, b| match s {
        drums_api::Stream::Stdout => out.extend_from_slice(b),
        drums_api::Stream::Stderr => err.extend_from_slice(b),
    })
    .await
    .map_err(|e| EvalError::Exec {
        command: argv.join(" "),
        source: e,
    })?;
    out.extend_from_slice(&err);
    let code = st.code.unwrap_or(128 + st.signal.unwrap_or(0));
    Ok((code, String::from_utf8_lossy(&out).into_owned()))
}

/// Asks the model through the proxy, on a connection of its own. A refused
/// connection or a broken exchange (drumsd killed and coming back) is
/// tried again, as the SDKs do, within [`PATIENCE`].
async fn ask(proxy: SocketAddr, session: &str, body: &Value) -> Result<Value, EvalError> {
    let deadline = Instant::now() + PATIENCE;
    let path = format!("/s/{session}/v1/chat/completions");
    let body = Bytes::from(body.to_string());
    loop {
        let why = match exchange(proxy, &path, body.clone()).await {
            Ok((200, v)) => return Ok(v),
            // The proxy's own refusals while a session is recovered, and a
            // daemon that is not up yet.
            Ok((status @ (409 | 502 | 503), v)) => format!("{status}: {v}"),
            Ok((status, v)) => {
                return Err(EvalError::Model(format!("{path}: {status}: {v}")));
            }
            Err(e) => drums_api::error_chain(&e),
        };
        if Instant::now() > deadline {
            return Err(EvalError::Model(format!(
                "{path}: no answer within {PATIENCE:?}: {why}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One exchange with the model through the proxy, that broke.
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    #[error("connect {proxy}")]
    Connect {
        proxy: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("handshake")]
    Handshake(#[source] hyper::Error),
    #[error("send")]
    Send(#[source] hyper::Error),
    #[error("answer")]
    Answer(#[source] hyper::Error),
    #[error("answer is no JSON")]
    Json(#[source] serde_json::Error),
}

async fn exchange(
    proxy: SocketAddr,
    path: &str,
    body: Bytes,
) -> Result<(u16, Value), ExchangeError> {
    let s = tokio::net::TcpStream::connect(proxy)
        .await
        .map_err(|source| ExchangeError::Connect { proxy, source })?;
    let _ = s.set_nodelay(true);
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .map_err(ExchangeError::Handshake)?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", proxy.to_string())
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("request");
    let resp = send.send_request(req).await.map_err(ExchangeError::Send)?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(ExchangeError::Answer)?
        .to_bytes();
    let v = serde_json::from_slice(&bytes).map_err(ExchangeError::Json)?;
    Ok((status, v))
}

/// Arms drumsd to hold the coming version's step for a checkpoint fault:
/// before CRIU's dump if the turn changed processes, else before the
/// version's manifest.
async fn arm_hold(c: &Client, class: &TurnClass) -> Result<(), EvalError> {
    let point = if class.processes() {
        "checkpoint.criu"
    } else {
        "version.manifest"
    };
    c.call(
        Method::POST,
        "/v1/debug/faults",
        Some(&drums_api::Fault {
            point: Some(point.into()),
            hold: true,
        }),
    )
    .await
    .map_err(|e| EvalError::api(format!("arm the fault {point}"), e))?;
    Ok(())
}

/// Injects `f` while the model thinks, then waits until the session runs
/// again (when drumsd recovers it) or is dead (when the operator replaces
/// it).
async fn inject(
    cx: &mut Ctx<'_>,
    f: Fault,
    latency: Duration,
    checkpointing: bool,
) -> Result<FaultRecord, EvalError> {
    let (h, name) = (cx.h, cx.name.clone());
    let name = name.as_str();
    let before = session(&h.client, name).await?;
    let mut mid_checkpoint = false;
    match f.kind {
        Kind::Checkpoint if checkpointing => {
            // Until the held version shows up, at most the model's time.
            let until = Instant::now() + latency.max(Duration::from_secs(3));
            while Instant::now() < until {
                if in_flight(&h.client, name).await {
                    mid_checkpoint = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        _ => tokio::time::sleep(latency / 2).await,
    }
    let t = Instant::now();
    match f.kind {
        Kind::Processes => {
            let pid = before
                .init_pid
                .ok_or_else(|| EvalError::Fault(format!("session {name} has no init to kill")))?;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .map_err(|e| EvalError::Fault(format!("kill the init {pid} of {name}: {e}")))?;
        }
        Kind::Drumsd | Kind::Checkpoint => match cx.d.as_deref_mut() {
            Some(d) => d.kill9_and_restart().await?,
            None => return Err(EvalError::Fault("no daemon to kill".into())),
        },
    }
    // A killed drumsd leaves its sessions running, and the next one adopts
    // them (docs/sessions.md): only killed processes need a recovery, by
    // drumsd from a version or by the operator with a new sandbox.
    let killed = f.kind == Kind::Processes;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = session(&h.client, name).await.ok();
        let done = match &now {
            Some(s) if checkpointing || !killed => {
                s.state == drums_api::SessionState::Running
                    && s.init_pid
                        .is_some_and(|p| alive(p) && (!killed || Some(p) != before.init_pid))
            }
            Some(_) => !before.init_pid.is_some_and(alive),
            None => !checkpointing,
        };
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err(EvalError::Fault(format!(
                "session {name} did not come back within {PATIENCE:?} after a {} fault (drumsd {})",
                f.kind.as_str(),
                h.client.socket().display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(FaultRecord {
        request: f.request,
        kind: f.kind,
        lost: killed,
        mid_checkpoint,
        recovery_ms: ms(t.elapsed()),
    })
}

async fn session(c: &Client, name: &str) -> Result<Session, EvalError> {
    c.json(
        Method::GET,
        &format!("/v1/sessions/{}", drums_api::exec::enc(name)),
        None::<&()>,
    )
    .await
    .map_err(|e| EvalError::api(format!("session {name}"), e))
}

/// A version of the session is being taken (held by the armed fault).
async fn in_flight(c: &Client, name: &str) -> bool {
    let v: Result<drums_api::SessionVersions, _> = c
        .json(
            Method::GET,
            &format!("/v1/sessions/{}/versions", drums_api::exec::enc(name)),
            None::<&()>,
        )
        .await;
    v.is_ok_and(|v| {
        v.versions.iter().any(|v| {
            matches!(
                v.state,
                drums_api::VersionState::Dumping | drums_api::VersionState::Versioning
            )
        })
    })
}

/// A host pid that is alive and no zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_owned()))
        .is_some_and(|r| !r.starts_with('Z') && !r.starts_with('X'))
}

/// The session's state as a recovery must bring it back: each file and
/// link under /root/task (type, mode, content's digest; a git index only
/// by size, since it holds stat data), and the command lines of its live
/// processes but drums' own and this probe's.
const PROBE: &str = r#"
import hashlib, os, sys
root = "/root/task"
for d, dirs, files in os.walk(root):
    dirs.sort()
    for n in sorted(dirs + files):
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, root)
        if os.path.islink(p):
            print("L", rel, os.readlink(p))
        elif os.path.isdir(p):
            print("D", rel, oct(st.st_mode & 0o7777))
        elif os.path.isfile(p) and n == "index" and os.path.basename(d) == ".git":
            # git's index holds stat data (times, inodes) of each entry.
            print("F", rel, oct(st.st_mode & 0o7777), st.st_size)
        elif os.path.isfile(p):
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()
            print("F", rel, oct(st.st_mode & 0o7777), st.st_size, h)
        else:
            print("O", rel, oct(st.st_mode))
print("--")
me = {os.getpid(), os.getppid()}
procs = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) in me:
        continue
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    state = stat.rsplit(")", 1)[1].split()[0]
    # drums' own, and the eval's agent when it lives in the session.
    if state in "ZX" or not cmd or "drums-" in cmd.split(" ")[0] or "/opt/drums-eval/" in cmd:
        continue
    procs.append(cmd)
print("\n".join(sorted(procs)))
"#;

async fn observe(c: &Client, name: &str, trace: &Trace) -> Result<Observation, EvalError> {
    let (code, state) = run_argv(c, name, &["python3", "-c", PROBE], "/").await?;
    if code != 0 {
        return Err(EvalError::Trace(format!(
            "the state probe failed with {code}: {}",
            clip(&state)
        )));
    }
    let (files, processes) = state.split_once("--\n").unwrap_or((&state, ""));
    let observe = match &trace.observe {
        Some(cmd) => sh(c, name, cmd, TASK_DIR).await?.1,
        None => String::new(),
    };
    let check = sh(c, name, &trace.check, TASK_DIR).await?.1;
    Ok(Observation {
        files: files.to_owned(),
        processes: processes.to_owned(),
        observe,
        check: check.trim().to_owned(),
    })
}

/// Fills each row with drumsd's record of its request. Rows and answered
/// records are both in request order; a request that a killed drumsd was
/// answering left no answered record (its retry did), so they pair up.
fn join_records(rows: &mut [TurnRow], records: &[CoordinatedTurn]) {
    let answered = records.iter().filter(|t| t.status == 200 && !t.client_gone);
    for (row, t) in rows.iter_mut().zip(answered) {
        row.class = t.class;
        row.decision = Some(t.decision.clone());
        row.version_bytes = t.version_bytes.unwrap_or(0);
        row.version_shared_bytes = t.version_shared_bytes.unwrap_or(0);
        row.held_ms = t.held_ms;
        row.release_ms = t.release_ms;
        row.overhead_us = ((row.rtt_ms - row.upstream_ms - row.release_ms) * 1000.0).max(0.0);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A command's output as the model sees it: the first 4 KiB.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(4096);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_that_differs_says_where() {
        let o = |files: &str, processes: &str| Observation {
            files: files.into(),
            processes: processes.into(),
            observe: String::new(),
            check: "1".into(),
        };
        let want = o("D a 0o755\nF a/b 0o644 3 ab\n", "python3 server.py\n");
        assert_eq!(want.first_difference(&want), None);
        let d = o("D a 0o755\nF a/b 0o644 4 cd\n", "python3 server.py\n")
            .first_difference(&want)
            .unwrap();
        assert!(d.starts_with("files, line 2:"), "{d}");
        assert!(
            d.contains("`F a/b 0o644 3 ab`") && d.contains("`F a/b 0o644 4 cd`"),
            "{d}"
        );
        let d = o(&want.files, "").first_difference(&want).unwrap();
        assert_eq!(
            d,
            "processes, line 1: the fault-free run has `python3 server.py`, this run (nothing)"
        );
    }

    /// A hostile session's done-file that is a symlink to a file of the
    /// host's is resolved inside the session, where it names nothing.
    #[test]
    fn the_done_file_is_looked_for_inside_the_session() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("opt/drums-eval");
        std::fs::create_dir_all(&dir).unwrap();
        let host = tempfile::NamedTempFile::new().unwrap();
        assert!(host.path().is_absolute() && host.path().exists());
        std::os::unix::fs::symlink(host.path(), dir.join("done")).unwrap();
        assert!(!agent_done(root.path()), "followed a symlink to the host");
        // Escaping by `..` stays inside too.
        std::fs::remove_file(dir.join("done")).unwrap();
        let up = "../".repeat(20) + host.path().to_str().unwrap().trim_start_matches('/');
        std::os::unix::fs::symlink(&up, dir.join("done")).unwrap();
        assert!(!agent_done(root.path()), "followed `..` out of the session");
        // The agent's own file is found.
        std::fs::remove_file(dir.join("done")).unwrap();
        std::fs::write(dir.join("done"), "").unwrap();
        assert!(agent_done(root.path()));
    }
}
