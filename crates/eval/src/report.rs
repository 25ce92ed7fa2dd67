//! The evaluation's output: `results.json` (raw: one row per turn, one per
//! run, the density arms), `summary.md` (the tables, the targets, and the
//! evaluation's own assertions), and the figures (`plots`), all from the
//! same numbers.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use drums_api::TurnClass;
use drums_bench::stats::percentile;
use serde_json::json;

use crate::plots::{self, DensityPoint, Figures, StrategyBar};
use crate::run::RunResult;
use crate::strategy::Strategy;
use crate::trace::{Needs, Trace};
use crate::{EvalError, Options, Outcome};

/// results.json's format.
pub const RESULTS_FORMAT: u32 = 1;

/// What `drums eval` prints at its end, and what failed of its assertions.
pub struct Summary {
    pub markdown: String,
    pub failures: Vec<String>,
}

/// Per strategy (and the agent inside, under selective), over its runs.
struct Tally {
    /// The runs' phase: the strategy's name, and whether the agent lived
    /// in the session.
    phase: String,
    strategy: Strategy,
    runs: usize,
    correct: usize,
    /// (correct, runs) per need.
    by_need: BTreeMap<Needs, (usize, usize)>,
    faults: usize,
    mid_checkpoint: usize,
    errors: Vec<String>,
    bytes: u64,
    bytes_by_need: BTreeMap<Needs, u64>,
    /// Bytes shared with earlier versions' images rather than written.
    shared: u64,
    shared_by_need: BTreeMap<Needs, u64>,
    wall_s: f64,
    /// The same traces' fault-free, checkpoint-free time.
    reference_s: f64,
}

