//! `drums bench corpus`: what each workload of the checkpointability corpus
//! (crates/daemon/tests/workloads.rs, whose `wl.py` this runs) costs a
//! checkpoint and a restore, against a plain headless session in the same
//! run. Each round goes through every arm, in an order that rotates round
//! by round: a new session with the workload started and answering, a
//! checkpoint of it (left running), one sibling restored to ready and its
//! workload answering, then everything removed.

use std::time::Instant;

use base64::Engine as _;
use drums_api::{Client, CreateSession, Session};
use serde_json::json;

use super::made::Made;
use super::sh;
use crate::exit::{self, Failure};
use crate::stats::p50_p95;
use crate::table;

/// The corpus's workloads, as the test runs them.
const WL: &str = include_str!("../../daemon/tests/workloads/wl.py");

/// The arms: no workload; the corpus's Python holding nothing (`idle`);
/// then each of the corpus's workloads (`wl.py`'s names).
const ARMS: &[&str] = &[
    "plain",
    "idle",
    "inotify_own",
    "inotify_image",
    "pty_shell",
    "pty_server",
    "ghost_100m",
    "ghost_1g",
    "locks",
    "sqlite_wal",
    "threads64",
    "stopped",
    "zombie",
    "deleted_cwd",
    "tcp",
    "socketpair",
    "memfd",
    "shm",
    "eventfd",
    "timerfd",
    "signalfd",
    "epoll",
];

#[derive(Default)]
struct Samples {
    checkpoint: Vec<f64>,
    restore: Vec<f64>,
    bytes: Vec<f64>,
}

/// The workload's answer in `s` must start with "ok".
async fn answers(c: &Client, s: &Session, arm: &str) -> Result<(), Failure> {
    if arm == "plain" {
        return Ok(());
    }
    let out = sh(c, s, "python3 /root/wl.py probe").await?;
    if out.starts_with("ok") {
        Ok(())
    } else {
        Err(Failure::new(
            exit::INTERNAL,
            format!("workload {arm} in {}: {}", s.id, out.trim()),
        ))
    }
}

/// One round of one arm: (checkpoint s, restore s, image bytes), with
/// everything it made removed again.
async fn round(m: &Made<'_>, arm: &str) -> Result<(f64, f64, f64), Failure> {
    let c = m.client();
    let (src, _) = m.create_with(&CreateSession::default()).await?;
    if arm != "plain" {
        let b64 = base64::engine::general_purpose::STANDARD.encode(WL);
        sh(
            c,
            &src,
            &format!(
                "echo {b64} | base64 -d > /root/wl.py && cd /root && \
                 (nohup python3 /root/wl.py serve {arm} >/root/wl.log 2>&1 &)"
            ),
        )
        .await?;
        answers(c, &src, arm).await?;
    }
    let t = Instant::now();
    let req = drums_api::CreateCheckpoint {
        session: src.id.clone(),
        name: None,
        clean: false,
        leave_running: true,
    };
    let ck = m.checkpoint(&req).await?;
    let dump = t.elapsed().as_secs_f64();
    let (mut sibs, restore) = m.restore(&ck.id, 1).await?;
    let sib = sibs.remove(0);
    answers(c, &sib, arm).await?;
    m.remove(&sib).await?;
    m.remove(&src).await?;
    m.delete_checkpoint(&ck.id).await?;
    Ok((dump, restore, ck.images_bytes as f64))
}

pub async fn corpus(c: &Client, n: usize, as_json: bool) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    let m = Made::new(c);
    let r = rounds(&m, n, as_json).await;
    let samples = m.finish(r).await?;
    report(&samples, n, as_json)
}

async fn rounds(m: &Made<'_>, n: usize, as_json: bool) -> Result<Vec<Samples>, Failure> {
    let mut samples: Vec<Samples> = ARMS.iter().map(|_| Samples::default()).collect();
    for r in 0..n {
        for k in 0..ARMS.len() {
            let i = (k + r) % ARMS.len();
            let (ck, rs, bytes) = round(m, ARMS[i]).await?;
            samples[i].checkpoint.push(ck);
            samples[i].restore.push(rs);
            samples[i].bytes.push(bytes);
            if !as_json {
                eprint!(
                    "\r\x1b[Kround {}/{n}: {} checkpoint {:.0} ms, restore {:.0} ms",
                    r + 1,
                    ARMS[i],
                    ck * 1e3,
                    rs * 1e3
                );
            }
        }
    }
    if !as_json {
        eprintln!();
    }
    Ok(samples)
}

fn report(samples: &[Samples], n: usize, as_json: bool) -> Result<i32, Failure> {
    let stats = |v: &[f64]| p50_p95(v.iter().copied());
    let plain = (
        stats(&samples[0].checkpoint).0,
        stats(&samples[0].restore).0,
    );
    let rows: Vec<_> = ARMS
        .iter()
        .zip(samples)
        .map(|(arm, s)| {
            let (ck, rs, b) = (stats(&s.checkpoint), stats(&s.restore), stats(&s.bytes));
            (*arm, ck, rs, b.0)
        })
        .collect();
    if as_json {
        let arms: Vec<_> = rows
            .iter()
            .map(|(arm, ck, rs, b)| {
                json!({
                    "workload": arm,
                    "checkpoint.p50": ck.0, "checkpoint.p95": ck.1,
                    "checkpoint.vs_plain": ck.0 / plain.0,
                    "restore.p50": rs.0, "restore.p95": rs.1,
                    "restore.vs_plain": rs.0 / plain.1,
                    "images_bytes.p50": b,
                })
            })
            .collect();
        println!("{}", json!({"n": n, "arms": arms}));
        return Ok(exit::OK);
    }
    let ms = |s: f64| format!("{:.1} ms", s * 1e3);
    println!("drums bench corpus -n {n} (checkpoint left running; restore of 1 sibling to ready; arms interleaved)");
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(arm, ck, rs, b)| {
            vec![
                arm.to_string(),
                ms(ck.0),
                ms(ck.1),
                format!("{:.2}x", ck.0 / plain.0),
                ms(rs.0),
                ms(rs.1),
                format!("{:.2}x", rs.0 / plain.1),
                format!("{:.1} MiB", b / (1u64 << 20) as f64),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "WORKLOAD",
                "CHECKPOINT P50",
                "P95",
                "VS PLAIN",
                "RESTORE P50",
                "P95",
                "VS PLAIN",
                "IMAGES",
            ],
            &body,
        )
    );
    Ok(exit::OK)
}
