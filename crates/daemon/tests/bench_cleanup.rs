//! A bench that fails halfway removes what it made (`crates/bench/src/
//! made.rs`). Each case arms one of drumsd's fault points, so that a bench
//! fails after it has made sessions or checkpoints: at a dump while its
//! source session runs, at a restore while its checkpoint is kept, at a
//! desktop's hygiene, at the first version of a session. The bench must fail,
//! naming the fault, and leave no session, checkpoint, process, veth or
//! subvolume behind.
//!
//! Needs root and the images set-up builds, as every daemon test.

mod common;

use common::{fails, TestDaemon};

/// (bench arguments, the fault point armed, what it had made when it failed)
const CASES: &[(&[&str], &str, &str)] = &[
    (
        &["bench", "restore", "-n", "1"],
        "checkpoint.criu",
        "its running source session",
    ),
    (
        &["bench", "restore", "-n", "1"],
        "restore.hygiene",
        "its checkpoint",
    ),
    (
        &["bench", "confinement", "-n", "1"],
        "restore.criu",
        "a checkpoint per arm",
    ),
    (
        &["bench", "restore", "--profile", "desktop", "-n", "1"],
        "restore.desktop",
        "a desktop's clean checkpoint",
    ),
    (
        &["bench", "engine", "-n", "1"],
        "checkpoint.criu",
        "a headless and a desktop session",
    ),
];

#[test]
fn a_bench_that_fails_halfway_leaves_nothing_behind() {
    let mut d = TestDaemon::start();
    for &(args, point, made) in CASES {
        let what = format!("drums {} failing at {point} ({made})", args.join(" "));
        common::run(d.arm(Some(point)));
        let err = fails(&d.drums(args), &what);
        common::run(d.arm(None));
        assert!(err.contains(point), "{what}: failed otherwise: {err}");
        assert!(
            !err.contains("cleaning up"),
            "{what}: could not clean up: {err}"
        );
        common::run(async {
            d.assert_no_session_left(&what).await;
            let k: drums_api::CheckpointList = d
                .client
                .json(hyper::Method::GET, "/v1/checkpoints", None::<&()>)
                .await
                .unwrap();
            assert!(
                k.checkpoints.is_empty(),
                "{what}: checkpoints left: {:?}",
                k.checkpoints.iter().map(|k| &k.id).collect::<Vec<_>>()
            );
        });
    }
    d.stop_and_check_leaks();
}
