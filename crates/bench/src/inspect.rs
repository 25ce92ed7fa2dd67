//! `drums bench inspect`: what the inspector costs and how well it judges.
//! (a) overhead: a syscall-heavy workload (a file create/write/unlink loop, and
//!     a fork/exec loop) in one session, with and without the inspector,
//!     interleaved round by round; "without" has the programs unloaded, since
//!     this is the only inspected session (on a daemon inspecting others, the
//!     programs stay loaded and "without" only leaves this session unwatched);
//! (b) turn_end latency, as drumsd measures it and as a client sees it;
//! (c) the labelled corpus (crates/inspect/corpus/turns.txt) run in a fresh
//!     session: the confusion matrix, false negatives and false positives.

use std::time::Instant;

use drums_api::{Client, Session, TurnClass, TurnEffects};
use hyper::Method;
use serde_json::json;

use super::{create, sh, turn_begin, Made};
use crate::exit::{self, Failure};
use crate::stats::{p50_p95, pct};
use crate::table;
use drums_api::exec::enc;

const CORPUS: &str = include_str!("../../inspect/corpus/turns.txt");

/// A line of the corpus that is not `LABEL<tab>SCRIPT`.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("corpus line {0}: no tab after the label")]
    NoTab(usize),
    #[error("corpus line {line}")]
    Label {
        line: usize,
        #[source]
        source: drums_api::UnknownName,
    },
}

/// Turns of the corpus: (label, script). `#` starts a comment line.
pub fn corpus() -> Result<Vec<(TurnClass, &'static str)>, CorpusError> {
    CORPUS
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|(i, l)| {
            let line = i + 1;
            let (label, script) = l.split_once('\t').ok_or(CorpusError::NoTab(line))?;
            let label = label
                .parse()
                .map_err(|source| CorpusError::Label { line, source })?;
            Ok((label, script))
        })
        .collect()
}

/// Many small files, each created, written and removed: the inspector's
/// worst case, two events with paths per iteration.
const FILE_LOOP: &str = r#"python3 -c "
import os, time
d = '/root/bench-inspect'
os.makedirs(d, exist_ok=True)
t = time.perf_counter()
for i in range(20000):
    p = '%s/f%d' % (d, i % 64)
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, b'x' * 64)
    os.close(fd)
    os.unlink(p)
print(time.perf_counter() - t)
""#;

/// fork + exec of a tiny program, 300 times.
const FORK_LOOP: &str = r#"s=$(date +%s%N); i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done; e=$(date +%s%N); echo "$(( (e - s) / 1000 ))e-6""#;

async fn end(c: &Client, s: &Session) -> Result<TurnEffects, Failure> {
    Ok(c.json(
        Method::POST,
        &format!("/v1/sessions/{}/turn/end", enc(&s.id)),
        None::<&()>,
    )
    .await?)
}

async fn stop(c: &Client, s: &Session) -> Result<(), Failure> {
    c.call(
        Method::DELETE,
        &format!("/v1/sessions/{}/turns", enc(&s.id)),
        None::<&()>,
    )
    .await?;
    Ok(())
}

async fn seconds(c: &Client, s: &Session, script: &str) -> Result<f64, Failure> {
    let out = sh(c, s, script).await?;
    out.trim().parse().map_err(|_| {
        Failure::new(
            exit::INTERNAL,
            format!("workload printed {out:?}, not seconds"),
        )
    })
}

struct Stats {
    p50: f64,
    p95: f64,
    /// In round order, for paired comparisons.
    rounds: Vec<f64>,
}

fn stats(rounds: Vec<f64>) -> Stats {
    let (p50, p95) = p50_p95(rounds.iter().copied());
    Stats { p50, p95, rounds }
}

/// The median over rounds of with/without within the same round: steadier
/// than a ratio of medians when the machine's speed drifts during the run.
fn paired(on: &Stats, off: &Stats) -> f64 {
    crate::stats::paired(&on.rounds, &off.rounds)
}

