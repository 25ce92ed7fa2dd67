//! Needs root and CRIU 4.2.1. A failing post-dump callback (say, the files
//! snapshot failed) must abort the dump, thaw the tree, and say which
//! notification failed and why.

mod common;

use common::*;
use drums_criu::{script, CriuError, DumpOpts, NetworkLock};

#[test]
fn failing_post_dump_callback_aborts_dump_and_tree_keeps_running() {
    let criu = criu();
    let mut fx = Fixture::new();
    let ext = fx.ext_dir();
    let ov = fx.overlay("orig");
    let init = fx.start_tree(&ov, &ext);
    let images = fx.mkdir("images");
    // Freeze through the v1 freezer (as drums does): an abort must leave
    // the cgroup thawed and the tasks released.
    // The init has no children, so moving it alone moves the whole tree.
    let freezer = fx.cgroup("freezer");
    std::fs::write(freezer.join("cgroup.procs"), init.to_string()).unwrap();

    let mut seen = Vec::new();
    let err = criu
        .dump(
            &DumpOpts {
                pid: init,
                images_dir: images.clone(),
                leave_running: true,
                freeze_cgroup: Some(freezer.clone()),
                external_mounts: vec![(EXT_MOUNTPOINT.into(), EXT_KEY.into())],
                network_lock: NetworkLock::Skip,
                tcp_established: false,
            },
            &mut |s, _| {
                seen.push(s.to_string());
                if s == script::POST_DUMP {
                    // CRIU freezes the cgroup only to seize every task at
                    // once, then thaws it: the tasks wait in ptrace-stop.
                    assert_eq!(
                        state_of(init),
                        Some('t'),
                        "tree not stopped during post-dump"
                    );
                    Err("files snapshot failed: no space left".into())
                } else {
                    Ok(())
                }
            },
        )
        .expect_err("dump succeeded although post-dump failed");
    let msg = err.to_string();
    eprintln!("{msg}");
    match &err {
        CriuError::Notify {
            script: s,
            reason,
            log,
            ..
        } => {
            assert_eq!(s, script::POST_DUMP);
            assert_eq!(reason.to_string(), "files snapshot failed: no space left");
            assert_eq!(log, &images.join("dump.log"));
        }
        other => panic!("wanted CriuError::Notify, got {other:?}"),
    }
    assert!(msg.contains("post-dump notification failed"), "{msg}");
    let source = std::error::Error::source(&err).map(|s| s.to_string());
    assert_eq!(
        source.as_deref(),
        Some("files snapshot failed: no space left"),
        "the callback's error is the source"
    );
    // Nothing after the failed post-dump asked the callback again.
    assert_eq!(
        seen.last().map(String::as_str),
        Some(script::POST_DUMP),
        "{seen:?}"
    );

    // The tree was thawed and runs on.
    let st = std::fs::read_to_string(freezer.join("freezer.state")).unwrap();
    assert_eq!(st.trim(), "THAWED");
    assert_ne!(state_of(init), Some('t'));
    ov.assert_advances("tree after aborted dump");
    fx.finish();
}
