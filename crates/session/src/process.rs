//! Process helpers: identifying a pid safely across pid reuse, and reaping.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The start time of a process in clock ticks since boot (field 22 of
/// /proc/PID/stat). With the pid it names one process for good: a recycled pid
/// has a later start time.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; the fields
    // after the last ')' are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// The process state letter (R, S, Z, ...) of a pid, if it exists.
pub fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// Alive and not a zombie.
/// How to name host pid `pid` to a user: as the session sees it (the last
/// pid of `NSpid`), with its command and the host's pid: "process 7
/// (python3, host pid 2214)".
pub fn describe(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let comm = field("Name:").unwrap_or("?");
    match field("NSpid:").and_then(|p| p.split_whitespace().last()) {
        Some(inner) if inner != pid.to_string() => {
            format!("process {inner} ({comm}, host pid {pid})")
        }
        _ => format!("process {pid} ({comm})"),
    }
}

pub fn alive(pid: i32) -> bool {
    matches!(state(pid), Some(s) if s != 'Z' && s != 'X')
}

/// The ledger key of a process: `pid:starttime`.
pub fn ledger_key(pid: i32) -> Option<String> {
    start_time(pid).map(|t| format!("{pid}:{t}"))
}

/// Why [`kill_and_reap`] could not make a process go.
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error("malformed process key {0:?}")]
    MalformedKey(String),
    #[error("waitpid {pid}")]
    Wait {
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error("process {pid} did not exit within {timeout:?} of SIGKILL")]
    Timeout { pid: i32, timeout: Duration },
}

/// Kill the process a ledger key names (only if it is still that process) and
/// wait until it is gone. drumsd is a child subreaper, so a session's PID 1 is
/// usually its child and must be reaped here, or it would stay a zombie.
pub fn kill_and_reap(key: &str, timeout: Duration) -> Result<(), ReapError> {
    let (pid, start) = key
        .split_once(':')
        .and_then(|(p, s)| Some((p.parse::<i32>().ok()?, s.parse::<u64>().ok()?)))
        .ok_or_else(|| ReapError::MalformedKey(key.to_owned()))?;
    if start_time(pid) != Some(start) {
        return Ok(()); // gone, or the pid now names another process
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let deadline = Instant::now() + timeout;
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) => return Ok(()),
            // Not our child (drumsd was restarted): the host's init reaps it.
            Err(nix::Error::ECHILD) => {
                if start_time(pid) != Some(start) || state(pid) == Some('Z') {
                    return Ok(());
                }
            }
            Err(source) => return Err(ReapError::Wait { pid, source }),
        }
        if Instant::now() > deadline {
            return Err(ReapError::Timeout { pid, timeout });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_names_this_process() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert!(alive(me));
        assert!(start_time(i32::MAX).is_none());
    }

    #[test]
    fn kill_and_reap_a_child_and_ignore_a_stale_key() {
        // Reaped by kill_and_reap itself, which is what this test checks.
        #[allow(clippy::zombie_processes)]
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let key = ledger_key(pid).unwrap();
        kill_and_reap(&key, Duration::from_secs(5)).unwrap();
        assert!(start_time(pid).is_none(), "child reaped");
        // A stale key (wrong start time) must not kill whatever has that pid now.
        let me = std::process::id() as i32;
        kill_and_reap(&format!("{me}:1"), Duration::from_secs(1)).unwrap();
        assert!(alive(me));
    }
}
