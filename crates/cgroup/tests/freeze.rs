//! Freezing real cgroups with both freezers (needs root, a v1 freezer and the
//! unified v2 hierarchy, as on the hosts drums runs on). Each test works under
//! its own parent and proves at the end that it left no cgroup behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drums_cgroup::{Cgroup, CgroupError, Devices, FreezeMethod, Limits};

mod common;

use common::*;

const BOTH: [FreezeMethod; 2] = [FreezeMethod::V2, FreezeMethod::V1];

/// Increments a counter in `$F` as fast as it can.
const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i > \"$F\"; done";
/// Forks a short-lived child every few ms; each child appends a line to `$F`.
const FORK_APPENDER: &str = "while :; do (echo x >> \"$F\") & sleep 0.002; done";

/// Whether this host has both freezers; the tests say so loudly when not.
fn has_both_freezers() -> bool {
    let ok = Path::new("/sys/fs/cgroup/freezer").is_dir()
        && Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists();
    if !ok {
        eprintln!("SKIPPED: needs the v1 freezer and the unified v2 hierarchy");
    }
    ok
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", unique_parent()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A shell running `script` with `F=file`, moved into every hierarchy of `cg`.
fn start_in(cg: &Cgroup, cleanup: &mut Cleanup, script: &str, file: &Path) {
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("F", file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    cg.add_pid(child.id() as i32).unwrap();
    cleanup.children.push(child);
}

fn read_string(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until `file`'s contents change, or panics after 5 s.
fn wait_changes(file: &Path, what: &str) {
    let before = read_string(file);
    let deadline = Instant::now() + Duration::from_secs(5);
    while read_string(file) == before {
        assert!(
            Instant::now() < deadline,
            "{what}: {} did not change",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn unified_dir(parent: &str, name: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/unified").join(parent).join(name)
}

fn freezer_dir(parent: &str, name: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/freezer").join(parent).join(name)
}

/// The kernel's own view: frozen under `how` or not.
fn kernel_says_frozen(parent: &str, name: &str, how: FreezeMethod) -> bool {
    match how {
        FreezeMethod::V2 => {
            read_string(&unified_dir(parent, name).join("cgroup.events")).contains("frozen 1")
        }
        FreezeMethod::V1 => {
            read_string(&freezer_dir(parent, name).join("freezer.state")).trim() == "FROZEN"
        }
    }
}

#[test]
fn a_busy_writer_stops_while_frozen_and_resumes_on_thaw() {
    if !has_both_freezers() {
        return;
    }
    let parent = unique_parent();
    let mut cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let dir = scratch("drums-freeze-writer");
    let counter = dir.join("counter");
    let cg = Cgroup::create(&parent, "w", &Limits::default(), Devices::AllowList).unwrap();
    start_in(&cg, &mut cleanup, COUNTER, &counter);
    wait_changes(&counter, "writer before freezing");

    for (round, how) in BOTH.into_iter().enumerate() {
        let frozen = cg.freeze(how).unwrap();
        assert_eq!(frozen.method(), how);
        assert!(kernel_says_frozen(&parent, "w", how), "{how:?}");
        let held = read_string(&counter);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            read_string(&counter),
            held,
            "{how:?}: the writer ran while frozen"
        );
        // Explicit thaw in one round, drop in the other.
        if round == 0 {
            frozen.thaw().unwrap();
        } else {
            drop(frozen);
        }
        assert!(
            !kernel_says_frozen(&parent, "w", how),
            "{how:?} still frozen"
        );
        wait_changes(&counter, "writer after thawing");
    }

    cg.remove().unwrap();
    drop(cleanup);
    assert_nothing_left(&parent);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A workload that forks all the time is frozen whole: no new process appears
/// and no child writes while frozen. Repeated, so that freezes land in every
/// phase of a fork.
#[test]
fn a_forking_workload_is_frozen_whole() {
    if !has_both_freezers() {
        return;
    }
    let parent = unique_parent();
    let mut cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let dir = scratch("drums-freeze-forker");
    let log = dir.join("log");
    let limits = Limits {
        pids_max: Some(256),
        ..Limits::default()
    };
    let cg = Cgroup::create(&parent, "f", &limits, Devices::AllowList).unwrap();
    start_in(&cg, &mut cleanup, FORK_APPENDER, &log);
    start_in(&cg, &mut cleanup, FORKER, &log);
    wait_changes(&log, "forker before freezing");

    for how in BOTH {
        for _ in 0..15 {
            let frozen = cg.freeze(how).unwrap();
            let pids = cg.pids().unwrap();
            let len = read_string(&log).len();
            std::thread::sleep(Duration::from_millis(40));
            // A task caught already exiting is not frozen (neither freezer
            // stops the exit path) and may still leave: only a new one is
            // wrong.
            let after = cg.pids().unwrap();
            let new: Vec<_> = after.iter().filter(|p| !pids.contains(p)).collect();
            assert!(
                new.is_empty(),
                "{how:?}: tasks {new:?} appeared while frozen"
            );
            assert_eq!(read_string(&log).len(), len, "{how:?}: a task wrote");
            frozen.thaw().unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_changes(&log, "forker after thawing");
    }

    cg.remove().unwrap();
    drop(cleanup);
    assert_nothing_left(&parent);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A freeze that cannot complete ends in an error naming the cgroup, and
/// leaves it thawed. Tasks frozen by v1 cannot enter the v2 freeze trap, which
/// makes a V2 freeze that can never finish.
#[test]
fn a_freeze_past_its_deadline_is_an_error_and_thaws() {
    if !has_both_freezers() {
        return;
    }
    let parent = unique_parent();
    let mut cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let cg = Cgroup::create(&parent, "d", &Limits::default(), Devices::AllowList).unwrap();
    start_in(
        &cg,
        &mut cleanup,
        "while :; do :; done",
        Path::new("/dev/null"),
    );

    let held = cg.freeze(FreezeMethod::V1).unwrap();
    let started = Instant::now();
    let timeout = Duration::from_millis(300);
    let err = cg.freeze_within(FreezeMethod::V2, timeout).unwrap_err();
    let took = started.elapsed();
    assert!(took >= timeout && took < timeout * 5, "{took:?}");
    let unified = unified_dir(&parent, "d");
    match &err {
        CgroupError::FreezeTimeout {
            path,
            method,
            timeout: t,
            state,
        } => {
            assert_eq!(path, &unified);
            assert_eq!(*method, "v2");
            assert_eq!(*t, timeout);
            assert!(state.contains("frozen 0"), "{state}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(err.to_string().starts_with(&format!(
        "freeze {} (v2): not frozen after 300ms",
        unified.display()
    )));
    // The failed freeze took itself back.
    assert_eq!(read_string(&unified.join("cgroup.freeze")).trim(), "0");
    drop(held);
    assert!(!kernel_says_frozen(&parent, "d", FreezeMethod::V1));
    // Without the v1 freeze in the way, v2 freezes.
    cg.freeze(FreezeMethod::V2).unwrap().thaw().unwrap();

    cg.remove().unwrap();
    drop(cleanup);
    assert_nothing_left(&parent);
}

#[test]
fn a_cgroup_without_the_hierarchy_cannot_be_frozen() {
    let nothing = Cgroup::open("..", "x");
    for how in BOTH {
        let err = nothing.freeze(how).unwrap_err();
        assert!(matches!(err, CgroupError::NoFreezer { .. }), "{err}");
    }
}
