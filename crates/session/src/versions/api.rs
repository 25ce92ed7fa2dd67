//! Versions and jobs as the API shows them.

use drums_api::{JobState, SessionVersion};
use drums_catalog::VersionRecord;
use drums_checkpoint::{ArtifactCost, Manifest};
use drums_engine::{Failure, Priority};

use super::job::outcome;
use crate::manager::Manager;
use crate::SessionError;

impl Manager {
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

    pub(super) fn api_version(&self, id: &str) -> Result<SessionVersion, SessionError> {
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
            let _ = self.versions.engine().wait(jid).await?;
        }
        let status = self.versions.engine().status(jid)?;
        let (state, priority) = match status {
            drums_engine::Status::Queued { priority, .. } => (JobState::Queued, priority),
            drums_engine::Status::Running => (JobState::Running, Priority::Normal),
            drums_engine::Status::Done => (JobState::Done, Priority::Normal),
            drums_engine::Status::Failed | drums_engine::Status::Cancelled => {
                (JobState::Failed, Priority::Normal)
            }
        };
        let mut job = drums_api::Job {
            id: id.to_owned(),
            state,
            priority: api_priority(priority),
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
            let o = self.versions.engine().wait(jid).await?;
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
                job.started_as = Some(api_priority(mx.priority_when_started));
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
        self.versions.engine().promote(jid)?;
        self.job(id, false).await
    }
}

fn api_priority(p: Priority) -> drums_api::Priority {
    match p {
        Priority::High => drums_api::Priority::High,
        Priority::Normal => drums_api::Priority::Normal,
    }
}

pub(crate) fn to_api_version(v: &VersionRecord) -> SessionVersion {
    let m: Option<Manifest> = serde_json::from_value(v.manifest.clone()).ok();
    let info = m.as_ref().and_then(|m| m.version.clone());
    let cost = |c: Option<ArtifactCost>| {
        c.map(|c| drums_api::ArtifactCost {
            bytes: c.bytes,
            shared_bytes: c.shared_bytes,
            frozen_ms: c.frozen_ms,
            total_ms: c.total_ms,
        })
    };
    SessionVersion {
        id: v.id.clone(),
        session_id: v.session_id.clone(),
        number: v.number.unwrap_or(0),
        state: v.state,
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
