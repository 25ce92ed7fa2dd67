//! `drums bench pool`: what a warm pool buys an RL or eval loop
//! (docs/pools.md), headless and desktop, in one run:
//! - a take from a ready pool, timed through the API (p50, p95);
//! - resets per hour with 4 workers, each getting a sandbox, running a short
//!   episode (a few commands, about 2 s) and removing it: from a pool of 4
//!   against a plain restore of one sibling, in alternating segments of the
//!   same length, with the time each worker waited for its sandbox. The pool
//!   is full when each of its segments starts, as a pool that lives across
//!   an RL run's steps is.

use std::time::{Duration, Instant};

use drums_api::{CreateSession, Pool, Session};
use hyper::Method;
use serde_json::json;

use super::made::Made;
use super::{percentile, sh};
use crate::exit::{self, Failure};
use crate::table;
use drums_api::exec::enc;

/// Workers getting sandboxes at once, and the pool's size.
const WORKERS: usize = 4;
/// The episode's commands; the last one holds the sandbox for the rest of
/// the episode's 2 s.
const EPISODE: [&str; 3] = [
    "true",
    "echo step > /root/episode && cat /root/episode >/dev/null",
    "sleep 2",
];

pub(crate) struct Args {
    /// Takes timed from a ready pool, per profile.
    pub takes: usize,
    /// Segments per arm, alternating pool and restore.
    pub segments: usize,
    pub segment: Duration,
}

#[derive(Clone, Copy, PartialEq)]
enum Arm {
    Pool,
    Restore,
}

#[derive(Default)]
struct ArmResult {
    episodes: usize,
    seconds: f64,
    waits: Vec<f64>,
}

impl ArmResult {
    fn per_hour(&self) -> f64 {
        self.episodes as f64 / self.seconds * 3600.0
    }
}

struct ProfileResult {
    profile: &'static str,
    takes: Vec<f64>,
    pool: ArmResult,
    restore: ArmResult,
}

pub(crate) async fn pool(m: &Made<'_>, a: &Args, as_json: bool) -> Result<i32, Failure> {
    let say = |line: String| {
        if !as_json {
            eprintln!("{line}");
        }
    };
    let mut results = Vec::new();
    for profile in ["headless", "desktop"] {
        say(format!("{profile}: a warm checkpoint"));
        let ck = warm_checkpoint(m, profile).await?;
        let p = m.create_pool(&ck, WORKERS as u32).await?;
        let mut takes = timed_takes(m, &p, a.takes).await?;
        sort(&mut takes);
        say(format!(
            "{profile}: take from a ready pool p50 {:.2} ms",
            percentile(&takes, 50.0) * 1e3
        ));
        let (mut pool, mut restore) = (ArmResult::default(), ArmResult::default());
        for i in 0..a.segments {
            // Alternate which arm goes first, so neither always follows the other.
            let order = if i % 2 == 0 {
                [Arm::Pool, Arm::Restore]
            } else {
                [Arm::Restore, Arm::Pool]
            };
            for arm in order {
                wait_full(m, &p).await?;
                let r = segment(m, arm, &p.id, &ck, a.segment).await?;
                let into = if arm == Arm::Pool {
                    &mut pool
                } else {
                    &mut restore
                };
                into.episodes += r.episodes;
                into.seconds += r.seconds;
                into.waits.extend(r.waits);
            }
            say(format!(
                "{profile}: segment {}/{}: pool {:.0} resets/h, restore {:.0} resets/h",
                i + 1,
                a.segments,
                pool.per_hour(),
                restore.per_hour()
            ));
        }
        m.remove_pool(&p.id).await?;
        m.delete_checkpoint(&ck).await?;
        sort(&mut pool.waits);
        sort(&mut restore.waits);
        results.push(ProfileResult {
            profile,
            takes,
            pool,
            restore,
        });
    }
    report(&results, a, as_json);
    Ok(exit::OK)
}

/// A session of `profile` with a process in it, checkpointed (and stopped):
/// a clean checkpoint for a desktop, so siblings get a fresh browser context.
async fn warm_checkpoint(m: &Made<'_>, profile: &str) -> Result<String, Failure> {
    let (s, _) = m
        .create_with(&CreateSession {
            profile: Some(profile.into()),
            ..Default::default()
        })
        .await?;
    sh(m.client(), &s, super::WORKLOAD).await?;
    let k = m
        .checkpoint(&drums_api::CreateCheckpoint {
            session: s.id.clone(),
            name: None,
            clean: profile == "desktop",
            leave_running: false,
        })
        .await?;
    Ok(k.id)
}

