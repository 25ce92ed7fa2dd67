//! Density: N agents at once, each running a trace without faults, on a
//! drumsd taking selective versions and on one taking none (the
//! fault-free, checkpoint-free run), the two arms interleaved in rounds
//! that alternate which goes first. Host CPU and memory are sampled while
//! each arm runs.
//!
//! "The highest density this host holds" (a density of 0 in the options):
//! from twice the largest fixed density, doubling while the selective arm
//! ends without error, its exposed delay p95 stays within 5% of turn time
//! and its time within 10% of the checkpoint-free arm's, and memory allows;
//! the last density that held is reported.

use std::time::{Duration, Instant};

use drums_api::Policy;
use drums_bench::stats::percentile;
use serde::Serialize;

use crate::daemon::{Drumsd, Setup};
use crate::run::{self, Job, RunResult};
use crate::trace::Trace;
use crate::upstream::Mock;
use crate::{progress, EvalError, Options};

/// The daemons' numbers (subnets) of the two arms.
const DAEMONS: (u32, u32) = (200, 201);

/// A /24 per daemon: its sessions' addresses.
const MOST_SESSIONS: usize = 200;

#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    /// Wall time of each session's run, seconds.
    pub session_s: Vec<f64>,
    /// Wall time from the first create to the last run's end, seconds.
    pub wall_s: f64,
    pub requests: usize,
    pub bytes: u64,
    /// Host CPU busy share (0..1) and memory in use (MiB) while it ran:
    /// mean and peak.
    pub cpu_mean: f64,
    pub mem_peak_mib: f64,
    pub errors: Vec<String>,
    pub runs: Vec<RunResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DensityResult {
    pub sessions: usize,
    /// Found by the probe for the host's highest density.
    pub probed: bool,
    /// Held time over turn time, per turn of the selective arm.
    pub exposed_p50: f64,
    pub exposed_p95: f64,
    /// Selective over checkpoint-free: the sum of the sessions' times.
    pub time_ratio: f64,
    /// The selective arm's exposed delay by what each request's turn end
    /// took (`first` for a session's first request): where a high p95
    /// comes from.
    pub by_decision: Vec<Exposure>,
    pub selective: Arm,
    pub off: Arm,
}

/// The exposed delay of the requests whose turn end took one thing.
#[derive(Debug, Clone, Serialize)]
pub struct Exposure {
    pub decision: String,
    pub requests: usize,
    pub p50: f64,
    pub p95: f64,
    /// Of their release, the hold for the version: mean, ms.
    pub held_ms_mean: f64,
    pub release_ms_mean: f64,
}

/// Exposure by decision, the largest p95 first.
fn by_decision(runs: &[RunResult]) -> Vec<Exposure> {
    let mut groups: std::collections::BTreeMap<String, Vec<&run::TurnRow>> = Default::default();
    for t in runs.iter().flat_map(|r| r.turns.iter()) {
        if t.turn_ms <= 0.0 {
            continue;
        }
        let key = if t.request == 0 {
            "first".to_string()
        } else {
            t.decision.clone().unwrap_or_else(|| "-".into())
        };
        groups.entry(key).or_default().push(t);
    }
    let mut out: Vec<Exposure> = groups
        .into_iter()
        .map(|(decision, ts)| {
            let shares = drums_bench::stats::sorted(ts.iter().map(|t| t.release_ms / t.turn_ms));
            let n = ts.len() as f64;
            Exposure {
                decision,
                requests: ts.len(),
                p50: percentile(&shares, 50.0),
                p95: percentile(&shares, 95.0),
                held_ms_mean: ts.iter().map(|t| t.held_ms).sum::<f64>() / n,
                release_ms_mean: ts.iter().map(|t| t.release_ms).sum::<f64>() / n,
            }
        })
        .collect();
    out.sort_by(|a, b| b.p95.total_cmp(&a.p95));
    out
}

impl DensityResult {
    /// Held under what the probe asks for.
    fn holds(&self) -> bool {
        self.selective.errors.is_empty()
            && self.off.errors.is_empty()
            && self.exposed_p95 <= 0.05
            && self.time_ratio <= 1.10
    }
}

