//! Versions of a session: what a turn's end takes, when a selective artifact
//! may pair with the other kind from an earlier version, how a version is
//! made and published, retention, and rollback. The scheduling is
//! drums_engine's; the row type and lifecycle are drums_catalog's versions
//! module. A named checkpoint is a pinned full version made by the same code
//! (see crate::checkpoint). The rules are written down in docs/engine.md.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use drums_api::{Policy, Session, SessionVersion, TurnClass, TurnEffects};
use drums_catalog::{ResourceKind, VersionRecord};
use drums_checkpoint::{ArtifactCost, Manifest, Took, VersionInfo};
use drums_engine::{Failure, Finished, Priority};
use futures::future::BoxFuture;
use tracing::{debug, info, warn};

use crate::boot::{boot, Plan, Ready, Start, Upper};
use crate::create::random_hex;
use crate::manager::Manager;
use crate::{teardown, SessionError};

/// Versions of a session that retention keeps besides pinned ones and those
/// whose artifacts a kept version uses.
pub const DEFAULT_KEEP: usize = 8;

/// What a policy asks for at a turn's end, before pairing; `None`: no
/// version, and the session's position does not move.
pub fn wanted(policy: Policy, class: TurnClass) -> Option<Took> {
    match policy {
        Policy::Off => None,
        Policy::Full => Some(Took::Full),
        Policy::Files => Some(Took::Files),
        Policy::Selective => match class {
            TurnClass::None => None,
            TurnClass::Files => Some(Took::Files),
            TurnClass::Processes => Some(Took::Process),
            TurnClass::Both => Some(Took::Full),
        },
    }
}

/// What changed in the turns a version covers, for the pairing check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// Paths as the session sees them.
    pub paths: Vec<String>,
    /// The inspector could not name everything (`unknown` changes).
    pub unknown: bool,
}

impl Changed {
    pub fn of(effects: &TurnEffects) -> Changed {
        Changed {
            paths: effects.files.iter().map(|f| f.path.clone()).collect(),
            unknown: effects.files.iter().any(|f| f.change == "unknown"),
        }
    }

    fn extend(&mut self, other: Changed) {
        self.paths.extend(other.paths);
        self.unknown |= other.unknown;
    }

    /// The first held path this change touches: the path itself, or a
    /// directory above it (renamed or removed).
    fn touches<'a>(&self, held: &'a [String]) -> Option<&'a str> {
        held.iter().map(String::as_str).find(|h| {
            self.paths.iter().any(|p| {
                let p = p.trim_end_matches('/');
                *h == p || h.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))
            })
        })
    }
}

/// What a version takes itself, and why, when that is more than `wanted`.
///
/// A files artifact pairs with the process artifact of the session's current
/// version (`head`) only when the processes of that artifact never saw the
/// files change under them: no turn since changed a file they held (open,
/// mapped, or as a directory), because CRIU refuses to restore an open file
/// whose size changed, and a process would read content it never wrote. A
/// turn in which a process also dirtied its memory is class `both`, so a
/// full version already. A process artifact pairs with the head's files
/// artifact: the files are as they were then, since every turn since was
/// covered by a version or changed nothing. When the session has no version
/// yet, its previous version failed, or turns went by without one
/// (`needs_full`), the version is full.
pub fn pair(
    wanted: Took,
    policy: Policy,
    head: Option<&Manifest>,
    changed: &Changed,
    needs_full: bool,
) -> (Took, Option<String>) {
    if wanted == Took::Full || policy == Policy::Files {
        return (wanted, None);
    }
    let full = |why: String| (Took::Full, Some(why));
    let Some(head) = head else {
        return full("the session has no version yet".into());
    };
    if needs_full {
        return full("a previous version failed or turns went by without one".into());
    }
    match wanted {
        Took::Files => {
            let Some(v) = &head.version else {
                return (Took::Files, None);
            };
            if v.process_of.is_none() {
                return full(format!(
                    "version {} has no process state to pair with",
                    v.number
                ));
            }
            if changed.unknown {
                return full("the turn changed files the inspector could not name".into());
            }
            match changed.touches(&v.held) {
                Some(h) => full(format!(
                    "the turn changed {h}, which a process held at version {}",
                    v.number
                )),
                None => (Took::Files, None),
            }
        }
        other => (other, None),
    }
}

/// Where a session stands in its history, in drumsd's memory: a restarted
/// daemon starts each session over with a full version (its inspector's
/// windows are gone too).
#[derive(Debug, Clone, Default)]
pub(crate) struct Position {
    /// The version the session is at: its newest, or the one it rolled back to.
    pub at: Option<String>,
    pub needs_full: bool,
    /// Rolled back or recovered to `at` since the coordinator last asked
    /// ([`Manager::take_restored`]): its agent, if one lives in it, is back
    /// at the request that version was taken in.
    pub restored: bool,
}

