//! One version to take, as the engine schedules it: a turn's end, a base
//! version or a person's checkpoint. The engine runs it through the narrow
//! [`TakeVersion`] trait, never the manager: what it needs is the one call
//! that takes a version.

use drums_api::VersionState;
use std::sync::{Arc, Weak};

use drums_api::{Policy, TurnClass};
use drums_catalog::VersionRecord;
use drums_checkpoint::{Manifest, Took, VersionInfo};
use drums_engine::{Failure, Finished};
use futures::future::BoxFuture;
use tracing::{info, warn};

use super::policy::{pair, Changed};

/// Why a light version took what it took, as `drums versions` shows it.
const LIGHT: &str = "only drums' own processes run: files alone, and a recovery to it starts the session cold on them";
use crate::create::random_hex;
use crate::manager::Manager;
use crate::{teardown, SessionError};

/// What a version is taken for: its manifest records it as text
/// ([`JobClass::as_str`]), the engine merges it as this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobClass {
    /// A turn's end, of the class its effects have.
    Turn(TurnClass),
    /// The first version of a session, as its agent's first model request
    /// arrives.
    Base,
    /// A person's checkpoint, or jobs of different kinds merged.
    Manual,
}

impl JobClass {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobClass::Turn(c) => c.as_str(),
            JobClass::Base => "base",
            JobClass::Manual => "manual",
        }
    }

    /// The class of a job that covers both `self` and `other`: two turns'
    /// changes together, or `manual` for anything else.
    fn union(self, other: JobClass) -> JobClass {
        match (self, other) {
            (JobClass::Turn(x), JobClass::Turn(y)) => JobClass::Turn(TurnClass::of(
                x.files() || y.files(),
                x.processes() || y.processes(),
            )),
            _ => JobClass::Manual,
        }
    }
}

/// What a version job needs of drumsd: the one call that takes a version.
/// The engine holds jobs, and a job holds this weakly, so a queued job
/// never keeps a stopping daemon alive.
pub(crate) trait TakeVersion: Send + Sync {
    fn take_version(
        self: Arc<Self>,
        job: VersionJob,
        worker: drums_engine::Worker,
    ) -> BoxFuture<'static, Result<Manifest, SessionError>>;
}

/// One version to take: a turn's end, or a person's checkpoint.
pub struct VersionJob {
    pub(crate) taker: Weak<dyn TakeVersion>,
    pub(crate) session_id: String,
    pub(crate) turn: Option<u64>,
    pub(crate) class: JobClass,
    pub(crate) policy: Policy,
    pub(crate) wanted: Took,
    pub(crate) changed: Changed,
    /// A checkpoint's name: pinned.
    pub(crate) name: Option<String>,
    pub(crate) clean: bool,
    pub(crate) leave_running: bool,
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
        self.class = self.class.union(newer.class);
        self.wanted = stronger(self.wanted, newer.wanted);
        if newer.policy != self.policy {
            self.policy = Policy::Full;
        }
        self.changed.extend(newer.changed);
        self.name = self.name.take().or(newer.name);
        self.clean |= newer.clean;
        self.leave_running &= newer.leave_running;
    }

    fn run(
        self,
        worker: drums_engine::Worker,
    ) -> BoxFuture<'static, Result<Arc<Manifest>, Arc<SessionError>>> {
        Box::pin(async move {
            let taker = self
                .taker
                .upgrade()
                .ok_or_else(|| Arc::new(SessionError::Invalid("drumsd is stopping".into())))?;
            taker
                .take_version(self, worker)
                .await
                .map(Arc::new)
                .map_err(Arc::new)
        })
    }
}

impl TakeVersion for Manager {
    fn take_version(
        self: Arc<Self>,
        job: VersionJob,
        worker: drums_engine::Worker,
    ) -> BoxFuture<'static, Result<Manifest, SessionError>> {
        Box::pin(async move { self.run_version_job(job, worker).await })
    }
}

/// The engine's outcome as the API's error.
pub(crate) fn outcome(o: drums_engine::Outcome<VersionJob>) -> Result<Arc<Manifest>, SessionError> {
    match o {
        Ok(Finished { output, .. }) => Ok(output),
        Err(Failure::Job { error, .. }) => Err(SessionError::Version(error)),
        Err(e) => Err(SessionError::VersionJob(e)),
    }
}

