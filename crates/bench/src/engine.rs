//! `drums bench engine`: what the checkpoint engine's versions cost
//! (docs/engine.md), through drumsd's API as an agent sees them.
//!
//! One headless and one desktop session each run a small server that keeps a
//! counter in memory only. After an unmeasured round, each of `n` rounds
//! takes, through `turn/begin`, an exec and `turn/end` with `checkpoint` and
//! `wait`:
//! - a files-only version of the headless session (a turn that writes a file);
//! - a process-only version of each (a turn that asks the server to count, so
//!   its memory changes and no file does). A desktop's turn is often `both`
//!   whatever the turn did: Chromium writes its profile now and then, and
//!   maps its databases shared and writable, which the inspector counts as
//!   unknown file changes, so the version is rightly full. Such a turn is
//!   done again, up to 3 times; when a round finds none, the desktop's
//!   process-only versions are tried no more, and the output says why;
//! - a full version of each (a turn that does both);
//!
//! then rolls the headless session back to its files-only version, and each
//! session back to its full version; then, on the headless session, two
//! turns that write a file and a rollback to the first one's version, which
//! no process ran since (what a rollback in place is for). Headless and desktop are interleaved in
//! every round, the arm that goes first alternating. Every version must have
//! taken what its turn calls for; the bench fails rather than report a number
//! under the wrong label. The version's own time and frozen time are what
//! drumsd recorded for it (`files` or `process` cost: from its job's start to
//! its manifest on disk); the turn end is the call as the client saw it.
//!
//! Recovery, `n` rounds after the versions: each session's processes are
//! killed (SIGKILL of its init) and `POST /v1/sessions/{s}/recover` times
//! the recovery; then drumsd and the session's processes are killed, drumsd
//! is started again as /proc says it was started (see `respawn`), and the
//! time from its start until it answers is timed: it recovers the session
//! before it opens its socket. The bench then talks to the new drumsd.
//!
//! Queue wait: 1, 4 and 16 headless sessions end a files turn at once (the
//! turn ends with `wait: false`, concurrently), and each job's `queued_ms`
//! is read with `GET /v1/jobs/{job}?wait=true`. With promotion on, every
//! other job is promoted as soon as its turn end answered; the promoted and
//! unpromoted groups are reported apart. Off and on alternate round by round.
//! The queue wait runs from the job's submission: a turn end that waited for
//! room (back-pressure) did so before it, and shows in the turn end's time.
//!
//! JSON keys: `[measure.]kind[.profile][.part].stat`, times in seconds, sizes
//! in bytes, stats `p50` and `p95`. The files-only version is headless only,
//! so it has no profile.
//! - `files`, `process.{headless,desktop}`, `full.{headless,desktop}`: the
//!   version's own time; `<kind>.end`: the turn end call;
//! - `frozen.<kind>`: how long the session's processes were frozen;
//! - `rollback.files`, `rollback.files.still`, `rollback.full.{headless,desktop}`:
//!   the rollback call (`still`: to a files-only version no process ran since);
//! - `recover.{headless,desktop}`: the recover call;
//!   `recover.restart.{headless,desktop}`: a drumsd's start after `kill -9`
//!   until it answers, the session recovered;
//! - `bytes.<kind>`: what the version wrote (file data of its snapshot newer
//!   than the previous files artifact, plus its CRIU images); for a full
//!   version also `bytes.full.<profile>.{files,process}`;
//! - `queue.{1,4,16}`: queue wait, promotion off; `queue.N.end`: the turn end
//!   call; `queue.{4,16}.{promoted,unpromoted}`: promotion on;
//!   `queue.N.promoted.started_high`: how many promoted jobs were still queued
//!   when promoted (a count); `queue.stopped`: why a size was not measured;
//! - `ratio.<kind>.desktop_headless`: the median over rounds of desktop over
//!   headless in the same round; `ratio.queue.N.promoted_unpromoted`: of the
//!   groups' p50s;
//! - `process.desktop.redone`: desktop process-only turns done again because
//!   Chromium wrote files in them too (a count).

use std::time::Instant;

use drums_api::{
    Client, EndTurn, Job, Policy, Rollback, Session, SessionVersion, TurnClass, TurnEffects,
};
use futures::future::join_all;
use hyper::Method;
use serde_json::{json, Map, Value};

use super::{create, progress, respawn, sh, turn_begin, Made};
use crate::exit::{self, Failure};
use crate::stats::{p50_p95, paired, put_p50_p95};
use crate::table;
use drums_api::exec::enc;

