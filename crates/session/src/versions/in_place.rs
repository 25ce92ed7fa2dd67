//! A session back at one of its versions, under its own identity: `drums
//! rollback` of a live session, `drums recover` of one whose processes died
//! (and a restarted drumsd's recovery of them).

use drums_api::{SessionState, VersionState};
use std::time::Instant;

use drums_api::{Session, SessionVersion};
use drums_catalog::VersionRecord;
use tracing::{info, warn};

use super::api::to_api_version;
use crate::boot::{boot, Plan, Ready, Start, Upper};
use crate::manager::Manager;
use crate::{teardown, SessionError};

impl Manager {
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
        if rec.state != SessionState::Running {
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
        self.versions.engine().cancel_session(&rec.id).await;
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
        if rec.state != SessionState::Running {
            return Err(SessionError::Conflict(format!(
                "session {} is {}",
                rec.name, rec.state
            )));
        }
        self.versions.engine().cancel_session(&rec.id).await;
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
                v.state == VersionState::Done
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
        let held = self.checkpoints.reading(&target.id).await;
        let (_, m) = self.manifest(&target.id)?;
        if what == InPlace::Rollback {
            match self.files_back(rec, target, &m).await {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => {}
                Err(e) => warn!(
                    session = %rec.name,
                    "rollback in place failed, restoring with CRIU: {}",
                    crate::error_chain(&e)
                ),
            }
        }
        let limits = self.host.manifest_limits(&target.id, &m)?;
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
            .set_session_state(&rec.id, SessionState::Creating, None)?;
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
                Some(_) => Start::Cold {
                    last_pid: m.last_pid(),
                },
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
        self.versions.set_position(&rec.id, |p| {
            p.at = Some(target.id.clone());
            p.needs_full = false;
            p.restored = true;
        });
        info!(session = %rec.name, version = ?target.number, ms = t0.elapsed().as_millis() as u64, "{}", what.done());
        Ok(session)
    }