/// One version to take: a turn's end, or a person's checkpoint.
pub struct VersionJob {
    pub(crate) manager: Weak<Manager>,
    pub(crate) session_id: String,
    pub(crate) turn: Option<u64>,
    /// A turn class, or `manual`.
    pub(crate) class: String,
    pub(crate) policy: Policy,
    pub(crate) wanted: Took,
    pub(crate) changed: Changed,
    /// A checkpoint's name: pinned.
    pub(crate) name: Option<String>,
    pub(crate) clean: bool,
    pub(crate) leave_running: bool,
}

fn union(a: &str, b: &str) -> String {
    let parse = |s: &str| s.parse::<TurnClass>().ok();
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => TurnClass::of(x.files() || y.files(), x.processes() || y.processes())
            .as_str()
            .into(),
        _ => "manual".into(),
    }
}

fn stronger(a: Took, b: Took) -> Took {
    if a == b {
        a
    } else {
        Took::Full
    }
}

impl drums_engine::Job for VersionJob {
    type Output = Arc<Manifest>;
    type Error = Arc<SessionError>;

    fn session(&self) -> &str {
        &self.session_id
    }

    /// A queued job has not looked at the session yet, so it takes the newer
    /// turn's state: it covers both turns' changes and both requests.
    fn merge(&mut self, newer: VersionJob) {
        self.turn = newer.turn.or(self.turn);
        self.class = union(&self.class, &newer.class);
        self.wanted = stronger(self.wanted, newer.wanted);
        if newer.policy != self.policy {
            self.policy = Policy::Full;
        }
        self.changed.extend(newer.changed);
        self.name = self.name.take().or(newer.name);
        self.clean |= newer.clean;
        self.leave_running &= newer.leave_running;
    }

    fn run(self) -> BoxFuture<'static, Result<Arc<Manifest>, Arc<SessionError>>> {
        Box::pin(async move {
            let m = self
                .manager
                .upgrade()
                .ok_or_else(|| Arc::new(SessionError::Invalid("drumsd is stopping".into())))?;
            m.take_version(self).await.map(Arc::new).map_err(Arc::new)
        })
    }
}

/// The engine's outcome as the API's error.
pub(crate) fn outcome(o: drums_engine::Outcome<VersionJob>) -> Result<Arc<Manifest>, SessionError> {
    match o {
        Ok(Finished { output, .. }) => Ok(output),
        Err(Failure::Job { error, .. }) => Err(SessionError::Version(error)),
        Err(e) => Err(SessionError::Invalid(crate::error_chain(&e))),
    }
}

impl Manager {
    pub(crate) fn position(&self, session_id: &str) -> Position {
        self.positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .cloned()
            .unwrap_or_default()
    }