impl Manager {
    /// Take one version: decide what it takes, take it, write its manifest,
    /// publish it, and let retention go.
    /// A job's handle on drumsd: weak, so a queued job never keeps a
    /// stopping daemon alive.
    pub(crate) fn taker(self: &Arc<Self>) -> Weak<dyn TakeVersion> {
        let me: Weak<Manager> = Arc::downgrade(self);
        me
    }

    async fn run_version_job(
        self: &Arc<Self>,
        job: VersionJob,
        worker: drums_engine::Worker,
    ) -> Result<Manifest, SessionError> {
        let (rec, pid) = self.host.running(&job.session_id)?;
        let pos = self.versions.position(&rec.id);
        let head = match &pos.at {
            Some(at) => self.manifest(at).ok().map(|(_, m)| m),
            None => None,
        };
        let (mut took, mut reason) = pair(
            job.wanted,
            job.policy,
            head.as_ref(),
            &job.changed,
            pos.needs_full,
        );
        // A whole version of a selective session that runs only drums' own
        // processes is taken light (super::light); checked again frozen,
        // and once snapshotted.
        let candidate = took == Took::Full
            && job.policy == Policy::Selective
            && rec.profile == drums_api::Profile::Headless
            && job.name.is_none()
            && job.leave_running
            && !pos.exported;
        let mut own = None;
        if candidate {
            let pids = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id)
                .pids()
                .unwrap_or_default();
            let mine = super::DrumsOwn::new(&self.host.bin_dir, pid, 0);
            if mine.why_not(&pids).is_none() {
                match super::last_pid(pid).await {
                    Ok(last_pid) => own = Some(super::DrumsOwn { last_pid, ..mine }),
                    Err(why) => tracing::debug!(session = %rec.name, "not light: {why}"),
                }
            }
        }
        let light = own.is_some();
        if light {
            took = Took::Files;
            reason = Some(LIGHT.into());
        }
        let open = if took == Took::Files {
            0
        } else {
            self.guest_streams.settled(&rec.id).await
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
            state: VersionState::Dumping,
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
            light: own,
            clean: job.clean,
            leave_running: job.leave_running,
            head: head.clone(),
            info: VersionInfo {
                number: ver.number.unwrap_or(0),
                parent: pos.at.clone(),
                turn: job.turn,
                class: job.class.as_str().into(),
                policy: job.policy.as_str().into(),
                took,
                reason,
                files_of: id.clone(),
                process_of: None,
                held: Vec::new(),
                files: None,
                process: None,
                last_pid: None,
            },
        };
        match self
            .make_version(&rec, pid, &ver, &owner, plan, Some(worker))
            .await
        {
            Ok(m) => {
                let info = m.version.as_ref().expect("a version has its info");
                self.host.catalog.publish_version(
                    &id,
                    &serde_json::to_value(&m).expect("manifest serializes"),
                    &info.files_of,
                    info.process_of.as_deref(),
                    &owner,
                )?;
                self.versions.set_position(&rec.id, |p| {
                    p.at = Some(id.clone());
                    p.needs_full = false;
                });
                let cost = info.process.as_ref().or(info.files.as_ref());
                info!(
                    session = %rec.name,
                    version = info.number,
                    took = info.took.as_str(),
                    dump_ms = m.dump_ms,
                    frozen_ms = m.frozen_ms,
                    total_ms = cost.map_or(0.0, |c| c.total_ms),
                    "version done"
                );
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
                self.versions.set_position(&rec.id, |p| p.needs_full = true);
                self.host
                    .catalog
                    .set_version_state(&id, VersionState::Failed)?;
                if let Err(t) = teardown::remove_owned(&self.host, &owner).await {
                    warn!("clean up failed version {id}: {}", crate::error_chain(&t));
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_jobs_cover_both_turns() {
        use JobClass::*;
        let turn = |c: &str| Turn(c.parse().unwrap());
        assert_eq!(turn("files").union(turn("processes")), turn("both"));
        assert_eq!(turn("none").union(turn("files")), turn("files"));
        assert_eq!(Manual.union(turn("files")), Manual);
        assert_eq!(Base.union(turn("files")), Manual);
        assert_eq!(Base.as_str(), "base");
        assert_eq!(turn("both").as_str(), "both");
        assert_eq!(stronger(Took::Files, Took::Process), Took::Full);
        assert_eq!(stronger(Took::Files, Took::Files), Took::Files);
    }
}