/// A server that keeps a counter in memory only: `inc` adds one. Started
/// from `/` with no open file of the session's, so a files-only version may
/// pair with its process state.
const SERVER: &str = "cd / && nohup python3 -c \"exec('import socket\\ns=socket.socket()\\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\\ns.bind((\\'127.0.0.1\\',7000))\\ns.listen()\\nn=0\\nwhile True:\\n c,_=s.accept()\\n m=c.recv(16)\\n n+=m==b\\'inc\\'\\n c.sendall(str(n).encode())\\n c.close()')\" >/dev/null 2>&1 & sleep 0.5";

/// A turn that changes the server's memory and no file.
const INC: &str = "python3 -c \"import socket;c=socket.create_connection(('127.0.0.1',7000));c.sendall(b'inc');c.recv(16)\"";

/// A turn that writes a file only.
fn write(round: usize) -> String {
    format!("echo round-{round} > /root/bench-engine")
}

/// The turns of the rollback to a files-only version that no process ran
/// since: a file each, and one that changes.
fn write_still(round: usize, k: usize) -> String {
    format!("echo round-{round}-{k} > /root/bench-engine-still; echo {k} > /root/bench-engine-still-{k}")
}

/// A turn that writes, and the version it took, whatever it took.
async fn any_version(c: &Client, s: &Session, script: &str) -> Result<(), Failure> {
    turn_begin(c, s).await?;
    sh(c, s, script).await?;
    let e = end(c, s, true).await?;
    match e.checkpoint.as_ref().and_then(|k| k.version.as_ref()) {
        Some(v) if v.state == drums_api::VersionState::Done => Ok(()),
        _ => Err(mislabelled(format!(
            "turn {} of session {} ({:?}) took no version: {:?}",
            e.turn, s.id, e.class, e.checkpoint
        ))),
    }
}

/// Queue sizes: sessions ending their turns at once.
const QUEUE_SIZES: [usize; 3] = [1, 4, 16];

const PROFILES: [&str; 2] = ["headless", "desktop"];

/// Turns of a desktop's process-only version, at most, before the bench
/// gives up on it.
const REDO_TRIES: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Files,
    Process,
    Full,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Files => "files",
            Kind::Process => "process",
            Kind::Full => "full",
        }
    }
}

/// One version, as drumsd recorded it and as the client saw its turn end.
struct Taken {
    number: u64,
    own: f64,
    frozen: f64,
    end: f64,
    files_bytes: u64,
    process_bytes: u64,
}

/// The samples of the versions part; `[headless, desktop]` where both run.
#[derive(Default)]
struct Versions {
    files: Vec<Taken>,
    /// By round; a desktop's is missing when its turns could not be
    /// process-only (see [`version_redoing`]).
    process: [Vec<Option<Taken>>; 2],
    full: [Vec<Taken>; 2],
    rollback_files: Vec<f64>,
    /// To a files-only version when no process did anything since.
    rollback_still: Vec<f64>,
    rollback_full: [Vec<f64>; 2],
    /// Desktop process-only turns that were another class.
    redone: usize,
    /// Why the desktop's process-only versions stopped being tried.
    desktop_process: Option<String>,
    /// `drums recover` after the session's processes were killed.
    recover: [Vec<f64>; 2],
    /// After `kill -9` of drumsd and of the session's processes: from the
    /// new drumsd's start until it answers, having recovered the session.
    restart: [Vec<f64>; 2],
}

/// One job of a queue batch.
struct Queued {
    queued: f64,
    end: f64,
    promoted: bool,
    started_high: bool,
}

/// The queue part: per size, promotion off, and promotion on; and why a
/// size was not measured.
#[derive(Default)]
struct Queue {
    off: Vec<(usize, Vec<Queued>)>,
    on: Vec<(usize, Vec<Queued>)>,
    stopped: Option<String>,
}

pub async fn engine(c: &Client, n: usize, as_json: bool) -> Result<i32, Failure> {
    let (versions, queue) = measure(c, n, as_json).await?;
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(n, &versions, &queue)).expect("serialize")
        );
    } else {
        print_tables(n, &versions, &queue);
    }
    Ok(status(&queue))
}

/// One run of `n` rounds as JSON, for `--ab`'s segments (ab.rs), and the
/// exit status it calls for.
pub(crate) async fn engine_json(c: &Client, n: usize) -> Result<(Value, i32), Failure> {
    let (versions, queue) = measure(c, n, true).await?;
    Ok((to_json(n, &versions, &queue), status(&queue)))
}

/// A size that found no room is said in the output, and is not a success.
fn status(queue: &Queue) -> i32 {
    if queue.stopped.is_some() {
        exit::UNAVAILABLE
    } else {
        exit::OK
    }
}

