//! `drums eval`: the evaluation of selective checkpointing (docs/eval.md).
//! `drums-eval` is its program; `drums eval` runs it.
//!
//! - `cli`: its command line;
//! - `trace`: the trace format and the corpus compiled in;
//! - `upstream`: the mock model, answering with a trace's tool calls;
//! - `daemon`: one drumsd per worker, with the strategy's turn policy;
//! - `strategy`, `fault`: the five strategies, and the seeded fault plan;
//! - `run`: one trace run by the agent outside the sandbox;
//! - `density`: many sessions at once, against a checkpoint-free run;
//! - `report`: results.json, summary.md; `plots`: the figures.

pub mod cli;
pub mod daemon;
pub mod density;
pub mod fault;
pub mod plots;
pub mod report;
pub mod run;
pub mod strategy;
pub mod trace;
pub mod upstream;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use strategy::Strategy;
pub use upstream::Latency;

use crate::daemon::{Drumsd, Setup};
use crate::run::{Job, RunResult};
use crate::trace::Trace;
use crate::upstream::Mock;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: drums_api::ClientError,
    },
    #[error("run {command:?}")]
    Exec {
        command: String,
        #[source]
        source: drums_api::ExecError,
    },
    #[error("drumsd: {0}")]
    Daemon(String),
    #[error("the model: {0}")]
    Model(String),
    #[error("fault: {0}")]
    Fault(String),
    #[error("{0}")]
    Trace(String),
    #[error(transparent)]
    Traces(#[from] trace::TraceError),
    #[error("plots")]
    Plots(#[from] plots::PlotError),
    #[error("{0}")]
    Usage(String),
    /// The evaluation ran, and its own assertions failed.
    #[error("the evaluation's assertions failed:\n{0}")]
    Assertions(String),
}

impl EvalError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> EvalError {
        EvalError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }

    pub(crate) fn api(what: String, source: drums_api::ClientError) -> EvalError {
        EvalError::Api { what, source }
    }
}

/// The traces `--quick` runs the strategies on: each kind of work, and
/// each of what a recovery must bring back.
pub const QUICK_TRACES: usize = 8;

#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    pub out: PathBuf,
    pub seed: u64,
    pub latency: Latency,
    /// Workers (one drumsd each) running traces at once.
    pub workers: usize,
    /// Runs of each trace per strategy, each with its own fault plan.
    pub runs: usize,
    /// Faults per run.
    pub faults: usize,
    pub strategies: Vec<Strategy>,
    /// Only these traces (all when empty).
    pub traces: Vec<String>,
    pub densities: Vec<usize>,
    /// Also run the agent that lives in its session (needs the `agent`
    /// image).
    pub inside: bool,
    pub bin_dir: PathBuf,
    pub images_dir: PathBuf,
}

impl Options {
    /// `--quick`: minutes, for CI; otherwise the full run (under an hour on
    /// two cores).
    pub fn new(quick: bool, out: PathBuf, bin_dir: PathBuf, images_dir: PathBuf) -> Options {
        Options {
            quick,
            out,
            seed: 1,
            latency: if quick {
                Latency::Fixed(std::time::Duration::from_millis(300))
            } else {
                Latency::Scaled(1.0)
            },
            workers: if quick { 4 } else { 8 },
            runs: if quick { 1 } else { 2 },
            faults: if quick { 2 } else { 4 },
            strategies: Strategy::ALL.to_vec(),
            traces: Vec::new(),
            densities: if quick { vec![1, 4] } else { vec![1, 4, 16, 0] },
            inside: true,
            bin_dir,
            images_dir,
        }
    }
}

/// Prints what the evaluation does, as it goes.
pub fn progress(m: &str) {
    eprintln!("eval: {m}");
}

/// Everything one `drums eval` found.
#[derive(Debug, serde::Serialize)]
pub struct Outcome {
    pub runs: Vec<RunResult>,
    pub density: Vec<density::DensityResult>,
    /// What stopped part of the evaluation (a worker's drumsd that died).
    pub failed: Vec<String>,
}

