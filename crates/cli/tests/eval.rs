//! `drums eval --quick`, as CI runs it: the evaluation passes its own
//! assertions (docs/eval.md), writes its output, and leaves nothing behind.
//!
//! Its assertions, checked by the evaluation itself (it exits non-zero if
//! one fails): `selective` and `full` recover every run; `chat-only` fails
//! a trace that needs process state (the faults bite); selective writes
//! fewer checkpoint bytes than full; and every turn of the whole corpus,
//! replayed without faults, has the class its trace labels it with. This
//! test checks that they were checked, on what, and that the raw data and
//! the figures are there.

use std::path::Path;
use std::process::Command;

#[test]
fn eval_quick_passes_its_assertions_and_leaves_nothing() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "drums eval runs drumsd daemons (namespaces, mounts, cgroups); CI runs it as root. NOT SKIPPED: failing on purpose"
    );
    let drums = env!("CARGO_BIN_EXE_drums");
    let dir = Path::new(drums).parent().unwrap();
    for b in ["drums-eval", "drumsd", "drums-init", "drums-guest"] {
        assert!(
            dir.join(b).exists(),
            "{b} missing beside drums: build the workspace's binaries first (`make test` does)"
        );
    }
    let out = tempfile::tempdir().unwrap();
    let child = Command::new(drums)
        .args(["eval", "--quick", "--out"])
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its host resources are named by its pid (drums_eval::daemon::tag).
    let tag = child.id() % 10_000;
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap_or_default();
    assert!(
        o.status.success(),
        "drums eval --quick failed:\n{stderr}\n--- summary.md ---\n{summary}"
    );
    // It said what it did while it ran, and printed the tables.
    assert!(stderr.contains("eval: reference"), "{stderr}");
    assert!(stdout.contains("## Recovery, per strategy"), "{stdout}");
    assert!(summary.contains("All hold"), "{summary}");

    // The raw data: every trace of the corpus replayed without faults (the
    // labels' check), each strategy and the agent inside on the quick
    // traces, and both densities; a row per turn.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(v["format"], 1);
    let runs = v["runs"].as_array().unwrap();
    let phase = |p: &str| runs.iter().filter(|r| r["phase"] == p).count();
    assert!(
        phase("reference") >= 30,
        "the whole corpus: {}",
        phase("reference")
    );
    for p in [
        "chat-only",
        "chat+files",
        "full",
        "selective",
        "restart",
        "selective (agent inside)",
    ] {
        assert_eq!(phase(p), drums_eval::QUICK_TRACES, "{p}");
    }
    let faults: usize = runs
        .iter()
        .filter(|r| r["phase"] == "selective")
        .map(|r| r["faults"].as_array().unwrap().len())
        .sum();
    assert!(
        faults >= drums_eval::QUICK_TRACES,
        "faults injected: {faults}"
    );
    let rows = v["rows"].as_array().unwrap();
    assert!(
        rows.iter().any(|r| r["class"].is_string()) && rows.len() > 300,
        "{} rows",
        rows.len()
    );
    assert_eq!(v["density"].as_array().unwrap().len(), 2);
    for f in [
        "correctness.svg",
        "traffic.svg",
        "density.svg",
        "time.svg",
        "proxy-overhead.svg",
    ] {
        let svg = std::fs::read_to_string(out.path().join(f)).unwrap();
        assert!(svg.starts_with("<svg"), "{f}");
    }

    // Nothing of its daemons is left: bridges, cgroups, mounts, work dirs
    // (another eval may run beside it: only its own are looked for).
    let links = Command::new("ip").args(["-br", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(&format!("drev{tag}x")), "{links}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&format!("drums-eval-{tag}-")), "{mounts}");
    // Every hierarchy: v2 at the root, or v1 controllers and the unified one
    // a level down.
    let mut roots = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    roots.extend(
        std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir()),
    );
    for root in roots {
        if let Ok(d) = std::fs::read_dir(&root) {
            for e in d.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                assert!(
                    !n.starts_with(&format!("drums-eval-{tag}-")),
                    "cgroup {} left",
                    e.path().display()
                );
            }
        }
    }
    for e in std::fs::read_dir("/var/tmp").unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        assert!(
            !n.starts_with(&format!("drums-eval-{tag}-")),
            "/var/tmp/{n} left"
        );
    }
}
