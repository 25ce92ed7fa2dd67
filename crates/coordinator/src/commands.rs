//! The command log of an agent outside its session (an agent *with* a
//! sandbox): each command it runs through drumsd (`drums exec`, the API's
//! exec) is logged durably before it runs, with its place in the agent's
//! conversation, so that after a recovery the commands the version does
//! not have are run again, in order, and the one that was outstanding is
//! re-issued for its caller (drumsd's `reissue` module runs them).

use std::sync::Arc;
use std::time::Duration;

use drums_api::CommandState;
use drums_catalog::CatalogError;
use drums_session::SessionError;
use http_body_util::{BodyExt, Full};
use tracing::{info, warn};

use crate::{Coordinator, Sessions};

/// A logged command to run again.
#[derive(Debug, Clone)]
pub struct Logged {
    pub seq: u64,
    /// The exec request, as JSON.
    pub request: String,
}

impl<S: Sessions> Coordinator<S> {
    /// Whether session `id`'s agent talks through the proxy: its commands
    /// are logged.
    pub fn coordinates(&self, id: &str) -> bool {
        self.log.catalog().is_coordinated(id).unwrap_or(false)
    }

    /// A command of session `id` starts: logged with the number of model
    /// calls answered so far (its turn is the one after them) and the
    /// inspector's turn, if one is open.
    pub fn command_begins(&self, id: &str, request: &str) -> Result<u64, CatalogError> {
        let catalog = self.log.catalog();
        let position = catalog.exchanges_len(id)?;
        let turn = self.manager.open_turn(id);
        catalog.begin_command(id, position, turn, request)
    }

    /// How a command ended: done, failed, reissued, cancelled or diverged.
    pub fn command_ends(&self, id: &str, seq: u64, state: CommandState) {
        if let Err(e) = self.log.catalog().end_command(id, seq, state) {
            tracing::warn!(session = %id, "log the end of command {seq}: {e}");
        }
    }

    /// Session `id` came back from version `at`: the commands that ran
    /// after that version was taken (after the model call whose turn end
    /// became it was answered), in order, but `outstanding`. None if the
    /// log does not know the version.
    pub fn commands_after(
        &self,
        id: &str,
        at: &str,
        outstanding: u64,
    ) -> Result<Option<Vec<Logged>>, CatalogError> {
        let catalog = self.log.catalog();
        // After the version: after the model call whose turn end took it.
        // A version whose call was never logged (drumsd, or the session,
        // died while the model thought about it) has no exchange; the
        // commands after it are those started after it was taken, as an
        // agent outside runs its commands only once it has the answer
        // (held until the version is durable).
        let after: Box<dyn Fn(&drums_catalog::Command) -> bool> =
            match catalog.exchange_of_version(id, at)? {
                Some(j) => Box::new(move |c| c.position > j),
                None => {
                    let Some(taken) = self
                        .manager
                        .session_versions(id)
                        .ok()
                        .and_then(|v| v.into_iter().find(|v| v.id == at))
                        .map(|v| v.created_at_ms)
                    else {
                        return Ok(None);
                    };
                    Box::new(move |c| c.started_at_ms >= taken)
                }
            };
        Ok(Some(
            catalog
                .commands(id)?
                .into_iter()
                .filter(|c| {
                    after(c)
                        && c.seq < outstanding
                        && matches!(c.state, CommandState::Done | CommandState::Reissued)
                })
                .map(|c| Logged {
                    seq: c.seq,
                    request: c.request,
                })
                .collect(),
        ))
    }
}

/// Session `id`'s recoveries by this drumsd, and how the newest one's
/// commands ran again.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    pub count: u64,
    /// Why the commands since the version could not all run again; a
    /// waiting exec does not re-issue its command on such a state.
    pub failed: Option<String>,
}