pub async fn inspect(c: &Client, n: usize, as_json: bool) -> Result<i32, Failure> {
    let turns = corpus().map_err(|e| Failure::internal(&e))?;
    let m = Made::new(c);
    let r = run(&m, n, &turns).await;
    let (overhead, latency, corpus) = m.finish(r).await?;

    let ratio = |on: &Stats, off: &Stats| on.p50 / off.p50;
    let [(file_off, file_on), (fork_off, fork_on)] = overhead;
    let (server, client) = latency;
    if as_json {
        let arm = |st: &Stats| json!({"p50_s": st.p50, "p95_s": st.p95});
        let v = json!({
            "rounds": n,
            "overhead": {
                "file_loop": {"without": arm(&file_off), "with": arm(&file_on),
                               "ratio_p50": ratio(&file_on, &file_off),
                               "ratio_paired_median": paired(&file_on, &file_off)},
                "fork_exec_loop": {"without": arm(&fork_off), "with": arm(&fork_on),
                                    "ratio_p50": ratio(&fork_on, &fork_off),
                                    "ratio_paired_median": paired(&fork_on, &fork_off)},
            },
            "turn_end_latency": {
                "turns": server.len(),
                "server_us": {"p50": pct(&server, 50.0), "p99": pct(&server, 99.0)},
                "client_ms": {"p50": pct(&client, 50.0), "p99": pct(&client, 99.0)},
            },
            "corpus": corpus.to_json(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("serialize"));
    } else {
        println!("inspector overhead, {n} interleaved rounds (p50 / p95 seconds)");
        let row = |name: &str, off: &Stats, on: &Stats| {
            vec![
                name.to_owned(),
                format!("{:.3} / {:.3}", off.p50, off.p95),
                format!("{:.3} / {:.3}", on.p50, on.p95),
                format!("{:+.1}%", (ratio(on, off) - 1.0) * 100.0),
                format!("{:+.1}%", (paired(on, off) - 1.0) * 100.0),
            ]
        };
        print!(
            "{}",
            table::render(
                &["workload", "without", "with", "slowdown (p50)", "(paired)"],
                &[
                    row("20000 x create+write+unlink", &file_off, &file_on),
                    row("300 x fork+exec", &fork_off, &fork_on),
                ]
            )
        );
        println!();
        println!("turn_end latency, {} turns", server.len());
        print!(
            "{}",
            table::render(
                &["measured by", "p50", "p99"],
                &[
                    vec![
                        "drumsd (classification)".into(),
                        format!("{:.3} ms", pct(&server, 50.0) / 1000.0),
                        format!("{:.3} ms", pct(&server, 99.0) / 1000.0),
                    ],
                    vec![
                        "client (API round trip)".into(),
                        format!("{:.3} ms", pct(&client, 50.0)),
                        format!("{:.3} ms", pct(&client, 99.0)),
                    ],
                ]
            )
        );
        println!();
        corpus.print();
    }
    Ok(if corpus.false_negatives == 0 {
        exit::OK
    } else {
        exit::INTERNAL
    })
}

type Overhead = [(Stats, Stats); 2];

async fn run(
    m: &Made<'_>,
    n: usize,
    turns: &[(TurnClass, &str)],
) -> Result<(Overhead, (Vec<f64>, Vec<f64>), Confusion), Failure> {
    let c = m.client();
    let (s, _) = create(m, "headless").await?;
    let s = &s;
    // Warm the page cache and Python's imports for both arms alike.
    seconds(c, s, FILE_LOOP).await?;
    seconds(c, s, FORK_LOOP).await?;
    let (mut file, mut fork) = ([vec![], vec![]], [vec![], vec![]]);
    for round in 0..n {
        // ABBA order, so neither arm always runs first.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            if on {
                turn_begin(c, s).await?;
            }
            file[on as usize].push(seconds(c, s, FILE_LOOP).await?);
            fork[on as usize].push(seconds(c, s, FORK_LOOP).await?);
            if on {
                end(c, s).await?;
                stop(c, s).await?;
            }
        }
    }
    let [file_off, file_on] = file.map(stats);
    let [fork_off, fork_on] = fork.map(stats);

    // Latency: small turns of each kind, as an agent's turns are.
    let kinds = [
        "ls / >/dev/null",
        "echo x >> /root/bench-latency",
        "rm -f /root/bench-latency",
        "sleep 0.01 & wait",
    ];
    let (mut server, mut client) = (Vec::new(), Vec::new());
    for i in 0..(10 * n).max(50) {
        turn_begin(c, s).await?;
        sh(c, s, kinds[i % kinds.len()]).await?;
        let t = Instant::now();
        let e = end(c, s).await?;
        client.push(t.elapsed().as_secs_f64() * 1000.0);
        server.push(e.latency_us as f64);
    }
    stop(c, s).await?;

    // The corpus in a fresh session: nothing of the workloads above in it.
    m.remove(s).await?;
    let (cs, _) = create(m, "headless").await?;
    let confusion = run_corpus(c, &cs, turns).await?;
    m.remove(&cs).await?;
    Ok((
        [(file_off, file_on), (fork_off, fork_on)],
        (server, client),
        confusion,
    ))
}