pub fn write(opts: &Options, corpus: &[Trace], o: &Outcome) -> Result<Summary, EvalError> {
    let commit = option_env!("DRUMS_COMMIT").unwrap_or("unknown");
    let reference: BTreeMap<&str, &RunResult> = o
        .runs
        .iter()
        .filter(|r| r.phase == "reference")
        .map(|r| (r.trace.as_str(), r))
        .collect();
    let mut tallies: Vec<Tally> = opts
        .strategies
        .iter()
        .map(|s| tally(*s, s.name(), &o.runs, &reference))
        .collect();
    let inside = tally(
        Strategy::Selective,
        "selective (agent inside)",
        &o.runs,
        &reference,
    );
    if inside.runs > 0 {
        tallies.push(inside);
    }
    let mut failures: Vec<String> = o.failed.clone();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# drums eval{}\n",
        if opts.quick { " --quick" } else { "" }
    );
    let _ = writeln!(
        md,
        "drums {} at commit `{commit}`; {} traces, latency {}, {} run(s) of each trace per strategy with {} fault(s) each, seed {}, {} workers.\n",
        env!("CARGO_PKG_VERSION"),
        corpus.len(),
        opts.latency,
        opts.runs,
        opts.faults,
        opts.seed,
        opts.workers
    );

    // The corpus, against Crab's finding.
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    let turns: usize = corpus.iter().map(|t| t.turns.len()).sum();
    for t in corpus.iter().flat_map(|t| &t.turns) {
        *classes.entry(t.class.as_str()).or_default() += 1;
    }
    let _ = writeln!(
        md,
        "## The corpus\n\n{} traces, {turns} turns, by label:\n",
        corpus.len()
    );
    let _ = writeln!(md, "| class | turns | share |\n|---|---|---|");
    for c in ["none", "files", "processes", "both"] {
        let n = classes.get(c).copied().unwrap_or(0);
        let _ = writeln!(md, "| {c} | {n} | {:.0}% |", pct(n, turns));
    }
    let _ = writeln!(
        md,
        "\nCrab found more than 75% of agent turns change nothing; this corpus has {:.0}% `none` turns: it over-samples stateful work on purpose.\n",
        pct(classes.get("none").copied().unwrap_or(0), turns)
    );

    // The labels, as replayed.
    let mut mismatches = Vec::new();
    for r in reference.values() {
        if let Some(e) = &r.error {
            failures.push(format!("the reference run of {} failed: {e}", r.trace));
        }
        for row in &r.turns {
            if let Some(label) = row.label {
                if row.class != Some(label) {
                    mismatches.push(format!(
                        "{} turn {}: labelled {}, replayed {}",
                        r.trace,
                        row.request,
                        label.as_str(),
                        row.class.map_or("nothing", TurnClass::as_str)
                    ));
                }
            }
        }
    }
    let _ = writeln!(
        md,
        "Labels against the inspector's classes in the fault-free runs: {} mismatch(es).\n",
        mismatches.len()
    );
    for m in &mismatches {
        let _ = writeln!(md, "- {m}");
        failures.push(format!("label mismatch: {m}"));
    }

    // Correctness, traffic, time.
    let _ = writeln!(md, "## Recovery, per strategy\n");
    let _ = writeln!(
        md,
        "Correct: the trace's check printed 1 and the files under /root/task, the live processes and the trace's `observe` equal the fault-free run's.\n"
    );
    let _ = writeln!(
        md,
        "| strategy | correct | needs none | needs files | needs processes | faults (mid-checkpoint) | checkpoint bytes | time vs fault-free |\n|---|---|---|---|---|---|---|---|"
    );
    for t in &tallies {
        let need = |n: Needs| {
            let (c, r) = t.by_need.get(&n).copied().unwrap_or((0, 0));
            format!("{c}/{r}")
        };
        let _ = writeln!(
            md,
            "| {} | {}/{} ({:.0}%) | {} | {} | {} | {} ({}) | {} | {:+.1}% |",
            t.phase,
            t.correct,
            t.runs,
            pct(t.correct, t.runs),
            need(Needs::None),
            need(Needs::Files),
            need(Needs::Processes),
            t.faults,
            t.mid_checkpoint,
            mib(t.bytes),
            (t.wall_s / t.reference_s.max(f64::MIN_POSITIVE) - 1.0) * 100.0
        );
    }
    for t in &tallies {
        for e in t.errors.iter().take(5) {
            let _ = writeln!(md, "\n- {} error: {e}", t.phase);
        }
    }
    let get = |s: Strategy| tallies.iter().find(|t| t.phase == s.name());
    for t in &tallies {
        if matches!(t.strategy, Strategy::Selective | Strategy::Full)
            && (t.correct != t.runs || t.runs == 0)
        {
            failures.push(format!(
                "{} recovered {}/{} runs correctly, not all",
                t.phase, t.correct, t.runs
            ));
        }
    }
    if let Some(t) = get(Strategy::ChatOnly) {
        let (c, r) = t.by_need.get(&Needs::Processes).copied().unwrap_or((0, 0));
        if r > 0 && c == r {
            failures.push(format!(
                "chat-only recovered all {r} runs of traces that need process state: the faults did not bite"
            ));
        }
    }
    let pair = get(Strategy::Selective).zip(get(Strategy::Full));
    let ratio = match pair {
        Some((s, f)) => {
            if s.bytes >= f.bytes {
                failures.push(format!(
                    "selective wrote {} of checkpoints, not less than full's {}",
                    mib(s.bytes),
                    mib(f.bytes)
                ));
            }
            Some(s.bytes as f64 / f.bytes.max(1) as f64)
        }
        _ => None,
    };
    // Full per-turn checkpointing as Crab measures it: every turn's whole
    // dump written. drums' own `full` shares its pages with the previous
    // version's too, so this is what it wrote plus what it shared.
    let whole = |t: &Tally, n: Option<Needs>| match n {
        None => t.bytes + t.shared,
        Some(n) => {
            t.bytes_by_need.get(&n).copied().unwrap_or(0)
                + t.shared_by_need.get(&n).copied().unwrap_or(0)
        }
    };
    if let (Some(x), Some((s, f))) = (ratio, pair) {
        let _ = writeln!(
            md,
            "\nSelective's checkpoint bytes (written) are {:.1}% of full's, and {:.1}% of what full per-turn checkpointing writes when every page is written ({}: full's bytes, written and shared). Both share pages with the previous version's images (docs/engine.md, \"Shared pages\"). By what the traces need:\n",
            x * 100.0,
            s.bytes as f64 / whole(f, None).max(1) as f64 * 100.0,
            mib(whole(f, None)),
        );
        let _ = writeln!(
            md,
            "| traces that need | selective | full | full, every page written | selective / full | selective / full, every page written |\n|---|---|---|---|---|---|"
        );
        for n in [Needs::None, Needs::Files, Needs::Processes] {
            let (sb, fb, wb) = (
                s.bytes_by_need.get(&n).copied().unwrap_or(0),
                f.bytes_by_need.get(&n).copied().unwrap_or(0),
                whole(f, Some(n)),
            );
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.1}% | {:.1}% |",
                n.as_str(),
                mib(sb),
                mib(fb),
                mib(wb),
                sb as f64 / fb.max(1) as f64 * 100.0,
                sb as f64 / wb.max(1) as f64 * 100.0
            );
        }
    }

    // Density.
    if !o.density.is_empty() {
        let _ = writeln!(md, "\n## Density\n");
        let _ = writeln!(
            md,
            "Each density runs that many agents at once on a selective drumsd and on a checkpoint-free one, arms interleaved. Exposed delay: the time from the model's answer to its release to the agent (the turn's end, and the hold for its version), as a share of its turn (request to next request), over every request.\n"
        );
        let _ = writeln!(
            md,
            "| sessions | exposed p50 | exposed p95 | time vs checkpoint-free | checkpoint bytes | requests/s | CPU busy (sel / off) | memory peak MiB (sel / off) | errors |\n|---|---|---|---|---|---|---|---|---|"
        );
        for d in &o.density {
            let _ = writeln!(
                md,
                "| {}{} | {:.3}% | {:.3}% | {:+.2}% | {} | {:.1} | {:.0}% / {:.0}% | {:.0} / {:.0} | {} |",
                d.sessions,
                if d.probed { " (probe)" } else { "" },
                d.exposed_p50 * 100.0,
                d.exposed_p95 * 100.0,
                (d.time_ratio - 1.0) * 100.0,
                mib(d.selective.bytes),
                d.selective.requests as f64 / d.selective.wall_s.max(f64::MIN_POSITIVE),
                d.selective.cpu_mean * 100.0,
                d.off.cpu_mean * 100.0,
                d.selective.mem_peak_mib,
                d.off.mem_peak_mib,
                d.selective.errors.len() + d.off.errors.len()
            );
        }
        if let Some(max) = o.density.iter().filter(|d| d.probed).rev().find(|d| {
            d.selective.errors.is_empty() && d.exposed_p95 <= 0.05 && d.time_ratio <= 1.10
        }) {
            let _ = writeln!(
                md,
                "\nThe highest density this host held: {} sessions.",
                max.sessions
            );
        }
    }

    // Proxy overhead: requests the agent timed itself (an agent inside
    // the session is timed only by the proxy), with no fault injected while
    // they were answered (a recovery is not the proxy's). A session's first
    // request is apart: it starts the session's turns.
    let timed = o
        .runs
        .iter()
        .filter(|r| !r.phase.ends_with("(agent inside)"))
        .chain(
            o.density
                .iter()
                .flat_map(|d| d.selective.runs.iter().chain(&d.off.runs)),
        )
        .flat_map(|r| r.turns.iter())
        .filter(|t| t.decision.is_some() && t.fault.is_none() && t.overhead_us.is_finite());
    let (mut first, mut overhead): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for t in timed {
        match t.request {
            0 => first.push(t.overhead_us),
            _ => overhead.push(t.overhead_us),
        }
    }
    first.sort_by(f64::total_cmp);
    overhead.sort_by(f64::total_cmp);
    let _ = writeln!(
        md,
        "\n## Proxy overhead\n\nWhat an agent's request took beyond the model's time (as the mock measured it) and the release, over {} requests with no fault injected, each on a new connection: p50 {:.0} µs, p95 {:.0} µs, p99 {:.0} µs. A session's first request ({} of them) starts its turns: p50 {:.0} µs, p95 {:.0} µs.",
        overhead.len(),
        percentile(&overhead, 50.0),
        percentile(&overhead, 95.0),
        percentile(&overhead, 99.0),
        first.len(),
        percentile(&first, 50.0),
        percentile(&first, 95.0),
    );

    // Targets.
    let sel = get(Strategy::Selective);
    let at16 = o.density.iter().find(|d| d.sessions == 16 && !d.probed);
    let faults = sel.map_or(0, |t| t.faults);
    let _ = writeln!(
        md,
        "\n## Targets\n\n| target | measured | met |\n|---|---|---|"
    );
    let mut target = |what: &str, measured: String, met: Option<bool>| {
        let _ = writeln!(
            md,
            "| {what} | {measured} | {} |",
            match met {
                Some(true) => "yes",
                Some(false) => "no",
                None => "not measured",
            }
        );
    };
    target(
        "selective recovers 100% over >= 200 faults",
        sel.map_or("-".into(), |t| {
            format!("{}/{} runs over {} faults", t.correct, t.runs, t.faults)
        }),
        sel.map(|t| t.correct == t.runs && t.faults >= 200),
    );
    // Against Crab's baseline: full per-turn checkpointing, every page
    // written. Selective against drums' own `full` (which shares pages too)
    // is the ratio above the table of needs.
    let crab = pair.map(|(s, f)| s.bytes as f64 / whole(f, None).max(1) as f64);
    target(
        "selective bytes <= 25% of full per-turn checkpointing's (every page written)",
        crab.map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
        crab.map(|x| x <= 0.25),
    );
    target(
        "exposed delay p95 <= 1% of turn time at 16 sessions",
        at16.map_or("-".into(), |d| format!("{:.3}%", d.exposed_p95 * 100.0)),
        at16.map(|d| d.exposed_p95 <= 0.01),
    );
    target(
        "total time within 2% of fault-free at 16 sessions",
        at16.map_or("-".into(), |d| {
            format!("{:+.2}%", (d.time_ratio - 1.0) * 100.0)
        }),
        at16.map(|d| d.time_ratio <= 1.02),
    );

    let _ = writeln!(md, "\n## The evaluation's assertions\n");
    if failures.is_empty() {
        let _ = writeln!(
            md,
            "All hold: selective and full recover every run, chat-only fails where process state is needed, selective writes fewer bytes than full, and every turn's label matches its replayed class."
        );
    } else {
        for f in &failures {
            let _ = writeln!(md, "- FAILED: {f}");
        }
    }

    // Figures.
    let bars: Vec<StrategyBar> = tallies
        .iter()
        .map(|t| StrategyBar {
            strategy: t.phase.clone(),
            correct: t.correct,
            runs: t.runs,
            bytes: t.bytes,
            time_ratio: t.wall_s / t.reference_s.max(f64::MIN_POSITIVE),
        })
        .collect();
    let points: Vec<DensityPoint> = o
        .density
        .iter()
        .map(|d| DensityPoint {
            sessions: d.sessions,
            exposed_p50: d.exposed_p50,
            exposed_p95: d.exposed_p95,
            time_ratio: d.time_ratio,
        })
        .collect();
    let caption = format!(
        "drums {} @ {}, {} traces, {} faults on selective, seed {}{}",
        env!("CARGO_PKG_VERSION"),
        &commit[..commit.len().min(10)],
        corpus.len(),
        faults,
        opts.seed,
        if opts.quick { ", --quick" } else { "" }
    );
    let files = plots::draw(
        &opts.out,
        &Figures {
            strategies: &bars,
            density: &points,
            proxy_overhead_us: &overhead,
            caption: &caption,
        },
    )?;
    let _ = writeln!(md, "\n## Figures\n");
    for f in &files {
        let n = f
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let _ = writeln!(md, "![{n}]({n})");
    }

    write_file(&opts.out.join("summary.md"), md.as_bytes())?;
    write_results(opts, commit, o)?;
    Ok(Summary {
        markdown: md,
        failures,
    })
}

