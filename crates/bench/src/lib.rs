//! `drums bench …`: benchmarks as code. Each prints the same table every time
//! (or JSON with stable keys), measured end to end through the API as a user
//! would see it. `drums-bench` is its program; `drums bench` runs it.
//!
//! Also the library the evaluation shares: [`stats`], and the mock model
//! ([`mock`]).

use std::time::Instant;

use drums_api::{Client, CreateSession, Session};
use futures::future::LocalBoxFuture;
use hyper::Method;
use serde_json::json;

pub mod ab;
pub mod args;
pub mod daemon;
pub mod mock;
pub mod stats;

mod confinement;
mod corpus;
mod desktop;
mod engine;
mod freeze;
mod image;
mod inspect;
mod made;
mod pool;
mod proxy;
mod respawn;

use made::Made;

pub use confinement::confinement;
pub use corpus::corpus;
pub use engine::engine;
pub use freeze::freeze;
pub use image::image;
pub use inspect::inspect;
pub use proxy::proxy;

use drums_api::exec::enc;
use drums_client::{exit, table, Failure, Global};

use args::BenchCommand;
use stats::{percentile, slope};

/// Run one bench: each but `freeze` through the drumsd that `g` names
/// (started if none answers, as `drums` starts it); with `--ab`, through
/// two daemons of its own (ab.rs).
pub async fn run(g: &Global, cmd: &BenchCommand) -> Result<i32, Failure> {
    match cmd {
        // A host mechanism, measured in-process: no daemon involved.
        BenchCommand::Freeze { n, json } => return freeze(*n, *json),
        BenchCommand::Engine { n, ab, json } if ab.ab.is_some() => {
            let run = |c: Client, _proxy, n| -> LocalBoxFuture<'static, _> {
                Box::pin(async move { engine::engine_json(&c, n).await })
            };
            return ab::run(
                &ab_of(g, ab),
                "engine",
                *n,
                Vec::new(),
                *json,
                Box::new(run),
            )
            .await;
        }
        BenchCommand::Proxy {
            n, turns, ab, json, ..
        } if ab.ab.is_some() => {
            // One mock for both arms: each daemon sends its OpenAI requests
            // there.
            let mock = proxy::start_mock(0).await?;
            let turns = *turns;
            let run = move |c: Client, at, n| -> LocalBoxFuture<'static, _> {
                Box::pin(async move {
                    Ok((
                        proxy::measure(&c, n, turns, at, mock, true).await?,
                        exit::OK,
                    ))
                })
            };
            let args = vec!["--llm-upstream".into(), format!("openai=http://{mock}")];
            return ab::run(&ab_of(g, ab), "proxy", *n, args, *json, Box::new(run)).await;
        }
        _ => {}
    }
    let c = drums_client::connect::client(g).await?;
    match cmd {
        BenchCommand::Start { profile, n, json } => start(&c, profile, *n, *json).await,
        BenchCommand::Restore { profile, n, json } => restore(&c, profile, *n, *json).await,
        BenchCommand::Inspect { n, json } => inspect(&c, *n, *json).await,
        BenchCommand::Pool {
            n,
            segments,
            segment_secs,
            json,
        } => pool(&c, *n, *segments, *segment_secs, *json).await,
        BenchCommand::Confinement { profile, n, json } => confinement(&c, profile, *n, *json).await,
        BenchCommand::Engine { n, json, .. } => engine(&c, *n, *json).await,
        BenchCommand::Corpus { n, json } => corpus(&c, *n, *json).await,
        BenchCommand::Proxy {
            n,
            turns,
            proxy: at,
            mock_port,
            json,
            ..
        } => proxy(&c, *n, *turns, *at, *mock_port, *json).await,
        BenchCommand::Freeze { .. } => unreachable!("run above"),
        BenchCommand::Image { n, base, json } => image(&c, base, *n, *json).await,
    }
}

/// `--ab`'s arms; both find their images where `g`'s drumsd does
/// (`DRUMS_IMAGES_DIR`, as drumsd reads it, else STATE_DIR/images).
fn ab_of(g: &Global, a: &args::AbArgs) -> ab::Ab {
    ab::Ab {
        other: a.ab.clone().expect("matched on --ab"),
        segments: a.segments,
        images_dir: std::env::var_os("DRUMS_IMAGES_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| g.state_dir.join("images")),
    }
}

/// Host memory in use: MemTotal - MemAvailable, in MiB.
fn host_used_mib() -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("MemTotal:") - field("MemAvailable:")) / 1024.0
}

