//! Versions of a session: what a turn's end takes ([`policy`]), the job that
//! takes and publishes it ([`job`]), turn ends ([`turn`]), retention
//! ([`retention`]), rollback and recovery ([`in_place`]), and the API's view
//! ([`api`]). The scheduling is drums_engine's; the row type and lifecycle
//! are drums_catalog's versions module. A named checkpoint is a pinned full
//! version made by the same code (see crate::checkpoint). The rules are
//! written down in docs/engine.md.

mod api;
mod in_place;
mod job;
mod light;
mod policy;
mod retention;
mod turn;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

pub(crate) use job::{outcome, JobClass, VersionJob};
pub(crate) use light::{last_pid, DrumsOwn};
pub(crate) use policy::held_paths;
pub use policy::{pair, wanted, Changed};

use crate::SessionError;

/// Versions of a session that retention keeps besides pinned ones and those
/// whose artifacts a kept version uses.
pub const DEFAULT_KEEP: usize = 8;

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
    /// Its versions are copied to another host, as archives (a replication
    /// gate is on): none is taken light, since an archive carries processes.
    pub exported: bool,
}

/// The versions subsystem's own state: the engine that takes every version
/// of every session, where each session stands, the retention passes
/// running, and the budget of versions each session's turn ends may take.
pub(crate) struct Versions {
    engine: drums_engine::Scheduler<VersionJob>,
    positions: Mutex<HashMap<String, Position>>,
    /// Sessions whose old versions are being dropped right now.
    retaining: Mutex<HashSet<String>>,
    /// Per session: the versions its turn ends took lately.
    budget: crate::budget::Budget,
}

impl Versions {
    pub(crate) fn new(
        turn_versions_per_minute: u32,
        workers: Option<usize>,
    ) -> Result<Versions, SessionError> {
        let config = workers.map_or_else(
            drums_engine::Config::default,
            drums_engine::Config::with_workers,
        );
        Ok(Versions {
            engine: drums_engine::Scheduler::new(config)?,
            positions: Default::default(),
            retaining: Default::default(),
            budget: crate::budget::Budget::per_minute(turn_versions_per_minute),
        })
    }

    /// The host's checkpoint scheduler.
    pub(crate) fn engine(&self) -> &drums_engine::Scheduler<VersionJob> {
        &self.engine
    }

    pub(crate) fn budget(&self) -> &crate::budget::Budget {
        &self.budget
    }

    pub(crate) fn position(&self, session_id: &str) -> Position {
        self.positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn set_position(&self, session_id: &str, f: impl FnOnce(&mut Position)) {
        let mut all = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(session_id.to_owned()).or_default());
    }

    /// A removed session's position goes with it.
    pub(crate) fn forget(&self, session_id: &str) {
        self.positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
    }

    /// The version session `id` was rolled back or recovered to, once.
    pub(crate) fn take_restored(&self, id: &str) -> Option<String> {
        let mut all = self.positions.lock().unwrap_or_else(|p| p.into_inner());
        let p = all.get_mut(id)?;
        std::mem::take(&mut p.restored)
            .then(|| p.at.clone())
            .flatten()
    }

    /// Mark session `id` as having a retention pass running; `false` if one
    /// already runs. [`Versions::retained`] ends it.
    pub(crate) fn retaining(&self, id: &str) -> bool {
        self.retaining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned())
    }

    pub(crate) fn retained(&self, id: &str) {
        self.retaining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}
