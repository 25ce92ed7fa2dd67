//! A turn's end: its effects from the inspector, the version its policy
//! and its session's budget call for, and the base version an agent's first
//! model request takes.

use std::sync::Arc;

use drums_api::{Policy, TurnClass, TurnEffects};
use drums_checkpoint::Took;
use drums_engine::Priority;
use tracing::debug;

use super::job::{outcome, VersionJob};
use super::policy::{wanted, Changed};
use crate::manager::Manager;
use crate::SessionError;

impl Manager {
    /// Session `id`'s versions are copied to another host as archives
    /// (`on`), or no longer: while they are, each is taken whole, never
    /// light (super::light), since an archive carries processes.
    pub fn versions_exported(&self, id: &str, on: bool) {
        self.versions.set_position(id, |p| p.exported = on);
    }

    /// Session `id` changed outside every turn the inspector watched (the
    /// commands an agent outside had run since the version it was
    /// recovered to, run again): its next version is full, since no turn's
    /// effects name what changed.
    pub fn changed_outside_turns(&self, id: &str) {
        self.versions.set_position(id, |p| p.needs_full = true);
    }

    /// End the open turn and, when asked, take the version its effects call
    /// for (in the background unless `wait`).
    pub async fn end_turn(
        self: &Arc<Self>,
        id_or_name: &str,
        req: &drums_api::EndTurn,
    ) -> Result<TurnEffects, SessionError> {
        let rec = self.host.record(id_or_name)?;
        self.end_turn_as(&rec.id, &rec.name, req, false).await
    }

    /// [`Manager::end_turn`] for a model call through the proxy, of session
    /// `id` named `name` (from the record the coordinator read for the
    /// call, which this does not read again): the session's calls set the
    /// pace, so its versions are held to its budget
    /// (`--turn-versions-per-minute`). A turn end asked for through the API
    /// is the host's, and is not.
    pub async fn end_model_turn(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        req: &drums_api::EndTurn,
    ) -> Result<TurnEffects, SessionError> {
        self.end_turn_as(id, name, req, true).await
    }

    async fn end_turn_as(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        req: &drums_api::EndTurn,
        budgeted: bool,
    ) -> Result<TurnEffects, SessionError> {
        // The inspector's maps are read on a blocking thread: many sessions
        // ending turns at once must not stall the runtime's workers.
        let (me, owned_id, owned_name) = (self.clone(), id.to_owned(), name.to_owned());
        let mut effects =
            tokio::task::spawn_blocking(move || me.turn_end_of(&owned_id, &owned_name))
                .await
                .expect("turn end does not panic")?;
        if !req.checkpoint {
            if effects.class != TurnClass::None {
                // What this turn changed is in no version: the next one must
                // be whole, and no version before it pairs with what is now.
                self.versions.set_position(id, |p| p.needs_full = true);
            }
            return Ok(effects);
        }
        let policy = req.policy.unwrap_or_default();
        let want = wanted(policy, effects.class);
        let mut ck = drums_api::TurnCheckpoint {
            decision: want.map_or("none", Took::as_str).into(),
            job: None,
            version: None,
        };
        let Some(want) = want else {
            if policy == Policy::Off && effects.class != TurnClass::None {
                // What this turn changed is in no version: the next one must
                // be whole.
                self.versions.set_position(id, |p| p.needs_full = true);
            }
            effects.checkpoint = Some(ck);
            return Ok(effects);
        };
        // A session's turn ends come as fast as it makes model calls: past
        // its budget a turn end takes no version, and what it changed goes
        // into the next one, whole (a recovery meanwhile goes back to the
        // version before and runs the turns since again).
        let granted = match budgeted {
            true => self.versions.budget().take(id, std::time::Instant::now()),
            false => Ok(()),
        };
        if let Err(wait) = granted {
            debug!(
                session = %name,
                turn = effects.turn,
                retry_in = ?wait,
                "the session's turn ends are over their budget of versions (--turn-versions-per-minute): this one takes none"
            );
            self.versions.set_position(id, |p| p.needs_full = true);
            ck.decision = "over_budget".into();
            effects.checkpoint = Some(ck);
            return Ok(effects);
        }
        let job = VersionJob {
            taker: self.taker(),
            session_id: id.to_owned(),
            turn: Some(effects.turn),
            class: super::JobClass::Turn(effects.class),
            policy,
            wanted: want,
            changed: Changed::of(&effects),
            name: None,
            clean: false,
            leave_running: true,
        };
        let submitted = match self.versions.engine().submit(job, Priority::Normal).await {
            Ok(s) => s,
            Err(e) => {
                // This turn's changes are in no version now.
                self.versions.set_position(id, |p| p.needs_full = true);
                return Err(e.into());
            }
        };
        ck.job = Some(submitted.id.to_string());
        if req.wait {
            let m = outcome(self.versions.engine().wait(submitted.id).await?)?;
            ck.version = Some(self.api_version(&m.id)?);
        }
        effects.checkpoint = Some(ck);
        Ok(effects)
    }

    /// The first version of a session that has none, taken as its agent's
    /// first model request arrives: what a failure before any turn
    /// changed something recovers to (the task's files and processes as
    /// the agent found them). Returns its job, or none if the session has
    /// a version already or `policy` takes none.
    pub async fn base_version(
        self: &Arc<Self>,
        id_or_name: &str,
        policy: Policy,
    ) -> Result<Option<String>, SessionError> {
        let wanted = match policy {
            Policy::Off => return Ok(None),
            Policy::Files => Took::Files,
            Policy::Selective | Policy::Full => Took::Full,
        };
        let rec = self.host.record(id_or_name)?;
        if !self.host.catalog.session_versions(&rec.id)?.is_empty() {
            return Ok(None);
        }
        let job = VersionJob {
            taker: self.taker(),
            session_id: rec.id.clone(),
            turn: None,
            class: super::JobClass::Base,
            policy,
            wanted,
            changed: Changed::default(),
            name: None,
            clean: false,
            leave_running: true,
        };
        let submitted = self.versions.engine().submit(job, Priority::Normal).await?;
        Ok(Some(submitted.id.to_string()))
    }
}
