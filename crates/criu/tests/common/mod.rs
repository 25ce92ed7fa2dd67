//! Fixtures for the root integration tests: a small session-shaped tree
//! (pid+uts+ipc+mount namespaces, overlay root, pivoted, own /proc and /dev,
//! one bind mount from the host), overlays for restores, and leak checks.
//!
//! Each test file is its own process, so "no child of this process remains"
//! is a valid check at the end of a test.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// Where the test tree's host bind mount appears inside it.
pub const EXT_MOUNTPOINT: &str = "/run/drums/bin";
pub const EXT_KEY: &str = "drums-bin";

/// These tests need root (namespaces, mounts, CRIU). They fail, never skip.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "drums-criu integration tests need root (namespaces, mounts, criu); run them as root"
    );
}

/// Everything a test creates, torn down on drop even when an assertion fails.
/// Mounts are undone before the temp dir is removed; if one cannot be, the
/// dir is kept, because removing it would walk into the mounted overlay.
pub struct Fixture {
    pub dir: PathBuf,
    pub marker: String,
    mounts: Vec<PathBuf>,
    cgroups: Vec<PathBuf>,
    children: Vec<Child>,
    pids: Vec<i32>,
    tmp: Option<tempfile::TempDir>,
}

impl Fixture {
    pub fn new() -> Fixture {
        require_root();
        let tmp = tempfile::Builder::new()
            .prefix("drums-criu-test-")
            .tempdir_in("/tmp")
            .expect("create temp dir");
        let dir = tmp.path().to_path_buf();
        let marker = dir.file_name().unwrap().to_string_lossy().into_owned();
        Fixture {
            dir,
            marker,
            mounts: Vec::new(),
            cgroups: Vec::new(),
            children: Vec::new(),
            pids: Vec::new(),
            tmp: Some(tmp),
        }
    }

    /// An overlay with lower "/" and its own upper/work, mounted at
    /// `<dir>/<name>/merged`, with the test tree's mountpoints present.
    pub fn overlay(&mut self, name: &str) -> Overlay {
        self.overlay_seeded(name, None)
    }