    fn set_position(&self, session_id: &str, f: impl FnOnce(&mut Position)) {
        let mut all = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(session_id.to_owned()).or_default());
    }

    /// Session `id` changed outside every turn the inspector watched (the
    /// commands an agent outside had run since the version it was
    /// recovered to, run again): its next version is full, since no turn's
    /// effects name what changed.
    pub fn changed_outside_turns(&self, id: &str) {
        self.set_position(id, |p| p.needs_full = true);
    }

    /// The session's history, oldest first.
    pub fn session_versions(&self, id_or_name: &str) -> Result<Vec<SessionVersion>, SessionError> {
        let rec = self.host.record(id_or_name)?;
        Ok(self
            .host
            .catalog
            .session_versions(&rec.id)?
            .iter()
            .map(to_api_version)
            .collect())
    }

    /// End the open turn and, when asked, take the version its effects call
    /// for (in the background unless `wait`).
    pub async fn end_turn(
        self: &Arc<Self>,
        id_or_name: &str,
        req: &drums_api::EndTurn,
    ) -> Result<TurnEffects, SessionError> {
        self.end_turn_as(id_or_name, req, false).await
    }

    /// [`Manager::end_turn`] for a model call through the proxy: the
    /// session's calls set the pace, so its versions are held to its budget
    /// (`--turn-versions-per-minute`). A turn end asked for through the API
    /// is the host's, and is not.
    pub async fn end_model_turn(
        self: &Arc<Self>,
        id_or_name: &str,
        req: &drums_api::EndTurn,
    ) -> Result<TurnEffects, SessionError> {
        self.end_turn_as(id_or_name, req, true).await
    }

    async fn end_turn_as(
        self: &Arc<Self>,
        id_or_name: &str,
        req: &drums_api::EndTurn,
        budgeted: bool,
    ) -> Result<TurnEffects, SessionError> {
        // The inspector's maps are read on a blocking thread: many sessions
        // ending turns at once must not stall the runtime's workers.
        let (me, id) = (self.clone(), id_or_name.to_owned());
        let mut effects = tokio::task::spawn_blocking(move || me.turn_end(&id))
            .await
            .expect("turn end does not panic")?;
        if !req.checkpoint {
            return Ok(effects);
        }
        let rec = self.host.record(id_or_name)?;
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
                self.set_position(&rec.id, |p| p.needs_full = true);
            }
            effects.checkpoint = Some(ck);
            return Ok(effects);
        };
        // A session's turn ends come as fast as it makes model calls: past
        // its budget a turn end takes no version, and what it changed goes
        // into the next one, whole (a recovery meanwhile goes back to the
        // version before and runs the turns since again).
        let granted = match budgeted {
            true => self.turn_versions.take(&rec.id, std::time::Instant::now()),
            false => Ok(()),
        };
        if let Err(wait) = granted {
            debug!(
                session = %rec.name,
                turn = effects.turn,
                retry_in = ?wait,
                "the session's turn ends are over their budget of versions (--turn-versions-per-minute): this one takes none"
            );
            self.set_position(&rec.id, |p| p.needs_full = true);
            ck.decision = "over_budget".into();
            effects.checkpoint = Some(ck);
            return Ok(effects);
        }
        let job = VersionJob {
            manager: Arc::downgrade(self),
            session_id: rec.id.clone(),
            turn: Some(effects.turn),
            class: effects.class.as_str().into(),
            policy,
            wanted: want,
            changed: Changed::of(&effects),
            name: None,
            clean: false,
            leave_running: true,
        };
        let submitted = match self.engine.submit(job, Priority::Normal).await {
            Ok(s) => s,
            Err(e) => {
                // This turn's changes are in no version now.
                self.set_position(&rec.id, |p| p.needs_full = true);
                return Err(e.into());
            }
        };
        ck.job = Some(submitted.id.to_string());
        if req.wait {
            let m = outcome(self.engine.wait(submitted.id).await?)?;
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
            manager: Arc::downgrade(self),
            session_id: rec.id.clone(),
            turn: None,
            class: "base".into(),
            policy,
            wanted,
            changed: Changed::default(),
            name: None,
            clean: false,
            leave_running: true,
        };
        let submitted = self.engine.submit(job, Priority::Normal).await?;
        Ok(Some(submitted.id.to_string()))
    }

    fn api_version(&self, id: &str) -> Result<SessionVersion, SessionError> {
        let v = self
            .host
            .catalog
            .version(id)?
            .ok_or_else(|| SessionError::CheckpointNotFound(id.to_owned()))?;
        Ok(to_api_version(&v))
    }

    /// `GET /v1/jobs/{job}`, waiting for it to finish with `wait`.
    pub async fn job(&self, id: &str, wait: bool) -> Result<drums_api::Job, SessionError> {
        let jid: drums_engine::JobId = id.parse()?;
        if wait {
            let _ = self.engine.wait(jid).await?;
        }
        let status = self.engine.status(jid)?;
        let (state, priority) = match status {
            drums_engine::Status::Queued { priority, .. } => ("queued", priority),
            drums_engine::Status::Running => ("running", Priority::Normal),
            drums_engine::Status::Done => ("done", Priority::Normal),
            drums_engine::Status::Failed | drums_engine::Status::Cancelled => {
                ("failed", Priority::Normal)
            }
        };
        let mut job = drums_api::Job {
            id: id.to_owned(),
            state: state.into(),
            priority: priority_str(priority).into(),
            version: None,
            error: None,
            queued_ms: None,
            ran_ms: None,
            started_as: None,
        };
        if matches!(
            status,
            drums_engine::Status::Done
                | drums_engine::Status::Failed
                | drums_engine::Status::Cancelled
        ) {
            let o = self.engine.wait(jid).await?;
            let metrics = match &o {
                Ok(f) => Some(f.metrics),
                Err(Failure::Job { metrics, .. } | Failure::Panicked { metrics, .. }) => {
                    Some(*metrics)
                }
                Err(Failure::Cancelled { .. }) => None,
            };
            if let Some(mx) = metrics {
                job.queued_ms = Some(mx.queued_for.as_secs_f64() * 1e3);
                job.ran_ms = Some(mx.ran_for.as_secs_f64() * 1e3);
                job.started_as = Some(priority_str(mx.priority_when_started).into());
            }
            match outcome(o) {
                Ok(m) => job.version = Some(m.id.clone()),
                Err(e) => job.error = Some(crate::error_chain(&e)),
            }
        }
        Ok(job)
    }

    /// `POST /v1/jobs/{job}/promote`: the caller now waits for it.
    pub async fn promote_job(&self, id: &str) -> Result<drums_api::Job, SessionError> {
        let jid: drums_engine::JobId = id.parse()?;
        self.engine.promote(jid)?;
        self.job(id, false).await
    }

    /// Take one version: decide what it takes, take it, write its manifest,
    /// publish it, and let retention go.
    pub(crate) async fn take_version(
        self: &Arc<Self>,
        job: VersionJob,
    ) -> Result<Manifest, SessionError> {
        let (rec, pid) = self.host.running(&job.session_id)?;
        let pos = self.position(&rec.id);
        let head = match &pos.at {
            Some(at) => self.manifest(at).ok().map(|(_, m)| m),
            None => None,
        };
        let (took, reason) = pair(
            job.wanted,
            job.policy,
            head.as_ref(),
            &job.changed,
            pos.needs_full,
        );
        let open = if took == Took::Files {
            0
        } else {
            self.settled_guest_streams(&rec.id).await
        };
        if open > 0 {
            // Refused before anything is made: CRIU would fail on the guest's
            // end of each such connection ("Unix socket … not found": its
            // peer is drumsd, outside the tree).
            return Err(SessionError::Conflict(format!(
                "session {} has {open} request(s) of drums exec or a file transfer still open: \
                 CRIU cannot checkpoint their connection to drumsd; checkpoint once they finish",
                rec.name
            )));
        }
        let id = random_hex(6);
        let ver = self.host.catalog.insert_version(&VersionRecord {
            id: id.clone(),
            name: job
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| id.clone()),
            session_id: rec.id.clone(),
            state: "dumping".into(),
            created_at_ms: drums_catalog::now_ms(),
            manifest: serde_json::Value::Null,
            number: Some(0),
            parent: pos.at.clone(),
            pinned: job.name.is_some(),
            files_of: None,
            process_of: None,
        })?;
        let owner = format!("ckpt:{id}");
        let plan = crate::checkpoint::Plan {
            took,
            clean: job.clean,
            leave_running: job.leave_running,
            head: head.clone(),
            info: VersionInfo {
                number: ver.number.unwrap_or(0),
                parent: pos.at.clone(),
                turn: job.turn,
                class: job.class.clone(),
                policy: job.policy.as_str().into(),
                took,
                reason,
                files_of: id.clone(),
                process_of: None,
                held: Vec::new(),
                files: None,
                process: None,
            },
        };
        match self.make_version(&rec, pid, &ver, &owner, plan).await {
            Ok(m) => {
                let info = m.version.as_ref().expect("a version has its info");
                self.host.catalog.publish_version(
                    &id,
                    &serde_json::to_value(&m).expect("manifest serializes"),
                    &info.files_of,
                    info.process_of.as_deref(),
                    &owner,
                )?;
                self.set_position(&rec.id, |p| {
                    p.at = Some(id.clone());
                    p.needs_full = false;
                });
                info!(session = %rec.name, version = info.number, took = took.as_str(), "version done");
                // Off the job: its waiter (an agent's held LLM answer) need
                // not wait for old versions' subvolumes to be deleted.
                let (me, sid, name) = (Arc::clone(self), rec.id.clone(), rec.name.clone());
                tokio::spawn(async move {
                    if let Err(e) = me.retain(&sid).await {
                        warn!("retention for {name}: {}", crate::error_chain(&e));
                    }
                });
                if !job.leave_running {
                    // CRIU killed the tree after dumping it; remove the rest.
                    self.remove_stopped(&rec).await?;
                }
                Ok(m)
            }
            Err(e) => {
                self.set_position(&rec.id, |p| p.needs_full = true);
                self.host.catalog.set_version_state(&id, "failed")?;
                if let Err(t) = teardown::remove_owned(&self.host, &owner).await {
                    warn!("clean up failed version {id}: {}", crate::error_chain(&t));
                }
                Err(e)
            }
        }
    }

    /// Retention: keep the newest [`DEFAULT_KEEP`] versions of the session,
    /// every pinned one, and the one it is at; drop the rest, and each
    /// artifact once no kept version uses it.
    pub(crate) async fn retain(&self, session_id: &str) -> Result<(), SessionError> {
        // One pass per session at a time: a pass that finds one running
        // leaves its work to the next version's pass, so at most one
        // version more than the limit stays meanwhile.
        if !self
            .retaining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session_id.to_owned())
        {
            return Ok(());
        }
        let r = self.retain_pass(session_id).await;
        self.retaining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
        r
    }

    async fn retain_pass(&self, session_id: &str) -> Result<(), SessionError> {
        let at = self.position(session_id).at;
        let all = self.host.catalog.session_versions(session_id)?;
        let finished: Vec<&VersionRecord> = all
            .iter()
            .filter(|v| !drums_catalog::IN_FLIGHT.contains(&v.state.as_str()))
            .collect();
        let cut = finished.len().saturating_sub(DEFAULT_KEEP);
        // A session with an agent living in it is recovered from its newest
        // version that dumped its processes itself (see `recover_record`):
        // that one stays, however many files versions came after it.
        let own = match self.host.catalog.agent_of(session_id)? {
            Some(_) => finished
                .iter()
                .rev()
                .find(|v| v.state == "done" && v.process_of.as_deref() == Some(v.id.as_str()))
                .map(|v| v.id.clone()),
            None => None,
        };
        for v in &finished[..cut] {
            if v.pinned || at.as_deref() == Some(&v.id) || own.as_deref() == Some(&v.id) {
                continue;
            }
            self.drop_version(v).await?;
        }
        Ok(())
    }

    /// Remove a version's row, then each artifact it took or used that no
    /// version uses any more.
    pub(crate) async fn drop_version(&self, v: &VersionRecord) -> Result<(), SessionError> {
        // Restores, rollbacks and recoveries of it finish first (see `busy`).
        let _held = self.busy_checkpoints.alone(&v.id).await;
        self.host.catalog.delete_version(&v.id)?;
        let mut owners: Vec<&str> = vec![&v.id];
        owners.extend(v.files_of.as_deref());
        owners.extend(v.process_of.as_deref());
        owners.sort();
        owners.dedup();
        for o in owners {
            if self.host.catalog.version(o)?.is_none() && self.host.catalog.artifact_users(o)? == 0
            {
                self.remove_artifacts(o).await?;
            }
        }
        Ok(())
    }

    /// Every unpinned version of a removed session goes with it.
    pub(crate) async fn drop_history(&self, session_id: &str) -> Result<(), SessionError> {
        for v in self.host.catalog.session_versions(session_id)? {
            if !v.pinned && !drums_catalog::IN_FLIGHT.contains(&v.state.as_str()) {
                self.drop_version(&v).await?;
            }
        }
        self.positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
        Ok(())
    }

    /// The directory (images, manifest) and snapshot a version took.
    async fn remove_artifacts(&self, id: &str) -> Result<(), SessionError> {
        let owner = format!("ckpt:{id}");
        self.host.catalog.record(
            &owner,
            ResourceKind::Dir,
            &self.host.checkpoint_dir(id).display().to_string(),
        )?;
        self.host.catalog.record(
            &owner,
            ResourceKind::Subvolume,
            &self.host.checkpoint_snapshot(id).display().to_string(),
        )?;
        teardown::remove_owned(&self.host, &owner).await
    }

    /// `drums rollback`: the same session (id, name, address, hostname, id
    /// range) continues from one of its versions. Its queued jobs are
    /// cancelled and a running one finishes first; the versions after the
    /// target stay until retention drops them, so a rollback can be undone.
    pub async fn rollback(
        &self,
        id_or_name: &str,
        to: Option<&str>,
    ) -> Result<Session, SessionError> {
        let rec = self.host.record(id_or_name)?;
        if rec.state != "running" {
            return Err(SessionError::Conflict(format!(
                "session {} is {}: only a running session rolls back",
                rec.name, rec.state
            )));
        }
        if self.host.live_init(&rec).is_none() {
            return Err(SessionError::Conflict(format!(
                "the processes of session {} died: `drums recover` brings back its newest version",
                rec.name
            )));
        }
        self.engine.cancel_session(&rec.id).await;
        let target = self.version_of(&rec, to)?;
        self.restore_in_place(&rec, &target, InPlace::Rollback)
            .await
    }

    /// `drums recover`: a session whose processes died comes back from its
    /// newest done version, under the same identity.
    pub async fn recover(&self, id_or_name: &str) -> Result<Session, SessionError> {
        let rec = self.host.record(id_or_name)?;
        if self.host.live_init(&rec).is_some() {
            return Err(SessionError::Conflict(format!(
                "session {} is running: `drums rollback` takes it back to a version",
                rec.name
            )));
        }
        if rec.state != "running" {
            return Err(SessionError::Conflict(format!(
                "session {} is {}",
                rec.name, rec.state
            )));
        }
        self.engine.cancel_session(&rec.id).await;
        self.recover_record(&rec).await
    }

    pub(crate) async fn recover_record(
        &self,
        rec: &drums_catalog::SessionRecord,
    ) -> Result<Session, SessionError> {
        // An agent living in the session is not tracked (the inspector's
        // agent marking): a version that took only files pairs them with
        // an older image of the agent, which would then redo its later
        // turns on files that already have them. Such a session comes back
        // from the newest version that dumped its processes itself, files
        // and agent of one moment, and the coordinator fast-forwards the
        // agent from there (docs/coordinator.md).
        let agent = self.host.catalog.agent_of(&rec.id)?.is_some();
        let newest = self
            .host
            .catalog
            .session_versions(&rec.id)?
            .into_iter()
            .rev()
            .find(|v| {
                v.state == "done"
                    && match &v.process_of {
                        Some(p) => !agent || p == &v.id,
                        // A files-only version (the files policy) starts
                        // cold on its files, which would lose such an agent.
                        None => !agent,
                    }
            })
            .ok_or_else(|| SessionError::NoDoneVersion {
                session: rec.name.clone(),
                purpose: "to recover from",
            })?;
        self.restore_in_place(rec, &newest, InPlace::Recover).await
    }

    /// Replace what session `rec` runs on with version `target`'s artifacts,
    /// keeping its catalog row (identity). On failure the session is removed
    /// with its unpinned versions, as `drums rm` would.
    async fn restore_in_place(
        &self,
        rec: &drums_catalog::SessionRecord,
        target: &VersionRecord,
        what: InPlace,
    ) -> Result<Session, SessionError> {
        // Retention or `checkpoint rm` waits until this has read the
        // version's artifacts (see `busy`); read under the lock.
        let held = self.busy_checkpoints.shared(&target.id).await;
        let (_, m) = self.manifest(&target.id)?;
        let limits = self
            .host
            .limits
            .from_manifest(&m.session.limits)
            .map_err(|source| SessionError::ManifestLimits {
                checkpoint: target.id.clone(),
                source,
            })?;
        let lower = self.resolve_image(&m.session.image)?.rootfs;
        // A files-only version (the files policy) has no processes: the
        // session starts cold on its files, as after a reboot.
        let cold = match m.process_of() {
            Some(_) => None,
            None => Some(crate::spec::Spec::of_version(&m.session, limits.clone())?),
        };
        let t0 = Instant::now();
        self.host
            .catalog
            .set_session_state(&rec.id, "creating", None)?;
        self.forget_turns(&rec.name);
        // Everything the session runs on goes; its catalog row (address, id
        // range, name) stays, and the version's artifacts come back under the
        // same identity. No hygiene: no clone of it is alive.
        // A live session's firewall port stays: the rebuilt one has the same
        // veth name, MAC and address. A dead one's may be gone with the
        // daemon that listed it.
        // (A cold start builds its network afresh, as a create does.)
        let keep_port = what == InPlace::Rollback && cold.is_none();
        if keep_port {
            teardown::remove_owned_keeping_port(&self.host, &rec.id).await?;
        } else {
            teardown::remove_owned(&self.host, &rec.id).await?;
        }
        let plan = Plan {
            limits: &limits,
            privileged: m.session.privileged,
            lower: &lower,
            upper: Upper::Snapshot(self.host.checkpoint_snapshot(m.files_of())),
            start: match &cold {
                None => Start::Restore {
                    manifest: &m,
                    kept_port: keep_port,
                },
                Some(_) => Start::Cold,
            },
            ready: match &cold {
                None => Ready::Same,
                Some(spec) => Ready::Fresh(spec.desktop.as_ref()),
            },
        };
        let built = boot(&self.host, rec, plan).await;
        let failed = built.is_err();
        let settled = self.settle(rec, built).await;
        // Before dropping versions below, which takes their locks alone.
        drop(held);
        let session = match settled {
            Ok(s) => s,
            Err(e) => {
                // The session is gone (settle removed what the rebuild
                // made): its history goes with it, as with `drums rm`.
                if failed {
                    if let Err(t) = self.drop_history(&rec.id).await {
                        warn!(
                            "drop the history of {}: {}",
                            rec.name,
                            crate::error_chain(&t)
                        );
                    }
                }
                return Err(e);
            }
        };
        self.set_position(&rec.id, |p| {
            p.at = Some(target.id.clone());
            p.needs_full = false;
            p.restored = true;
        });
        info!(session = %rec.name, version = ?target.number, ms = t0.elapsed().as_millis() as u64, "{}", what.done());
        Ok(session)
    }

    /// The version session `id` was rolled back or recovered to, once: the
    /// coordinator asks at each of its agent's requests.
    pub fn take_restored(&self, id: &str) -> Option<String> {
        let mut all = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        let p = all.get_mut(id)?;
        std::mem::take(&mut p.restored)
            .then(|| p.at.clone())
            .flatten()
    }

    /// The version session `id` is at: its newest, or the one it was
    /// rolled back or recovered to.
    pub fn at_version(&self, id: &str) -> Option<String> {
        self.position(id).at
    }

    /// Whether a running session's processes died (its init is gone): what
    /// `drums recover` is for.
    pub fn processes_died(&self, id_or_name: &str) -> Result<bool, SessionError> {
        let rec = self.host.record(id_or_name)?;
        Ok(rec.state == "running" && self.host.live_init(&rec).is_none())
    }

    /// `fork --at`: the id of a done version of the session.
    pub fn version_of_session(&self, id_or_name: &str, at: &str) -> Result<String, SessionError> {
        let rec = self.host.record(id_or_name)?;
        Ok(self.version_of(&rec, Some(at))?.id)
    }

    /// The version a rollback of the session to `to` would go to, refused
    /// as [`Manager::rollback`] would refuse it, without rolling back: for a
    /// caller that must answer before the rollback starts (drumsd's session
    /// API, whose caller the rollback replaces).
    pub fn rollback_target(
        &self,
        id_or_name: &str,
        to: Option<&str>,
    ) -> Result<SessionVersion, SessionError> {
        let rec = self.host.record(id_or_name)?;
        if rec.state != "running" || self.host.live_init(&rec).is_none() {
            return Err(SessionError::Conflict(format!(
                "session {} is {}: only a running session rolls back",
                rec.name, rec.state
            )));
        }
        let target = self.version_of(&rec, to)?;
        let (_, m) = self.manifest(&target.id)?;
        crate::restore::process_artifact(&m)?;
        Ok(to_api_version(&target))
    }

    /// A done version of `rec` by id, name or number; its position if none.
    fn version_of(
        &self,
        rec: &drums_catalog::SessionRecord,
        to: Option<&str>,
    ) -> Result<VersionRecord, SessionError> {
        let history = self.host.catalog.session_versions(&rec.id)?;
        let found = match to {
            None => {
                let at = self.position(&rec.id).at;
                history
                    .iter()
                    .rev()
                    .find(|v| v.state == "done" && (at.is_none() || at.as_deref() == Some(&v.id)))
                    .or_else(|| history.iter().rev().find(|v| v.state == "done"))
            }
            Some(t) => history
                .iter()
                .find(|v| v.id == t || v.name == t || v.number.is_some_and(|n| n.to_string() == t)),
        };
        match (found, to) {
            (None, Some(t)) => Err(SessionError::VersionNotFound {
                session: rec.name.clone(),
                version: t.to_owned(),
            }),
            (None, None) => Err(SessionError::NoDoneVersion {
                session: rec.name.clone(),
                purpose: "yet",
            }),
            (Some(v), _) if v.state != "done" => Err(SessionError::Conflict(format!(
                "version {} of session {} is {}, not done",
                v.number.unwrap_or(0),
                rec.name,
                v.state
            ))),
            (Some(v), _) => Ok(v.clone()),
        }
    }
}

