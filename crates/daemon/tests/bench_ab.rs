//! `drums bench proxy|engine --ab OTHER` (crates/bench/src/ab.rs): a bench
//! against two private daemons in one run, which must answer for both arms
//! and leave nothing of either on the host, also when an arm cannot start.
//!
//! Arm B is this build's drumsd again (an A/A run): what is checked is the
//! mode's mechanics, not a difference between builds.
//!
//! Needs root and the images set-up builds, as every daemon test.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bin_dir, bounded, fails, ok, require_root};

/// `drums bench ARGS`, with a state dir of its own that no drumsd uses: the
/// A/B mode must not start or reach the host's daemon.
fn bench(args: &[&str]) -> std::process::Output {
    let state = tempfile::tempdir().unwrap();
    let out = bounded(
        Command::new(bin_dir().join("drums"))
            .arg("--state-dir")
            .arg(state.path())
            .arg("--no-autostart")
            .arg("bench")
            .args(args)
            .env("DRUMS_IMAGES_DIR", common::images_dir()),
    );
    // Nothing was made in it: no autostarted drumsd, no socket.
    let left: Vec<_> = std::fs::read_dir(state.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "the host's state dir was used: {left:?}");
    out
}

/// What the A/B runs of process `pid` could have left: their work dirs,
/// bridges, cgroups and daemons.
fn leftovers(pid: u32) -> Vec<String> {
    let tag = pid % 10_000;
    let mut left = Vec::new();
    for e in std::fs::read_dir("/var/tmp").unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&format!("drums-ab-{tag}-")) {
            left.push(format!("work dir /var/tmp/{n}"));
        }
    }
    for arm in ["a", "b"] {
        let bridge = format!("drab{tag}{arm}");
        if Path::new("/sys/class/net").join(&bridge).exists() {
            left.push(format!("link {bridge}"));
        }
        let cg = format!("drums-ab-{tag}-{arm}");
        for root in [
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids",
        ] {
            if Path::new(root).join(&cg).exists() {
                left.push(format!("cgroup {root}/{cg}"));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&format!("/var/tmp/drums-ab-{tag}-")))
            .map(|l| format!("mount {l}")),
    );
    left
}

/// The pid the bench ran as: the CLI execs drums-bench in place, so it is
/// the child's own, read back from the log directory it names.
fn bench_pid(stderr: &str) -> u32 {
    let dir = stderr
        .lines()
        .find_map(|l| l.split("the daemons' logs are in ").nth(1))
        .unwrap_or_else(|| panic!("no log directory named:\n{stderr}"));
    let name = Path::new(dir.trim())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    name.trim_start_matches("drums-ab-")
        .trim_end_matches("-logs")
        .parse()
        .unwrap_or_else(|_| panic!("a log dir named {name}"))
}

#[test]
fn proxy_ab_measures_both_arms_and_leaves_nothing() {
    require_root();
    let drumsd = bin_dir().join("drumsd");
    let out = bench(&[
        "proxy",
        "--ab",
        drumsd.to_str().unwrap(),
        "-n",
        "2",
        "--turns",
        "1",
        "--segments",
        "2",
        "--json",
    ]);
    let stdout = ok(&out, "drums bench proxy --ab");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["segments"], 2);
    for arm in ["a", "b"] {
        let values = &v[arm]["values"];
        assert_eq!(
            v[arm]["drumsd"].as_str(),
            Some(std::fs::canonicalize(&drumsd).unwrap().to_str().unwrap()),
            "arm {arm}: {v}"
        );
        for key in [
            "session.proxy.p50",
            "session.added.p95",
            "rps.16.proxy",
            "held.files.p50",
        ] {
            assert!(
                values[key].as_f64().is_some_and(f64::is_finite),
                "arm {arm} has no {key}: {values}"
            );
        }
        // Samples pooled over both segments: one per request of each.
        assert!(values["session.proxy.p50"].as_f64().unwrap() > 0.0);
    }
    assert!(v["b_over_a"]["session.proxy.p50"].as_f64().is_some(), "{v}");
    // Each arm ran each segment, alternating.
    let order: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split(", arm ").nth(1))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(order, ["a", "b", "b", "a"], "{stderr}");
    let pid = bench_pid(&stderr);
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
    // A run that succeeded keeps no logs.
    let logs = std::env::temp_dir().join(format!("drums-ab-{pid}-logs"));
    assert!(!logs.exists(), "{} kept", logs.display());
}

#[test]
fn an_arm_that_cannot_start_fails_the_run_and_leaves_nothing() {
    require_root();
    // Arm B: a "drumsd" that exits at once, beside copies of nothing.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("drumsd");
    std::fs::write(&fake, "#!/bin/sh\necho 'not a drumsd' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = bench(&[
        "proxy",
        "--ab",
        fake.to_str().unwrap(),
        "-n",
        "2",
        "--turns",
        "1",
    ]);
    let err = fails(&out, "drums bench proxy --ab with a drumsd that exits");
    assert!(err.contains("arm b"), "the failing arm is not named: {err}");
    assert!(err.contains("exited with"), "{err}");
    // Arm A had started: it was stopped, and removed what it made. The
    // daemons' logs are kept for a failed run, and say why.
    let pid = bench_pid(&err);
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
    let logs = std::env::temp_dir().join(format!("drums-ab-{pid}-logs"));
    let b = std::fs::read_to_string(logs.join("drumsd-b.log")).unwrap();
    assert!(b.contains("not a drumsd"), "arm b's log: {b}");
    std::fs::remove_dir_all(&logs).unwrap();
}

#[test]
fn bad_arguments_are_refused_before_anything_starts() {
    require_root();
    let missing = PathBuf::from("/nonexistent/drumsd");
    let out = bench(&["engine", "--ab", missing.to_str().unwrap()]);
    let err = fails(&out, "drums bench engine --ab /nonexistent/drumsd");
    assert!(err.contains("is not a drumsd binary"), "{err}");
    let drumsd = bin_dir().join("drumsd");
    let out = bench(&[
        "engine",
        "--ab",
        drumsd.to_str().unwrap(),
        "-n",
        "1",
        "--segments",
        "2",
    ]);
    let err = fails(&out, "more segments than rounds");
    assert!(err.contains("--segments"), "{err}");
    // `--segments` means nothing without `--ab`.
    let out = bench(&["proxy", "--segments", "2"]);
    fails(&out, "--segments without --ab");
}