async fn measure(c: &Client, n: usize, as_json: bool) -> Result<(Versions, Queue), Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    // Everything a part creates is removed after it, also when it failed;
    // its versions go with their sessions.
    let m = Made::new(c);
    let r = versions_part(&m, n, as_json).await;
    let versions = m.finish(r).await?;
    let m = Made::new(c);
    let r = queue_part(&m, n, as_json).await;
    let queue = m.finish(r).await?;
    Ok((versions, queue))
}

async fn end(c: &Client, s: &Session, wait: bool) -> Result<TurnEffects, Failure> {
    Ok(c.json(
        Method::POST,
        &format!("/v1/sessions/{}/turn/end", enc(&s.id)),
        Some(&EndTurn {
            checkpoint: true,
            policy: Some(Policy::Selective),
            wait,
        }),
    )
    .await?)
}

/// A turn running `script`, ended with a version that must have taken
/// `want`; anything else fails the bench.
async fn version(c: &Client, s: &Session, script: &str, want: Kind) -> Result<Taken, Failure> {
    match turn(c, s, script, want).await? {
        Ok(t) => Ok(t),
        Err(was) => Err(mislabelled(format!(
            "a {} turn of session {} was {was}",
            want.as_str(),
            s.id
        ))),
    }
}

/// Like [`version`], but a turn that the session's own background work made
/// another class (a desktop's Chromium writes its profile now and then, and
/// once it maps its databases shared and writable, every turn in which it
/// ran may have changed them) is done again, up to `tries` times. Returns
/// the version, or what the last turn was; and how many turns were not what
/// they meant to be.
async fn version_redoing(
    c: &Client,
    s: &Session,
    script: &str,
    want: Kind,
    tries: usize,
) -> Result<(Result<Taken, String>, usize), Failure> {
    let mut was = String::new();
    for redone in 0..tries {
        match turn(c, s, script, want).await? {
            Ok(t) => return Ok((Ok(t), redone)),
            Err(w) => was = w,
        }
    }
    Ok((Err(was), tries))
}

/// A turn's class and the first of the changes that made it so.
fn other_class(e: &TurnEffects) -> String {
    let mut out = format!("{:?}", e.class).to_lowercase();
    if !e.files.is_empty() {
        let first: Vec<String> = e
            .files
            .iter()
            .take(3)
            .map(|f| format!("{} {}", f.path, f.change))
            .collect();
        out.push_str(&format!(" ({}", first.join(", ")));
        if e.files.len() > 3 {
            out.push_str(&format!(", and {} more", e.files.len() - 3));
        }
        out.push(')');
    }
    out
}

/// What the turn was, when its class is not what `want` calls for: its
/// version, if any, is not what this turn meant to measure. (The inner
/// `Err` is that description for the report, an outcome and not a failure;
/// failures are the outer `Failure`.)
async fn turn(
    c: &Client,
    s: &Session,
    script: &str,
    want: Kind,
) -> Result<Result<Taken, String>, Failure> {
    turn_begin(c, s).await?;
    sh(c, s, script).await?;
    let t = Instant::now();
    let e = end(c, s, true).await?;
    let end = t.elapsed().as_secs_f64();
    let class = match want {
        Kind::Files => TurnClass::Files,
        Kind::Process => TurnClass::Processes,
        Kind::Full => TurnClass::Both,
    };
    // The first version of a session is full whatever its turn did.
    if e.class != class && !(want == Kind::Full && e.turn == 1) {
        return Ok(Err(other_class(&e)));
    }
    let v = e
        .checkpoint
        .as_ref()
        .and_then(|k| k.version.as_ref())
        .ok_or_else(|| {
            mislabelled(format!(
                "turn {} of session {} ({:?}) took no version, not {}: {:?}",
                e.turn,
                s.id,
                e.class,
                want.as_str(),
                e.checkpoint
            ))
        })?;
    // A session's first version, while only drums' own processes run in it,
    // is light: its files alone (docs/engine.md, "Light versions"); the
    // queue's sessions take theirs so. It is setup there, not a number.
    let light = want == Kind::Full && e.turn == 1 && v.took == "files" && v.process_of.is_none();
    if v.state != drums_api::VersionState::Done || (v.took != want.as_str() && !light) {
        return Err(mislabelled(format!(
            "version {} of session {} is {} and took {:?}, not {} (turn class {:?}, reason {:?})",
            v.number,
            s.id,
            v.state,
            v.took,
            want.as_str(),
            e.class,
            v.reason
        )));
    }
    let cost = match want {
        _ if light => v.files,
        Kind::Files => v.files,
        Kind::Process | Kind::Full => v.process,
    }
    .ok_or_else(|| no_cost(v))?;
    Ok(Ok(Taken {
        number: v.number,
        own: cost.total_ms / 1e3,
        frozen: cost.frozen_ms / 1e3,
        end,
        files_bytes: v.files.map_or(0, |c| c.bytes),
        process_bytes: v.process.map_or(0, |c| c.bytes),
    }))
}

