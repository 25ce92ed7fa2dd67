//! The inspector end to end, against a real drumsd, as root: every turn of a
//! labelled corpus (`crates/inspect/corpus/turns.txt`) runs in one session between
//! turn/begin and turn/end, and no turn that changed something may be
//! classified as having changed less. False alarms are counted and reported,
//! not failed: one costs a checkpoint, a miss costs a recovery.

mod common;

use std::collections::BTreeMap;

use common::{assert_schema, gone, TestDaemon};
use drums_api::{ClientError, CreateSession, TurnBegun, TurnClass, TurnEffects};
use hyper::Method;

const CORPUS: &str = include_str!("../../inspect/corpus/turns.txt");

/// The corpus must stay big enough for its rates to mean something.
const MIN_TURNS: usize = 100;

const CLASSES: [TurnClass; 4] = [
    TurnClass::None,
    TurnClass::Files,
    TurnClass::Processes,
    TurnClass::Both,
];

struct Turn {
    /// 1-based line in the corpus file, for messages.
    line: usize,
    label: TurnClass,
    script: &'static str,
}

/// `<class><TAB><script>` per line; `#` comments and blank lines skipped.
fn parse(corpus: &'static str) -> Vec<Turn> {
    corpus
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let (label, script) = l
                .split_once('\t')
                .unwrap_or_else(|| panic!("corpus line {}: no tab after the class: {l}", i + 1));
            Turn {
                line: i + 1,
                label: label
                    .parse()
                    .unwrap_or_else(|e| panic!("corpus line {}: {e}", i + 1)),
                script,
            }
        })
        .collect()
}

fn index(c: TurnClass) -> usize {
    CLASSES.iter().position(|x| *x == c).unwrap()
}

async fn turn_begin(d: &TestDaemon, session: &str) -> Result<TurnBegun, ClientError> {
    d.client
        .json(
            Method::POST,
            &format!("/v1/sessions/{session}/turn/begin"),
            None::<&()>,
        )
        .await
}

async fn turn_end(d: &TestDaemon, session: &str) -> Result<TurnEffects, ClientError> {
    d.client
        .json(
            Method::POST,
            &format!("/v1/sessions/{session}/turn/end"),
            None::<&()>,
        )
        .await
}

/// An API error with this status and kind; returns its message.
fn api_error<T: std::fmt::Debug>(
    r: Result<T, ClientError>,
    status: u16,
    kind: &str,
    what: &str,
) -> String {
    match r {
        Err(ClientError::Api {
            status: s,
            kind: k,
            message,
        }) => {
            assert_eq!(
                (s, k.as_str()),
                (status, kind),
                "{what}: wrong error, message: {message}"
            );
            message
        }
        other => panic!("{what}: expected {status} {kind}, got {other:?}"),
    }
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rfind(')')
            .is_some_and(|close| s[close + 1..].trim_start().starts_with('Z'))
    })
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Every corpus turn, in order, in one headless session: a turn labelled with
/// files or processes must be detected with them (no false negatives). The
/// confusion matrix, the false-positive rate and every mismatch are printed,
/// and written to `$CARGO_TARGET_TMPDIR/inspect-corpus.json`.
#[tokio::test(flavor = "multi_thread")]
async fn corpus_has_no_false_negatives() {
    let turns = parse(CORPUS);
    assert!(
        turns.len() >= MIN_TURNS,
        "the corpus has {} turns, fewer than {MIN_TURNS}",
        turns.len()
    );
    let mut d = TestDaemon::start();
    let s = d
        .create(&CreateSession::default())
        .await
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()));

    // matrix[label][detected]
    let mut matrix = [[0usize; 4]; 4];
    let mut false_negatives = 0usize;
    let mut missed_files = 0usize;
    let mut missed_processes = 0usize;
    let mut false_positive_turns = 0usize;
    let mut extra_components = 0usize;
    let mut latencies = Vec::with_capacity(turns.len());
    let mut mismatches = Vec::new();

    for (i, t) in turns.iter().enumerate() {
        let begun = turn_begin(&d, &s.id)
            .await
            .unwrap_or_else(|e| panic!("turn/begin before line {}: {e}\n{}", t.line, d.log()));
        assert_schema("TurnBegun", &serde_json::to_value(&begun).unwrap());
        assert_eq!(begun.turn, i as u64 + 1, "turns are numbered from 1");
        // The CLI call blocks; keep it off the runtime's other workers.
        let (code, out, err) = tokio::task::block_in_place(|| d.sh(&s.id, t.script));
        assert_eq!(
            code, 0,
            "corpus line {} exited {code}: {}\nstdout: {out}\nstderr: {err}",
            t.line, t.script
        );
        let fx = turn_end(&d, &s.id)
            .await
            .unwrap_or_else(|e| panic!("turn/end after line {}: {e}\n{}", t.line, d.log()));
        assert_schema("TurnEffects", &serde_json::to_value(&fx).unwrap());
        assert_eq!((fx.session.as_str(), fx.turn), (s.id.as_str(), begun.turn));
        latencies.push(fx.latency_us);

        let (label, got) = (t.label, fx.class);
        matrix[index(label)][index(got)] += 1;
        let miss_f = label.files() && !got.files();
        let miss_p = label.processes() && !got.processes();
        let extra = usize::from(got.files() && !label.files())
            + usize::from(got.processes() && !label.processes());
        missed_files += usize::from(miss_f);
        missed_processes += usize::from(miss_p);
        false_negatives += usize::from(miss_f || miss_p);
        extra_components += extra;
        false_positive_turns += usize::from(extra > 0);
        if label != got {
            mismatches.push(serde_json::json!({
                "line": t.line,
                "script": t.script,
                "label": label.as_str(),
                "detected": got.as_str(),
                "false_negative": miss_f || miss_p,
                "effects": fx,
            }));
        }
    }

    let n = turns.len();
    let labelled_none = matrix[0].iter().sum::<usize>();
    let none_flagged = labelled_none - matrix[0][0];
    let fp_rate = false_positive_turns as f64 / n as f64;
    latencies.sort_unstable();

    println!("inspector corpus: {n} turns (rows: label, columns: detected)");
    println!(
        "{:>10} {:>6} {:>6} {:>10} {:>6}",
        "", "none", "files", "processes", "both"
    );
    for (r, row) in matrix.iter().enumerate() {
        println!(
            "{:>10} {:>6} {:>6} {:>10} {:>6}",
            CLASSES[r].as_str(),
            row[0],
            row[1],
            row[2],
            row[3]
        );
    }
    println!(
        "false negatives: {false_negatives} turns ({missed_files} missed files, \
         {missed_processes} missed processes)"
    );
    println!(
        "false positives: {false_positive_turns} turns of {n} ({:.1}%), \
         {extra_components} extra components; {none_flagged} of {labelled_none} \
         `none` turns flagged",
        fp_rate * 100.0
    );
    println!(
        "turn/end latency: p50 {} us, p99 {} us, max {} us",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(0)
    );
    for m in &mismatches {
        println!(
            "{} line {}: label {} detected {}: {}\n  {}",
            if m["false_negative"].as_bool() == Some(true) {
                "FALSE NEGATIVE"
            } else {
                "false positive"
            },
            m["line"],
            m["label"].as_str().unwrap(),
            m["detected"].as_str().unwrap(),
            m["script"].as_str().unwrap(),
            m["effects"]
        );
    }

    let by_label: BTreeMap<&str, BTreeMap<&str, usize>> = CLASSES
        .iter()
        .enumerate()
        .map(|(r, l)| {
            (
                l.as_str(),
                CLASSES
                    .iter()
                    .enumerate()
                    .map(|(c, g)| (g.as_str(), matrix[r][c]))
                    .collect(),
            )
        })
        .collect();
    let report = serde_json::json!({
        "turns": n,
        "matrix": by_label,
        "false_negatives": false_negatives,
        "missed_files": missed_files,
        "missed_processes": missed_processes,
        "false_positive_turns": false_positive_turns,
        "false_positive_rate": fp_rate,
        "extra_components": extra_components,
        "none_labelled": labelled_none,
        "none_flagged": none_flagged,
        "latency_us": {
            "p50": percentile(&latencies, 0.5),
            "p99": percentile(&latencies, 0.99),
            "max": latencies.last().copied().unwrap_or(0),
        },
        "mismatches": mismatches,
    });
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspect-corpus.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report).unwrap())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    println!("report: {}", path.display());

    assert_eq!(
        false_negatives, 0,
        "the inspector missed effects in {false_negatives} turns (see above)"
    );
    d.rm(&s.id).await.unwrap();
    d.stop_and_check_leaks();
}