/// Runs the evaluation and writes its output into `opts.out`; fails if its
/// own assertions do not hold (after writing what it found).
pub async fn eval(opts: &Options) -> Result<report::Summary, EvalError> {
    let corpus = trace::corpus()?;
    let chosen: Vec<Trace> = if opts.traces.is_empty() {
        corpus.clone()
    } else {
        let mut v = Vec::new();
        for n in &opts.traces {
            let t = corpus
                .iter()
                .find(|t| &t.name == n)
                .ok_or_else(|| EvalError::Usage(format!("no trace named {n:?}")))?;
            v.push(t.clone());
        }
        v
    };
    // The strategies' traces: all of them, or under --quick a few that
    // cover each need, the stateful first.
    let strategy_traces: Vec<Trace> = if opts.quick && opts.traces.is_empty() {
        quick_subset(&chosen)
    } else {
        chosen.clone()
    };
    std::fs::create_dir_all(&opts.out).map_err(|e| EvalError::io("create", &opts.out, e))?;
    sweep_work_dirs();
    let work = tempfile::Builder::new()
        .prefix(&format!("drums-eval-{}-", daemon::tag()))
        .tempdir_in("/var/tmp")
        .map_err(|e| EvalError::io("create a work directory in", Path::new("/var/tmp"), e))?;
    let scripts: Vec<_> = corpus.iter().map(upstream::script).collect();
    let mock = Arc::new(Mock::new(&scripts, opts.latency));
    let upstream = upstream::serve(mock.clone())
        .await
        .map_err(|e| EvalError::io("serve the mock model on", Path::new("127.0.0.1"), e))?;
    let setup = Setup {
        bin_dir: opts.bin_dir.clone(),
        images_dir: opts.images_dir.clone(),
        upstream,
        work: work.path().to_owned(),
        logs: opts.out.join("logs"),
        net: daemon::free_net()?,
    };
    progress(&format!(
        "{} traces ({} for the strategies), {} worker(s), latency {}, seed {}, output {}",
        chosen.len(),
        strategy_traces.len(),
        opts.workers,
        opts.latency,
        opts.seed,
        opts.out.display()
    ));

    // The fault-free, checkpoint-free reference of every trace: the state
    // each strategy must end in, and the replayed class of every turn.
    progress("reference: every trace without faults or checkpoints");
    let jobs: Vec<Job> = chosen
        .iter()
        .map(|t| Job {
            trace: t,
            strategy: None,
            seed: 0,
            faults: Vec::new(),
            inside: false,
        })
        .collect();
    let mut failed = Vec::new();
    let (mut runs, e) = run_jobs(&setup, &mock, drums_api::Policy::Off, opts.workers, jobs).await;
    failed.extend(e);
    let reference: HashMap<String, run::Observation> = runs
        .iter()
        .filter_map(|r| Some((r.trace.clone(), r.observed.clone()?)))
        .collect();

    for s in &opts.strategies {
        progress(&format!(
            "{}: {} trace(s) x {} run(s), {} fault(s) each",
            s.name(),
            strategy_traces.len(),
            opts.runs,
            opts.faults
        ));
        let mut jobs = Vec::new();
        for k in 0..opts.runs as u64 {
            for t in &strategy_traces {
                let seed = opts.seed + k;
                jobs.push(Job {
                    trace: t,
                    strategy: Some(*s),
                    seed,
                    faults: fault::plan(t, seed, opts.faults),
                    inside: false,
                });
            }
        }
        let (mut done, e) = run_jobs(&setup, &mock, s.policy(), opts.workers, jobs).await;
        failed.extend(e);
        judge(&mut done, &reference);
        runs.append(&mut done);
    }

    // The agent inside its session, under drums' default, on the same
    // traces and the first run's faults.
    if opts.inside {
        progress(&format!(
            "selective, the agent inside its session (openai SDK): {} trace(s), {} fault(s) each",
            strategy_traces.len(),
            opts.faults
        ));
        let jobs = strategy_traces
            .iter()
            .map(|t| Job {
                trace: t,
                strategy: Some(Strategy::Selective),
                seed: opts.seed,
                faults: fault::plan(t, opts.seed, opts.faults),
                inside: true,
            })
            .collect();
        let (mut done, e) = run_jobs(
            &setup,
            &mock,
            drums_api::Policy::Selective,
            opts.workers,
            jobs,
        )
        .await;
        failed.extend(e);
        judge(&mut done, &reference);
        runs.append(&mut done);
    }

    let density = match density::run(&setup, &mock, &strategy_traces, opts).await {
        Ok(d) => d,
        Err(e) => {
            failed.push(format!("density: {}", drums_api::error_chain(&e)));
            Vec::new()
        }
    };
    let outcome = Outcome {
        runs,
        density,
        failed,
    };
    let summary = report::write(opts, &chosen, &outcome)?;
    drop(work);
    if summary.failures.is_empty() {
        Ok(summary)
    } else {
        Err(EvalError::Assertions(summary.failures.join("\n")))
    }
}

