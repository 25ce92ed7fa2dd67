//! Retention: which versions a session keeps, and the removal of a version
//! and of each artifact no kept version uses.

use drums_api::VersionState;
use drums_catalog::{ResourceKind, VersionRecord};

use super::DEFAULT_KEEP;
use crate::manager::Manager;
use crate::{teardown, SessionError};

impl Manager {
    /// Retention: keep the newest [`DEFAULT_KEEP`] versions of the session,
    /// every pinned one, and the one it is at; drop the rest, and each
    /// artifact once no kept version uses it.
    pub(crate) async fn retain(&self, session_id: &str) -> Result<(), SessionError> {
        // One pass per session at a time: a pass that finds one running
        // leaves its work to the next version's pass, so at most one
        // version more than the limit stays meanwhile.
        if !self.versions.retaining(session_id) {
            return Ok(());
        }
        let r = self.retain_pass(session_id).await;
        self.versions.retained(session_id);
        r
    }

    async fn retain_pass(&self, session_id: &str) -> Result<(), SessionError> {
        let at = self.versions.position(session_id).at;
        let all = self.host.catalog.session_versions(session_id)?;
        let finished: Vec<&VersionRecord> = all.iter().filter(|v| !v.state.in_flight()).collect();
        let cut = finished.len().saturating_sub(DEFAULT_KEEP);
        // A session with an agent living in it is recovered from its newest
        // version that dumped its processes itself (see `recover_record`):
        // that one stays, however many files versions came after it.
        let own = match self.host.catalog.agent_of(session_id)? {
            Some(_) => finished
                .iter()
                .rev()
                .find(|v| {
                    v.state == VersionState::Done && v.process_of.as_deref() == Some(v.id.as_str())
                })
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
        let _held = self.checkpoints.removing(&v.id).await;
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
            if !v.pinned && !v.state.in_flight() {
                self.drop_version(&v).await?;
            }
        }
        self.versions.forget(session_id);
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
}