fn mislabelled(what: String) -> Failure {
    Failure::new(
        exit::INTERNAL,
        format!("{what}; the bench reports no number under the wrong label"),
    )
}

fn no_cost(v: &SessionVersion) -> Failure {
    Failure::new(
        exit::INTERNAL,
        format!(
            "version {} ({}) of session {} records no cost of what it took",
            v.number, v.took, v.session_id
        ),
    )
}

/// Seconds of a rollback of `s` to version `number`.
async fn rollback(c: &Client, s: &Session, number: u64) -> Result<f64, Failure> {
    let t = Instant::now();
    let _: Session = c
        .json(
            Method::POST,
            &format!("/v1/sessions/{}/rollback", enc(&s.id)),
            Some(&Rollback {
                to: Some(number.to_string()),
            }),
        )
        .await?;
    Ok(t.elapsed().as_secs_f64())
}

async fn versions_part(m: &Made<'_>, n: usize, as_json: bool) -> Result<Versions, Failure> {
    let c = m.client();
    let mut live = Vec::new();
    for profile in PROFILES {
        progress(as_json, format!("creating a {profile} session"));
        live.push(create(m, profile).await?.0);
    }
    let sessions = [live[0].clone(), live[1].clone()];
    // The first version of a session is full whatever its turn did.
    for s in &sessions {
        version(c, s, SERVER, Kind::Full).await?;
    }
    let mut v = Versions::default();
    // Round 0 is unmeasured: it warms caches and the daemon's paths.
    for round in 0..=n {
        let r = one_round(c, &sessions, round, v.desktop_process.is_none()).await?;
        if let Some(was) = r.desktop_process {
            // Turns of a desktop stay what its background work makes them:
            // trying again each round only adds full versions.
            v.desktop_process = Some(format!(
                "{} turns in a row in round {round} were {was}",
                REDO_TRIES
            ));
        }
        v.redone += r.redone;
        if round > 0 {
            v.files.push(r.files);
            for (p, (process, full)) in r.process.into_iter().zip(r.full).enumerate() {
                v.process[p].push(process);
                v.full[p].push(full);
            }
            v.rollback_files.push(r.rollback_files);
            v.rollback_still.push(r.rollback_still);
            for (p, t) in r.rollback_full.into_iter().enumerate() {
                v.rollback_full[p].push(t);
            }
            progress(
                as_json,
                format!(
                    "round {round}/{n}: files {:.1} ms, full headless {:.0} ms, desktop {:.0} ms",
                    v.files[round - 1].own * 1e3,
                    v.full[0][round - 1].own * 1e3,
                    v.full[1][round - 1].own * 1e3
                ),
            );
        }
    }
    let daemon = respawn::Daemon::of(c.socket())?;
    for round in 1..=n {
        progress(as_json, format!("recover: round {round}/{n}"));
        let order = if round.is_multiple_of(2) {
            [0, 1]
        } else {
            [1, 0]
        };
        for p in order {
            v.recover[p].push(recover(c, &sessions[p]).await?);
            v.restart[p].push(restart(c, &sessions[p], &daemon).await?);
        }
    }
    if !as_json {
        eprintln!();
    }
    Ok(v)
}

/// The session as drumsd has it now.
async fn current(c: &Client, s: &Session) -> Result<Session, Failure> {
    Ok(c.json(
        Method::GET,
        &format!("/v1/sessions/{}", enc(&s.id)),
        None::<&()>,
    )
    .await?)
}

/// The live init of `s`, which must have changed from `before`.
fn init_of(s: &Session, before: Option<i32>) -> Result<i32, Failure> {
    match s.init_pid {
        Some(pid) if s.state == drums_api::SessionState::Running && Some(pid) != before => Ok(pid),
        _ => Err(Failure::new(
            exit::INTERNAL,
            format!(
                "session {} was not recovered: {} with init {:?} (was {before:?})",
                s.name, s.state, s.init_pid
            ),
        )),
    }
}

/// Seconds of `drums recover` of `s` after its processes were killed.
async fn recover(c: &Client, s: &Session) -> Result<f64, Failure> {
    let before = init_of(&current(c, s).await?, None)?;
    respawn::kill_session(before)?;
    let t = Instant::now();
    let back: Session = c
        .json(
            Method::POST,
            &format!("/v1/sessions/{}/recover", enc(&s.id)),
            None::<&()>,
        )
        .await?;
    let took = t.elapsed().as_secs_f64();
    init_of(&back, Some(before))?;
    Ok(took)
}

