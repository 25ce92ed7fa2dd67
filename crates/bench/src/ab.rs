//! `drums bench engine|proxy --ab OTHER`: one bench against two builds in
//! one run, as Firecracker's A/B tests compare two binaries. Arm A is this
//! build's drumsd (beside `drums-bench`), arm B the drumsd at OTHER (with
//! the `drums-init` and `drums-guest` beside it), typically the parent
//! commit's, so that a change is measured against its parent on the same
//! machine at the same moment.
//!
//! Each arm is a private drumsd (daemon.rs): its own state directory in a
//! temporary directory of /var/tmp, bridge, subnet, cgroup parent and LLM
//! proxy port, sharing only the images. Both run for the whole bench; the
//! bench's rounds are split into `segments` runs per arm, alternating A, B
//! then B, A, so that the machine's drift over the run hits both arms
//! alike. The samples of an arm's segments are pooled: its p50 and p95 are
//! of all of them (stats::put_p50_p95). A value without samples (a count,
//! requests per second, a ratio) is the median of its segments'.
//!
//! JSON: `a` and `b`, each `{drumsd, version, values}` (`values` keyed as
//! the bench's own JSON); `b_over_a` of every value both arms have;
//! `segments`. The daemons' logs are in the directory printed at the start,
//! kept only when the run fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use drums_api::Client;
use futures::future::LocalBoxFuture;
use serde_json::{json, Map, Value};

use crate::daemon::{free_net, free_port, tag, Private, Spec};
use crate::exit::{self, Failure};
use crate::stats::p50_p95;
use crate::table;

/// What `--ab` is given.
#[derive(Debug, Clone)]
pub struct Ab {
    /// Arm B's drumsd.
    pub other: PathBuf,
    /// Runs of the bench per arm, alternating.
    pub segments: usize,
    /// Where both arms' sessions find their images.
    pub images_dir: PathBuf,
}

/// One segment of a bench against one arm: its client, its LLM proxy, and
/// how many rounds; the bench's JSON and its exit status.
pub type Segment = Box<
    dyn FnMut(Client, SocketAddr, usize) -> LocalBoxFuture<'static, Result<(Value, i32), Failure>>,
>;

struct Arm {
    label: &'static str,
    drumsd: PathBuf,
    daemon: Option<Private>,
    version: String,
    runs: Vec<Value>,
}

/// Run `segment` on both arms, `rounds` rounds split over the segments,
/// with `args` for both daemons (an upstream, a policy), and print the
/// comparison (JSON with `as_json`).
pub async fn run(
    ab: &Ab,
    title: &str,
    rounds: usize,
    args: Vec<String>,
    as_json: bool,
    mut segment: Segment,
) -> Result<i32, Failure> {
    if ab.segments == 0 || rounds < ab.segments {
        return Err(Failure::usage(format!(
            "--segments must be at least 1 and at most the rounds ({rounds})"
        )));
    }
    let this = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("drumsd")))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Failure::usage("--ab: no drumsd beside this drums-bench (arm A is this build's)")
        })?;
    let other = std::fs::canonicalize(&ab.other)
        .ok()
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Failure::usage(format!(
                "--ab: {} is not a drumsd binary",
                ab.other.display()
            ))
        })?;
    let work = tempfile::Builder::new()
        .prefix(&format!("drums-ab-{}-", tag()))
        .tempdir_in("/var/tmp")
        .map_err(|e| {
            Failure::new(
                exit::INTERNAL,
                format!("create a directory in /var/tmp: {e}"),
            )
        })?;
    // Each drumsd installs the binaries its sessions run beside its state
    // directory, which the sessions' user namespaces must reach: 0700 would
    // keep them out.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).map_err(
            |e| {
                Failure::new(
                    exit::INTERNAL,
                    format!("chmod {}: {e}", work.path().display()),
                )
            },
        )?;
    }
    let logs = std::env::temp_dir().join(format!("drums-ab-{}-logs", std::process::id()));
    eprintln!(
        "drums bench --ab: the daemons' logs are in {}",
        logs.display()
    );
    let mut arms = [
        Arm {
            label: "a",
            drumsd: this,
            daemon: None,
            version: String::new(),
            runs: Vec::new(),
        },
        Arm {
            label: "b",
            drumsd: other,
            daemon: None,
            version: String::new(),
            runs: Vec::new(),
        },
    ];
    // Two stores side by side: a smaller one each than the default 64 GiB.
    let mut args = args;
    args.extend(["--store-gib".to_owned(), "16".to_owned()]);
    let r = measure(
        ab,
        rounds,
        &args,
        work.path(),
        &logs,
        &mut arms,
        &mut segment,
    )
    .await;
    // Both daemons are stopped, whatever happened: each removes its
    // sessions, bridge, cgroups and store.
    let mut stopped = Ok(());
    for arm in &mut arms {
        let Some(d) = arm.daemon.take() else {
            continue;
        };
        let spec = d.spec().clone();
        if let Err(e) = d.stop().await {
            stopped = Err(Failure::new(
                exit::INTERNAL,
                format!(
                    "stop arm {}'s drumsd: {}",
                    arm.label,
                    drums_api::error_chain(&e)
                ),
            ));
            continue;
        }
        let left = crate::daemon::leftovers(&spec);
        if !left.is_empty() {
            stopped = Err(Failure::new(
                exit::INTERNAL,
                format!(
                    "arm {}'s drumsd left on the host:\n{}",
                    arm.label,
                    left.join("\n")
                ),
            ));
        }
    }
    let status = r?;
    stopped?;
    drop(work);
    // Kept only when the run failed (above): they say why.
    let _ = std::fs::remove_dir_all(&logs);
    let out = compare(ab.segments, &arms);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
    } else {
        print_table(title, rounds, ab.segments, &arms, &out);
    }
    Ok(status)
}