/// Host memory, as the median of several readings: other work on a shared
/// machine moves MemAvailable by more than one session weighs.
async fn host_used_median() -> f64 {
    let mut v = Vec::new();
    for _ in 0..7 {
        v.push(host_used_mib());
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

async fn create(m: &Made<'_>, profile: &str) -> Result<(Session, f64), Failure> {
    m.create_with(&CreateSession {
        profile: Some(profile.into()),
        ..Default::default()
    })
    .await
}

/// `drums bench pool`: a take from a warm pool, and resets per hour with a
/// pool against plain restores, headless and desktop (bench/pool.rs).
pub async fn pool(
    c: &Client,
    takes: usize,
    segments: usize,
    segment_secs: f64,
    as_json: bool,
) -> Result<i32, Failure> {
    if takes == 0 || segments == 0 || segment_secs.is_nan() || segment_secs < 1.0 {
        return Err(Failure::usage(
            "-n and --segments must be at least 1, --segment-secs at least 1",
        ));
    }
    let m = Made::new(c);
    let a = pool::Args {
        takes,
        segments,
        segment: std::time::Duration::from_secs_f64(segment_secs),
    };
    let r = pool::pool(&m, &a, as_json).await;
    m.finish(r).await
}

/// `drums bench start`: create-to-ready (ready = the guest agent answers), and
/// host memory per added session as the slope over 1, 4 and 8 live sessions.
pub async fn start(c: &Client, profile: &str, n: usize, as_json: bool) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    let m = Made::new(c);
    let r = start_in(&m, profile, n, as_json).await;
    m.finish(r).await
}

async fn start_in(m: &Made<'_>, profile: &str, n: usize, as_json: bool) -> Result<i32, Failure> {
    let c = m.client();
    // One unmeasured round warms the page cache and the daemon's paths.
    let (s, _) = create(m, profile).await?;
    m.remove(&s).await?;

    let mut cold = Vec::with_capacity(n);
    for i in 0..n {
        let (s, t) = create(m, profile).await?;
        m.remove(&s).await?;
        cold.push(t);
        if !as_json {
            eprint!("\r\x1b[Kcold start {}/{n}: {:.1} ms", i + 1, t * 1e3);
        }
    }
    if !as_json {
        eprintln!();
    }
    cold.sort_by(|a, b| a.partial_cmp(b).expect("finite"));

    // Memory: settle, measure, add sessions, measure again.
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(1000));
    settle().await;
    let mut points = vec![(0.0, host_used_median().await)];
    let mut live = Vec::new();
    for target in [1usize, 4, 8] {
        while live.len() < target {
            live.push(create(m, profile).await?.0);
        }
        settle().await;
        points.push((target as f64, host_used_median().await));
        if !as_json {
            eprintln!(
                "memory with {target} sessions: {:.0} MiB used on the host",
                points.last().expect("pushed").1
            );
        }
    }
    // What each session's own cgroup is charged: exact where the host figure is noisy.
    let mut charged = Vec::new();
    for s in &live {
        let st: drums_api::SessionStats = c
            .json(
                Method::GET,
                &format!("/v1/sessions/{}/stats", enc(&s.id)),
                None::<&()>,
            )
            .await?;
        charged.push(st.memory_bytes.unwrap_or(0) as f64 / (1 << 20) as f64);
    }
    let charged_mean = charged.iter().sum::<f64>() / charged.len().max(1) as f64;
    for s in &live {
        m.remove(s).await?;
    }
    let per_session = slope(&points);

    let (p50, p95) = (percentile(&cold, 50.0), percentile(&cold, 95.0));
    if as_json {
        let out = json!({
            "profile": profile,
            "n": n,
            "cold.p50": p50,
            "cold.p95": p95,
            "cold.min": cold[0],
            "cold.max": cold[cold.len() - 1],
            "mem.per_session_mib": per_session,
            "mem.cgroup_per_session_mib": charged_mean,
            "mem.points": points.iter().map(|(k, m)| json!({"sessions": *k as u64, "host_used_mib": m})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
    } else {
        let ms = |s: f64| format!("{:.1} ms", s * 1e3);
        let rows = vec![
            vec!["cold create-to-ready p50".into(), ms(p50)],
            vec!["cold create-to-ready p95".into(), ms(p95)],
            vec![
                "cold create-to-ready min / max".into(),
                format!("{} / {}", ms(cold[0]), ms(cold[cold.len() - 1])),
            ],
            vec![
                "host memory per added session".into(),
                format!("{per_session:.1} MiB (slope over 1, 4, 8)"),
            ],
            vec![
                "memory charged to a session's cgroup".into(),
                format!("{charged_mean:.1} MiB (mean of 8)"),
            ],
        ];
        println!("drums bench start --profile {profile} -n {n}");
        print!("{}", table::render(&["metric", "value"], &rows));
    }
    Ok(exit::OK)
}

async fn restore_n(m: &Made<'_>, ck: &str, count: usize) -> Result<(Vec<Session>, f64), Failure> {
    m.restore(ck, count).await
}

/// Dump time: `n` checkpoints of `src` in a row, all but the last removed.
/// Returns (seconds, frozen seconds) of each, and the last checkpoint, whose
/// dump stops `src` unless `keep_running`.
async fn checkpoints(
    m: &Made<'_>,
    src: &Session,
    n: usize,
    clean: bool,
    keep_running: bool,
) -> Result<(Vec<(f64, f64)>, drums_api::Checkpoint), Failure> {
    let mut dumps = Vec::new();
    for i in 0..n {
        let last = i + 1 == n;
        let t = Instant::now();
        let req = drums_api::CreateCheckpoint {
            session: src.id.clone(),
            name: None,
            clean,
            leave_running: keep_running || !last,
        };
        let k = m.checkpoint(&req).await?;
        dumps.push((t.elapsed().as_secs_f64(), k.frozen_ms / 1e3));
        if last {
            return Ok((dumps, k));
        }
        m.delete_checkpoint(&k.id).await?;
    }
    Err(Failure::usage("a bench takes at least one checkpoint"))
}

/// Run a script in a session; its stdout, or a failure naming the script.
async fn sh(c: &Client, s: &Session, script: &str) -> Result<String, Failure> {
    let req = drums_api::ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let code = drums_client::exec::run_exec(c, &s.id, &req, &mut o, &mut e).await?;
    if code != 0 {
        return Err(Failure::new(
            exit::INTERNAL,
            format!(
                "bench command failed ({code}): {script}: {}",
                String::from_utf8_lossy(&e).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&o).into_owned())
}

/// The warm workload of the checkpointed session: a Python HTTP server.
const WORKLOAD: &str = "nohup python3 -m http.server 8000 >/dev/null 2>&1 &";

/// Wait (bounded) until a TCP port of a session accepts a connection.
async fn wait_port(ip: &str, port: u16) -> Result<(), Failure> {
    let addr: std::net::SocketAddr = format!("{ip}:{port}").parse().map_err(|_| {
        Failure::new(
            exit::INTERNAL,
            format!("bench needs a bridged session, got address {ip:?}"),
        )
    })?;
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    Err(Failure::new(
        exit::INTERNAL,
        format!("{addr} never answered"),
    ))
}

/// What a memory arm adds: a cold session, or a restored sibling.
enum Arm<'a> {
    Cold(&'a str),
    Restored(&'a str),
}

/// Proportional set size (MiB) of every process in the PID namespace of
/// `init_pid`: shared pages count once across all their users, so this is
/// what one more session really adds, without the host-wide noise of
/// MemAvailable. Needs root (other users' smaps).
fn session_pss_mib(init_pid: i32) -> f64 {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let Some(want) = ns(&init_pid.to_string()) else {
        return 0.0;
    };
    let mut kib = 0.0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || ns(&name).as_ref() != Some(&want) {
            continue;
        }
        let rollup =
            std::fs::read_to_string(format!("/proc/{name}/smaps_rollup")).unwrap_or_default();
        kib += rollup
            .lines()
            .find(|l| l.starts_with("Pss:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    kib / 1024.0
}

/// Whether the host runs KSM (`drumsd --ksm` turns it on).
pub(crate) fn ksm_on() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/ksm/run").is_ok_and(|v| v.trim() == "1")
}

/// With KSM on, waits (at most a minute) until ksmd has made two more full
/// passes over the marked memory, so the sessions' PSS shows the merging.
async fn ksm_settle() {
    let scans = || {
        std::fs::read_to_string("/sys/kernel/mm/ksm/full_scans")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let Some(start) = scans().filter(|_| ksm_on()) else {
        return;
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while Instant::now() < deadline && scans().unwrap_or(start) < start + 2 {
        // sysfs offers no notification for a finished scan.
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Memory per added session: host slope over `steps`, the mean cgroup
/// charge, and the mean PSS of the sessions at the last step.
async fn memory_slope(
    m: &Made<'_>,
    steps: &[usize],
    arm: Arm<'_>,
) -> Result<(f64, f64, f64), Failure> {
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let mut points = vec![(0.0, host_used_median().await)];
    let mut live: Vec<Session> = Vec::new();
    for &target in steps {
        while live.len() < target {
            live.push(match arm {
                Arm::Cold(profile) => create(m, profile).await?.0,
                Arm::Restored(ck) => restore_n(m, ck, 1).await?.0.remove(0),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
        points.push((target as f64, host_used_median().await));
    }
    ksm_settle().await;
    let pss = live
        .iter()
        .filter_map(|s| s.init_pid)
        .map(session_pss_mib)
        .sum::<f64>()
        / live.len().max(1) as f64;
    let mut charged = 0.0;
    for s in &live {
        let st: drums_api::SessionStats = m
            .client()
            .json(
                Method::GET,
                &format!("/v1/sessions/{}/stats", enc(&s.id)),
                None::<&()>,
            )
            .await?;
        charged += st.memory_bytes.unwrap_or(0) as f64 / (1 << 20) as f64;
    }
    for s in &live {
        m.remove(s).await?;
    }
    Ok((slope(&points), charged / live.len().max(1) as f64, pss))
}

/// `drums bench restore`: COLD (create to ready) and RESTORE (hygienic
/// restore to ready) interleaved in one run; forks; memory; dump.
/// The checkpointed session runs a Python HTTP server, so a restore brings
/// back a warm process, not just the init and the guest.
pub async fn restore(c: &Client, profile: &str, n: usize, as_json: bool) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    let m = Made::new(c);
    let r = if profile == "desktop" {
        desktop::restore(&m, n, as_json).await
    } else {
        restore_in(&m, profile, n, as_json).await
    };
    m.finish(r).await
}

async fn restore_in(m: &Made<'_>, profile: &str, n: usize, as_json: bool) -> Result<i32, Failure> {
    let c = m.client();
    let say = |line: String| {
        if !as_json {
            eprintln!("{line}");
        }
    };
    let (src, _) = create(m, profile).await?;
    sh(c, &src, WORKLOAD).await?;
    wait_port(src.ip.as_deref().unwrap_or_default(), 8000).await?;
    // Dump time: a few checkpoints of the warm session, the last one kept.
    let (dumps, ck) = checkpoints(m, &src, 5, false, true).await?;
    m.remove(&src).await?;
    // Warm-up of both arms.
    let (s, _) = create(m, profile).await?;
    m.remove(&s).await?;
    let (v, _) = restore_n(m, &ck.id, 1).await?;
    m.remove(&v[0]).await?;

    let (mut cold, mut warm, mut cold_work) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let (s, t) = create(m, profile).await?;
        m.remove(&s).await?;
        cold.push(t);
        // The fair comparison for a restore: a cold session brought to the
        // same state (the workload started and answering).
        let t0 = Instant::now();
        let (s, _) = create(m, profile).await?;
        sh(c, &s, WORKLOAD).await?;
        wait_port(s.ip.as_deref().unwrap_or_default(), 8000).await?;
        cold_work.push(t0.elapsed().as_secs_f64());
        m.remove(&s).await?;
        let (v, t) = restore_n(m, &ck.id, 1).await?;
        for s in &v {
            m.remove(s).await?;
        }
        warm.push(t);
        if !as_json {
            eprint!(
                "\r\x1b[Kround {}/{n}: cold {:.1} ms, restore {:.1} ms",
                i + 1,
                cold[i] * 1e3,
                warm[i] * 1e3
            );
        }
    }
    say(String::new());
    let mut forks = Vec::new();
    for count in [1usize, 4, 8] {
        let (v, t) = restore_n(m, &ck.id, count).await?;
        for s in &v {
            m.remove(s).await?;
        }
        forks.push((count, t));
        say(format!("fork of {count}: all ready in {:.1} ms", t * 1e3));
    }
    say("memory: cold sessions".into());
    let (cold_slope, cold_cg, _) = memory_slope(m, &[1, 4, 8, 12], Arm::Cold(profile)).await?;
    say("memory: restored siblings".into());
    let (warm_slope, warm_cg, _) = memory_slope(m, &[1, 4, 8, 12], Arm::Restored(&ck.id)).await?;
    m.delete_checkpoint(&ck.id).await?;

    let sort = |v: &mut Vec<f64>| v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    sort(&mut cold);
    sort(&mut warm);
    sort(&mut cold_work);
    let (w50, w95) = (percentile(&cold_work, 50.0), percentile(&cold_work, 95.0));
    let mut dump_t: Vec<f64> = dumps.iter().map(|d| d.0).collect();
    let mut frozen: Vec<f64> = dumps.iter().map(|d| d.1).collect();
    sort(&mut dump_t);
    sort(&mut frozen);
    let (c50, c95) = (percentile(&cold, 50.0), percentile(&cold, 95.0));
    let (r50, r95) = (percentile(&warm, 50.0), percentile(&warm, 95.0));
    let image_mib = ck.images_bytes as f64 / (1 << 20) as f64;
    if as_json {
        let mut out = json!({
            "profile": profile,
            "n": n,
            "cold.p50": c50, "cold.p95": c95,
            "restore.p50": r50, "restore.p95": r95,
            "ratio": c50 / r50,
            "cold_workload.p50": w50, "cold_workload.p95": w95,
            "ratio_workload": w50 / r50,
            "dump.p50": percentile(&dump_t, 50.0),
            "dump.frozen.p50": percentile(&frozen, 50.0),
            "image_mib": image_mib,
            "mem.cold.per_session_mib": cold_slope,
            "mem.restore.per_session_mib": warm_slope,
            "mem.cold.cgroup_mib": cold_cg,
            "mem.restore.cgroup_mib": warm_cg,
        });
        for (count, t) in &forks {
            out[format!("fork.{count}")] = json!(t);
        }
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
    } else {
        let ms = |s: f64| format!("{:.1} ms", s * 1e3);
        let row = |a: &str, b: String, c: String, d: String| vec![a.to_owned(), b, c, d];
        let mut rows = vec![
            row("create-to-ready (COLD)", ms(c50), ms(c95), String::new()),
            row(
                "hygienic restore-to-ready (RESTORE)",
                ms(r50),
                ms(r95),
                format!("cold/restore {:.2}x", c50 / r50),
            ),
            row(
                "cold + the same workload answering",
                ms(w50),
                ms(w95),
                format!("that/restore {:.2}x", w50 / r50),
            ),
        ];
        for (count, t) in &forks {
            rows.push(row(
                &format!("fork of {count}, all ready"),
                ms(*t),
                String::new(),
                String::new(),
            ));
        }
        rows.push(row(
            "checkpoint (dump, snapshot, seal)",
            ms(percentile(&dump_t, 50.0)),
            ms(percentile(&dump_t, 95.0)),
            "n=5".into(),
        ));
        rows.push(row(
            "  of which frozen",
            ms(percentile(&frozen, 50.0)),
            ms(percentile(&frozen, 95.0)),
            "n=5".into(),
        ));
        rows.push(row(
            "image size",
            format!("{image_mib:.1} MiB"),
            String::new(),
            String::new(),
        ));
        rows.push(row(
            "host memory per added session, cold",
            format!("{cold_slope:.1} MiB"),
            String::new(),
            "slope 1,4,8,12".into(),
        ));
        rows.push(row(
            "host memory per added session, restored",
            format!("{warm_slope:.1} MiB"),
            String::new(),
            "slope 1,4,8,12".into(),
        ));
        rows.push(row(
            "cgroup memory per session, cold",
            format!("{cold_cg:.1} MiB"),
            String::new(),
            "mean of 12".into(),
        ));
        rows.push(row(
            "cgroup memory per session, restored",
            format!("{warm_cg:.1} MiB"),
            String::new(),
            "mean of 12".into(),
        ));
        println!("drums bench restore --profile {profile} -n {n}");
        print!(
            "{}",
            table::render(&["metric", "p50", "p95", "note"], &rows)
        );
    }
    Ok(exit::OK)
}

/// One progress line on stderr, replacing the last (none with `--json`).
fn progress(as_json: bool, m: impl std::fmt::Display) {
    if !as_json {
        eprint!("\r\x1b[K{m}");
    }
}

/// Begin a turn of `s` by hand, as the benches that mark turns do.
async fn turn_begin(c: &Client, s: &Session) -> Result<(), Failure> {
    c.call(
        Method::POST,
        &format!("/v1/sessions/{}/turn/begin", enc(&s.id)),
        None::<&()>,
    )
    .await?;
    Ok(())
}