    /// A rollback that puts the target's files back in place, with no
    /// CRIU restore and no process touched, when the session's processes are
    /// still what the target's process artifact holds: every version from
    /// the target to the one the session is at shares that artifact, no turn
    /// since was left out of a version, no agent lives in the session (it
    /// would have to go back too), and the inspector saw its processes do
    /// nothing since (checked while they are frozen). `Ok(None)`: one of
    /// those does not hold, or the files are not all of a kind the overlay
    /// can be made to show exactly (crate::files_back); the caller restores
    /// with CRIU. An error part-way leaves the session half put back, and
    /// the caller's CRIU restore replaces all of it (docs/engine.md, "A
    /// files-only rollback in place").
    async fn files_back(
        &self,
        rec: &drums_catalog::SessionRecord,
        target: &VersionRecord,
        m: &drums_checkpoint::Manifest,
    ) -> Result<Option<Session>, SessionError> {
        let refused = |why: &str| {
            info!(session = %rec.name, version = ?target.number, "rollback: not in place ({why}): restoring it whole");
            Ok(None)
        };
        let Some(process_of) = m.process_of() else {
            return refused("the version has no processes");
        };
        if self.host.catalog.agent_of(&rec.id)?.is_some() {
            return refused("an agent lives in the session");
        }
        let at = self.versions.position(&rec.id);
        if at.needs_full {
            return refused("turns went by that no version holds");
        }
        let history: std::collections::HashMap<String, VersionRecord> = self
            .host
            .catalog
            .session_versions(&rec.id)?
            .into_iter()
            .map(|v| (v.id.clone(), v))
            .collect();
        let mut walk = at.at;
        loop {
            let Some(v) = walk.as_ref().and_then(|id| history.get(id)) else {
                return refused("the version is not one the session came through to where it is");
            };
            if v.process_of.as_deref() != Some(process_of) {
                return refused("the processes changed since the version");
            }
            if v.id == target.id {
                break;
            }
            walk = v.parent.clone();
        }
        let Some(init) = self.host.live_init(rec) else {
            return refused("its processes died");
        };
        let lower = self.resolve_image(&m.session.image)?.rootfs;
        let version = self.host.checkpoint_snapshot(m.files_of()).join("upper");
        let live = self.host.session_subvolume(&rec.id).join("upper");
        let cg = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id);
        let (inspector, name, host) = (self.inspector(), rec.name.clone(), self.host.clone());
        // On-disk owners of the session's layer, as its root shows them.
        let base = rec.id_base;
        let owner = move |disk: u32| match base {
            None => Some(disk),
            Some(b) => disk
                .checked_sub(crate::ids::DISK_BASE)
                .filter(|k| *k < crate::ids::RANGE)
                .map(|k| b + k),
        };
        let t0 = Instant::now();
        self.host
            .catalog
            .set_session_state(&rec.id, SessionState::Creating, None)?;
        let done = tokio::task::spawn_blocking(move || {
            let Some(pause) = inspector.freezing(&name)? else {
                return Ok(Err("the session is not inspected".to_owned()));
            };
            let frozen = match cg.freeze(drums_cgroup::FreezeMethod::V2) {
                Ok(f) => f,
                Err(e) => {
                    let _ = inspector.thawed(&name, pause);
                    return Err(e.into());
                }
            };
            let put = (|| -> Result<Result<usize, String>, SessionError> {
                if let Err(why) = inspector.still(&name, &pause)? {
                    return Ok(Err(why));
                }
                let steps = match crate::files_back::plan(&version, &live, &lower) {
                    Ok(s) => s,
                    Err(r) => return Ok(Err(r.0)),
                };
                let root_path = format!("/proc/{init}/root");
                let root = std::fs::File::open(&root_path).map_err(|source| SessionError::Io {
                    op: "open the session's root",
                    path: root_path.into(),
                    source,
                })?;
                let apply = |steps: &[crate::files_back::Step]| {
                    crate::files_back::apply(std::os::fd::AsFd::as_fd(&root), steps, owner).map_err(
                        |(path, source)| SessionError::Io {
                            op: "put back a file of the version",
                            path,
                            source,
                        },
                    )
                };
                let (first, rest) = steps.split_at(steps.len() / 2);
                apply(first)?;
                host.faults.check("rollback.files")?;
                apply(rest)?;
                inspector.files_put_back(&name);
                Ok(Ok(steps.len()))
            })();
            let thawed = frozen.thaw();
            if let Err(e) = inspector.thawed(&name, pause) {
                warn!("inspector: {name} was thawed: {e}");
            }
            thawed?;
            put
        })
        .await
        .expect("a rollback in place does not panic");
        let steps = match done {
            Ok(Ok(n)) => n,
            Ok(Err(why)) => {
                self.host
                    .catalog
                    .set_session_state(&rec.id, SessionState::Running, None)?;
                return refused(&why);
            }
            Err(e) => return Err(e),
        };
        self.host
            .catalog
            .set_session_state(&rec.id, SessionState::Running, None)?;
        self.versions.set_position(&rec.id, |p| {
            p.at = Some(target.id.clone());
            p.needs_full = false;
            p.restored = true;
        });
        info!(session = %rec.name, version = ?target.number, steps, ms = t0.elapsed().as_millis() as u64, "rolled back in place: files put back, processes untouched");
        Ok(Some(self.get(&rec.id)?))
    }

    /// The version session `id` was rolled back or recovered to, once: the
    /// coordinator asks at each of its agent's requests.
    pub fn take_restored(&self, id: &str) -> Option<String> {
        self.versions.take_restored(id)
    }

    /// The version session `id` is at: its newest, or the one it was
    /// rolled back or recovered to.
    pub fn at_version(&self, id: &str) -> Option<String> {
        self.versions.position(id).at
    }

    /// Whether a running session's processes died (its init is gone): what
    /// `drums recover` is for.
    pub fn processes_died(&self, id_or_name: &str) -> Result<bool, SessionError> {
        let rec = self.host.record(id_or_name)?;
        Ok(rec.state == SessionState::Running && self.host.live_init(&rec).is_none())
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
        if rec.state != SessionState::Running || self.host.live_init(&rec).is_none() {
            return Err(SessionError::Conflict(format!(
                "session {} is {}: only a running session rolls back",
                rec.name, rec.state
            )));
        }
        let target = self.version_of(&rec, to)?;
        let (_, m) = self.manifest(&target.id)?;
        // A light version starts cold, as its processes were: no caller
        // alive now was in it, as with a CRIU restore.
        if !m.is_light() {
            crate::restore::process_artifact(&m)?;
        }
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
                let at = self.versions.position(&rec.id).at;
                history
                    .iter()
                    .rev()
                    .find(|v| {
                        v.state == VersionState::Done
                            && (at.is_none() || at.as_deref() == Some(&v.id))
                    })
                    .or_else(|| history.iter().rev().find(|v| v.state == VersionState::Done))
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
            (Some(v), _) if v.state != VersionState::Done => Err(SessionError::Conflict(format!(
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
