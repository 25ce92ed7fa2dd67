//! drums-init's pipe during stages 0 and 1: the config goes down, reports
//! come up, and with an id range drumsd writes the new user namespace's
//! maps when stage 0 asks.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use drums_init::{InitConfig, Report};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout, Command};

use crate::{io, SessionError};

/// The pipe to drums-init during stages 0 and 1.
pub(super) struct InitPipe {
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl InitPipe {
    /// Start stage 0 with `cfg`; with an id range (`base`), write the maps of
    /// its new user namespace when it asks.
    pub(super) async fn spawn(
        sys: &(dyn drums_sys::Syscall + Send + Sync),
        bin: &Path,
        cfg: &InitConfig,
        base: Option<u32>,
    ) -> Result<(InitPipe, i32), SessionError> {
        // Never drumsd's own environment (drums_init::environment says why);
        // stage 1 sets the session's own at its exec.
        let mut child = Command::new(bin)
            .env_clear()
            .env("PATH", drums_init::PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io("spawn", bin))?;
        let stage0 = child.id().expect("not yet reaped") as i32;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        // Stage 0 exits right after the fork; reap it.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let mut pipe = InitPipe {
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        let mut line = serde_json::to_string(cfg).expect("config serializes");
        line.push('\n');
        pipe.send(&line).await?;
        let mut report = pipe.next().await?;
        if let (Report::MapIds, Some(base)) = (&report, base) {
            sys.write_id_maps(stage0, &crate::ids::session_map(base))?;
            pipe.send("mapped\n").await?;
            report = pipe.next().await?;
        }
        match report {
            Report::Pid(pid) => Ok((pipe, pid)),
            other => Err(unexpected(other)),
        }
    }

    async fn send(&mut self, line: &str) -> Result<(), SessionError> {
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|source| SessionError::InitPipe {
                op: "write to",
                source,
            })
    }

    async fn next(&mut self) -> Result<Report, SessionError> {
        let line = tokio::time::timeout(REPORT_WAIT, self.lines.next_line())
            .await
            .map_err(|_| SessionError::Init(InitFailure::Silent(REPORT_WAIT)))?
            .map_err(|source| SessionError::InitPipe {
                op: "read from",
                source,
            })?
            .ok_or(SessionError::Init(InitFailure::Exited))?;
        let r: Report = serde_json::from_str(&line)
            .map_err(|source| SessionError::InitReport { line, source })?;
        match r {
            Report::Error(m) => Err(SessionError::Init(InitFailure::Reported(m))),
            r => Ok(r),
        }
    }

    /// The root cause of `e`, a failure that stage 1's exit may explain: if
    /// stage 1 failed, its own report (already on the pipe, or about to be)
    /// names the cause. A healthy stage 1 says nothing until `go`, so the
    /// short wait only costs time on a failure path.
    pub(super) async fn cause(&mut self, e: SessionError) -> SessionError {
        match tokio::time::timeout(Duration::from_millis(300), self.next()).await {
            Ok(Err(init_err)) => init_err,
            _ => e,
        }
    }

    /// Let stage 1 go on to start the services, and wait for its `ok`.
    pub(super) async fn go(&mut self) -> Result<(), SessionError> {
        if let Err(e) = self.send("go\n").await {
            // Stage 1 exited without reading it (a broken pipe).
            return Err(self.cause(e).await);
        }
        match self.next().await? {
            Report::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(r: Report) -> SessionError {
    SessionError::Init(InitFailure::Unexpected(format!("{r:?}")))
}

/// How long drums-init may take over one report.
const REPORT_WAIT: Duration = Duration::from_secs(15);

/// How drums-init's pipe failed a boot, apart from the pipe's own I/O.
#[derive(Debug, thiserror::Error)]
pub enum InitFailure {
    #[error("drums-init did not report within {0:?}")]
    Silent(Duration),
    #[error("drums-init exited without reporting")]
    Exited,
    /// drums-init's own message, from across the process boundary: text is
    /// all it can send.
    #[error("{0}")]
    Reported(String),
    #[error("unexpected report {0}")]
    Unexpected(String),
}
