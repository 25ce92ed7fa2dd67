//! A light version: a selective session's whole version taken as files
//! alone, while the only processes in it are drums' own.
//!
//! A session that runs nothing but its init and the guest agent init
//! started holds no process state a cold start on the same files would not
//! make again. A CRIU dump of it still costs a whole dump: ~1 MiB and tens of
//! ms alone, and seconds when many sessions take their base version at once
//! (their agents' first model requests wait for it: docs/engine.md). So such
//! a version takes the files snapshot only, with no process artifact, and a
//! recovery or rollback to it starts the session cold on its files, as one
//! to a `files`-policy version does.
//!
//! The processes are checked before the job takes the light path and again
//! while the session is frozen for the snapshot, so none can start between
//! the check and the files it stands with. Refused then, the version is
//! taken whole (crate::checkpoint's `make_version`).
//!
//! A cold start makes the same processes, but a new pid namespace, whose
//! next pid is the one after the guest's; a CRIU restore brings back the
//! namespace's last pid. So a light version records that last pid (which
//! only a process inside can read: the guest reports it, [`last_pid`]),
//! checked unchanged once the files are snapshotted, and a cold start to it
//! puts it back (`drums_sys::set_last_pid_in`). A first try without it was
//! reverted: a recovered session's shell got pid 3 where it had had 13.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a light version is checked against: the session's init, and the
/// binaries drums' own processes run.
#[derive(Debug, Clone)]
pub(crate) struct DrumsOwn {
    pub init: i32,
    /// The session's last pid when the job looked ([`last_pid`]): what a
    /// cold start to the version puts back, and what must not have moved
    /// once its files are snapshotted.
    pub last_pid: u32,
    /// drums-init and drums-guest as installed in the binaries' directory,
    /// which every session binds read-only.
    pub init_bin: PathBuf,
    pub guest_bin: PathBuf,
}

impl DrumsOwn {
    pub(crate) fn new(bin_dir: &Path, init: i32, last_pid: u32) -> DrumsOwn {
        let session = bin_dir.join("session");
        DrumsOwn {
            init,
            last_pid,
            init_bin: session.join("drums-init"),
            guest_bin: session.join("drums-guest"),
        }
    }

    /// Why `pids` (a session's processes) are more than drums' own, or
    /// none if they are only its init and at most one guest agent that init
    /// started. A process is told by its pid and parent and by the inode it
    /// runs, never by its name, which the session's code may set.
    pub(crate) fn why_not(&self, pids: &[i32]) -> Option<String> {
        if !pids.contains(&self.init) {
            return Some(format!(
                "the session's init ({}) is not in its cgroup",
                self.init
            ));
        }
        if !runs(self.init, &self.init_bin) {
            return Some("the session's init no longer runs drums-init".into());
        }
        let mut guests = 0;
        for &pid in pids.iter().filter(|&&p| p != self.init) {
            if parent(pid) != Some(self.init) || !runs(pid, &self.guest_bin) {
                return Some(format!("process {pid} of the session is not drums' own"));
            }
            guests += 1;
        }
        (guests > 1).then(|| format!("{guests} guest agents run in the session"))
    }
}

/// What the guest's health check says of the session's pids.
#[derive(serde::Deserialize)]
struct Pids {
    /// Absent from a guest built before light versions: never light.
    last_pid: Option<u32>,
}

/// The last pid the session's pid namespace handed out, as its guest agent
/// reads it (only a process inside can); else why it is not known.
///
/// Code in the session could make the guest lie. A lie within range only
/// gives the session's next process, after a recovery to this version,
/// another pid in the session's own new namespace, and drumsd nothing. A
/// lie out of range would make every later rollback to the version fail at
/// the write-back, so it is refused here and the version is taken whole.
pub(crate) async fn last_pid(init: i32) -> Result<u32, String> {
    let p: Pids = crate::manager::guest_client(init)
        .json(hyper::Method::GET, "/v1/health", None::<&()>)
        .await
        .map_err(|e| format!("the guest's health check failed: {e}"))?;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or("the host's kernel.pid_max is not readable")?;
    in_range(p.last_pid, pid_max)
}

/// `reported` if the session's namespace could have handed it out: a
/// session's namespace has the pid_max of the host's, which it cannot
/// change (its /proc/sys is read-only), and its init and guest took pids 1
/// and 2 before anything else ran.
fn in_range(reported: Option<u32>, pid_max: u32) -> Result<u32, String> {
    match reported {
        None => Err("the guest does not report the session's last pid".into()),
        Some(last) if (2..pid_max).contains(&last) => Ok(last),
        Some(last) => Err(format!(
            "the guest reported {last} as the session's last pid, outside 2..{pid_max}"
        )),
    }
}

/// Whether process `pid` runs the file `bin` (the same inode).
fn runs(pid: i32, bin: &Path) -> bool {
    let exe = std::fs::metadata(format!("/proc/{pid}/exe"));
    let bin = std::fs::metadata(bin);
    match (exe, bin) {
        (Ok(e), Ok(b)) => (e.dev(), e.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// The parent of process `pid`, from /proc.
fn parent(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's reply is hostile input: a last pid no namespace could
    /// have handed out is refused (the version is then taken whole), so a
    /// rollback never fails writing it back.
    #[test]
    fn a_last_pid_out_of_range_is_refused() {
        assert_eq!(in_range(Some(13), 4_194_304), Ok(13));
        assert_eq!(in_range(Some(2), 32_768), Ok(2));
        assert_eq!(in_range(Some(32_767), 32_768), Ok(32_767));
        for bad in [0, 1, 32_768, u32::MAX] {
            let why = in_range(Some(bad), 32_768).unwrap_err();
            assert!(why.contains(&format!("reported {bad} ")), "{why}");
        }
        assert!(in_range(None, 32_768)
            .unwrap_err()
            .contains("does not report"));
    }

    /// This test's own process stands for an init, with its own executable
    /// as drums-init; a child running `sleep` is not drums' own.
    #[test]
    fn only_init_and_its_guest_are_drums_own() {
        let me = std::process::id() as i32;
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let own = DrumsOwn {
            init: me,
            last_pid: 0,
            init_bin: exe.clone(),
            guest_bin: exe.clone(),
        };
        assert_eq!(own.why_not(&[me]), None);
        assert!(own.why_not(&[]).unwrap().contains("not in its cgroup"));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let why = own.why_not(&[me, pid]);
        // A guest runs drums-guest: `sleep` is refused as not drums' own.
        assert!(why.unwrap().contains("not drums' own"), "{pid}");
        let sleep = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        let own_sleep = DrumsOwn {
            guest_bin: sleep,
            ..own.clone()
        };
        // The child of init running the guest's binary is the guest.
        assert_eq!(own_sleep.why_not(&[me, pid]), None);
        // Two of them are not.
        let mut second = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let two = [me, pid, second.id() as i32];
        assert!(own_sleep.why_not(&two).unwrap().contains("2 guest"));
        second.kill().unwrap();
        second.wait().unwrap();
        // Init running another binary is refused.
        let other = DrumsOwn {
            init_bin: PathBuf::from("/bin/true"),
            ..own
        };
        assert!(other.why_not(&[me]).unwrap().contains("no longer runs"));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
