//! `drums bench …`: benchmarks as code. Each prints the same table every time
//! (or JSON with stable keys), measured end to end through the API as a user
//! would see it.

use std::time::Instant;

use drums_api::{Client, CreateSession, Session};
use hyper::Method;
use serde_json::json;

use crate::commands::enc;
use crate::exit::{self, Failure};
use crate::table;

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Least-squares slope of y over x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let num: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    num / den
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

async fn create(c: &Client, profile: &str) -> Result<(Session, f64), Failure> {
    let req = CreateSession {
        profile: Some(profile.into()),
        ..Default::default()
    };
    let t = Instant::now();
    let s: Session = c.json(Method::POST, "/v1/sessions", Some(&req)).await?;
    Ok((s, t.elapsed().as_secs_f64()))
}

async fn remove(c: &Client, s: &Session) -> Result<(), Failure> {
    c.call(
        Method::DELETE,
        &format!("/v1/sessions/{}", enc(&s.id)),
        None::<&()>,
    )
    .await?;
    Ok(())
}

/// `drums bench start`: create-to-ready (ready = the guest agent answers), and
/// host memory per added session as the slope over 1, 4 and 8 live sessions.
pub async fn start(c: &Client, profile: &str, n: usize, as_json: bool) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    // One unmeasured round warms the page cache and the daemon's paths.
    let (s, _) = create(c, profile).await?;
    remove(c, &s).await?;

    let mut cold = Vec::with_capacity(n);
    for i in 0..n {
        let (s, t) = create(c, profile).await?;
        remove(c, &s).await?;
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
            live.push(create(c, profile).await?.0);
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
        remove(c, s).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 95.0), 10.0);
        assert_eq!(percentile(&[3.0], 95.0), 3.0);
        assert!((slope(&[(0.0, 10.0), (1.0, 12.0), (4.0, 18.0), (8.0, 26.0)]) - 2.0).abs() < 1e-9);
    }
}
