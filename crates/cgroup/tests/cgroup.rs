//! Real cgroups on this host (needs root). Each test works under its own
//! `drums-test-<hex>` parent and removes it, even when it fails halfway.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drums_cgroup::{
    list_children, remove_parent, Cgroup, CgroupError, Devices, Limits, LimitsError,
};

const MIB: u64 = 1 << 20;

mod common;

use common::*;

#[test]
fn lifecycle_limits_membership_kill_and_removal() {
    let parent = unique_parent();
    let mut cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let limits = Limits {
        memory_bytes: Some(64 * MIB),
        pids_max: Some(512),
        cpus: Some(0.5),
    };
    let cg = Cgroup::create(&parent, "s1", &limits, Devices::AllowList).unwrap();
    assert!(cg.exists());
    assert_eq!(list_children(&parent), vec!["s1".to_owned()]);

    // The limits landed in the control files.
    if v2_only() {
        let dir = Path::new("/sys/fs/cgroup").join(&parent).join("s1");
        assert_eq!(read(&dir.join("memory.max")), (64 * MIB).to_string());
        assert_eq!(read(&dir.join("pids.max")), "512");
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        assert_eq!(cg.id(), Some(std::fs::metadata(&dir).unwrap().ino()));
    } else {
        let dir = |ctrl: &str| {
            Path::new("/sys/fs/cgroup")
                .join(ctrl)
                .join(&parent)
                .join("s1")
        };
        assert_eq!(
            read(&dir("memory").join("memory.limit_in_bytes")),
            (64 * MIB).to_string()
        );
        assert_eq!(read(&dir("pids").join("pids.max")), "512");
        assert_eq!(read(&dir("cpu").join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&dir("cpu").join("cpu.cfs_quota_us")), "50000");
        assert!(dir("freezer").is_dir());
        let unified = Path::new("/sys/fs/cgroup/unified").join(&parent).join("s1");
        if unified.is_dir() {
            assert_eq!(cg.id(), Some(std::fs::metadata(&unified).unwrap().ino()));
        }
    }
    assert_eq!(cg.procs_files().len(), cg.paths().len());
    assert!(cg.memory_usage().is_some());
    assert_eq!(cg.pids().unwrap(), Vec::<i32>::new());

    // A plain process joins every hierarchy.
    let sleeper = spawn(&["sleep", "60"]);
    let sleeper_pid = sleeper.id() as i32;
    cleanup.children.push(sleeper);
    cg.add_pid(sleeper_pid).unwrap();
    assert_eq!(cg.pids().unwrap(), vec![sleeper_pid]);
    let membership = std::fs::read_to_string(format!("/proc/{sleeper_pid}/cgroup")).unwrap();
    let expected = format!("/{parent}/s1");
    for line in membership.lines() {
        let hierarchy_path = line.splitn(3, ':').nth(2).unwrap();
        if ["memory", "pids", "cpu", "freezer"]
            .iter()
            .any(|c| line.split(':').nth(1).unwrap().split(',').any(|x| x == *c))
            || line.starts_with("0::")
        {
            assert_eq!(hierarchy_path, expected, "{line}");
        }
    }

    // A process that forks all the time; its children are born in the cgroup.
    let forker = spawn(&["sh", "-c", FORKER]);
    let forker_pid = forker.id() as i32;
    cleanup.children.push(forker);
    cg.add_pid(forker_pid).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while cg.pids().unwrap().len() < 10 {
        assert!(Instant::now() < deadline, "forker did not fork");
        std::thread::sleep(Duration::from_millis(20));
    }
    let members = cg.pids().unwrap();
    assert!(members.contains(&forker_pid));
    assert!(
        members.len() <= 64,
        "pids.max not enforced: {}",
        members.len()
    );

    let started = Instant::now();
    cg.kill_all().unwrap();
    let took = started.elapsed();
    assert_eq!(
        cg.pids()
            .unwrap()
            .into_iter()
            .filter(|&p| !is_gone(p))
            .count(),
        0
    );
    assert!(took < Duration::from_secs(5), "kill_all took {took:?}");
    // kill_all returned although our own children are unreaped zombies.
    assert!(is_gone(sleeper_pid));
    assert!(is_gone(forker_pid));

    cg.remove().unwrap();
    assert!(!cg.exists());
    cg.remove().unwrap(); // idempotent
    remove_parent(&parent).unwrap();
    for root in hierarchy_roots() {
        assert!(
            !root.join(&parent).exists(),
            "{} left behind",
            root.join(&parent).display()
        );
    }
    assert_eq!(list_children(&parent), Vec::<String>::new());

    for mut child in cleanup.children.drain(..) {
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
    for pid in members {
        assert!(is_gone(pid), "{pid} survived");
    }
}

#[test]
fn failed_create_removes_what_it_made() {
    let parent = unique_parent();
    let _cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    // Make the last hierarchy's session directory exist already, so creation
    // fails after the others were made.
    let planned = Cgroup::open(&parent, "s").paths();
    let last = planned.last().unwrap().clone();
    std::fs::create_dir_all(&last).unwrap();

    let err = Cgroup::create(&parent, "s", &Limits::default(), Devices::AllowList).unwrap_err();
    match &err {
        CgroupError::CreateDir { path, source } => {
            assert_eq!(path, &last);
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        }
        other => panic!("unexpected error {other}"),
    }
    assert_eq!(
        err.to_string(),
        format!("create directory {}", last.display())
    );
    for dir in &planned[..planned.len() - 1] {
        assert!(!dir.exists(), "{} not cleaned up", dir.display());
    }
    assert!(
        last.exists(),
        "a directory it did not create must be left alone"
    );

    // The sweep's view: the leftover is found and removed by name.
    assert_eq!(list_children(&parent), vec!["s".to_owned()]);
    let leftover = Cgroup::open(&parent, "s");
    assert!(leftover.exists());
    leftover.remove().unwrap();
    assert!(!leftover.exists());
    remove_parent(&parent).unwrap();
    for root in hierarchy_roots() {
        assert!(!root.join(&parent).exists());
    }
}

#[test]
fn open_handles_absent_cgroups() {
    let parent = unique_parent();
    let cg = Cgroup::open(&parent, "never");
    assert!(!cg.exists());
    assert_eq!(cg.pids().unwrap(), Vec::<i32>::new());
    assert_eq!(cg.memory_usage(), None);
    assert_eq!(cg.id(), None);
    cg.kill_all().unwrap();
    cg.remove().unwrap();
    remove_parent(&parent).unwrap();
    assert!(list_children(&parent).is_empty());
}

#[test]
fn remove_parent_keeps_a_parent_with_children() {
    let parent = unique_parent();
    let _cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let a = Cgroup::create(&parent, "a", &Limits::default(), Devices::AllowList).unwrap();
    let b = Cgroup::create(
        &parent,
        "b",
        &Limits {
            pids_max: Some(10),
            ..Limits::default()
        },
        Devices::AllowList,
    )
    .unwrap();
    assert_eq!(list_children(&parent), vec!["a".to_owned(), "b".to_owned()]);
    remove_parent(&parent).unwrap();
    assert!(a.exists() && b.exists());
    a.remove().unwrap();
    b.remove().unwrap();
    remove_parent(&parent).unwrap();
    for root in hierarchy_roots() {
        assert!(!root.join(&parent).exists());
    }
}

#[test]
fn create_rejects_bad_names_and_limits() {
    let parent = unique_parent();
    let err =
        Cgroup::create(&parent, "../escape", &Limits::default(), Devices::AllowList).unwrap_err();
    assert!(matches!(err, CgroupError::InvalidName { .. }), "{err}");
    let err = Cgroup::create(
        &parent,
        "s",
        &Limits {
            memory_bytes: Some(1000),
            ..Limits::default()
        },
        Devices::AllowList,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "memory limit 1000 bytes is below the minimum of 8 MiB"
    );
    for root in hierarchy_roots() {
        assert!(
            !root.join(&parent).exists(),
            "nothing is created for bad input"
        );
    }
}

#[test]
fn limits_validation_messages() {
    let ok = Limits {
        memory_bytes: Some(8 * MIB),
        pids_max: Some(1),
        cpus: Some(0.01),
    };
    ok.validate_for(2).unwrap();
    Limits::default().validate().unwrap();
    Limits {
        cpus: Some(2.0),
        ..Limits::default()
    }
    .validate_for(2)
    .unwrap();

    let cases: [(Limits, LimitsError, &str); 6] = [
        (
            Limits {
                memory_bytes: Some(1000),
                ..Limits::default()
            },
            LimitsError::MemoryTooSmall { bytes: 1000 },
            "memory limit 1000 bytes is below the minimum of 8 MiB",
        ),
        (
            Limits {
                pids_max: Some(0),
                ..Limits::default()
            },
            LimitsError::PidsTooSmall { pids: 0 },
            "pids limit 0 is below the minimum of 1",
        ),
        (
            Limits {
                pids_max: Some(5_000_000),
                ..Limits::default()
            },
            LimitsError::PidsTooLarge { pids: 5_000_000 },
            "pids limit 5000000 exceeds the maximum of 4194304",
        ),
        (
            Limits {
                cpus: Some(0.001),
                ..Limits::default()
            },
            drums_api::CpusError::TooSmall { cpus: 0.001 }.into(),
            "cpu limit 0.001 is below the minimum of 0.01",
        ),
        (
            Limits {
                cpus: Some(3.5),
                ..Limits::default()
            },
            drums_api::CpusError::TooLarge { cpus: 3.5, host: 2 }.into(),
            "cpu limit 3.5 exceeds the 2 cpus of this host",
        ),
        (
            Limits {
                cpus: Some(f64::INFINITY),
                ..Limits::default()
            },
            drums_api::CpusError::NotFinite {
                cpus: f64::INFINITY,
            }
            .into(),
            "cpu limit inf is not a finite number",
        ),
    ];
    for (limits, error, message) in cases {
        let err = limits.validate_for(2).unwrap_err();
        assert_eq!(err, error);
        assert_eq!(err.to_string(), message);
    }
    let err = Limits {
        cpus: Some(f64::NAN),
        ..Limits::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.to_string(), "cpu limit NaN is not a finite number");
    let too_many = drums_cgroup::host_cpus() as f64 + 1.0;
    assert!(Limits {
        cpus: Some(too_many),
        ..Limits::default()
    }
    .validate()
    .is_err());
}

/// On a v1 host, processes that joined only the v1 hierarchies (so cgroup.kill in
/// the unified one cannot see them) are still all killed, through the freezer.
#[test]
fn v1_kill_uses_the_freezer_for_forking_processes() {
    if v2_only() {
        eprintln!("v2-only host: the v1 freezer path does not apply");
        return;
    }
    let parent = unique_parent();
    let mut cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let cg = Cgroup::create(&parent, "f", &Limits::default(), Devices::AllowList).unwrap();
    let forker = spawn(&["sh", "-c", FORKER]);
    let pid = forker.id() as i32;
    cleanup.children.push(forker);
    for file in cg.procs_files() {
        if !file.starts_with("/sys/fs/cgroup/unified") {
            std::fs::write(&file, pid.to_string()).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while cg.pids().unwrap().len() < 10 {
        assert!(Instant::now() < deadline, "forker did not fork");
        std::thread::sleep(Duration::from_millis(20));
    }
    cg.kill_all().unwrap();
    assert!(cg.pids().unwrap().into_iter().all(is_gone));
    let freezer = Path::new("/sys/fs/cgroup/freezer").join(&parent).join("f");
    if freezer.is_dir() {
        assert_eq!(read(&freezer.join("freezer.state")), "THAWED");
    }
    cg.remove().unwrap();
    remove_parent(&parent).unwrap();
    let status = cleanup.children.pop().unwrap().wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
}

/// pids.max bounds an unthrottled fork loop (dash gives up once a fork fails).
#[test]
fn pids_max_bounds_a_fork_loop() {
    let parent = unique_parent();
    let mut cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let limits = Limits {
        pids_max: Some(16),
        ..Limits::default()
    };
    let cg = Cgroup::create(&parent, "p", &limits, Devices::AllowList).unwrap();
    // Join before exec, like the session runtime does, so no fork escapes.
    let procs = cg.procs_files();
    let mut command = Command::new("sh");
    command
        .args(["-c", "while :; do sleep 1 & done"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let procs_c: Vec<std::ffi::CString> = procs
        .iter()
        .map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap())
        .collect();
    // SAFETY: the closure runs between fork and exec, where only async-signal-safe
    // calls are allowed: it calls just getpid, open, write and close through libc
    // and allocates nothing (the C paths are built before the fork).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            let mut buf = [0u8; 16];
            let mut n = libc::getpid();
            let mut len = 0;
            while n > 0 {
                buf[len] = b'0' + (n % 10) as u8;
                n /= 10;
                len += 1;
            }
            buf[..len].reverse();
            for path in &procs_c {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, buf.as_ptr().cast(), len) != len as isize {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            Ok(())
        });
    }
    cleanup.children.push(command.spawn().unwrap());
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        most = most.max(cg.pids().unwrap().len());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(most >= 2, "the loop never forked");
    assert!(most <= 16, "pids.max not enforced: {most} processes");
    cg.kill_all().unwrap();
    cg.remove().unwrap();
    remove_parent(&parent).unwrap();
    let status = cleanup.children.pop().unwrap().wait().unwrap();
    // Either the shell gave up on a failed fork (exit 2) or kill_all got it.
    assert!(
        status.code() == Some(2) || status.signal() == Some(libc::SIGKILL),
        "{status:?}"
    );
}

/// The parent's caps bound its children together: a child with a larger limit
/// of its own is still held to the parent's.
#[test]
fn parent_caps_bound_every_child() {
    use drums_cgroup::{ensure_parent, ParentCaps};
    let parent = unique_parent();
    let _cleanup = Cleanup {
        parent: parent.clone(),
        children: Vec::new(),
    };
    let caps = ParentCaps {
        memory_bytes: Some(64 * MIB),
        pids_max: Some(5),
    };
    let dirs = ensure_parent(&parent, &caps).unwrap();
    assert!(!dirs.is_empty());
    // Twice is fine (a restarted daemon).
    ensure_parent(&parent, &caps).unwrap();
    let (mem_file, pids_dir) = if v2_only() {
        let d = Path::new("/sys/fs/cgroup").join(&parent);
        (d.join("memory.max"), d)
    } else {
        (
            Path::new("/sys/fs/cgroup/memory")
                .join(&parent)
                .join("memory.limit_in_bytes"),
            Path::new("/sys/fs/cgroup/pids").join(&parent),
        )
    };
    assert_eq!(read(&mem_file).trim(), (64 * MIB).to_string());
    assert_eq!(read(&pids_dir.join("pids.max")).trim(), "5");

    // A child allowed 100 tasks gets no more than the parent's 5: a shell in
    // it that forks a loop of sleepers is refused its later forks.
    let cg = Cgroup::create(
        &parent,
        "child",
        &Limits {
            pids_max: Some(100),
            ..Limits::default()
        },
        Devices::AllowList,
    )
    .unwrap();
    let mut sh = Command::new("sh")
        .args([
            "-c",
            "read x; for i in 1 2 3 4 5 6 7 8; do sleep 3 & done; wait",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    cg.add_pid(sh.id() as i32).unwrap();
    use std::io::Write;
    sh.stdin.take().unwrap().write_all(b"go\n").unwrap();
    // The shell's forks past the cap fail (EAGAIN), with its complaint.
    let out = sh.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("fork"), "stderr: {stderr}");
    assert!(cg.pids().unwrap().len() <= 5, "the parent's pids cap holds");
    cg.kill_all().unwrap();
    cg.remove().unwrap();
    remove_parent(&parent).unwrap();
    for root in hierarchy_roots() {
        assert!(!root.join(&parent).exists());
    }
}