/// Seconds from the start of a new drumsd, after `kill -9` of the old one
/// and of the session's processes, until it answers: it recovers the
/// session (from its newest version) before it opens its socket.
async fn restart(c: &Client, s: &Session, daemon: &respawn::Daemon) -> Result<f64, Failure> {
    let before = init_of(&current(c, s).await?, None)?;
    // drumsd first, so it sees nothing of the session's death.
    let daemon = respawn::Daemon::of(c.socket()).unwrap_or_else(|_| daemon.clone());
    daemon.kill9()?;
    respawn::kill_session(before)?;
    let t = Instant::now();
    daemon.respawn()?;
    daemon.wait_up(std::time::Duration::from_secs(120))?;
    let took = t.elapsed().as_secs_f64();
    init_of(&current(c, s).await?, Some(before))?;
    Ok(took)
}

/// One round's samples.
struct Round {
    files: Taken,
    process: [Option<Taken>; 2],
    full: [Taken; 2],
    rollback_files: f64,
    rollback_still: f64,
    rollback_full: [f64; 2],
    redone: usize,
    /// What the desktop's last process-only turn was, when none was.
    desktop_process: Option<String>,
}

async fn one_round(
    c: &Client,
    s: &[Session; 2],
    round: usize,
    try_desktop_process: bool,
) -> Result<Round, Failure> {
    let order: [usize; 2] = if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    };
    let files = version(c, &s[0], &write(round), Kind::Files).await?;
    let mut process: [Option<Taken>; 2] = [None, None];
    let (mut redone, mut desktop_process) = (0, None);
    for p in order {
        process[p] = if PROFILES[p] != "desktop" {
            Some(version(c, &s[p], INC, Kind::Process).await?)
        } else if try_desktop_process {
            let (t, k) = version_redoing(c, &s[p], INC, Kind::Process, REDO_TRIES).await?;
            redone += k;
            t.map_err(|was| desktop_process = Some(was)).ok()
        } else {
            None
        };
    }
    let mut full: [Option<Taken>; 2] = [None, None];
    let both = format!("{}; {INC}", write(round));
    for p in order {
        full[p] = Some(version(c, &s[p], &both, Kind::Full).await?);
    }
    let [Some(f0), Some(f1)] = full else {
        unreachable!("both arms ran")
    };
    let rollback_files = rollback(c, &s[0], files.number).await?;
    let mut rollback_full = [0.0; 2];
    let numbers = [f0.number, f1.number];
    for p in order {
        rollback_full[p] = rollback(c, &s[p], numbers[p]).await?;
    }
    // Two turns that write a file, and back to the first: no process did
    // anything since it, so its files are put back in place, with no CRIU
    // restore. (The second version is whatever its turn takes: on a build
    // before issue 29, a files-only version's own freeze made the next
    // turn `both`.)
    let still = version(c, &s[0], &write_still(round, 1), Kind::Files).await?;
    any_version(c, &s[0], &write_still(round, 2)).await?;
    let rollback_still = rollback(c, &s[0], still.number).await?;
    Ok(Round {
        files,
        process,
        full: [f0, f1],
        rollback_files,
        rollback_still,
        rollback_full,
        redone,
        desktop_process,
    })
}

async fn queue_part(m: &Made<'_>, n: usize, as_json: bool) -> Result<Queue, Failure> {
    let c = m.client();
    let mut live = Vec::new();
    let mut q = Queue::default();
    let most = QUEUE_SIZES[QUEUE_SIZES.len() - 1];
    while live.len() < most {
        progress(
            as_json,
            format!("queue: creating session {}/{most}", live.len() + 1),
        );
        match create(m, "headless").await {
            Ok((s, _)) => live.push(s),
            Err(e) => {
                q.stopped = Some(format!(
                    "session {} of {most} could not be created ({}); sizes above {} not measured",
                    live.len() + 1,
                    e.message,
                    live.len()
                ));
                break;
            }
        }
    }
    // The first version of each is full; the batches' are files-only.
    for (i, s) in live.iter().enumerate() {
        progress(
            as_json,
            format!("queue: first version {}/{}", i + 1, live.len()),
        );
        version(c, s, &write(0), Kind::Full).await?;
    }
    for size in QUEUE_SIZES.into_iter().filter(|&k| k <= live.len()) {
        let sessions = &live[..size];
        let (mut off, mut on) = (Vec::new(), Vec::new());
        // Round 0 is unmeasured.
        for round in 0..=n {
            let arms: &[bool] = match (size, round % 2) {
                (1, _) => &[false],
                (_, 0) => &[false, true],
                _ => &[true, false],
            };
            for &promote in arms {
                let got = batch(c, sessions, promote, round).await?;
                if round > 0 {
                    if promote { &mut on } else { &mut off }.extend(got);
                }
            }
            progress(
                as_json,
                format!("queue: {size} sessions, round {round}/{n}"),
            );
        }
        q.off.push((size, off));
        if size > 1 {
            q.on.push((size, on));
        }
    }
    if !as_json {
        eprintln!();
    }
    Ok(q)
}