pub async fn run(
    setup: &Setup,
    mock: &Mock,
    traces: &[Trace],
    opts: &Options,
) -> Result<Vec<DensityResult>, EvalError> {
    if opts.densities.is_empty() || traces.is_empty() {
        return Ok(Vec::new());
    }
    let rounds = if opts.quick { 1 } else { 2 };
    let mut sel = Drumsd::start(setup, DAEMONS.0, Policy::Selective).await?;
    let off = match Drumsd::start(setup, DAEMONS.1, Policy::Off).await {
        Ok(d) => d,
        Err(e) => {
            let _ = sel.stop().await;
            return Err(e);
        }
    };
    let mut out = Vec::new();
    let r = async {
        for &n in opts.densities.iter().filter(|n| **n > 0) {
            out.push(one(mock, traces, &mut sel, &off, n, rounds, false).await?);
        }
        if opts.densities.contains(&0) {
            let mut n = 2 * opts.densities.iter().copied().max().unwrap_or(8).max(8);
            while n <= MOST_SESSIONS && memory_allows(&out, n) {
                let d = one(mock, traces, &mut sel, &off, n, 1, true).await?;
                let held = d.holds();
                out.push(d);
                if !held {
                    break;
                }
                n *= 2;
            }
        }
        Ok::<_, EvalError>(())
    }
    .await;
    let stopped = (sel.stop().await, off.stop().await);
    r?;
    stopped.0?;
    stopped.1?;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
async fn one(
    mock: &Mock,
    traces: &[Trace],
    sel: &mut Drumsd,
    off: &Drumsd,
    n: usize,
    rounds: usize,
    probed: bool,
) -> Result<DensityResult, EvalError> {
    let mut arms: (Vec<Arm>, Vec<Arm>) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for first in [round % 2 == 0, round % 2 == 1] {
            let (d, label) = if first {
                (&*sel, "selective")
            } else {
                (off, "checkpoint-free")
            };
            progress(&format!(
                "density {n}{}: round {}, {label}",
                if probed {
                    " (probing the host's highest)"
                } else {
                    ""
                },
                round + 1
            ));
            let arm = arm(mock, traces, d, n, round).await;
            if first {
                arms.0.push(arm);
            } else {
                arms.1.push(arm);
            }
        }
    }
    let merge = |v: Vec<Arm>| {
        let mut it = v.into_iter();
        let mut a = it.next().expect("one round at least");
        for b in it {
            a.session_s.extend(b.session_s);
            a.wall_s += b.wall_s;
            a.requests += b.requests;
            a.bytes += b.bytes;
            a.cpu_mean = (a.cpu_mean + b.cpu_mean) / 2.0;
            a.mem_peak_mib = a.mem_peak_mib.max(b.mem_peak_mib);
            a.errors.extend(b.errors);
            a.runs.extend(b.runs);
        }
        a
    };
    let (selective, off) = (merge(arms.0), merge(arms.1));
    let mut shares: Vec<f64> = selective
        .runs
        .iter()
        .flat_map(|r| r.turns.iter())
        // A session's first request too: its base version and its first
        // watch are drums' delay as much as any turn's end.
        .filter(|t| t.turn_ms > 0.0)
        .map(|t| t.release_ms / t.turn_ms)
        .collect();
    shares.sort_by(f64::total_cmp);
    let total = |a: &Arm| a.session_s.iter().sum::<f64>();
    let by_decision = by_decision(&selective.runs);
    for e in &by_decision {
        progress(&format!(
            "density {n}: {:>8} {:>5} request(s), exposed p50 {:.3}% p95 {:.3}%, held {:.1} ms, release {:.1} ms (means)",
            e.decision,
            e.requests,
            e.p50 * 100.0,
            e.p95 * 100.0,
            e.held_ms_mean,
            e.release_ms_mean
        ));
    }
    Ok(DensityResult {
        by_decision,
        sessions: n,
        probed,
        exposed_p50: percentile(&shares, 50.0),
        exposed_p95: percentile(&shares, 95.0),
        time_ratio: total(&selective) / total(&off).max(f64::MIN_POSITIVE),
        selective,
        off,
    })
}

/// `n` sessions at once on `d`, session `i` running trace `i` (round
/// robin, shifted by the round).
async fn arm(mock: &Mock, traces: &[Trace], d: &Drumsd, n: usize, round: usize) -> Arm {
    let h = d.handle.clone();
    let sampler = Sampler::start();
    let t0 = Instant::now();
    let jobs: Vec<Job> = (0..n)
        .map(|i| Job {
            trace: &traces[(i + round) % traces.len()],
            strategy: None,
            // The seed names the session apart from its neighbours.
            seed: 1000 + i as u64,
            faults: Vec::new(),
            inside: false,
        })
        .collect();
    let runs: Vec<RunResult> =
        futures::future::join_all(jobs.iter().map(|j| run::run(mock, &h, None, j))).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let (cpu_mean, mem_peak_mib) = sampler.stop().await;
    Arm {
        session_s: runs.iter().map(|r| r.wall_s).collect(),
        wall_s,
        requests: runs.iter().map(|r| r.turns.len()).sum(),
        bytes: runs.iter().map(|r| r.bytes).sum(),
        cpu_mean,
        mem_peak_mib,
        errors: runs
            .iter()
            .filter_map(|r| r.error.clone().map(|e| format!("{}: {e}", r.trace)))
            .collect(),
        runs,
    }
}

/// Whether the host's memory holds `n` sessions, from what the largest
/// density so far used per session, with a quarter of the memory to spare.
fn memory_allows(done: &[DensityResult], n: usize) -> bool {
    let Some(last) = done.iter().max_by_key(|d| d.sessions) else {
        return true;
    };
    let per = last.selective.mem_peak_mib / last.sessions as f64;
    let total = meminfo("MemTotal:").unwrap_or(0.0);
    per * n as f64 <= 0.75 * total
}

/// Samples host CPU (from /proc/stat) and memory in use every 250 ms.
struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(f64, f64)>,
}

impl Sampler {
    fn start() -> Sampler {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let first = cpu_times();
            let mut peak = 0f64;
            loop {
                if let Some(used) = meminfo("MemTotal:")
                    .zip(meminfo("MemAvailable:"))
                    .map(|(t, a)| t - a)
                {
                    peak = peak.max(used);
                }
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
            let last = cpu_times();
            let busy = match (first, last) {
                (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
                _ => f64::NAN,
            };
            (busy, peak)
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> (f64, f64) {
        let _ = self.stop.send(());
        self.task.await.unwrap_or((f64::NAN, f64::NAN))
    }
}

/// (busy, total) jiffies of all CPUs.
fn cpu_times() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    // idle and iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// A /proc/meminfo field, MiB.
fn meminfo(key: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