/// Running a session's logged commands again failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("read the command log")]
    Log(#[from] CatalogError),
    #[error("reach the session's guest")]
    Session(#[source] Box<SessionError>),
    #[error("command {seq}: ask the guest")]
    Guest {
        seq: u64,
        #[source]
        source: drums_api::ClientError,
    },
    #[error("command {seq}: its stream broke")]
    Stream {
        seq: u64,
        #[source]
        source: hyper::Error,
    },
    #[error("command {seq}: not done within {after:?}")]
    CommandTimeout { seq: u64, after: Duration },
    #[error("the commands since the version: not done within {after:?}")]
    TotalTimeout { after: Duration },
    #[error("command {seq}: over {max} bytes of output")]
    OutputOver { seq: u64, max: u64 },
}

impl<S: Sessions> Coordinator<S> {
    /// How many times session `id` has been recovered and had its commands
    /// run again by this drumsd: a waiting exec re-issues its command once
    /// this has moved.
    pub fn recoveries(&self, id: &str) -> u64 {
        self.recovery(id).count
    }

    /// Session `id`'s recoveries, and how the newest one's commands ran.
    pub fn recovery(&self, id: &str) -> Recovered {
        self.recovered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// The coordinator's bounds (drumsd's flags).
    pub fn limits(&self) -> &crate::Limits {
        &self.limits
    }

    /// Session `id` is being recovered: until the recovery's commands have
    /// run again (`after_recovery`), or the recovery failed (`gate`
    /// dropped), its agent's execs wait ([`Coordinator::replayed`]).
    pub(crate) fn recovering(&self, id: &str) -> crate::replays::Gate {
        self.replays.close(id)
    }

    /// Until session `id` is neither being recovered nor having its
    /// commands run again after a recovery: an exec or a file read of its
    /// agent's then sees the state the agent had (replays.rs).
    pub async fn replayed(&self, id: &str) {
        self.replays.wait(id).await
    }

    /// Session `id` was recovered (under `gate`): an agent outside it has
    /// its commands since the version run again, in order, their output
    /// dropped (their caller had it); then any waiting exec re-issues its
    /// own, and new ones go on (the gate opens).
    ///
    /// They run in a task of the session's own, bounded by the re-issue
    /// limits: the session's guest is hostile, and a guest that never
    /// answers or a command that prints forever must not hold the watch,
    /// which recovers every other session (docs/security.md). A newer
    /// recovery of the same session stops a run still under way (the
    /// guest it talked to is gone).
    pub(crate) fn after_recovery(self: &Arc<Self>, id: &str, gate: crate::replays::Gate) {
        let me = self.clone();
        let sid = id.to_owned();
        let ticket = gate.ticket();
        let task = tokio::spawn(async move {
            let lives_in = me.log.catalog().agent_of(&sid).ok().flatten().is_some();
            let failed = if lives_in {
                None
            } else {
                let total = me.limits.reissue_total;
                let run = tokio::time::timeout(total, me.replay_commands(&sid)).await;
                match run.unwrap_or(Err(ReplayError::TotalTimeout { after: total })) {
                    Ok(()) => None,
                    Err(e) => {
                        let why = drums_api::error_chain(&e);
                        warn!(session = %sid, "run its commands again after the recovery: {why}");
                        Some(why)
                    }
                }
            };
            let mut all = me.recovered.lock().unwrap_or_else(|p| p.into_inner());
            let r = all.entry(sid.clone()).or_default();
            r.count += 1;
            r.failed = failed;
            drop(all);
            // Opened after the count moved: a re-issuing exec and a new one
            // both see this recovery done.
            drop(gate);
        });
        self.replays.running(&ticket, task.abort_handle());
    }

    async fn replay_commands(&self, id: &str) -> Result<(), ReplayError> {
        let Some(at) = self.manager.at_version(id) else {
            return Ok(());
        };
        let running = self
            .log
            .catalog()
            .commands(id)?
            .iter()
            .filter(|c| c.state == CommandState::Running)
            .map(|c| c.seq)
            .min()
            .unwrap_or(u64::MAX);
        let Some(todo) = self.commands_after(id, &at, running)? else {
            warn!(session = %id, version = %at, "the command log does not know the version recovered to: no command is run again");
            return Ok(());
        };
        let session = self
            .manager
            .get(id)
            .map_err(|e| ReplayError::Session(Box::new(e)))?;
        for c in &todo {
            let after = self.limits.reissue_command;
            tokio::time::timeout(after, self.run_again(&session, c))
                .await
                .unwrap_or(Err(ReplayError::CommandTimeout { seq: c.seq, after }))?;
        }
        if !todo.is_empty() {
            // They ran outside every turn the inspector watches.
            self.manager.changed_outside_turns(id);
        }
        info!(session = %id, version = %at, commands = todo.len(), "ran the commands since the version again");
        Ok(())
    }

    /// Run one logged command again, to its end, its output counted and
    /// dropped. Dropping the guest's answer (a timeout, the cap) stops the
    /// command in the guest.
    async fn run_again(&self, session: &drums_api::Session, c: &Logged) -> Result<(), ReplayError> {
        let client = self
            .manager
            .guest_proxy(session)
            .map_err(|e| ReplayError::Session(Box::new(e)))?;
        let _open = self.manager.guest_stream(&session.id);
        let req = hyper::Request::builder()
            .method(hyper::Method::POST)
            .uri("/v1/exec")
            .header("host", "guest")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes::Bytes::from(c.request.clone())))
            .expect("a valid request");
        let guest = |source| ReplayError::Guest { seq: c.seq, source };
        let resp = client.send(req).await.map_err(guest)?;
        let mut body = client.check(resp).await.map_err(guest)?.into_body();
        // To its end: the command has run when its stream ends.
        let max = self.limits.reissue_output;
        let mut seen: u64 = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|source| ReplayError::Stream { seq: c.seq, source })?;
            if let Some(d) = frame.data_ref() {
                seen += d.len() as u64;
                if seen > max {
                    return Err(ReplayError::OutputOver { seq: c.seq, max });
                }
            }
        }
        Ok(())
    }
}
