//! One error type for every CRIU operation.
//!
//! When CRIU itself fails, the error carries the log file's path and its last
//! error lines: CRIU's errno alone ("errno 0" is common) says almost nothing,
//! and the reason is only ever in the log.

use std::fmt;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Which CRIU request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Dump,
    Restore,
    Version,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Dump => "dump",
            Op::Restore => "restore",
            Op::Version => "version",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("criu binary not found in PATH or /usr/local/sbin")]
    NotFound,

    #[error("criu {op}: spawn {bin}: {source}")]
    Spawn {
        op: Op,
        bin: PathBuf,
        source: io::Error,
    },

    /// A path the caller passed is unusable (missing images or work dir, ...).
    #[error("criu {op}: {what} {path}: {source}")]
    Path {
        op: Op,
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },

    #[error("criu {op}: join cgroup {path}: {source}")]
    JoinCgroup {
        op: Op,
        path: PathBuf,
        source: io::Error,
    },

    /// The socket to `criu swrk` failed (socketpair, send or receive).
    #[error("criu {op}: rpc {what}: {source}")]
    Rpc {
        op: Op,
        what: &'static str,
        source: nix::Error,
    },

    /// An image drums rewrites (the user namespace's) is not what CRIU
    /// writes.
    #[error("criu image {path}: {why}")]
    Image { path: PathBuf, why: String },

    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("criu {op}: encode request: {source}")]
    Encode { op: Op, source: protobuf::Error },

    #[error("criu {op}: decode response: {source}")]
    Decode { op: Op, source: protobuf::Error },

    /// CRIU answered the request with failure.
    #[error("criu {op} failed (errno {errno}{msg}); log {log}: {tail}", log = .log.display(), msg = fmt_msg(.criu_msg))]
    Failed {
        op: Op,
        errno: i32,
        /// `cr_errmsg` of the response: CRIU's first error, when it sends one.
        criu_msg: Option<String>,
        log: PathBuf,
        tail: String,
    },

    /// CRIU was killed before it answered: what it worked on went away under
    /// it, and it would have waited for it forever.
    #[error("criu {op} stopped: {reason}; log {log}: {tail}", log = .log.display())]
    Abandoned {
        op: Op,
        reason: String,
        log: PathBuf,
        tail: String,
    },

    /// A notification callback returned an error, so CRIU was told to abort.
    /// The callback's error is the source; CRIU's log tail says how it
    /// unwound.
    #[error("criu {op} aborted ({script} notification failed; log {log}: {tail})", log = .log.display())]
    Notify {
        op: Op,
        script: String,
        #[source]
        reason: crate::swrk::NotifyError,
        log: PathBuf,
        tail: String,
    },

    /// `criu swrk` closed the socket before its final response (it crashed
    /// or was killed); its exit status and stderr are all we have besides the log.
    #[error("criu {op}: swrk ended without a response ({status}); log {log}: {tail}; stderr: {stderr}", log = .log.display())]
    NoResponse {
        op: Op,
        status: String,
        log: PathBuf,
        tail: String,
        stderr: String,
    },

    #[error("criu {op}: unexpected response type {got} (wanted {want})")]
    UnexpectedResponse { op: Op, got: String, want: String },
}

fn fmt_msg(m: &Option<String>) -> String {
    match m {
        Some(m) if !m.trim().is_empty() => format!(": {}", m.trim()),
        _ => String::new(),
    }
}

/// How many error lines of a CRIU log go into an error message.
const TAIL_LINES: usize = 8;
/// Only the end of a log is read: a `-v4` dump log of a desktop is megabytes,
/// and the lines that explain a failure are at its end.
const TAIL_BYTES: u64 = 1 << 20;

/// The last error lines of a CRIU log, joined with " | ".
///
/// Lines containing "Error" or "error" are CRIU's `pr_err`/`pr_perror` output.
/// If there are none (CRIU died before logging one) the last lines are used
/// instead, so the message never comes back empty without saying so.
pub fn log_tail(log: &Path) -> String {
    let text = match read_end(log) {
        Ok(t) => t,
        Err(e) => return format!("(log unreadable: {e})"),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| (l.contains("Error") || l.contains("error")) && !is_harmless(l))
        .collect();
    let pick = if errors.is_empty() { &lines } else { &errors };
    if pick.is_empty() {
        return "(log empty)".to_string();
    }
    let start = pick.len().saturating_sub(TAIL_LINES);
    pick[start..]
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Error lines CRIU logs on every run on this kind of host, whatever happens
/// next. Left in, they would push out (or, as CRIU's "first error", stand in
/// for) the line that explains a failure.
const HARMLESS: &[&str] = &[
    // No CAP_SYS_RESOURCE in the sandbox: CRIU cannot raise its own fd limit
    // and carries on with the current one.
    "rlimit: Can't setup RLIMIT_NOFILE",
];

pub(crate) fn is_harmless(line: &str) -> bool {
    HARMLESS.iter().any(|h| line.contains(h))
}

/// What a failed dump could not take, read from CRIU's error lines: which
/// process (a host pid, when CRIU names one), what it holds, and what the
/// user can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    pub pid: Option<i32>,
    pub object: String,
    pub advice: String,
}

impl CriuError {
    /// For a dump CRIU refused: what it could not take, in words a user can
    /// act on, instead of CRIU's log line.
    pub fn unsupported(&self) -> Option<Unsupported> {
        match self {
            CriuError::Failed { tail, .. } => Some(explain_dump(tail)),
            _ => None,
        }
    }
}

