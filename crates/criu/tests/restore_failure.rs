//! Needs root and CRIU 4.2.1. A restore that CRIU rejects must come back as
//! an error that points at the log and quotes CRIU's error, with nothing left
//! running.

mod common;

use common::*;
use drums_criu::{CriuError, NetworkLock, Op, RestoreOpts};

fn opts(fx: &Fixture) -> RestoreOpts {
    RestoreOpts {
        // Exists but holds no image.
        images_dir: fx.mkdir("empty-images"),
        work_dir: fx.mkdir("work"),
        root: fx.mkdir("root"),
        external_mounts: vec![],
        veth_pairs: vec![],
        join_cgroups: vec![],
        network_lock: NetworkLock::Skip,
        tcp_established: false,
        empty_net: false,
    }
}

#[test]
fn restore_of_empty_images_dir_reports_log_and_criu_error() {
    let criu = criu();
    let fx = Fixture::new();
    let o = opts(&fx);
    let mut notes = Vec::new();
    let err = criu
        .restore(&o, &mut |s, _| {
            notes.push(s.to_string());
            Ok(())
        })
        .expect_err("restore from an empty images dir succeeded");
    let msg = err.to_string();
    eprintln!("{msg}");
    let log = o.work_dir.join("restore.log");
    match &err {
        CriuError::Failed {
            op, log: l, tail, ..
        } => {
            assert_eq!(*op, Op::Restore);
            assert_eq!(l, &log);
            assert!(tail.contains("Error ("), "no CRIU error line in: {tail}");
            // The sandbox's ever-present rlimit complaint is filtered out.
            assert!(!tail.contains("RLIMIT_NOFILE"), "{tail}");
        }
        other => panic!("wanted CriuError::Failed, got {other:?}"),
    }
    assert!(msg.starts_with("criu restore failed"), "{msg}");
    assert!(
        msg.contains(&log.display().to_string()),
        "log path missing: {msg}"
    );
    assert!(msg.contains("Error ("), "CRIU's error line missing: {msg}");
    fx.finish();
}

#[test]
fn restore_without_root_dir_fails_before_criu() {
    let criu = criu();
    let fx = Fixture::new();
    let mut o = opts(&fx);
    o.root = fx.dir.join("no-such-root");
    let err = criu.restore(&o, &mut |_, _| Ok(())).unwrap_err();
    assert!(
        matches!(err, CriuError::Path { what: "root", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no-such-root"), "{err}");
}