/// Every session ends a files turn at once; with `promote`, every other job
/// is promoted as soon as its turn end answered.
async fn batch(
    c: &Client,
    sessions: &[Session],
    promote: bool,
    round: usize,
) -> Result<Vec<Queued>, Failure> {
    for s in sessions {
        turn_begin(c, s).await?;
        sh(c, s, &write(round)).await?;
    }
    let submitted = join_all(sessions.iter().enumerate().map(|(i, s)| async move {
        let t = Instant::now();
        let e = end(c, s, false).await?;
        let end = t.elapsed().as_secs_f64();
        let job = e.checkpoint.and_then(|k| k.job).ok_or_else(|| {
            mislabelled(format!("turn {} of session {} queued no job", e.turn, s.id))
        })?;
        let promoted = promote && i % 2 == 0;
        let mut started_high = false;
        if promoted {
            let j: Job = c
                .json(
                    Method::POST,
                    &format!("/v1/jobs/{}/promote", enc(&job)),
                    None::<&()>,
                )
                .await?;
            started_high =
                j.state == drums_api::JobState::Queued && j.priority == drums_api::Priority::High;
        }
        Ok::<_, Failure>((job, end, promoted, started_high))
    }))
    .await;
    // Wait for every job that was queued before failing, so none is still
    // running when the sessions are removed.
    let finished = join_all(submitted.iter().flatten().map(|(job, ..)| async move {
        c.json::<Job>(
            Method::GET,
            &format!("/v1/jobs/{}?wait=true", enc(job)),
            None::<&()>,
        )
        .await
    }))
    .await;
    let submitted: Vec<_> = submitted.into_iter().collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for ((_, end, promoted, asked_high), j) in submitted.into_iter().zip(finished) {
        let j = j?;
        let queued = match (j.state, j.queued_ms) {
            (drums_api::JobState::Done, Some(ms)) => ms / 1e3,
            _ => {
                return Err(Failure::new(
                    exit::INTERNAL,
                    format!("job {} is {}: {:?}", j.id, j.state, j.error),
                ))
            }
        };
        out.push(Queued {
            queued,
            end,
            promoted,
            started_high: asked_high && j.started_as == Some(drums_api::Priority::High),
        });
    }
    Ok(out)
}

/// One row of the versions table: a measure of a kind, headless or desktop.
struct Line {
    key: String,
    what: String,
    secs: Vec<f64>,
    target: &'static str,
}

fn lines(v: &Versions) -> Vec<Line> {
    let line = |key: &str, what: &str, secs: Vec<f64>, target| Line {
        key: key.into(),
        what: what.into(),
        secs,
        target,
    };
    let own = |t: &[&Taken]| t.iter().map(|x| x.own).collect::<Vec<_>>();
    let endt = |t: &[&Taken]| t.iter().map(|x| x.end).collect::<Vec<_>>();
    let frozen = |t: &[&Taken]| t.iter().map(|x| x.frozen).collect::<Vec<_>>();
    let files: Vec<&Taken> = v.files.iter().collect();
    let mut out = vec![
        line("files", "files-only version", own(&files), "15 ms"),
        line("files.end", "  turn end (wait)", endt(&files), ""),
        line("frozen.files", "  frozen", frozen(&files), ""),
    ];
    let (process, full) = taken(v);
    for (kind, samples) in [("process", &process), ("full", &full)] {
        for (p, profile) in PROFILES.into_iter().enumerate() {
            let t = &samples[p];
            let name = if kind == "process" {
                "process-only"
            } else {
                "full"
            };
            out.push(line(
                &format!("{kind}.{profile}"),
                &format!("{name} version, {profile}"),
                own(t),
                "",
            ));
            out.push(line(
                &format!("{kind}.{profile}.end"),
                "  turn end (wait)",
                endt(t),
                "",
            ));
            out.push(line(
                &format!("frozen.{kind}.{profile}"),
                "  frozen",
                frozen(t),
                "",
            ));
        }
    }
    out.push(line(
        "rollback.files",
        "rollback to files-only, headless, processes changed since",
        v.rollback_files.clone(),
        "",
    ));
    out.push(line(
        "rollback.files.still",
        "rollback to files-only, headless, no process ran since",
        v.rollback_still.clone(),
        "20 ms",
    ));
    for (p, (profile, target)) in PROFILES.into_iter().zip(["80 ms", "0.35 s"]).enumerate() {
        out.push(line(
            &format!("rollback.full.{profile}"),
            &format!("rollback to full, {profile}"),
            v.rollback_full[p].clone(),
            target,
        ));
    }
    for (p, profile) in PROFILES.into_iter().enumerate() {
        out.push(line(
            &format!("recover.{profile}"),
            &format!("recover, {profile} (drums recover)"),
            v.recover[p].clone(),
            "",
        ));
        out.push(line(
            &format!("recover.restart.{profile}"),
            &format!("recover, {profile}, kill -9 of drumsd"),
            v.restart[p].clone(),
            "",
        ));
    }
    out
}

