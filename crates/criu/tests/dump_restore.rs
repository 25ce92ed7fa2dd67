//! Needs root and CRIU 4.2.1. Dumps a session-shaped tree (pid+uts+ipc+mount
//! namespaces, overlay root, a host bind mount) while it keeps running, then
//! restores the image twice, each copy on its own fresh overlay root.

mod common;

use common::*;
use drums_criu::{script, DumpOpts, NetworkLock, RestoreOpts};

#[test]
fn dump_once_restore_twice() {
    let criu = criu();
    let mut fx = Fixture::new();
    let ext = fx.ext_dir();
    let orig = fx.overlay("orig");
    let init = fx.start_tree(&orig, &ext);
    let images = fx.mkdir("images");
    let snap = fx.mkdir("snapshot");

    let mut seen = Vec::new();
    let dump = criu
        .dump(
            &DumpOpts {
                pid: init,
                images_dir: images.clone(),
                leave_running: true,
                freeze_cgroup: None,
                external_mounts: vec![(EXT_MOUNTPOINT.into(), EXT_KEY.into())],
                network_lock: NetworkLock::Skip,
                tcp_established: false,
            },
            &mut |s, _pid| {
                // The tree is frozen during post-dump: drums snapshots files here.
                if s == script::POST_DUMP {
                    assert_eq!(
                        state_of(init),
                        Some('t'),
                        "tree not stopped during post-dump"
                    );
                    // The files consistent with the image (a counter.tmp the
                    // tree has open included): the restores start from them.
                    let st = std::process::Command::new("cp")
                        .arg("-a")
                        .arg(orig.upper.join("."))
                        .arg(&snap)
                        .status()
                        .unwrap();
                    assert!(st.success(), "copy the frozen upper layer");
                }
                seen.push(s.to_string());
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "dump: {:?} (frozen at most {:?})",
        dump.elapsed, dump.frozen_at_most
    );
    let pre = seen.iter().position(|s| s == script::PRE_DUMP);
    let post = seen.iter().position(|s| s == script::POST_DUMP);
    assert!(
        matches!((pre, post), (Some(a), Some(b)) if a < b),
        "dump notifications out of order: {seen:?}"
    );
    assert_eq!(dump.log, images.join("dump.log"));
    assert!(dump.log.is_file());
    orig.assert_advances("original after dump (leave_running)");

    // The second copy is restored into cgroups (v1 pids and the v2 unified
    // hierarchy) that swrk joins first: CRIU's cgroup handling is off, so
    // the restored tree must simply inherit them.
    let pids_cg = fx.cgroup("pids");
    let unified_cg = fx.cgroup("unified");
    let orig_ns = pid_ns(init);
    let mut restored_ns = Vec::new();
    for i in 0..2 {
        let ov = fx.overlay_seeded(&format!("restore{i}"), Some(&snap));
        let work = fx.mkdir(&format!("restore{i}/work-dir"));
        let mut notes: Vec<(String, i32)> = Vec::new();
        let rep = criu
            .restore(
                &RestoreOpts {
                    images_dir: images.clone(),
                    work_dir: work.clone(),
                    root: ov.merged.clone(),
                    external_mounts: vec![(EXT_KEY.into(), ext.clone())],
                    veth_pairs: vec![],
                    join_cgroups: if i == 1 {
                        vec![
                            pids_cg.join("cgroup.procs"),
                            unified_cg.join("cgroup.procs"),
                        ]
                    } else {
                        vec![]
                    },
                    network_lock: NetworkLock::Skip,
                    tcp_established: false,
                    empty_net: false,
                },
                &mut |s, pid| {
                    notes.push((s.to_string(), pid));
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("restore {i}: {e}"));
        fx.adopt(rep.pid);
        eprintln!("restore {i}: {:?}", rep.elapsed);

        assert!(rep.pid > 0);
        assert_eq!(rep.log, work.join("restore.log"));
        assert!(rep.log.is_file());
        // rst_sibling: the restored root is our child, so we can reap it.
        assert_eq!(parent_of(rep.pid), Some(std::process::id() as i32));
        let ns = pid_ns(rep.pid);
        assert_ne!(
            ns, orig_ns,
            "restore {i} shares the original's pid namespace"
        );
        assert!(!restored_ns.contains(&ns), "restores share a pid namespace");
        restored_ns.push(ns);
        // setup-namespaces and post-restore carry the same root pid CRIU returns.
        for name in [script::SETUP_NAMESPACES, script::POST_RESTORE] {
            assert!(
                notes.iter().any(|(s, p)| s == name && *p == rep.pid),
                "restore {i}: no {name} with pid {}: {notes:?}",
                rep.pid
            );
        }
        if i == 1 {
            let want = format!("/{}", fx.marker);
            assert_eq!(cgroup_of(rep.pid, "pids").as_deref(), Some(want.as_str()));
            assert_eq!(cgroup_of(rep.pid, "").as_deref(), Some(want.as_str()));
        } else {
            assert_eq!(
                cgroup_of(rep.pid, "pids"),
                cgroup_of(std::process::id() as i32, "pids")
            );
        }
        // It runs: its counter moves in its own upper layer.
        ov.assert_advances(&format!("restore {i}"));
        // The external mount was bound from the host path given for its key.
        let hello =
            std::fs::read_to_string(format!("/proc/{}/root{EXT_MOUNTPOINT}/hello", rep.pid))
                .expect("external mount missing in the restored tree");
        assert_eq!(hello, "from the host\n");
    }
    orig.assert_advances("original after restores");

    // A restore aborted after its root exists (say, the veth could not be set
    // up at setup-namespaces) must leave no process, and no zombie child of ours.
    let ov = fx.overlay_seeded("restore-aborted", Some(&snap));
    let work = fx.mkdir("restore-aborted/work-dir");
    let mut root = 0;
    let err = criu
        .restore(
            &RestoreOpts {
                images_dir: images.clone(),
                work_dir: work,
                root: ov.merged.clone(),
                external_mounts: vec![(EXT_KEY.into(), ext.clone())],
                veth_pairs: vec![],
                join_cgroups: vec![],
                network_lock: NetworkLock::Skip,
                tcp_established: false,
                empty_net: false,
            },
            &mut |s, pid| {
                if s == script::SETUP_NAMESPACES {
                    root = pid;
                    return Err("host veth setup failed".into());
                }
                Ok(())
            },
        )
        .expect_err("restore succeeded although setup-namespaces failed");
    assert!(
        err.to_string()
            .contains("setup-namespaces notification failed"),
        "{err}"
    );
    assert_eq!(
        std::error::Error::source(&err)
            .map(|s| s.to_string())
            .as_deref(),
        Some("host veth setup failed"),
        "the callback's error is the source"
    );
    assert!(root > 0, "setup-namespaces carried no pid");
    assert!(
        !std::path::Path::new(&format!("/proc/{root}")).exists(),
        "aborted restore left its root {root} behind"
    );

    fx.finish();
}