fn tally(
    s: Strategy,
    phase: &str,
    runs: &[RunResult],
    reference: &BTreeMap<&str, &RunResult>,
) -> Tally {
    let mut t = Tally {
        phase: phase.into(),
        strategy: s,
        runs: 0,
        correct: 0,
        by_need: BTreeMap::new(),
        faults: 0,
        mid_checkpoint: 0,
        errors: Vec::new(),
        bytes: 0,
        bytes_by_need: BTreeMap::new(),
        shared: 0,
        shared_by_need: BTreeMap::new(),
        wall_s: 0.0,
        reference_s: 0.0,
    };
    for r in runs.iter().filter(|r| r.phase == phase) {
        let ok = r.correct == Some(true);
        t.runs += 1;
        t.correct += usize::from(ok);
        let e = t.by_need.entry(r.needs).or_default();
        e.0 += usize::from(ok);
        e.1 += 1;
        t.faults += r.faults.len();
        t.mid_checkpoint += r.faults.iter().filter(|f| f.mid_checkpoint).count();
        t.errors.extend(
            r.error
                .iter()
                .map(|e| format!("{} (seed {}): {e}", r.trace, r.seed)),
        );
        t.errors.extend(r.differs.iter().map(|d| {
            format!(
                "{} (seed {}): it left another state than the fault-free run: {d}",
                r.trace, r.seed
            )
        }));
        t.bytes += r.bytes;
        *t.bytes_by_need.entry(r.needs).or_default() += r.bytes;
        t.shared += r.shared_bytes;
        *t.shared_by_need.entry(r.needs).or_default() += r.shared_bytes;
        t.wall_s += r.wall_s;
        t.reference_s += reference.get(r.trace.as_str()).map_or(0.0, |x| x.wall_s);
    }
    t
}

