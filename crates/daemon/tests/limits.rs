//! Limits by default (issue 10, part 4), against a real drumsd: every session
//! gets memory, pids, cpu and disk limits; the cgroup parent caps all sessions
//! together; a fork bomb, a memory hog and a disk filler each hit their limit
//! while drumsd, a neighbour session and the host stay healthy; a full store
//! stops sessions, never drumsd.
//!
//! Needs root, the images set-up builds, and this host's cgroups (v1 with the
//! unified hierarchy, or v2): the tests fail, never skip, without them.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin_dir, run, TestDaemon};
use drums_api::{CreateSession, Limits, Session};
use hyper::Method;

const MIB: u64 = 1 << 20;

fn v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A control file of `cgroup` (`PARENT` or `PARENT/ID`) in the hierarchy that
/// has it: v1 names it by controller, v2 has one directory.
fn cg_file(cgroup: &str, v1_controller: &str, v1: &str, v2_name: &str) -> PathBuf {
    if v2() {
        Path::new("/sys/fs/cgroup").join(cgroup).join(v2_name)
    } else {
        Path::new("/sys/fs/cgroup")
            .join(v1_controller)
            .join(cgroup)
            .join(v1)
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// A counter such as `oom_kill 3` in a flat-keyed cgroup file.
fn counter(path: &Path, key: &str) -> u64 {
    read(path)
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {}: {}", path.display(), read(path)))
}

fn mem_total() -> u64 {
    drums_cgroup::host_memory_bytes().unwrap()
}

/// (max exclusive bytes, exclusive bytes) of the subvolume's own qgroup, as
/// btrfs-progs reports them after a sync (limits reach the disk at a commit):
/// a second opinion on what drumsd asked the kernel.
fn qgroup_of(subvolume: &Path) -> (Option<u64>, u64) {
    let o = Command::new("btrfs")
        .args(["qgroup", "show", "-re", "--raw", "--sync", "-f"])
        .arg(subvolume)
        .output()
        .expect("btrfs-progs is installed");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "btrfs qgroup show: {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("0/"))
        .unwrap_or_else(|| panic!("no level-0 qgroup for {}: {text}", subvolume.display()));
    let cols: Vec<&str> = line.split_whitespace().collect();
    (cols[4].parse().ok(), cols[2].parse().unwrap())
}

/// `drums exec SESSION -- sh -c SCRIPT` in the background, stdout piped.
fn spawn_sh(d: &TestDaemon, session: &str, script: &str) -> Child {
    Command::new(bin_dir().join("drums"))
        .arg("--state-dir")
        .arg(d.state.path())
        .args(["--no-autostart", "exec", session, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Read the child's stdout until a line starts with `prefix`; returns it.
fn wait_for_line(child: &mut Child, prefix: &str) -> String {
    let out = child.stdout.as_mut().unwrap();
    let mut lines = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        let n = lines.read_line(&mut line).unwrap();
        assert!(n > 0, "output ended before a line starting {prefix:?}");
        if line.starts_with(prefix) {
            return line.trim().to_owned();
        }
    }
}

/// drumsd answers, the neighbour runs a command (and writes to its disk, if
/// `write`), and the host can still fork and has memory to spare.
fn assert_all_healthy(d: &TestDaemon, neighbour: &str, during: &str, write: bool) {
    let t = Instant::now();
    let v: drums_api::Version = run(d.client.json(Method::GET, "/v1/version", None::<&()>))
        .unwrap_or_else(|e| panic!("{during}: drumsd does not answer: {e}"));
    assert!(!v.version.is_empty());
    let script = if write {
        "echo alive; head -c 1048576 /dev/zero > /tmp/n && sync /tmp/n && echo wrote"
    } else {
        "echo alive; echo wrote"
    };
    let (code, out, err) = d.sh(neighbour, script);
    assert_eq!(
        (code, out.as_str()),
        (0, "alive\nwrote"),
        "{during}: neighbour: {err}"
    );
    let host = Command::new("true").status().unwrap();
    assert!(host.success(), "{during}: the host cannot fork");
    let avail = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemAvailable:")?
                .trim()
                .trim_end_matches(" kB")
                .parse::<u64>()
                .ok()
        })
        .unwrap()
        * 1024;
    assert!(
        avail > mem_total() / 10,
        "{during}: host MemAvailable {avail} bytes"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "{during}: health checks took {:?}",
        t.elapsed()
    );
}

/// A session given no limits gets drumsd's defaults, the API and `drums ps`
/// show them, and the kernel enforces them: the cgroup files, the subvolume's
/// qgroup, and the parent's caps on all sessions.
#[test]
fn defaults_apply_when_a_request_names_no_limits() {
    let mut d = TestDaemon::start();
    let s: Session = run(d.create(&CreateSession::default())).unwrap();
    let host_cpus = drums_cgroup::host_cpus();
    let cpus = host_cpus.min(2) as f64;
    assert_eq!(s.limits.memory_bytes, Some(4 << 30));
    assert_eq!(s.limits.pids_max, Some(2048));
    assert_eq!(s.limits.cpus, Some(cpus));
    // The test store is 4 GiB with 10% reserved: the disk default (10 GiB) is
    // held to what the store has for sessions.
    let disk = s.limits.disk_bytes.expect("a default disk quota");
    let store = nix::sys::statfs::statfs(&d.state.path().join("store")).unwrap();
    let size = store.blocks() * store.block_size() as u64;
    assert_eq!(disk, size - size / 10);

    let me = format!("{}/{}", d.cgroup_parent, s.id);
    assert_eq!(
        read(&cg_file(
            &me,
            "memory",
            "memory.limit_in_bytes",
            "memory.max"
        )),
        (4u64 << 30).to_string()
    );
    assert_eq!(read(&cg_file(&me, "pids", "pids.max", "pids.max")), "2048");
    let quota = (cpus * 100_000.0) as u64;
    if v2() {
        assert_eq!(
            read(&cg_file(&me, "cpu", "", "cpu.max")),
            format!("{quota} 100000")
        );
    } else {
        assert_eq!(
            read(&cg_file(&me, "cpu", "cpu.cfs_quota_us", "")),
            quota.to_string()
        );
    }
    let sv = d.state.path().join("store/sessions").join(&s.id);
    assert_eq!(qgroup_of(&sv).0, Some(disk));

    // The parent caps all sessions together at 3/4 of the host (the kernel
    // rounds a memory limit down to whole pages).
    let parent_mem: u64 = read(&cg_file(
        &d.cgroup_parent,
        "memory",
        "memory.limit_in_bytes",
        "memory.max",
    ))
    .parse()
    .unwrap();
    let share = mem_total() / 4 * 3;
    assert_eq!(parent_mem, share / 4096 * 4096);
    let parent_pids: u64 = read(&cg_file(&d.cgroup_parent, "pids", "pids.max", "pids.max"))
        .parse()
        .unwrap();
    assert_eq!(parent_pids, drums_cgroup::host_pids_max() / 4 * 3);

    // `drums ps` shows the effective limits.
    let o = d.drums(&["ps"]);
    let ps = String::from_utf8_lossy(&o.stdout);
    assert!(ps.contains("LIMITS"), "{ps}");
    assert!(
        ps.contains(&format!("mem=4G pids=2048 cpus={cpus} disk=")),
        "{ps}"
    );

    // A request's own limits win, field by field.
    let t: Session = run(d.create(&CreateSession {
        limits: Limits {
            memory_bytes: Some(512 * MIB),
            disk_bytes: Some(100 * MIB),
            ..Limits::default()
        },
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(t.limits.memory_bytes, Some(512 * MIB));
    assert_eq!(t.limits.pids_max, Some(2048));
    assert_eq!(t.limits.disk_bytes, Some(100 * MIB));
    let sv = d.state.path().join("store/sessions").join(&t.id);
    assert_eq!(qgroup_of(&sv).0, Some(100 * MIB));

    // A bad disk size is refused by the CLI (exit 2) and the API (400), and
    // nothing is created.
    for bad in ["0", "nan", "inf", "18446744073709551616", "1e30G", "1M"] {
        let o = d.drums(&["create", &format!("--disk={bad}")]);
        assert_eq!(
            o.status.code(),
            Some(2),
            "--disk {bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = d.drums(&["create", "--disk", "1T"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("bytes the store holds for sessions"), "{err}");
    // (serde_json reads 2^64 as a float, so that one reaches drumsd as 1.8e19.)
    for body in [
        r#"{"limits":{"disk_bytes":0}}"#,
        r#"{"limits":{"disk_bytes":18446744073709551616}}"#,
        r#"{"limits":{"disk_bytes":-1}}"#,
        r#"{"limits":{"disk_bytes":1.5}}"#,
        r#"{"limits":{"disk_bytes":"10G"}}"#,
    ] {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        match run(d.client.call(Method::POST, "/v1/sessions", Some(&v))) {
            Err(drums_api::ClientError::Api { status: 400, .. }) => {}
            other => panic!("{body}: {other:?}"),
        }
    }
    let l: drums_api::SessionList =
        run(d.client.json(Method::GET, "/v1/sessions", None::<&()>)).unwrap();
    assert_eq!(l.sessions.len(), 2, "a refused create left a session");
    d.stop_and_check_leaks();
}

/// A fork bomb, a memory hog and a disk filler, each in a session of its own
/// limits, hit exactly those limits; meanwhile drumsd answers, a neighbour
/// made beforehand runs commands and writes, and the host is fine. A checkpoint
/// of the full session restores with the same limits, already full.
#[test]
fn fork_bomb_memory_hog_and_disk_filler_hit_their_limits() {
    let mut d = TestDaemon::start();
    let _neighbour: Session = run(d.create(&CreateSession {
        name: Some("neighbour".into()),
        ..Default::default()
    }))
    .unwrap();
    let victim: Session = run(d.create(&CreateSession {
        name: Some("victim".into()),
        limits: Limits {
            memory_bytes: Some(256 * MIB),
            pids_max: Some(64),
            cpus: Some(0.5),
            disk_bytes: Some(64 * MIB),
        },
        ..Default::default()
    }))
    .unwrap();
    let vcg = format!("{}/{}", d.cgroup_parent, victim.id);

    // Fork until the kernel refuses: EAGAIN at pids.max. The children are held
    // while the others are checked, then killed by the bomb itself.
    let bomb = r#"
import errno, os, sys, time
kids = []
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print("refused", errno.errorcode[e.errno], len(kids), flush=True)
        break
    if pid == 0:
        os.close(1); os.close(2)
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
time.sleep(4)
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
print("done", flush=True)
"#;
    let mut child = spawn_sh(&d, "victim", &format!("python3 -c '{bomb}'"));
    let refused = wait_for_line(&mut child, "refused");
    assert!(refused.starts_with("refused EAGAIN "), "{refused}");
    let pids_now: u64 = read(&cg_file(&vcg, "pids", "pids.current", "pids.current"))
        .parse()
        .unwrap();
    assert!(pids_now >= 60, "pids.current {pids_now} at the limit of 64");
    assert!(counter(&cg_file(&vcg, "pids", "pids.events", "pids.events"), "max") > 0);
    assert_all_healthy(&d, "neighbour", "fork bomb", true);
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Allocate and touch memory until the OOM killer, confined to the
    // session's cgroup, kills the hog: three times, while the rest is checked.
    let oom_file = cg_file(&vcg, "memory", "memory.oom_control", "memory.events");
    let hog = r#"python3 -c 'a = []
while True: a.append(b"x" * (16 << 20))'"#;
    let child = spawn_sh(
        &d,
        "victim",
        &format!("for i in 1 2 3; do {hog}; echo exit $?; done"),
    );
    assert_all_healthy(&d, "neighbour", "memory hog", true);
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.trim(), "exit 137\nexit 137\nexit 137", "{out}");
    assert!(counter(&oom_file, "oom_kill") >= 3);
    assert_all_healthy(&d, "neighbour", "after the memory hog", true);
    // The session itself survived its hog: its agent still runs commands.
    assert_eq!(d.sh("victim", "echo ok").1, "ok");

    // Write until the quota refuses. btrfs reports a full qgroup as EDQUOT
    // ("Disk quota exceeded"), the quota errno; ENOSPC would mean the store
    // itself was full.
    let filler = r#"
import errno, os
n = 0
fd = os.open("/tmp/fill", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"z" * (1 << 20))
        os.fsync(fd)
        n += 1
except OSError as e:
    print("refused", errno.errorcode[e.errno], n, flush=True)
"#;
    let (code, out, err) = d.sh("victim", &format!("python3 -c '{filler}'"));
    assert_eq!(code, 0, "{err}");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words[..2], ["refused", "EDQUOT"], "{out}");
    let written: u64 = words[2].parse().unwrap();
    assert!(
        (32..=64).contains(&written),
        "{written} MiB written under a 64 MiB quota"
    );
    assert_all_healthy(&d, "neighbour", "disk filler", true);
    let sv = d.state.path().join("store/sessions").join(&victim.id);
    let (max, used) = qgroup_of(&sv);
    assert_eq!(max, Some(64 * MIB));
    assert!(used > 32 * MIB, "{used}");

    // A checkpoint of the full session works, and its sibling keeps the same
    // limits: the checkpoint's data, and the same budget for new writes.
    let ck = run(d.checkpoint("victim", false, true));
    let r = run(d.restore(&ck.id, 1)).unwrap_or_else(|e| panic!("restore: {e}\n{}", d.log()));
    let sib = &r.sessions[0];
    assert_eq!(sib.limits, victim.limits);
    let scg = format!("{}/{}", d.cgroup_parent, sib.id);
    assert_eq!(read(&cg_file(&scg, "pids", "pids.max", "pids.max")), "64");
    let sv = d.state.path().join("store/sessions").join(&sib.id);
    assert_eq!(qgroup_of(&sv).0, Some(64 * MIB));
    assert_eq!(
        d.sh(&sib.id, "wc -c < /tmp/fill").1,
        d.sh("victim", "wc -c < /tmp/fill").1
    );
    let (code, out, err) = d.sh(
        &sib.id,
        &format!("python3 -c '{}'", filler.replace("/tmp/fill", "/tmp/more")),
    );
    assert_eq!(code, 0, "{err}");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words[..2], ["refused", "EDQUOT"], "{out}");
    let more: u64 = words[2].parse().unwrap();
    assert!(
        (32..=64).contains(&more),
        "the sibling wrote {more} MiB under its 64 MiB quota"
    );
    assert_all_healthy(&d, "neighbour", "after the restore", true);
    d.stop_and_check_leaks();
}

/// When sessions together fill what the store holds for them, the one that
/// writes gets EDQUOT, and drumsd still creates, checkpoints, restores and
/// removes sessions from its reserve, and the other sessions still run.
#[test]
fn a_full_store_stops_sessions_not_drumsd() {
    // A 4 GiB store that keeps all but ~300 MiB for drumsd.
    let mut d = TestDaemon::start_with(&["--store-reserve", "3800M"]);
    let a: Session = run(d.create(&CreateSession {
        name: Some("a".into()),
        ..Default::default()
    }))
    .unwrap();
    let b: Session = run(d.create(&CreateSession {
        name: Some("b".into()),
        ..Default::default()
    }))
    .unwrap();
    let room = a.limits.disk_bytes.unwrap();
    assert!(room < 400 * MIB, "room for sessions {room}");
    let fill = |s: &str, mib: u64| {
        d.sh(
            s,
            &format!(
                "python3 -c 'import errno, os
fd = os.open(\"/tmp/fill\", os.O_WRONLY | os.O_CREAT)
n = 0
try:
    while n < {mib}:
        os.write(fd, b\"z\" * (1 << 20)); os.fsync(fd); n += 1
    print(\"wrote\", n)
except OSError as e:
    print(\"refused\", errno.errorcode[e.errno], n)'"
            ),
        )
    };
    let (_, out, err) = fill("a", 200);
    assert_eq!(out, "wrote 200", "{err}");
    let (_, out, err) = fill("b", 200);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words[..2], ["refused", "EDQUOT"], "{out} {err}");
    let got: u64 = words[2].parse().unwrap();
    assert!(
        got < 150,
        "b wrote {got} MiB into a store with ~100 MiB left"
    );

    // drumsd works on. A new session needs room for its writable layer, so it
    // is refused with the quota's error, and nothing of it is left behind.
    assert_all_healthy(&d, "a", "full store", false);
    match run(d.create(&CreateSession::default())) {
        Err(drums_api::ClientError::Api {
            status: 409,
            message,
            ..
        }) => assert!(message.contains("Disk quota exceeded"), "{message}"),
        other => panic!("create on a full store: {other:?}"),
    }
    let l: drums_api::SessionList =
        run(d.client.json(Method::GET, "/v1/sessions", None::<&()>)).unwrap();
    assert_eq!(l.sessions.len(), 2);
    assert_eq!(d.store_subvolumes().len(), 2, "{:?}", d.store_subvolumes());
    // Removing a session frees its room, once btrfs's cleaner has dropped the
    // deleted subvolume (in the background; `btrfs subvolume sync` waits for
    // it): then creates, checkpoints and restores work.
    run(d.rm(&b.id)).unwrap();
    let store = d.state.path().join("store");
    let o = Command::new("btrfs")
        .args(["subvolume", "sync"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new("btrfs")
        .args(["filesystem", "sync"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c: Session = run(d.create(&CreateSession::default()))
        .unwrap_or_else(|e| panic!("create after rm: {e}\n{}", d.log()));
    assert_eq!(d.sh(&c.id, "echo ok").1, "ok");
    let ck = run(d.checkpoint("a", false, true));
    let r = run(d.restore(&ck.id, 1)).unwrap_or_else(|e| panic!("restore: {e}\n{}", d.log()));
    assert_eq!(d.sh(&r.sessions[0].id, "wc -c < /tmp/fill").1, "209715200");
    run(d.rm(&c.id)).unwrap();
    d.stop_and_check_leaks();
}
