//! Needs root and CRIU 4.2.1. A tree whose root is killed while CRIU holds
//! it seized, at delays that sweep the dump from the seizing on: every dump
//! must end (dumped, failed on the dead task, or stopped by drums), and the
//! tree must be gone after it.
//!
//! In drums' sessions one such dump never ended: the root, pid 1 of its pid
//! namespace, waited in its exit for the namespace's other tasks, which
//! CRIU held as their tracer, and CRIU waited for the root to trap, so
//! drumsd hung with it (the coordinator's tests, two at a time, about one
//! run in three). `Criu::dump` now stops CRIU once the root is exiting
//! (`CriuError::Abandoned`). This fixture's smaller tree has not been seen
//! to hang, so the sweep holds the outcome, not the race; the unit test of
//! `exiting` in `src/lib.rs` holds the check itself.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use drums_criu::{script, CriuError, DumpOpts, NetworkLock};

/// Children of the root, so that its exit has tasks to wait for.
const PRELUDE: &str = "
for _ in range(2):
    if os.fork() == 0:
        while True:
            time.sleep(1)
";

/// Delays, after CRIU asked for external files (every task seized by
/// then), before the root is killed: they sweep the dump's parasite phase,
/// where the root must trap for CRIU and a dead one never does.
const DELAYS_US: [u64; 16] = [
    0, 100, 200, 300, 400, 500, 700, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 20000,
];

#[test]
fn a_dump_whose_root_is_killed_under_it_always_ends() {
    let criu = criu();
    let mut fx = Fixture::new();
    let ext = fx.ext_dir();
    let mut abandoned = 0;
    for (k, delay) in DELAYS_US.into_iter().enumerate() {
        let ov = fx.overlay(&format!("tree{k}"));
        let init = fx.start_tree_with(&ov, &ext, PRELUDE);
        let children = wait_for(Duration::from_secs(10), || {
            let c = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).ok()?;
            (c.split_whitespace().count() == 2).then_some(())
        });
        assert!(children.is_some(), "the root never forked its children");
        let opts = DumpOpts {
            pid: init,
            images_dir: fx.mkdir(&format!("images{k}")),
            leave_running: true,
            freeze_cgroup: None,
            external_mounts: vec![(EXT_MOUNTPOINT.into(), EXT_KEY.into())],
            network_lock: NetworkLock::Skip,
            tcp_established: false,
        };
        // The dump on a thread of its own: if it hangs, the test says so,
        // and the fixture's teardown still kills the tree (which lets CRIU
        // go).
        let (tx, rx) = mpsc::channel();
        let criu = criu.clone();
        std::thread::spawn(move || {
            let r = criu.dump(&opts, &mut |s, _| {
                if s == script::QUERY_EXT_FILES {
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_micros(delay));
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(init),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    });
                }
                Ok(())
            });
            let _ = tx.send(r);
        });
        let r = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!("the dump never returned after its root was killed {delay} µs in")
            });
        // Whatever CRIU got to, the root is dead: it may have finished the
        // dump first, or failed on the dead task, or been stopped.
        if let Err(CriuError::Abandoned { reason, .. }) = &r {
            assert!(
                reason.contains(&format!("pid {init}")) && reason.contains("began to exit"),
                "{reason}"
            );
            abandoned += 1;
        }
        eprintln!(
            "killed {delay} µs in: {}",
            match &r {
                Ok(_) => "dumped".to_owned(),
                Err(e) => e.to_string().chars().take(160).collect(),
            }
        );
        let gone = wait_for(Duration::from_secs(10), || {
            (!std::path::Path::new(&format!("/proc/{init}")).exists()
                || state_of(init) == Some('Z'))
            .then_some(())
        });
        assert!(
            gone.is_some(),
            "the killed root is still there: {:?}",
            state_of(init)
        );
    }
    eprintln!(
        "{abandoned} of {} dumps stopped while waiting for the dead root",
        DELAYS_US.len()
    );
    fx.finish();
}