async fn measure(
    ab: &Ab,
    rounds: usize,
    args: &[String],
    work: &Path,
    logs: &Path,
    arms: &mut [Arm; 2],
    segment: &mut Segment,
) -> Result<i32, Failure> {
    let fail = |what: String| {
        move |e: crate::daemon::DaemonError| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("{what}: {}", drums_api::error_chain(&e)),
            )
        }
    };
    let net = free_net().map_err(fail("a subnet for the arms".into()))?;
    let t = tag();
    for (k, arm) in arms.iter_mut().enumerate() {
        let bin_dir = arm.drumsd.parent().expect("a file has a parent").to_owned();
        let spec = Spec {
            drumsd: arm.drumsd.clone(),
            bin_dir,
            images_dir: ab.images_dir.clone(),
            state: work.join(arm.label),
            bridge: format!("drab{t}{}", arm.label),
            subnet: format!("10.{net}.{}.0/24", k + 1),
            cgroup_parent: format!("drums-ab-{t}-{}", arm.label),
            proxy: free_port().map_err(fail("a port for a proxy".into()))?,
            args: args.to_vec(),
            log: logs.join(format!("drumsd-{}.log", arm.label)),
        };
        let d = Private::start(spec).await.map_err(fail(format!(
            "start arm {}'s drumsd {}",
            arm.label,
            arm.drumsd.display()
        )))?;
        // Kept before anything else can fail: the caller stops it.
        let d = arm.daemon.insert(d);
        let v: drums_api::Version = d
            .client
            .json(hyper::Method::GET, "/v1/version", None::<&()>)
            .await?;
        arm.version = v.version;
    }
    let mut status = exit::OK;
    for s in 0..ab.segments {
        // This segment's share of the rounds; the first ones take the rest.
        let n = rounds / ab.segments + usize::from(s < rounds % ab.segments);
        let order = if s % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let arm = &mut arms[k];
            let d = arm.daemon.as_ref().expect("started");
            eprintln!(
                "drums bench --ab: segment {}/{}, arm {} ({n} rounds)",
                s + 1,
                ab.segments,
                arm.label
            );
            let (v, st) = segment(d.client.clone(), d.proxy, n).await?;
            if st != exit::OK {
                status = st;
            }
            arm.runs.push(v);
        }
    }
    Ok(status)
}

/// An arm's values: pooled samples' p50 and p95, and the median of its
/// segments' other numbers.
fn values(runs: &[Value]) -> BTreeMap<String, f64> {
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut scalars: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in runs {
        if let Some(all) = r["samples"].as_object() {
            for (k, v) in all {
                let v = v.as_array().into_iter().flatten().filter_map(Value::as_f64);
                samples.entry(k.clone()).or_default().extend(v);
            }
        }
        for (k, v) in r.as_object().into_iter().flatten() {
            if let Some(x) = v.as_f64() {
                scalars.entry(k.clone()).or_default().push(x);
            }
        }
    }
    let mut out = BTreeMap::new();
    for (k, v) in &scalars {
        let pooled = k
            .strip_suffix(".p50")
            .or_else(|| k.strip_suffix(".p95"))
            .is_some_and(|base| samples.contains_key(base));
        if !pooled && k != "n" {
            out.insert(k.clone(), p50_p95(v.iter().copied()).0);
        }
    }
    for (k, v) in samples {
        let (p50, p95) = p50_p95(v);
        out.insert(format!("{k}.p50"), p50);
        out.insert(format!("{k}.p95"), p95);
    }
    out
}

