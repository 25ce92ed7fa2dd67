//! A real Xvfb per test, found through `-displayfd` (no sleeping), and the
//! leak check every X test ends with.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Kills and reaps its Xvfb when dropped, also when the test panics.
pub struct Xvfb {
    child: Child,
    pub display: String,
}

impl Xvfb {
    /// Starts `Xvfb -screen 0 1280x800x24 -nolisten tcp -noreset` on a display number
    /// the server picks itself (`-displayfd` writes it once it accepts
    /// connections, which is exactly the readiness signal we need).
    pub fn start() -> Xvfb {
        let mut child = Command::new("Xvfb")
            // -noreset: otherwise the server resets (black root, pointer
            // centred) whenever its last client leaves, e.g. between an
            // xsetroot and the capture. A session always has its window
            // manager connected, so it never sees such resets.
            .args(["-displayfd", "1", "-screen", "0", "1280x800x24", "-nolisten", "tcp", "-noreset"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start Xvfb ({e}): these tests need a real X server; install the Debian package xvfb")
            });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read display number from Xvfb");
        let n: u32 = match line.trim().parse() {
            Ok(n) => n,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("Xvfb did not report a display number (got {line:?}, exit {status:?})");
            }
        };
        Xvfb {
            child,
            display: format!(":{n}"),
        }
    }

    /// Runs an X client (xsetroot, xdotool…) against this display and
    /// waits for it.
    pub fn run(&self, program: &str, args: &[&str]) {
        let out = Command::new(program)
            .args(args)
            .env("DISPLAY", &self.display)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} ({e}); install it on the test host"));
        assert!(out.status.success(), "{program} {args:?} failed: {out:?}");
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of this process's live children, from every thread's
/// `/proc/self/task/*/children` (children belong to the spawning thread).
pub fn child_pids() -> Vec<u32> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    pids
}

/// Fails the test if any child process is left. Integration test
/// binaries run their tests on parallel threads, so callers hold
/// `serial()` for the whole test to make "no children" meaningful.
pub fn assert_no_children() {
    let left = child_pids();
    assert!(left.is_empty(), "child processes left behind: {left:?}");
}

/// Serialises the tests of one binary: each starts its own processes and
/// checks that none are left, which only works when they do not overlap.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