fn write_results(opts: &Options, commit: &str, o: &Outcome) -> Result<(), EvalError> {
    let mut rows = Vec::new();
    let runs_of_density = o.density.iter().flat_map(|d| {
        [("selective", &d.selective), ("checkpoint-free", &d.off)]
            .into_iter()
            .flat_map(move |(arm, a)| a.runs.iter().map(move |r| (Some((d.sessions, arm)), r)))
    });
    for (density, r) in o.runs.iter().map(|r| (None, r)).chain(runs_of_density) {
        for t in &r.turns {
            let mut row = json!({
                "phase": r.phase, "trace": r.trace, "seed": r.seed, "needs": r.needs.as_str(),
            });
            if let Some((n, arm)) = density {
                row["phase"] = json!(format!("density-{n}-{arm}"));
            }
            if let (Some(obj), Ok(serde_json::Value::Object(t))) =
                (row.as_object_mut(), serde_json::to_value(t))
            {
                obj.extend(t);
            }
            rows.push(row);
        }
    }
    let runs: Vec<serde_json::Value> = o
        .runs
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                m.remove("turns");
            }
            v
        })
        .collect();
    let density: Vec<serde_json::Value> = o
        .density
        .iter()
        .map(|d| {
            let arm = |a: &crate::density::Arm| {
                json!({"session_s": a.session_s, "wall_s": a.wall_s, "requests": a.requests,
                       "bytes": a.bytes, "cpu_mean": a.cpu_mean, "mem_peak_mib": a.mem_peak_mib,
                       "errors": a.errors})
            };
            json!({"sessions": d.sessions, "probed": d.probed, "exposed_p50": d.exposed_p50,
                   "exposed_p95": d.exposed_p95, "time_ratio": d.time_ratio,
                   "selective": arm(&d.selective), "checkpoint_free": arm(&d.off)})
        })
        .collect();
    let v = json!({
        "format": RESULTS_FORMAT,
        "drums": env!("CARGO_PKG_VERSION"),
        "commit": commit,
        "options": {"quick": opts.quick, "seed": opts.seed, "latency": opts.latency.to_string(),
                    "workers": opts.workers, "runs": opts.runs, "faults": opts.faults,
                    "strategies": opts.strategies.iter().map(|s| s.name()).collect::<Vec<_>>(),
                    "densities": opts.densities},
        "rows": rows,
        "runs": runs,
        "density": density,
    });
    let text = serde_json::to_vec_pretty(&v).expect("results serialize");
    write_file(&opts.out.join("results.json"), &text)
}

fn write_file(p: &Path, data: &[u8]) -> Result<(), EvalError> {
    std::fs::write(p, data).map_err(|e| EvalError::io("write", p, e))
}

fn pct(n: usize, of: usize) -> f64 {
    if of == 0 {
        0.0
    } else {
        n as f64 * 100.0 / of as f64
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}
