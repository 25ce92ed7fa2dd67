//! `drums bench confinement`: what the security boundary costs. The hardened
//! default and `--privileged` run the same start and restore, interleaved
//! round by round (the arm that goes first alternates), so both arms see the
//! same machine. Reports p50 and p95 per arm, the ratio of the medians, and
//! the median of the per-round ratios.

use drums_api::{Client, CreateSession, Session};
use serde_json::json;

use super::{restore_n, sh, wait_port, Made, WORKLOAD};
use crate::exit::{self, Failure};
use crate::stats::p50_p95;
use crate::table;

/// One table row: what, (p50, p95) hardened, (p50, p95) privileged, and the
/// paired ratio.
type Row = (&'static str, (f64, f64), (f64, f64), f64);

/// One arm: a cold create-to-ready and a restore-to-ready per round.
#[derive(Default)]
struct Samples {
    start: Vec<f64>,
    restore: Vec<f64>,
}

fn request(profile: &str, privileged: bool) -> CreateSession {
    CreateSession {
        profile: Some(profile.into()),
        privileged,
        ..Default::default()
    }
}

/// A session made from `req`, and the seconds until it was ready.
async fn timed_create(m: &Made<'_>, req: &CreateSession) -> Result<(Session, f64), Failure> {
    m.create_with(req).await
}

/// One sibling of `ck`, and the seconds until it was ready.
async fn timed_restore(m: &Made<'_>, ck: &str) -> Result<(Session, f64), Failure> {
    let (mut v, t) = restore_n(m, ck, 1).await?;
    Ok((v.remove(0), t))
}

/// The checkpoint each arm restores from: a warm headless session (the
/// restore bench's Python server), or a clean desktop (the OSWorld reset).
async fn checkpoint(m: &Made<'_>, profile: &str, privileged: bool) -> Result<String, Failure> {
    let c = m.client();
    let (src, _) = timed_create(m, &request(profile, privileged)).await?;
    let desktop = profile == "desktop";
    if !desktop {
        sh(c, &src, WORKLOAD).await?;
        wait_port(src.ip.as_deref().unwrap_or_default(), 8000).await?;
    }
    let req = drums_api::CreateCheckpoint {
        session: src.id.clone(),
        name: None,
        clean: desktop,
        leave_running: true,
    };
    let ck = m.checkpoint(&req).await?;
    m.remove(&src).await?;
    Ok(ck.id)
}

pub async fn confinement(
    c: &Client,
    profile: &str,
    n: usize,
    as_json: bool,
) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    let m = Made::new(c);
    let r = confinement_in(&m, profile, n, as_json).await;
    m.finish(r).await
}

async fn confinement_in(
    m: &Made<'_>,
    profile: &str,
    n: usize,
    as_json: bool,
) -> Result<i32, Failure> {
    let arms = [false, true]; // hardened, privileged
    let mut cks = Vec::new();
    for privileged in arms {
        cks.push(checkpoint(m, profile, privileged).await?);
    }
    // One unmeasured round of each arm warms caches and the daemon's paths.
    for (i, privileged) in arms.into_iter().enumerate() {
        let (s, _) = timed_create(m, &request(profile, privileged)).await?;
        m.remove(&s).await?;
        let (s, _) = timed_restore(m, &cks[i]).await?;
        m.remove(&s).await?;
    }
    let mut samples = [Samples::default(), Samples::default()];
    for round in 0..n {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (s, t) = timed_create(m, &request(profile, arms[i])).await?;
            m.remove(&s).await?;
            samples[i].start.push(t);
            let (s, t) = timed_restore(m, &cks[i]).await?;
            m.remove(&s).await?;
            samples[i].restore.push(t);
        }
        if !as_json {
            eprint!(
                "\r\x1b[Kround {}/{n}: restore hardened {:.1} ms, privileged {:.1} ms",
                round + 1,
                samples[0].restore[round] * 1e3,
                samples[1].restore[round] * 1e3
            );
        }
    }
    if !as_json {
        eprintln!();
    }
    for ck in &cks {
        m.delete_checkpoint(ck).await?;
    }

    let stats = |v: &[f64]| p50_p95(v.iter().copied());
    // Per-round ratio hardened/privileged: the noise of one moment hits both
    // arms of a round alike.
    let paired = crate::stats::paired;
    let rows: Vec<Row> = vec![
        (
            "start (create to ready)",
            stats(&samples[0].start),
            stats(&samples[1].start),
            paired(&samples[0].start, &samples[1].start),
        ),
        (
            "restore (to ready)",
            stats(&samples[0].restore),
            stats(&samples[1].restore),
            paired(&samples[0].restore, &samples[1].restore),
        ),
    ];
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|(what, h, p, pr)| {
                json!({
                    "what": what,
                    "hardened.p50": h.0, "hardened.p95": h.1,
                    "privileged.p50": p.0, "privileged.p95": p.1,
                    "ratio_of_p50": h.0 / p.0,
                    "paired_ratio_p50": pr,
                })
            })
            .collect();
        let out = json!({"profile": profile, "n": n, "rows": out});
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
    } else {
        let ms = |s: f64| format!("{:.1} ms", s * 1e3);
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|(what, h, p, pr)| {
                vec![
                    what.to_string(),
                    ms(h.0),
                    ms(h.1),
                    ms(p.0),
                    ms(p.1),
                    format!("{:.3}", h.0 / p.0),
                    format!("{pr:.3}"),
                ]
            })
            .collect();
        println!("drums bench confinement --profile {profile} -n {n} (arms interleaved)");
        print!(
            "{}",
            table::render(
                &[
                    "",
                    "hardened p50",
                    "hardened p95",
                    "privileged p50",
                    "privileged p95",
                    "p50 ratio",
                    "paired ratio",
                ],
                &body
            )
        );
    }
    Ok(exit::OK)
}
