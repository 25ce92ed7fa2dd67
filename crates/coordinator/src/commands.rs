//! The command log of an agent outside its session (an agent *with* a
//! sandbox): each command it runs through drumsd (`drums exec`, the API's
//! exec) is logged durably before it runs, with its place in the agent's
//! conversation, so that after a recovery the commands the version does
//! not have are run again, in order, and the one that was outstanding is
//! re-issued for its caller (drumsd's `reissue` module runs them).

use drums_catalog::CatalogError;
use http_body_util::{BodyExt, Full};
use tracing::{info, warn};

use crate::Coordinator;

/// A logged command to run again.
#[derive(Debug, Clone)]
pub struct Logged {
    pub seq: u64,
    /// The exec request, as JSON.
    pub request: String,
}

impl Coordinator {
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

    /// `done`, `failed`, `reissued` or `diverged`.
    pub fn command_ends(&self, id: &str, seq: u64, state: &str) {
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
                        && ["done", "reissued"].contains(&c.state.as_str())
                })
                .map(|c| Logged {
                    seq: c.seq,
                    request: c.request,
                })
                .collect(),
        ))
    }
}

impl Coordinator {
    /// How many times session `id` has been recovered and had its commands
    /// run again by this drumsd: a waiting exec re-issues its command once
    /// this has moved.
    pub fn recoveries(&self, id: &str) -> u64 {
        self.recovered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    /// Session `id` was recovered: an agent outside it had its commands
    /// since the version run again, in order, their output dropped (their
    /// caller had it); then any waiting exec re-issues its own.
    pub(crate) async fn after_recovery(&self, id: &str) {
        let lives_in = self.log.catalog().agent_of(id).ok().flatten().is_some();
        if !lives_in {
            if let Err(e) = self.replay_commands(id).await {
                warn!(session = %id, "run its commands again after the recovery: {e}");
            }
        }
        *self
            .recovered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_owned())
            .or_default() += 1;
    }

    async fn replay_commands(&self, id: &str) -> Result<(), String> {
        let Some(at) = self.manager.at_version(id) else {
            return Ok(());
        };
        let running = self
            .log
            .catalog()
            .commands(id)
            .map_err(|e| e.to_string())?
            .iter()
            .filter(|c| c.state == "running")
            .map(|c| c.seq)
            .min()
            .unwrap_or(u64::MAX);
        let Some(todo) = self
            .commands_after(id, &at, running)
            .map_err(|e| e.to_string())?
        else {
            warn!(session = %id, version = %at, "the command log does not know the version recovered to: no command is run again");
            return Ok(());
        };
        let session = self
            .manager
            .get(id)
            .map_err(|e| drums_session::error_chain(&e))?;
        for c in &todo {
            let client = self
                .manager
                .guest_proxy(&session)
                .map_err(|e| drums_session::error_chain(&e))?;
            let _open = self.manager.guest_stream(id);
            let req = hyper::Request::builder()
                .method(hyper::Method::POST)
                .uri("/v1/exec")
                .header("host", "guest")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(bytes::Bytes::from(c.request.clone())))
                .map_err(|e| e.to_string())?;
            let resp = client.send(req).await.map_err(|e| e.to_string())?;
            let resp = client.check(resp).await.map_err(|e| e.to_string())?;
            // To its end: the command has run when its stream ends.
            resp.into_body()
                .collect()
                .await
                .map_err(|e| format!("command {}: {e}", c.seq))?;
        }
        if !todo.is_empty() {
            // They ran outside every turn the inspector watches.
            self.manager.changed_outside_turns(id);
        }
        info!(session = %id, version = %at, commands = todo.len(), "ran the commands since the version again");
        Ok(())
    }
}
