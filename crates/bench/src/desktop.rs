//! `drums bench restore --profile desktop`: a desktop (Xvfb, openbox,
//! Chromium on a titled page) from cold start vs from a clean checkpoint,
//! both to agent-ready, interleaved in one run; then the same with the page
//! cache dropped before each sample; forks of 4; memory per added session;
//! dump time, image size and the cost of hygiene.

use std::time::Instant;

use drums_api::{Client, Session};
use hyper::Method;
use serde_json::json;

use super::{checkpoints, create, memory_slope, percentile, restore_n, Arm, Made};
use crate::exit::{self, Failure};
use crate::table;

/// Samples with the page cache dropped are slow (Chromium is read from
/// disk) and disturb the machine, so fewer of them.
fn dropped_rounds(n: usize) -> usize {
    n.div_ceil(4).max(3)
}

/// Writes back dirty pages and drops the clean ones, host-wide: the next
/// start reads Chromium, and the next restore its checkpoint, from disk.
fn drop_page_cache() -> Result<(), Failure> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        Failure::new(
            exit::INTERNAL,
            format!("drop the page cache (/proc/sys/vm/drop_caches, needs root): {e}"),
        )
    })
}

/// The in-session half of a restore again, on a restored sibling, done as
/// drumsd's restore does it (`crates/session/src/restore.rs`, `hygiene`):
/// the hostname set in the session's UTS namespace from outside, since a
/// confined session may not call sethostname itself; then, through its
/// guest agent, hostname and machine-id files and the generation, the
/// browser's clean reset, and agent-readiness. What a restore pays for not
/// being a clone.
async fn hygiene_cost(s: &Session, round: usize) -> Result<f64, Failure> {
    let pid = s
        .init_pid
        .ok_or_else(|| Failure::new(exit::INTERNAL, format!("session {} has no init pid", s.id)))?;
    let guest = Client::in_root(format!("/proc/{pid}/root"), "/run/drums/guest.sock");
    let hostname = format!("bench-{round}");
    let t = Instant::now();
    let h = hostname.clone();
    tokio::task::spawn_blocking(move || drums_sys::set_hostname_in(pid, &h))
        .await
        .map_err(|e| Failure::new(exit::INTERNAL, format!("set the hostname: {e}")))?
        .map_err(|e| {
            Failure::new(
                exit::INTERNAL,
                format!("set the hostname of session {} from outside: {e}", s.id),
            )
        })?;
    let _: serde_json::Value = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(&json!({
                "hostname": hostname,
                "machine_id": format!("{:032x}", round + 1),
                "generation": s.generation + 1,
                "ip": s.ip,
            })),
        )
        .await?;
    let _: serde_json::Value = guest
        .json(
            Method::POST,
            "/v1/desktop/hygiene",
            Some(&json!({"hostname": hostname, "clean": true})),
        )
        .await?;
    let _: serde_json::Value = guest
        .json(Method::GET, "/v1/desktop/ready", None::<&()>)
        .await?;
    Ok(t.elapsed().as_secs_f64())
}