/// The process-only and full versions taken, per profile.
type PerProfile<'a> = [Vec<&'a Taken>; 2];

fn taken(v: &Versions) -> (PerProfile<'_>, PerProfile<'_>) {
    (
        [0, 1].map(|p| v.process[p].iter().flatten().collect()),
        [0, 1].map(|p| v.full[p].iter().collect()),
    )
}

/// Bytes written per version kind: (key, what, samples).
fn byte_lines(v: &Versions) -> Vec<(String, String, Vec<f64>)> {
    let (process, _) = taken(v);
    let mut out = vec![(
        "bytes.files".to_owned(),
        "files-only version".to_owned(),
        v.files.iter().map(|t| t.files_bytes as f64).collect(),
    )];
    for (p, profile) in PROFILES.into_iter().enumerate() {
        out.push((
            format!("bytes.process.{profile}"),
            format!("process-only version, {profile}"),
            process[p].iter().map(|t| t.process_bytes as f64).collect(),
        ));
    }
    for (p, profile) in PROFILES.into_iter().enumerate() {
        let t = &v.full[p];
        out.push((
            format!("bytes.full.{profile}"),
            format!("full version, {profile}"),
            t.iter()
                .map(|t| (t.files_bytes + t.process_bytes) as f64)
                .collect(),
        ));
        out.push((
            format!("bytes.full.{profile}.files"),
            "  of which files".to_owned(),
            t.iter().map(|t| t.files_bytes as f64).collect(),
        ));
        out.push((
            format!("bytes.full.{profile}.process"),
            "  of which process images".to_owned(),
            t.iter().map(|t| t.process_bytes as f64).collect(),
        ));
    }
    out
}

/// Desktop over headless, paired by round (rounds in which both were
/// taken): (key, what, ratio). None without such a round.
fn ratios(v: &Versions) -> Vec<(String, &'static str, f64)> {
    let own = |t: &[Taken]| t.iter().map(|x| x.own).collect::<Vec<_>>();
    let (headless, desktop): (Vec<f64>, Vec<f64>) = v.process[0]
        .iter()
        .zip(&v.process[1])
        .filter_map(|(h, d)| Some((h.as_ref()?.own, d.as_ref()?.own)))
        .unzip();
    let mut out = Vec::new();
    if !headless.is_empty() {
        out.push((
            "ratio.process.desktop_headless".into(),
            "process-only version",
            paired(&desktop, &headless),
        ));
    }
    out.extend([
        (
            "ratio.full.desktop_headless".into(),
            "full version",
            paired(&own(&v.full[1]), &own(&v.full[0])),
        ),
        (
            "ratio.rollback.full.desktop_headless".into(),
            "rollback to full",
            paired(&v.rollback_full[1], &v.rollback_full[0]),
        ),
    ]);
    out
}

/// The queue groups: (key, sessions, promotion, group, samples).
fn queue_groups(q: &Queue) -> Vec<(String, usize, &'static str, &'static str, Vec<&Queued>)> {
    let mut out = Vec::new();
    for &size in &QUEUE_SIZES {
        if let Some((_, s)) = q.off.iter().find(|(k, _)| *k == size) {
            out.push((
                format!("queue.{size}"),
                size,
                "off",
                "all",
                s.iter().collect(),
            ));
        }
        if let Some((_, s)) = q.on.iter().find(|(k, _)| *k == size) {
            for (group, promoted) in [("promoted", true), ("unpromoted", false)] {
                out.push((
                    format!("queue.{size}.{group}"),
                    size,
                    "on",
                    group,
                    s.iter().filter(|x| x.promoted == promoted).collect(),
                ));
            }
        }
    }
    out
}