/// Work directories of evals that were killed (a signal ends the eval
/// before it removes its own; its daemons stop with it, by their parent
/// death signal): each whose eval is not running and under which nothing
/// is mounted goes.
fn sweep_work_dirs() {
    let Ok(dir) = std::fs::read_dir("/var/tmp") else {
        return;
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let evals: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"eval"))
        })
        .map(|pid| pid % 10_000)
        .collect();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(tag) = name
            .strip_prefix("drums-eval-")
            .and_then(|r| r.split('-').next())
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let path = e.path();
        if evals.contains(&tag) || mounts.contains(&path.display().to_string()) {
            continue;
        }
        progress(&format!(
            "removing {}, left by a killed eval",
            path.display()
        ));
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// Correct: the run ended without error, its check passed, and what it
/// left equals the fault-free run's. A run that left something else says
/// where (`differs`), so that a failure can be read from the report.
fn judge(runs: &mut [RunResult], reference: &HashMap<String, run::Observation>) {
    for r in runs {
        r.differs = match (&r.observed, reference.get(&r.trace)) {
            (Some(o), Some(want)) => o.first_difference(want),
            (Some(_), None) => Some("the fault-free run left no state to compare".into()),
            (None, _) => None,
        };
        r.correct = Some(
            r.error.is_none()
                && r.differs.is_none()
                && r.observed.as_ref().is_some_and(|o| o.check == "1"),
        );
    }
}

/// Under `--quick`: the traces that need processes, then files, then none,
/// alternating between kinds of work, [`QUICK_TRACES`] in all.
fn quick_subset(all: &[Trace]) -> Vec<Trace> {
    let mut by_need: Vec<Vec<&Trace>> = vec![Vec::new(); 3];
    for t in all {
        by_need[t.needs as usize].push(t);
    }
    // 4 that need processes, 3 files, 1 none.
    let mut out = Vec::new();
    for (need, n) in [(2usize, 4usize), (1, 3), (0, 1)] {
        out.extend(by_need[need].iter().take(n).map(|t| (*t).clone()));
    }
    out
}

/// Runs `jobs` on `workers` workers, each with a drumsd of `policy`. A
/// worker whose drumsd dies (or does not start) stops, and the others take
/// the rest of the queue; what went wrong comes back with the results
/// (second), so that the report is still written.
async fn run_jobs(
    setup: &Setup,
    mock: &Arc<Mock>,
    policy: drums_api::Policy,
    workers: usize,
    jobs: Vec<Job<'_>>,
) -> (Vec<RunResult>, Vec<String>) {
    let total = jobs.len();
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>());
    let results = Mutex::new(Vec::with_capacity(total));
    let worker = |n: u32| {
        let (queue, results) = (&queue, &results);
        async move {
            let mut d = Drumsd::start(setup, n, policy).await?;
            loop {
                if !d.is_running() {
                    return Err(EvalError::Daemon(format!(
                        "worker {n}'s drumsd is gone; log {}",
                        d.log_path().display()
                    )));
                }
                let Some((i, job)) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
                else {
                    break;
                };
                let h = d.handle.clone();
                let r = run::run(mock, &h, Some(&mut d), &job).await;
                let verdict = match (&r.error, r.observed.as_ref().map(|o| o.check.as_str())) {
                    (Some(e), _) => format!("error: {e}"),
                    (None, Some("1")) => "check passed".into(),
                    (None, other) => format!("check says {other:?}"),
                };
                progress(&format!(
                    "  [{}/{total}] {} {} (seed {}): {} turns, {} fault(s), {:.1} s, {verdict}",
                    results.lock().unwrap_or_else(|p| p.into_inner()).len() + 1,
                    r.phase,
                    r.trace,
                    r.seed,
                    r.turns.len(),
                    r.faults.len(),
                    r.wall_s,
                ));
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, r));
            }
            d.stop().await
        }
    };
    let all = futures::future::join_all((0..workers.max(1) as u32).map(worker)).await;
    let mut errors: Vec<String> = all
        .into_iter()
        .filter_map(Result::err)
        .map(|e| drums_api::error_chain(&e))
        .collect();
    let left = queue.into_inner().unwrap_or_else(|p| p.into_inner()).len();
    if left > 0 {
        errors.push(format!(
            "{left} run(s) not made: no worker's drumsd was left"
        ));
    }
    for e in &errors {
        progress(&format!("  {e}"));
    }
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(i, _)| *i);
    (results.into_iter().map(|(_, r)| r).collect(), errors)
}
