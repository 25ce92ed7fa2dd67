//! Turn boundaries: the session side of the inspector (drums_inspect), which
//! the API's turn routes, the coordinator and `drums inspect` call.

use drums_api::{AgentMarked, TurnBegun, TurnEffects};
use drums_inspect::Target;

use crate::{Manager, SessionError};

/// What `GET /v1/sessions/{session}/turns` streams.
#[derive(Debug, Clone)]
pub enum TurnNews {
    Ended(Box<TurnEffects>),
    /// The coordinator answered a model call of the session.
    Coordinated(Box<drums_api::CoordinatedTurn>),
    /// The session was removed: its stream ends.
    Gone(String),
    /// The daemon is shutting down: every stream ends, so that the server's
    /// graceful shutdown is not held open by a follower.
    Closing,
}

/// The depth of session cgroups in the unified hierarchy: the parent's
/// components, plus the session's own.
pub fn session_level(cgroup_parent: &str) -> u32 {
    cgroup_parent.split('/').filter(|c| !c.is_empty()).count() as u32 + 1
}

/// The inspector, which loads its eBPF programs with the first inspected
/// session, and the news of turns it tells every `turns` stream.
pub(crate) struct Turns {
    inspector: drums_inspect::Inspector,
    news: tokio::sync::broadcast::Sender<TurnNews>,
}

impl Turns {
    pub(crate) fn new(cgroup_parent: &str) -> Turns {
        Turns {
            inspector: drums_inspect::Inspector::new(session_level(cgroup_parent)),
            news: tokio::sync::broadcast::channel(256).0,
        }
    }
}