/// The explanation of a failed dump's error lines (`tail`, as [`log_tail`]
/// joins them): the known cases in CRIU 4.2.1's own words, and otherwise
/// its first error that is not a summary ("Dumping FAILED"), with the pid
/// a summary names.
fn explain_dump(tail: &str) -> Unsupported {
    let lines: Vec<&str> = tail
        .split(" | ")
        .filter_map(|l| l.split_once("): ").map(|(_, m)| m.trim()))
        .collect();
    let number_after = |text: &str, key: &str| -> Option<i32> {
        let rest = &text[text.find(key)? + key.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let summary_pid = lines.iter().find_map(|l| number_after(l, "(pid:"));
    for l in &lines {
        // tty.c: a task holds its session's controlling terminal through
        // /dev/tty, and the first pty of that session CRIU met (the master,
        // when the pty's holder is dumped first) is another task's.
        if l.contains("ctty inheritance detected") {
            return Unsupported {
                pid: number_after(l, "ctty pid_real"),
                object: format!(
                    "its session's controlling terminal open as /dev/tty, while process {} holds that terminal's pty master",
                    number_after(l, "pty pid_real").map_or("?".into(), |p| p.to_string())
                ),
                advice: "CRIU 4.2.1 cannot dump a shell that keeps /dev/tty open under another process's pty (dash does, for job control): run bash on the pty, or turn job control off in that shell (`set +m`)".into(),
            };
        }
        if l.contains("Can't dump ghost file") {
            return Unsupported {
                pid: summary_pid,
                object: format!("an unlinked file that is still open ({})", l.trim_start_matches("Can't dump ghost file").trim()),
                advice: "CRIU copies such files into the checkpoint, up to 4 GiB each: close it, or keep it linked".into(),
            };
        }
        if l.contains("Can't dump that handle") {
            return Unsupported {
                pid: summary_pid,
                object:
                    "an inotify or fanotify watch on a file that has no path CRIU can restore it by"
                        .into(),
                advice: "remove the watch (restart the watcher) before checkpointing".into(),
            };
        }
    }
    let first = lines
        .iter()
        .find(|l| !l.contains("FAILED") && !l.contains("failed with"))
        .or(lines.first())
        .copied()
        .unwrap_or("an object CRIU did not name");
    Unsupported {
        pid: summary_pid,
        object: format!("something CRIU 4.2.1 cannot dump ({first})"),
        advice: "end or restart that process before checkpointing".into(),
    }
}

fn read_end(path: &Path) -> io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > TAIL_BYTES {
        f.seek(SeekFrom::Start(len - TAIL_BYTES))?;
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_dumps_are_explained() {
        let ctty = explain_dump("(00.134262) Error (criu/tty.c:2286): tty: ctty inheritance detected sid/pgrp 8 (ctty pid_real 22227 pty pid_real 22221) | (00.134516) Error (criu/cr-dump.c:1975): Dumping FAILED.");
        assert_eq!(ctty.pid, Some(22227));
        assert!(ctty.object.contains("process 22221"), "{ctty:?}");
        assert!(ctty.advice.contains("set +m"));
        let fsn = explain_dump("(00.09) Error (criu/fsnotify.c:284): fsnotify: \tCan't dump that handle | (00.09) Error (criu/cr-dump.c:1545): Dump files (pid: 22144) failed with -1 | (00.10) Error (criu/cr-dump.c:1975): Dumping FAILED.");
        assert_eq!(fsn.pid, Some(22144));
        assert!(fsn.object.contains("inotify"));
        let other = explain_dump("(00.1) Error (criu/sk-inet.c:1): inet: Unsupported socket family 44 | (00.2) Error (criu/cr-dump.c:1545): Dump files (pid: 7) failed with -1");
        assert_eq!(other.pid, Some(7));
        assert!(
            other.object.contains("Unsupported socket family 44"),
            "{other:?}"
        );
        let nothing = explain_dump("(log empty)");
        assert_eq!(nothing.pid, None);
    }

    #[test]
    fn tail_keeps_last_error_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let mut s = String::new();
        s.push_str(
            "(00.001) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n",
        );
        for i in 0..20 {
            s.push_str(&format!("(00.0{i}) info line {i}\n"));
            s.push_str(&format!("(00.0{i}) Error (criu/x.c:{i}): bad {i}\n"));
        }
        std::fs::write(&log, s).unwrap();
        let t = log_tail(&log);
        assert_eq!(t.matches("Error").count(), TAIL_LINES);
        assert!(t.contains("bad 19"));
        assert!(!t.contains("bad 11"));
        assert!(!t.contains("info"));
        assert!(!t.contains("rlimit"));
    }

    #[test]
    fn tail_falls_back_to_last_lines_and_reports_missing_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, "a\nb\n").unwrap();
        assert_eq!(log_tail(&log), "a | b");
        assert!(log_tail(&dir.path().join("none")).starts_with("(log unreadable"));
    }

    #[test]
    fn failed_message_names_log_and_errno() {
        let e = CriuError::Failed {
            op: Op::Restore,
            errno: 2,
            criu_msg: Some("Can't open images".into()),
            log: "/w/restore.log".into(),
            tail: "Error (x): y".into(),
        };
        assert_eq!(
            e.to_string(),
            "criu restore failed (errno 2: Can't open images); log /w/restore.log: Error (x): y"
        );
    }
}