/// What a restore in place is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InPlace {
    /// The session is live: `drums rollback`.
    Rollback,
    /// Its processes died: `drums recover`, or a restarted drumsd.
    Recover,
}

impl InPlace {
    fn done(self) -> &'static str {
        match self {
            InPlace::Rollback => "rolled back",
            InPlace::Recover => "recovered",
        }
    }
}

fn priority_str(p: Priority) -> &'static str {
    match p {
        Priority::High => "high",
        Priority::Normal => "normal",
    }
}

pub(crate) fn to_api_version(v: &VersionRecord) -> SessionVersion {
    let m: Option<Manifest> = serde_json::from_value(v.manifest.clone()).ok();
    let info = m.as_ref().and_then(|m| m.version.clone());
    let cost = |c: Option<ArtifactCost>| {
        c.map(|c| drums_api::ArtifactCost {
            bytes: c.bytes,
            frozen_ms: c.frozen_ms,
            total_ms: c.total_ms,
        })
    };
    SessionVersion {
        id: v.id.clone(),
        session_id: v.session_id.clone(),
        number: v.number.unwrap_or(0),
        state: v.state.clone(),
        pinned: v.pinned,
        name: v.name.clone(),
        parent: v.parent.clone(),
        turn: info.as_ref().and_then(|i| i.turn),
        class: info.as_ref().map_or_else(String::new, |i| i.class.clone()),
        policy: info.as_ref().map_or_else(String::new, |i| i.policy.clone()),
        took: info
            .as_ref()
            .map_or_else(String::new, |i| i.took.as_str().into()),
        reason: info.as_ref().and_then(|i| i.reason.clone()),
        files_of: v.files_of.clone(),
        process_of: v.process_of.clone(),
        files: cost(info.as_ref().and_then(|i| i.files)),
        process: cost(info.as_ref().and_then(|i| i.process)),
        created_at_ms: v.created_at_ms,
    }
}