/// Turn calls out of order, on an unknown session, and on a session that died
/// mid-turn are refused with a kind and a message that say so.
#[tokio::test(flavor = "multi_thread")]
async fn turn_errors_are_clear() {
    let mut d = TestDaemon::start();
    let s = d
        .create(&CreateSession::default())
        .await
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()));

    api_error(
        turn_end(&d, &s.id).await,
        409,
        "conflict",
        "turn/end before any turn/begin",
    );
    let first = turn_begin(&d, &s.id).await.unwrap();
    assert_eq!(first.turn, 1);
    api_error(
        turn_begin(&d, &s.id).await,
        409,
        "conflict",
        "turn/begin while a turn is open",
    );
    let fx = turn_end(&d, &s.id).await.unwrap();
    assert_eq!(fx.turn, 1);
    api_error(turn_end(&d, &s.id).await, 409, "conflict", "turn/end twice");
    let second = turn_begin(&d, &s.id).await.unwrap();
    assert_eq!(second.turn, 2, "a refused call does not consume a turn");
    turn_end(&d, &s.id).await.unwrap();

    api_error(
        turn_begin(&d, "no-such-session").await,
        404,
        "not_found",
        "turn/begin on an unknown session",
    );
    api_error(
        turn_end(&d, "no-such-session").await,
        404,
        "not_found",
        "turn/end on an unknown session",
    );
    d.rm(&s.id).await.unwrap();

    // A session whose init is killed from the host mid-turn: its pid
    // namespace dies with it, and turn/end says the session died rather than
    // reporting the deaths as the turn's effects.
    let s = d
        .create(&CreateSession::default())
        .await
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()));
    turn_begin(&d, &s.id).await.unwrap();
    let init = s.init_pid.expect("a running session has an init");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Dead, that is: its init stays a zombie until the daemon reaps it.
    assert!(
        gone(|| d.processes().into_iter().all(zombie)),
        "the killed session's processes linger: {:?}",
        d.processes()
    );
    let msg = api_error(
        turn_end(&d, &s.id).await,
        409,
        "conflict",
        "turn/end after the session died",
    );
    assert!(msg.contains("died"), "{msg}");
    // The dead session is still the daemon's to remove (or already removed).
    match d.rm(&s.id).await {
        Ok(()) => {}
        Err(e) if e.kind() == Some("not_found") => {}
        Err(e) => panic!("rm of a dead session: {e}\n{}", d.log()),
    }
    d.stop_and_check_leaks();
}
