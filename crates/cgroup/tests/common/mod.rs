//! Helpers shared by the tests that use real cgroups.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use drums_cgroup::{list_children, remove_parent, Cgroup};

/// Forks children forever. The pause keeps it well below the pids limits used here:
/// dash exits on a failed fork, and the point is a process still forking when it is
/// killed.
pub const FORKER: &str = "while :; do sleep 1 & sleep 0.01; done";

pub fn unique_parent() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("drums-test-{:x}{:08x}", std::process::id(), nanos)
}

pub fn v2_only() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Every directory under /sys/fs/cgroup that could hold a hierarchy.
pub fn hierarchy_roots() -> Vec<PathBuf> {
    if v2_only() {
        return vec![PathBuf::from("/sys/fs/cgroup")];
    }
    std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect()
}

/// Removes whatever the test left under its parent, so a failed assertion does not
/// leak cgroups or processes.
pub struct Cleanup {
    pub parent: String,
    pub children: Vec<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in list_children(&self.parent) {
            let _ = Cgroup::open(&self.parent, &name).remove();
        }
        let _ = remove_parent(&self.parent);
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_owned()
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Gone from /proc or a zombie waiting for a parent to reap it.
pub fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .next();
            matches!(state, Some("Z" | "X"))
        }
    }
}

/// Fails if any hierarchy still has `parent`.
pub fn assert_nothing_left(parent: &str) {
    for root in hierarchy_roots() {
        assert!(
            !root.join(parent).exists(),
            "{} left behind",
            root.join(parent).display()
        );
    }
    assert!(list_children(parent).is_empty());
}