/// Until the pool is full, bounded: a pool that cannot refill says why.
async fn wait_full(m: &Made<'_>, p: &Pool) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now: Pool = m
            .client()
            .json(
                Method::GET,
                &format!("/v1/pools/{}", enc(&p.id)),
                None::<&()>,
            )
            .await?;
        if now.ready == now.size {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure::new(
                exit::INTERNAL,
                format!(
                    "pool {} did not refill within 300 s ({} of {} ready; waiting on {})",
                    p.name,
                    now.ready,
                    now.size,
                    now.waiting_on.as_deref().unwrap_or("nothing")
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` takes, each from a full pool: the take itself, not the refill.
async fn timed_takes(m: &Made<'_>, p: &Pool, n: usize) -> Result<Vec<f64>, Failure> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        wait_full(m, p).await?;
        let (s, t) = m.take(&p.id).await?;
        out.push(t);
        m.remove(&s).await?;
    }
    Ok(out)
}

/// One segment of one arm: 4 workers loop (get a sandbox, run the episode,
/// remove it), starting episodes until the segment's time is up. Every
/// episode counts, over the time until the last worker is done, so the rate
/// has no rounding to whole episodes per segment.
async fn segment(
    m: &Made<'_>,
    arm: Arm,
    pool: &str,
    ck: &str,
    length: Duration,
) -> Result<ArmResult, Failure> {
    let start = Instant::now();
    let end = start + length;
    let worker = || async {
        let mut r = ArmResult::default();
        while Instant::now() < end {
            let (s, waited) = match arm {
                Arm::Pool => m.take(pool).await?,
                Arm::Restore => {
                    let (mut v, t) = m.restore(ck, 1).await?;
                    (v.pop().expect("one sibling"), t)
                }
            };
            r.waits.push(waited);
            episode(m, &s).await?;
            m.remove(&s).await?;
            r.episodes += 1;
        }
        Ok::<_, Failure>(r)
    };
    let all = futures::future::join_all((0..WORKERS).map(|_| worker())).await;
    let mut out = ArmResult {
        seconds: start.elapsed().as_secs_f64(),
        ..Default::default()
    };
    for r in all {
        let r = r?;
        out.episodes += r.episodes;
        out.waits.extend(r.waits);
    }
    Ok(out)
}

async fn episode(m: &Made<'_>, s: &Session) -> Result<(), Failure> {
    for cmd in EPISODE {
        sh(m.client(), s, cmd).await?;
    }
    Ok(())
}

fn sort(v: &mut [f64]) {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
}

fn report(results: &[ProfileResult], a: &Args, as_json: bool) {
    let ms = |v: &[f64], p: f64| percentile(v, p) * 1e3;
    if as_json {
        let mut o = serde_json::Map::new();
        for r in results {
            let arm = |x: &ArmResult| {
                json!({
                    "resets_per_hour": x.per_hour(),
                    "episodes": x.episodes,
                    "seconds": x.seconds,
                    "wait_ms": {"p50": ms(&x.waits, 50.0), "p95": ms(&x.waits, 95.0)},
                })
            };
            o.insert(
                r.profile.into(),
                json!({
                    "take_ms": {"p50": ms(&r.takes, 50.0), "p95": ms(&r.takes, 95.0), "n": r.takes.len()},
                    "pool": arm(&r.pool),
                    "restore": arm(&r.restore),
                    "resets_ratio_pool_over_restore": r.pool.per_hour() / r.restore.per_hour(),
                }),
            );
        }
        o.insert(
            "workers".into(),
            json!({"count": WORKERS, "pool_size": WORKERS, "episode": EPISODE,
                   "segments_per_arm": a.segments, "segment_s": a.segment.as_secs_f64()}),
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::Value::Object(o)).expect("serialize")
        );
        return;
    }
    let mut rows = Vec::new();
    for r in results {
        rows.push(vec![
            r.profile.to_string(),
            "take (ready pool)".into(),
            "-".into(),
            format!("{:.2} ms", ms(&r.takes, 50.0)),
            format!("{:.2} ms", ms(&r.takes, 95.0)),
        ]);
        for (name, x) in [("pool of 4", &r.pool), ("restore", &r.restore)] {
            rows.push(vec![
                r.profile.to_string(),
                format!("4 workers, {name}"),
                format!("{:.0} ({} episodes)", x.per_hour(), x.episodes),
                format!("{:.1} ms", ms(&x.waits, 50.0)),
                format!("{:.1} ms", ms(&x.waits, 95.0)),
            ]);
        }
        rows.push(vec![
            r.profile.to_string(),
            "resets pool / restore".into(),
            format!("{:.2}x", r.pool.per_hour() / r.restore.per_hour()),
            "-".into(),
            "-".into(),
        ]);
    }
    print!(
        "{}",
        table::render(
            &["PROFILE", "WHAT", "RESETS/HOUR", "WAIT P50", "WAIT P95"],
            &rows
        )
    );
    println!(
        "episode: {} (4 workers; {} segments of {:.0} s per arm, alternating)",
        EPISODE.join("; "),
        a.segments,
        a.segment.as_secs_f64()
    );
}