impl Manager {
    fn inspect_target(&self, id_or_name: &str) -> Result<Target, SessionError> {
        let (rec, pid) = self.host.running(id_or_name)?;
        let cgroup = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id);
        let (Some(cgroup_id), Some(cgroup_dir)) = (cgroup.id(), cgroup.v2_dir()) else {
            return Err(SessionError::Invalid(format!(
                "session {} has no cgroup in the unified (v2) hierarchy, which the inspector attributes events by",
                rec.name
            )));
        };
        Ok(Target {
            session: rec.name,
            cgroup_id,
            cgroup_dir: cgroup_dir.to_owned(),
            root_pid: pid,
            subvolume: Some(self.host.store_root.join("sessions").join(&rec.id)),
            // drums' own directory: the init's log, the guest's socket, the
            // Python reseed registrations (bound to their processes' lives).
            ignore: vec!["/run/drums/".to_owned()],
        })
    }

    /// Begin a turn; the first one starts inspecting the session.
    pub fn turn_begin(&self, id_or_name: &str) -> Result<TurnBegun, SessionError> {
        let target = self.inspect_target(id_or_name)?;
        let turn = self.turns.inspector.turn_begin(&target)?;
        Ok(TurnBegun {
            session: target.session,
            turn,
        })
    }

    /// Begin the next turn of session `id`, named `name` (both from a record
    /// the caller read), if the inspector watches it already: no catalog
    /// read and no blocking, which the coordinator does at every model
    /// call's answer. `None` if it is not watched (or no longer as that
    /// session), and the caller takes [`Manager::turn_begin`].
    pub fn turn_begin_watched(
        &self,
        id: &str,
        name: &str,
    ) -> Option<Result<TurnBegun, SessionError>> {
        let cgroup = self.cgroup(id);
        let begun = self
            .turns
            .inspector
            .turn_begin_watched(name, cgroup.v2_dir()?)?;
        Some(
            begun
                .map(|turn| TurnBegun {
                    session: name.to_owned(),
                    turn,
                })
                .map_err(SessionError::from),
        )
    }

    /// End the open turn: what it changed, also sent to every `turns` stream.
    pub fn turn_end(&self, id_or_name: &str) -> Result<TurnEffects, SessionError> {
        let rec = self.host.record(id_or_name)?;
        self.turn_end_of(&rec.id, &rec.name)
    }

    /// [`Manager::turn_end`] of session `id`, named `name`, from a record
    /// the caller read: the session is looked up again only if the
    /// inspector does not watch it as that session.
    pub(crate) fn turn_end_of(&self, id: &str, name: &str) -> Result<TurnEffects, SessionError> {
        let cgroup = self.cgroup(id);
        let ended = cgroup
            .v2_dir()
            .and_then(|dir| self.turns.inspector.turn_end_watched(name, dir));
        let effects = match ended {
            Some(ended) => ended?,
            // Not watched (no turn: the inspector says so), or the name
            // is another session's now (this one is gone: the catalog
            // says so).
            None => {
                let rec = self.host.record(id)?;
                self.turns.inspector.turn_end(&rec.name)?
            }
        };
        let _ = self
            .turns
            .news
            .send(TurnNews::Ended(Box::new(effects.clone())));
        Ok(effects)
    }

    /// Exclude an agent living in the session (its pid there) from process
    /// tracking.
    pub fn mark_agent(&self, id_or_name: &str, pid: i32) -> Result<AgentMarked, SessionError> {
        let target = self.inspect_target(id_or_name)?;
        let pids = self.turns.inspector.mark_agent(&target, pid)?;
        Ok(AgentMarked {
            session: target.session,
            pids,
        })
    }

    /// The host pids of session `id`'s processes (its cgroup's): where the
    /// coordinator looks for the agent that holds a connection.
    pub fn session_pids(&self, id: &str) -> Result<Vec<i32>, SessionError> {
        Ok(self.cgroup(id).pids()?)
    }

    /// How many processes the OOM killer killed in session `id` (its
    /// cgroup's count; `None` where the kernel keeps none).
    pub fn oom_kills(&self, id: &str) -> Option<u64> {
        self.cgroup(id).oom_kills()
    }

    /// Kill every process left of session `id`, so that a recovery brings
    /// it back whole from its version (after the OOM killer killed in it).
    pub fn kill_processes(&self, id: &str) -> Result<(), SessionError> {
        Ok(self.cgroup(id).kill_all()?)
    }

    fn cgroup(&self, id: &str) -> drums_cgroup::Cgroup {
        drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, id)
    }

    /// The session's open turn, if one is.
    pub fn open_turn(&self, id_or_name: &str) -> Option<u64> {
        let rec = self.host.record(id_or_name).ok()?;
        self.turns.inspector.open_turn(&rec.name)
    }

    /// Stop inspecting a session (its programs unload with the last one).
    pub fn stop_inspecting(&self, id_or_name: &str) -> Result<(), SessionError> {
        let rec = self.host.record(id_or_name)?;
        self.turns.inspector.unwatch(&rec.name);
        Ok(())
    }

    /// The coordinator's record of a request, to every `turns` stream.
    pub fn publish_coordinated(&self, record: drums_api::CoordinatedTurn) {
        let _ = self
            .turns
            .news
            .send(TurnNews::Coordinated(Box::new(record)));
    }

    pub fn subscribe_turns(&self) -> tokio::sync::broadcast::Receiver<TurnNews> {
        self.turns.news.subscribe()
    }

    /// End every turns stream: the daemon is stopping.
    pub fn end_turn_streams(&self) {
        let _ = self.turns.news.send(TurnNews::Closing);
    }

    /// A session is going away: stop inspecting it and end its streams.
    pub(crate) fn forget_turns(&self, name: &str) {
        self.turns.inspector.unwatch(name);
        let _ = self.turns.news.send(TurnNews::Gone(name.to_owned()));
    }

    /// A checkpoint is about to dump the session: what CRIU does inside its
    /// processes is not theirs (see drums_inspect::Inspector::set_aside).
    pub(crate) fn inspect_set_aside(&self, name: &str) -> bool {
        self.turns.inspector.set_aside(name).unwrap_or_else(|e| {
            tracing::warn!("inspector: set {name}'s events aside: {e}");
            false
        })
    }

    /// CRIU has resumed the session after a dump that left it running.
    pub(crate) fn inspect_resumed(&self, name: &str) {
        if let Err(e) = self.turns.inspector.resumed(name) {
            tracing::warn!("inspector: {name}: {e}");
        }
    }

    /// The checkpoint failed: the session's next turn reports both kinds of
    /// change, since the inspector cannot tell what it set aside.
    pub(crate) fn inspect_checkpoint_failed(&self, name: &str) {
        if let Err(e) = self.turns.inspector.checkpoint_failed(name) {
            tracing::warn!("inspector: {name}: {e}");
        }
    }

    /// For the dump's post-dump callback, which runs on a blocking thread
    /// while the session is still frozen.
    pub(crate) fn inspector(&self) -> drums_inspect::Inspector {
        self.turns.inspector.clone()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn session_levels() {
        assert_eq!(super::session_level("drums"), 2);
        assert_eq!(super::session_level("a/b/"), 3);
    }
}