/// The files the session's processes hold, as the session sees them: open
/// file descriptors, working directories and mapped files, read from /proc
/// while the tree is frozen. drums' own files (its binaries and /run/drums)
/// are not the session's.
pub(crate) fn held_paths(pids: &[i32]) -> Vec<String> {
    let mut out = Vec::new();
    let mut keep = |p: std::path::PathBuf| {
        let s = p.to_string_lossy().into_owned();
        if s.starts_with('/') && !s.starts_with("/run/drums/") && !s.starts_with("/dev/") {
            out.push(s.trim_end_matches(" (deleted)").to_owned());
        }
    };
    for pid in pids {
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        if let Ok(p) = std::fs::read_link(proc.join("cwd")) {
            keep(p);
        }
        if let Ok(rd) = std::fs::read_dir(proc.join("fd")) {
            for e in rd.flatten() {
                if let Ok(p) = std::fs::read_link(e.path()) {
                    keep(p);
                }
            }
        }
        if let Ok(maps) = std::fs::read_to_string(proc.join("maps")) {
            for line in maps.lines() {
                if let Some(path) = line.split_whitespace().nth(5) {
                    keep(path.into());
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Per-session positions, kept by the manager.
pub(crate) type Positions = std::sync::Mutex<HashMap<String, Position>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(process_of: Option<&str>, held: &[&str]) -> Manifest {
        let mut m: Manifest = serde_json::from_value(serde_json::json!({
            "format_version": 4, "id": "v1", "name": "v1", "created_at_ms": 1,
            "session": {"id": "s", "name": "s", "hostname": "s", "profile": "headless",
                "image": "default", "network": "none", "limits": {}, "generation": 0},
            "host": {"kernel": "k", "arch": "a", "cpu_vendor": "v", "cpu_family": "f",
                "cpu_flags": [], "criu_version": "c"},
            "clean": false, "leave_running": true, "images": [], "frozen_ms": 0.0, "dump_ms": 0.0
        }))
        .unwrap();
        m.version = Some(VersionInfo {
            number: 1,
            parent: None,
            turn: Some(1),
            class: "both".into(),
            policy: "selective".into(),
            took: Took::Full,
            reason: None,
            files_of: "v1".into(),
            process_of: process_of.map(str::to_owned),
            held: held.iter().map(|s| s.to_string()).collect(),
            files: None,
            process: None,
        });
        m
    }

    fn changed(paths: &[&str]) -> Changed {
        Changed {
            paths: paths.iter().map(|s| s.to_string()).collect(),
            unknown: false,
        }
    }

    #[test]
    fn each_policy_wants_what_it_says() {
        use TurnClass::*;
        let all = [None, Files, Processes, Both];
        let got: Vec<_> = all.iter().map(|c| wanted(Policy::Selective, *c)).collect();
        assert_eq!(
            got,
            vec![
                Option::None,
                Some(Took::Files),
                Some(Took::Process),
                Some(Took::Full)
            ]
        );
        for c in all {
            assert_eq!(wanted(Policy::Full, c), Some(Took::Full));
            assert_eq!(wanted(Policy::Files, c), Some(Took::Files));
            assert_eq!(wanted(Policy::Off, c), Option::None);
        }
    }

    #[test]
    fn a_files_artifact_pairs_unless_it_changed_a_held_file() {
        let head = manifest(Some("v1"), &["/data/log", "/srv/app/state.db"]);
        let ok = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/data/other"]),
            false,
        );
        assert_eq!(ok, (Took::Files, None));
        let (took, why) = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/data/log"]),
            false,
        );
        assert_eq!(took, Took::Full);
        assert!(why.unwrap().contains("/data/log"));
        // A directory above a held file, renamed or removed.
        let (took, _) = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/srv/app"]),
            false,
        );
        assert_eq!(took, Took::Full);
        // A sibling whose name merely starts the same is not above it.
        let ok = pair(
            Took::Files,
            Policy::Selective,
            Some(&head),
            &changed(&["/srv/ap"]),
            false,
        );
        assert_eq!(ok.0, Took::Files);
        let unknown = Changed {
            paths: vec![],
            unknown: true,
        };
        assert_eq!(
            pair(Took::Files, Policy::Selective, Some(&head), &unknown, false).0,
            Took::Full
        );
    }

    #[test]
    fn without_a_valid_head_a_version_is_full() {
        let head = manifest(Some("v1"), &[]);
        let none = changed(&[]);
        assert_eq!(
            pair(Took::Files, Policy::Selective, None, &none, false).0,
            Took::Full
        );
        assert_eq!(
            pair(Took::Process, Policy::Selective, None, &none, false).0,
            Took::Full
        );
        assert_eq!(
            pair(Took::Process, Policy::Selective, Some(&head), &none, true).0,
            Took::Full
        );
        assert_eq!(
            pair(Took::Process, Policy::Selective, Some(&head), &none, false),
            (Took::Process, None)
        );
        // A head without processes (the files policy) has none to pair with.
        let files_only = manifest(None, &[]);
        assert_eq!(
            pair(
                Took::Files,
                Policy::Selective,
                Some(&files_only),
                &none,
                false
            )
            .0,
            Took::Full
        );
        // The files policy never takes processes.
        assert_eq!(
            pair(Took::Files, Policy::Files, None, &none, true),
            (Took::Files, None)
        );
    }

    #[test]
    fn merged_jobs_cover_both_turns() {
        assert_eq!(union("files", "processes"), "both");
        assert_eq!(union("none", "files"), "files");
        assert_eq!(union("manual", "files"), "manual");
        assert_eq!(stronger(Took::Files, Took::Process), Took::Full);
        assert_eq!(stronger(Took::Files, Took::Files), Took::Files);
    }
}