/// Labels against detections over the corpus.
pub struct Confusion {
    /// [label][detected], in TurnClass order none, files, processes, both.
    pub matrix: [[usize; 4]; 4],
    pub false_negatives: usize,
    pub false_positives: usize,
    pub turns: usize,
    pub mismatches: Vec<(usize, TurnClass, TurnClass, String)>,
}

const CLASSES: [TurnClass; 4] = [
    TurnClass::None,
    TurnClass::Files,
    TurnClass::Processes,
    TurnClass::Both,
];

fn index(c: TurnClass) -> usize {
    CLASSES
        .iter()
        .position(|x| *x == c)
        .expect("every class is listed")
}

async fn run_corpus(
    c: &Client,
    s: &Session,
    turns: &[(TurnClass, &str)],
) -> Result<Confusion, Failure> {
    let mut k = Confusion {
        matrix: [[0; 4]; 4],
        false_negatives: 0,
        false_positives: 0,
        turns: turns.len(),
        mismatches: Vec::new(),
    };
    for (i, (label, script)) in turns.iter().enumerate() {
        turn_begin(c, s).await?;
        sh(c, s, script).await?;
        let e = end(c, s).await?;
        k.matrix[index(*label)][index(e.class)] += 1;
        let missed =
            (label.files() && !e.class.files()) || (label.processes() && !e.class.processes());
        let extra =
            (e.class.files() && !label.files()) || (e.class.processes() && !label.processes());
        k.false_negatives += missed as usize;
        k.false_positives += extra as usize;
        if missed || extra {
            k.mismatches
                .push((i + 1, *label, e.class, script.to_string()));
        }
    }
    Ok(k)
}

impl Confusion {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "turns": self.turns,
            "classes": CLASSES.map(|c| c.as_str()),
            "matrix_label_by_detected": self.matrix,
            "false_negatives": self.false_negatives,
            "false_positives": self.false_positives,
            "false_positive_rate": self.false_positives as f64 / self.turns.max(1) as f64,
            "mismatches": self.mismatches.iter().map(|(i, l, d, s)| json!({
                "turn": i, "label": l.as_str(), "detected": d.as_str(), "script": s})).collect::<Vec<_>>(),
        })
    }

    fn print(&self) {
        println!(
            "labelled corpus: {} turns, {} false negatives, {} false positives ({:.1}%)",
            self.turns,
            self.false_negatives,
            self.false_positives,
            100.0 * self.false_positives as f64 / self.turns.max(1) as f64
        );
        let rows: Vec<Vec<String>> = CLASSES
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut r = vec![c.as_str().to_owned()];
                r.extend(self.matrix[i].iter().map(|n| n.to_string()));
                r
            })
            .collect();
        print!(
            "{}",
            table::render(
                &["label \\ detected", "none", "files", "processes", "both"],
                &rows
            )
        );
        for (i, l, d, s) in &self.mismatches {
            println!(
                "  turn {i}: labelled {}, detected {}: {s}",
                l.as_str(),
                d.as_str()
            );
        }
    }
}
