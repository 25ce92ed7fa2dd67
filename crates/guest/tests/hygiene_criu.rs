//! The reseed protocol across a real CRIU dump and restore: the case it
//! exists for. A restored process gets a new start time (CRIU cannot set
//! it), so a registration checked by start time would be thrown away as
//! stale at the one moment it matters. Checked by "holds its registration
//! open", which CRIU restores, it is signalled.
//!
//! A separate test binary because it makes the test process a child
//! subreaper (process-wide), to reap the restored process, whose parent,
//! `criu restore -d`, exits.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hyper::{Method, StatusCode};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde_json::json;

fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Field 22; the fields after the comm (field 2, in parentheses) start at 3.
    let after_comm = stat.rsplit_once(") ").unwrap().1;
    after_comm.split(' ').nth(22 - 3).unwrap().parse().unwrap()
}

fn criu(args: &[&str], images: &std::path::Path, log: &str) {
    let out = Command::new("criu")
        .args(args)
        .arg("-D")
        .arg(images)
        .args(["-o", log, "-v4"])
        .output()
        .expect("cannot run criu: this test needs CRIU 4.2.1 (scripts/setup.sh installs it)");
    if !out.status.success() {
        let log = std::fs::read_to_string(images.join(log)).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        panic!(
            "criu {} failed ({}): {}\n{}",
            args[0],
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// Kills and reaps the restored process if the test ends early.
struct Restored(u32);

impl Drop for Restored {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.0 as i32);
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok() {
            let _ = waitpid(pid, None);
        }
    }
}

#[tokio::test]
async fn a_registration_survives_a_criu_restore() {
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let guest = SandboxedGuest::start().await;
    let lib = write_python_path(guest.dir.path());
    let images = guest.dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let out_path = guest.dir.path().join("registrant.out");

    // Its own session (CRIU dumps a session leader's whole tree, and must
    // not reach ours), stdio on files (a pipe to us could not be restored).
    let mut registrant = Command::new("setsid")
        .arg(python3())
        .args(["-S", "-c", REGISTRANT])
        .env("PYTHONPATH", &lib)
        .env("DRUMS_RUN_DIR", &guest.run)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(guest.dir.path().join("registrant.err")).unwrap())
        .spawn()
        .unwrap();
    let pid = registrant.id();
    let output = || std::fs::read_to_string(&out_path).unwrap();
    wait_until("the registrant is ready", || output().starts_with("ready"));
    assert_eq!(output(), format!("ready {pid}\n"));
    let started = start_time(pid);

    let images_str = images.to_str().unwrap();
    criu(&["dump", "-t", &pid.to_string()], &images, "dump.log");
    // The dump killed it; reap it so its pid is free for the restore.
    registrant.wait().unwrap();
    criu(&["restore", "-d"], &images, "restore.log");
    let restored = Restored(pid);
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "criu restored no process {pid} from {images_str}"
    );
    assert_ne!(
        start_time(pid),
        started,
        "CRIU now restores start times; docs/hygiene.md should say so"
    );

    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({
                "hostname": "sib-1",
                "machine_id": "0123456789abcdef0123456789abcdef",
                "generation": 1,
                "ack_timeout_ms": 5000,
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stale_removed"], json!([]), "{body}\n{}", guest.log());
    assert_eq!(body["signalled"], json!([pid]), "{body}");
    assert_eq!(body["acked"], json!([pid]), "{body}");

    // It prints its draw and exits; we are its parent now (subreaper).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)).unwrap() {
            WaitStatus::Exited(_, code) => {
                assert_eq!(code, 0);
                break;
            }
            WaitStatus::StillAlive => {
                assert!(
                    Instant::now() < deadline,
                    "the restored registrant did not exit"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            other => panic!("unexpected wait status {other:?}"),
        }
    }
    std::mem::forget(restored);
    let out = output();
    let draw: f64 = out
        .lines()
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {out:?}"));
    assert_ne!(draw, SEED_1_DRAW, "the restored process was not reseeded");
}