    /// An overlay whose upper layer starts as a copy of `seed` (the files of
    /// a dump, copied while the tree was frozen), as drums restores a
    /// checkpoint's snapshot: a file the tree held open at the dump must be
    /// there again for CRIU to reopen it.
    pub fn overlay_seeded(&mut self, name: &str, seed: Option<&Path>) -> Overlay {
        let base = self.dir.join(name);
        let (upper, work, merged) = (base.join("upper"), base.join("work"), base.join("merged"));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d).unwrap();
        }
        if let Some(seed) = seed {
            let st = std::process::Command::new("cp")
                .arg("-a")
                .arg(seed.join("."))
                .arg(&upper)
                .status()
                .unwrap();
            assert!(
                st.success(),
                "seed {} into {}",
                seed.display(),
                upper.display()
            );
        }
        // Mountpoints the session needs that "/" may not have.
        std::fs::create_dir_all(upper.join(EXT_MOUNTPOINT.trim_start_matches('/'))).unwrap();
        std::fs::create_dir_all(upper.join(".oldroot")).unwrap();
        let data = format!(
            "lowerdir=/,upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            MsFlags::empty(),
            Some(data.as_str()),
        )
        .expect("mount overlay");
        self.mounts.push(merged.clone());
        Overlay { upper, merged }
    }

    /// A fresh cgroup `/sys/fs/cgroup/<hierarchy>/<marker>`, removed on
    /// teardown once the processes in it are gone.
    pub fn cgroup(&mut self, hierarchy: &str) -> PathBuf {
        let cg = Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join(&self.marker);
        std::fs::create_dir(&cg).unwrap_or_else(|e| panic!("create cgroup {}: {e}", cg.display()));
        self.cgroups.push(cg.clone());
        cg
    }

    /// A host dir to bind into the tree at EXT_MOUNTPOINT.
    pub fn ext_dir(&self) -> PathBuf {
        let ext = self.dir.join("ext");
        std::fs::create_dir_all(&ext).unwrap();
        std::fs::write(ext.join("hello"), "from the host\n").unwrap();
        ext
    }

    pub fn mkdir(&self, name: &str) -> PathBuf {
        let d = self.dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Start the test tree on `ov`: returns the host pid of its init (the
    /// pid-namespace init, a session leader, the root to dump).
    pub fn start_tree(&mut self, ov: &Overlay, ext: &Path) -> i32 {
        self.start_tree_with(ov, ext, "")
    }

    /// [`Fixture::start_tree`], whose init first runs `prelude` (Python,
    /// after its stdio moved to /dev/null): to fork children, say.
    pub fn start_tree_with(&mut self, ov: &Overlay, ext: &Path, prelude: &str) -> i32 {
        // Stage 1 mirrors the drums session init: own /proc and /dev, the host
        // bind mount, pivot into the overlay and drop the old root, so the
        // mount namespace holds nothing CRIU cannot restore under a new root.
        let stage1 = r#"
set -e
R=$1; EXT=$2
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3
mount --bind "$EXT" "$R/run/drums/bin"
cd "$R"
pivot_root . .oldroot
umount -l /.oldroot
exec /usr/bin/python3 -c "$3" "$4"
"#;
        // Stage 2: session leader in its namespace, no fd to host files,
        // a counter rewritten every 20 ms so a test can see the tree running.
        let py = r#"
import os, time
os.setsid()
fd = os.open("/dev/null", os.O_RDWR)
for i in range(3):
    os.dup2(fd, i)
os.closerange(3, 65536)
PRELUDE
n = 0
while True:
    n += 1
    with open("/counter.tmp", "w") as f:
        f.write(str(n))
    os.rename("/counter.tmp", "/counter")
    time.sleep(0.02)
"#;
        let child = Command::new("unshare")
            .args([
                "--fork",
                "--pid",
                "--uts",
                "--ipc",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                stage1,
                "stage1",
            ])
            .arg(&ov.merged)
            .arg(ext)
            .arg(py.replace("PRELUDE", prelude))
            .arg(&self.marker)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Only stage 1 writes here; stage 2 moves its stdio to the
            // session's /dev/null before the tree is ever dumped.
            .stderr(std::fs::File::create(self.dir.join("tree.stderr")).unwrap())
            .spawn()
            .expect("spawn unshare");
        let unshare = child.id();
        self.children.push(child);
        let init = wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        })
        .expect("tree init did not appear");
        if wait_for(Duration::from_secs(10), || ov.counter()).is_none() {
            let err = std::fs::read_to_string(self.dir.join("tree.stderr")).unwrap_or_default();
            panic!("tree never wrote its counter; stage 1 stderr: {err}");
        }
        init
    }

    /// A restored root (our child, via rst_sibling): killed and reaped on drop.
    pub fn adopt(&mut self, pid: i32) {
        self.pids.push(pid);
    }

    /// Tear everything down and assert nothing of this test is left: no
    /// process, no child of this process, no mount under the test dir.
    pub fn finish(mut self) {
        let cgroups = self.cgroups.clone();
        let known: Vec<i32> = self
            .pids
            .iter()
            .copied()
            .chain(self.children.iter().map(|c| c.id() as i32))
            .collect();
        self.teardown();
        for pid in known {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "process {pid} of the test is still there"
            );
        }
        assert_eq!(
            children_of_self(),
            Vec::<i32>::new(),
            "children of the test left behind"
        );
        assert_eq!(
            processes_with(&self.marker),
            Vec::<i32>::new(),
            "test tree processes left behind"
        );
        assert_eq!(
            mounts_under(&self.dir),
            Vec::<String>::new(),
            "mounts left behind"
        );
        for cg in cgroups {
            assert!(!cg.exists(), "cgroup {} left behind", cg.display());
        }
    }

    fn teardown(&mut self) {
        // A task in a frozen v1 freezer cgroup does not die of SIGKILL until thawed.
        for cg in &self.cgroups {
            let _ = std::fs::write(cg.join("freezer.state"), "THAWED");
        }
        for pid in self.pids.drain(..) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid), None);
        }
        for mut c in self.children.drain(..) {
            // Kill the tree's init (which takes its pid namespace with it) and
            // let the unshare parent exit on its own. Killing unshare first
            // would orphan the init to the host's pid 1, which here never reaps.
            if let Ok(Some(init)) =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", c.id())).map(|s| {
                    s.split_whitespace()
                        .next()
                        .and_then(|p| p.parse::<i32>().ok())
                })
            {
                let _ = kill(Pid::from_raw(init), Signal::SIGKILL);
            }
            if wait_for(Duration::from_secs(5), || c.try_wait().ok().flatten()).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for m in self.mounts.drain(..).rev() {
            // The mount can stay busy for a moment while a dead tree's mount
            // namespace is released.
            let ok = wait_for(Duration::from_secs(5), || {
                umount2(&m, MntFlags::empty()).ok()
            })
            .is_some();
            if !ok {
                let _ = umount2(&m, MntFlags::MNT_DETACH);
            }
        }
        for cg in self.cgroups.drain(..) {
            // rmdir fails with EBUSY until the last task in it has been reaped.
            wait_for(Duration::from_secs(5), || {
                (std::fs::remove_dir(&cg).is_ok() || !cg.exists()).then_some(())
            });
        }
        if let Some(tmp) = self.tmp.take() {
            if mounts_under(&self.dir).is_empty() {
                drop(tmp);
            } else {
                // Never remove_dir_all through a mounted overlay of "/".
                let _ = tmp.keep();
            }
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.teardown();
    }
}

pub struct Overlay {
    pub upper: PathBuf,
    pub merged: PathBuf,
}

impl Overlay {
    /// The tree's counter, read from the upper layer (what the tree writes
    /// lands there, whichever mount namespace it runs in).
    pub fn counter(&self) -> Option<u64> {
        std::fs::read_to_string(self.upper.join("counter"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Wait until the counter moves past its current value.
    pub fn assert_advances(&self, what: &str) {
        let start = self.counter().unwrap_or(0);
        let moved = wait_for(Duration::from_secs(5), || {
            self.counter().filter(|&n| n > start)
        });
        assert!(moved.is_some(), "{what}: counter stuck at {start}");
    }
}

pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn pid_ns(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The cgroup path of `pid` in the hierarchy whose /proc/PID/cgroup line
/// has `controllers` (e.g. "pids", or "" for the unified v2 hierarchy).
pub fn cgroup_of(pid: i32, controllers: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, path) = (f.next()?, f.next()?, f.next()?);
            (c == controllers).then(|| path.to_string())
        })
}

pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

pub fn children_of_self() -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

/// Live processes whose command line carries `marker` (restored copies keep
/// the original's argv, so this finds them too).
pub fn processes_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&c).contains(marker) {
                out.push(pid);
            }
        }
    }
    out
}

pub fn mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(d.as_ref()))
        .map(str::to_string)
        .collect()
}

pub fn criu() -> drums_criu::Criu {
    drums_criu::Criu::new().expect("criu binary (install CRIU 4.2.1 to /usr/local/sbin)")
}