fn compare(segments: usize, arms: &[Arm; 2]) -> Value {
    let [a, b] = [values(&arms[0].runs), values(&arms[1].runs)];
    let mut ratio = Map::new();
    for (k, x) in &a {
        if let Some(y) = b.get(k) {
            if *x != 0.0 && x.is_finite() && y.is_finite() {
                ratio.insert(k.clone(), json!(y / x));
            }
        }
    }
    let arm = |arm: &Arm, v: &BTreeMap<String, f64>| json!({"drumsd": arm.drumsd.display().to_string(), "version": arm.version, "values": v});
    json!({
        "segments": segments,
        "a": arm(&arms[0], &a),
        "b": arm(&arms[1], &b),
        "b_over_a": ratio,
    })
}

/// A value as its key says it is measured: bytes, a count or a rate, a
/// share, or seconds.
fn show(key: &str, x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    if key.starts_with("bytes.") {
        match x {
            x if x >= (1 << 20) as f64 => format!("{:.1} MiB", x / (1 << 20) as f64),
            x if x >= 1024.0 => format!("{:.1} KiB", x / 1024.0),
            x => format!("{x:.0} B"),
        }
    } else if key.starts_with("rps.")
        || key.starts_with("ratio.")
        || key.ends_with(".turns")
        || key.ends_with(".redone")
        || key.ends_with(".started_high")
    {
        format!("{x:.2}")
    } else if key.ends_with("share") {
        format!("{:.3}%", x * 100.0)
    } else if x.abs() >= 1.0 {
        format!("{x:.2} s")
    } else if x.abs() >= 1e-3 {
        format!("{:.1} ms", x * 1e3)
    } else {
        format!("{:.0} µs", x * 1e6)
    }
}

fn print_table(title: &str, rounds: usize, segments: usize, arms: &[Arm; 2], out: &Value) {
    println!(
        "drums bench {title} --ab: {rounds} rounds per arm in {segments} segments, alternating"
    );
    for arm in arms {
        println!(
            "  {}: {} ({})",
            arm.label.to_uppercase(),
            arm.drumsd.display(),
            arm.version
        );
    }
    let (a, b) = (&out["a"]["values"], &out["b"]["values"]);
    let rows: Vec<Vec<String>> = a
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| {
            let x = x.as_f64().unwrap_or(f64::NAN);
            let y = b[k].as_f64().unwrap_or(f64::NAN);
            let r = out["b_over_a"][k]
                .as_f64()
                .map_or_else(|| "-".into(), |r| format!("{r:.2}"));
            vec![k.clone(), show(k, x), show(k, y), r]
        })
        .collect();
    print!("{}", table::render(&["value", "A", "B", "B/A"], &rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_pool_samples_and_take_the_median_of_the_rest() {
        let runs = [
            json!({"n": 2, "x.p50": 9.0, "x.p95": 9.0, "rps": 10.0, "samples": {"x": [1.0, 2.0]}}),
            json!({"n": 2, "x.p50": 9.0, "x.p95": 9.0, "rps": 30.0, "samples": {"x": [3.0, 4.0]}}),
            json!({"n": 2, "rps": 20.0, "samples": {"x": [5.0]}}),
        ];
        let v = values(&runs);
        // p50 and p95 of 1..5, not of the segments' own (9.0).
        assert_eq!(v["x.p50"], 3.0);
        assert_eq!(v["x.p95"], 5.0);
        assert_eq!(v["rps"], 20.0);
        assert!(!v.contains_key("n"));
    }

    #[test]
    fn ratios_are_b_over_a_where_both_have_a_value() {
        let arm = |runs: Vec<Value>| Arm {
            label: "a",
            drumsd: PathBuf::from("/x"),
            daemon: None,
            version: String::new(),
            runs,
        };
        let out = compare(
            1,
            &[
                arm(vec![json!({"t": 2.0, "only_a": 1.0, "zero": 0.0})]),
                arm(vec![json!({"t": 3.0, "zero": 1.0})]),
            ],
        );
        assert_eq!(out["b_over_a"]["t"], 1.5);
        assert!(out["b_over_a"].get("only_a").is_none());
        assert!(out["b_over_a"].get("zero").is_none());
    }
}