pub(super) async fn restore(m: &Made<'_>, n: usize, as_json: bool) -> Result<i32, Failure> {
    let say = |line: String| {
        if !as_json {
            eprintln!("{line}");
        }
    };
    let (src, _) = create(m, "desktop").await?;
    // Dump time: a few clean checkpoints of the warm desktop; the last one
    // stops the source and is kept.
    let (dumps, ck) = checkpoints(m, &src, 3, true, false).await?;
    // Warm-up of both arms.
    let (s, _) = create(m, "desktop").await?;
    m.remove(&s).await?;
    let (v, _) = restore_n(m, &ck.id, 1).await?;
    m.remove(&v[0]).await?;

    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let mut hygiene = Vec::new();
    for i in 0..n {
        let (s, t) = create(m, "desktop").await?;
        m.remove(&s).await?;
        cold.push(t);
        let (v, t) = restore_n(m, &ck.id, 1).await?;
        warm.push(t);
        hygiene.push(hygiene_cost(&v[0], i).await?);
        m.remove(&v[0]).await?;
        if !as_json {
            eprint!(
                "\r\x1b[Kwarm round {}/{n}: cold {:.0} ms, restore {:.0} ms",
                i + 1,
                cold[i] * 1e3,
                warm[i] * 1e3
            );
        }
    }
    say(String::new());
    let nd = dropped_rounds(n);
    let (mut cold_d, mut warm_d) = (Vec::new(), Vec::new());
    for i in 0..nd {
        drop_page_cache()?;
        let (s, t) = create(m, "desktop").await?;
        m.remove(&s).await?;
        cold_d.push(t);
        drop_page_cache()?;
        let (v, t) = restore_n(m, &ck.id, 1).await?;
        m.remove(&v[0]).await?;
        warm_d.push(t);
        if !as_json {
            eprint!(
                "\r\x1b[Kdropped-cache round {}/{nd}: cold {:.0} ms, restore {:.0} ms",
                i + 1,
                cold_d[i] * 1e3,
                warm_d[i] * 1e3
            );
        }
    }
    say(String::new());
    let mut forks = Vec::new();
    for _ in 0..3 {
        let (v, t) = restore_n(m, &ck.id, 4).await?;
        for s in &v {
            m.remove(s).await?;
        }
        forks.push(t);
        say(format!("fork of 4: all agent-ready in {:.0} ms", t * 1e3));
    }
    say("memory: cold desktops".into());
    let (cold_slope, cold_cg, cold_pss) = memory_slope(m, &[1, 2, 4], Arm::Cold("desktop")).await?;
    say("memory: restored siblings".into());
    let (warm_slope, warm_cg, warm_pss) =
        memory_slope(m, &[1, 2, 4], Arm::Restored(&ck.id)).await?;
    m.delete_checkpoint(&ck.id).await?;

    let sorted = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        v
    };
    let (cold, warm, cold_d, warm_d) = (sorted(cold), sorted(warm), sorted(cold_d), sorted(warm_d));
    let (hygiene, forks) = (sorted(hygiene), sorted(forks));
    let dump_t = sorted(dumps.iter().map(|d| d.0).collect());
    let frozen = sorted(dumps.iter().map(|d| d.1).collect());
    let p = |v: &[f64], q: f64| percentile(v, q);
    let image_mib = ck.images_bytes as f64 / (1 << 20) as f64;
    if as_json {
        let out = json!({
            "profile": "desktop",
            "n": n,
            "n_dropped": nd,
            "cold.p50": p(&cold, 50.0), "cold.p95": p(&cold, 95.0),
            "restore.p50": p(&warm, 50.0), "restore.p95": p(&warm, 95.0),
            "ratio": p(&cold, 50.0) / p(&warm, 50.0),
            "dropped.cold.p50": p(&cold_d, 50.0), "dropped.cold.p95": p(&cold_d, 95.0),
            "dropped.restore.p50": p(&warm_d, 50.0), "dropped.restore.p95": p(&warm_d, 95.0),
            "dropped.ratio": p(&cold_d, 50.0) / p(&warm_d, 50.0),
            "fork.4.p50": p(&forks, 50.0), "fork.4.max": p(&forks, 100.0),
            "hygiene.p50": p(&hygiene, 50.0), "hygiene.p95": p(&hygiene, 95.0),
            "dump.p50": p(&dump_t, 50.0),
            "dump.frozen.p50": p(&frozen, 50.0),
            "image_mib": image_mib,
            "mem.cold.per_session_mib": cold_slope,
            "mem.restore.per_session_mib": warm_slope,
            "mem.cold.cgroup_mib": cold_cg,
            "mem.cold.pss_mib": cold_pss,
            "mem.restore.pss_mib": warm_pss,
            "mem.pss_ratio": warm_pss / cold_pss,
            "ksm": super::ksm_on(),
            "mem.restore.cgroup_mib": warm_cg,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
        return Ok(exit::OK);
    }
    let ms = |s: f64| format!("{:.0} ms", s * 1e3);
    let row = |a: &str, b: String, c: String, d: String| vec![a.to_owned(), b, c, d];
    let rows = vec![
        row(
            "COLD create-to-agent-ready, warm cache",
            ms(p(&cold, 50.0)),
            ms(p(&cold, 95.0)),
            format!("n={n}"),
        ),
        row(
            "RESTORE (clean, hygienic) to agent-ready, warm cache",
            ms(p(&warm, 50.0)),
            ms(p(&warm, 95.0)),
            format!("cold/restore {:.2}x", p(&cold, 50.0) / p(&warm, 50.0)),
        ),
        row(
            "COLD, page cache dropped",
            ms(p(&cold_d, 50.0)),
            ms(p(&cold_d, 95.0)),
            format!("n={nd}"),
        ),
        row(
            "RESTORE, page cache dropped",
            ms(p(&warm_d, 50.0)),
            ms(p(&warm_d, 95.0)),
            format!("cold/restore {:.2}x", p(&cold_d, 50.0) / p(&warm_d, 50.0)),
        ),
        row(
            "fork of 4, all agent-ready",
            ms(p(&forks, 50.0)),
            format!("max {}", ms(p(&forks, 100.0))),
            "n=3".into(),
        ),
        row(
            "hygiene (guest, browser clean, ready)",
            ms(p(&hygiene, 50.0)),
            ms(p(&hygiene, 95.0)),
            "part of RESTORE".into(),
        ),
        row(
            "checkpoint (dump, snapshot, seal)",
            ms(p(&dump_t, 50.0)),
            ms(p(&dump_t, 95.0)),
            "n=3".into(),
        ),
        row(
            "  of which frozen",
            ms(p(&frozen, 50.0)),
            ms(p(&frozen, 95.0)),
            "n=3".into(),
        ),
        row(
            "image size",
            format!("{image_mib:.1} MiB"),
            String::new(),
            String::new(),
        ),
        row(
            "host memory per added desktop, cold",
            format!("{cold_slope:.0} MiB"),
            String::new(),
            "slope 1,2,4".into(),
        ),
        row(
            "host memory per added desktop, restored",
            format!("{warm_slope:.0} MiB"),
            String::new(),
            format!("restored/cold {:.2}x", warm_slope / cold_slope),
        ),
        row(
            "PSS per desktop, cold",
            format!("{cold_pss:.0} MiB"),
            String::new(),
            "mean of 4 running".into(),
        ),
        row(
            "PSS per desktop, restored",
            format!("{warm_pss:.0} MiB"),
            String::new(),
            format!("restored/cold {:.2}x", warm_pss / cold_pss),
        ),
        row(
            "cgroup memory per desktop, cold",
            format!("{cold_cg:.0} MiB"),
            String::new(),
            "mean of 4".into(),
        ),
        row(
            "cgroup memory per desktop, restored",
            format!("{warm_cg:.0} MiB"),
            String::new(),
            "mean of 4".into(),
        ),
    ];
    println!(
        "drums bench restore --profile desktop -n {n} (KSM {})",
        if super::ksm_on() { "on" } else { "off" }
    );
    print!(
        "{}",
        table::render(&["metric", "p50", "p95", "note"], &rows)
    );
    Ok(exit::OK)
}