fn to_json(n: usize, v: &Versions, q: &Queue) -> Value {
    let mut out = Map::new();
    out.insert("n".into(), json!(n));
    let mut put = |key: &str, samples: &[f64]| put_p50_p95(&mut out, key, samples);
    for l in lines(v) {
        put(&l.key, &l.secs);
    }
    for (key, _, b) in byte_lines(v) {
        put(&key, &b);
    }
    for (key, _, _, group, s) in queue_groups(q) {
        put(&key, &s.iter().map(|x| x.queued).collect::<Vec<_>>());
        if group == "all" {
            put(
                &format!("{key}.end"),
                &s.iter().map(|x| x.end).collect::<Vec<_>>(),
            );
        }
    }
    for (key, size, _, group, s) in queue_groups(q) {
        if group == "promoted" {
            out.insert(
                format!("{key}.started_high"),
                json!(s.iter().filter(|x| x.started_high).count()),
            );
            let p50 = |g: &str| {
                out.get(&format!("queue.{size}.{g}.p50"))
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN)
            };
            // A group whose median job started at once has no ratio.
            if p50("unpromoted") > 0.0 {
                let r = p50("promoted") / p50("unpromoted");
                out.insert(format!("ratio.queue.{size}.promoted_unpromoted"), json!(r));
            }
        }
    }
    for (key, _, r) in ratios(v) {
        out.insert(key, json!(r));
    }
    out.insert("process.desktop.redone".into(), json!(v.redone));
    if let Some(why) = &v.desktop_process {
        out.insert("process.desktop.stopped".into(), json!(why));
    }
    if let Some(why) = &q.stopped {
        out.insert("queue.stopped".into(), json!(why));
    }
    Value::Object(out)
}

fn ms(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s < 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

fn size(b: f64) -> String {
    match b {
        b if b >= (1 << 20) as f64 => format!("{:.1} MiB", b / (1 << 20) as f64),
        b if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b => format!("{b:.0} B"),
    }
}

fn print_tables(n: usize, v: &Versions, q: &Queue) {
    println!("drums bench engine -n {n} (headless and desktop interleaved in each round)");
    let rows: Vec<Vec<String>> = lines(v)
        .into_iter()
        .map(|l| {
            let (p50, p95) = p50_p95(l.secs.iter().copied());
            let target = if l.target.is_empty() {
                String::new()
            } else {
                format!("<= {}", l.target)
            };
            let n = l.secs.len().to_string();
            if l.secs.is_empty() {
                return vec![l.what, n, "not taken".into(), String::new(), target];
            }
            vec![l.what, n, ms(p50), ms(p95), target]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["version / step", "n", "p50", "p95", "target (p50)"],
            &rows
        )
    );
    println!(
        "desktop process-only turns that were another class (their versions full): {}",
        v.redone
    );
    if let Some(why) = &v.desktop_process {
        println!("desktop process-only versions no longer tried: {why}");
    }
    println!();
    let rows: Vec<Vec<String>> = byte_lines(v)
        .into_iter()
        .map(|(_, what, b)| {
            if b.is_empty() {
                return vec![what, "not taken".into(), String::new()];
            }
            let (p50, p95) = p50_p95(b);
            vec![what, size(p50), size(p95)]
        })
        .collect();
    print!("{}", table::render(&["bytes written", "p50", "p95"], &rows));
    println!();
    let rows: Vec<Vec<String>> = ratios(v)
        .into_iter()
        .map(|(_, what, r)| vec![what.to_owned(), format!("{r:.2}")])
        .collect();
    print!(
        "{}",
        table::render(&["desktop / headless, paired by round", "ratio"], &rows)
    );
    println!();
    let groups = queue_groups(q);
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|(_, size, promotion, group, s)| {
            let (w50, w95) = p50_p95(s.iter().map(|x| x.queued));
            let (e50, e95) = p50_p95(s.iter().map(|x| x.end));
            let high = if *group == "promoted" {
                format!(
                    "{}/{}",
                    s.iter().filter(|x| x.started_high).count(),
                    s.len()
                )
            } else {
                String::new()
            };
            vec![
                size.to_string(),
                promotion.to_string(),
                group.to_string(),
                ms(w50),
                ms(w95),
                ms(e50),
                ms(e95),
                high,
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "sessions",
                "promotion",
                "jobs",
                "queue wait p50",
                "p95",
                "turn end p50",
                "p95",
                "promoted while queued",
            ],
            &rows
        )
    );
    for &size in &QUEUE_SIZES {
        let p50 = |g: &str| {
            groups
                .iter()
                .find(|(_, k, _, gr, _)| *k == size && *gr == g)
                .map(|(.., s)| p50_p95(s.iter().map(|x| x.queued)).0)
        };
        if let (Some(a), Some(b)) = (p50("promoted"), p50("unpromoted").filter(|&b| b > 0.0)) {
            println!(
                "{size} sessions, promotion on: promoted/unpromoted queue wait p50 {:.2}",
                a / b
            );
        }
    }
    if let Some(why) = &q.stopped {
        println!("queue stopped: {why}");
    }
}
