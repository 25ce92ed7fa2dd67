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
    #[error("criu {op} aborted: {script} notification failed: {reason}; log {log}: {tail}", log = .log.display())]
    Notify {
        op: Op,
        script: String,
        reason: String,
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
