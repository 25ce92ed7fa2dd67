//! The coordinator's watch over the sessions it coordinates: one whose
//! processes died (its init killed, so its pid namespace) or in whose cgroup
//! the OOM killer killed is recovered from its newest done version, under
//! the same identity, and carries on (docs/coordinator.md, "Failures").
//!
//! It polls: a session's init and its OOM count are two small reads of
//! `/proc` and the cgroup, and a tenth of a second is nothing next to a
//! model's turn; the catalog is read only when one of them changed. A restarted drumsd
//! recovers the sessions that died with the previous one at its start
//! (`Manager::open`), and this watch takes over from the catalog's list.
//!
//! An agent process that ends while its session lives is not a failure: it
//! is an agent that finished (without its exit status, which only its
//! parent in the session sees, a kill looks the same).
//!
//! The watch is one task for every session, so nothing a session can make
//! slow runs on it: the commands an agent outside ran since the version run
//! again in a task of the session's own (commands.rs), and one session's
//! recoveries in a row back off exponentially (the coordinator's
//! [`crate::Backoff`]), so a session that fails as soon as it is back
//! cannot keep drumsd restoring it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use drums_session::SessionError;
use tracing::{info, warn};

use crate::{Coordinator, Sessions};

/// How often sessions are looked at.
const EVERY: Duration = Duration::from_millis(100);

/// Ticks between reads of the list of coordinated sessions.
const LIST_EVERY: u64 = 10;

/// Recoveries in a row that fail, or that bring the session back to a
/// failure before its agent got one more answer, before the watch gives
/// the session up (until drumsd restarts, or `drums recover` by hand): an
/// agent whose own work runs out of memory would otherwise be brought back
/// into the same failure forever.
const TRIES: u32 = 3;

/// Sessions a restarted drumsd recovered at its start (their processes
/// died with the previous one): an agent outside has its commands since
/// the version run again, as after a recovery by the watch, each in a task
/// of its own with the same bounds.
pub(crate) fn restored_at_start<S: Sessions>(c: &Arc<Coordinator<S>>) {
    for (id, agent) in c.log.catalog().coordinated().unwrap_or_default() {
        if agent.is_none() && c.manager.take_restored(&id).is_some() {
            c.after_recovery(&id, c.recovering(&id));
        }
    }
}

pub(crate) async fn run<S: Sessions>(c: Weak<Coordinator<S>>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Per session: OOM kills seen in its cgroup; (log length at the last
    // recovery, recoveries since it grew).
    let mut ooms: HashMap<String, u64> = HashMap::new();
    let mut tries: HashMap<String, (u64, u32)> = HashMap::new();
    let mut given_up: HashSet<String> = HashSet::new();
    // Per session: its last recovery by this watch, and how many came in a
    // row before it (the backoff's streak).
    let mut last: HashMap<String, (Instant, u32)> = HashMap::new();
    // Sessions whose recovery (a task of its own) is under way.
    let recovering: Arc<Mutex<HashSet<String>>> = Arc::default();
    // Per session: its init as last seen (pid, start time), so that a tick
    // reads /proc, not the catalog, while all is well.
    let mut inits: HashMap<String, Option<(i32, u64)>> = HashMap::new();
    let mut sessions: Vec<String> = Vec::new();
    for n in 0u64.. {
        tick.tick().await;
        let Some(c) = c.upgrade() else {
            return;
        };
        // The list from the journal once a second (a session's first model
        // request adds it), and what is kept of sessions that are gone goes.
        if n % LIST_EVERY == 0 {
            match c.log.catalog().coordinated() {
                Ok(l) => sessions = l.into_iter().map(|(id, _)| id).collect(),
                Err(e) => warn!("watch: list coordinated sessions: {e}"),
            }
            ooms.retain(|id, _| sessions.contains(id));
            tries.retain(|id, _| sessions.contains(id));
            given_up.retain(|id| sessions.contains(id));
            last.retain(|id, _| sessions.contains(id));
            inits.retain(|id, _| sessions.contains(id));
        }
        for id in sessions.clone() {
            if given_up.contains(&id)
                || recovering
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&id)
            {
                // Given up, or its recovery is still under way.
                continue;
            }
            let init = *inits.entry(id.clone()).or_insert_with(|| {
                let pid = c
                    .manager
                    .get(&id)
                    .ok()
                    .filter(|s| s.state == drums_api::SessionState::Running)?
                    .init_pid?;
                Some((pid, drums_session::process::start_time(pid)?))
            });
            let init_runs = init.is_some_and(|(pid, start)| {
                drums_session::process::start_time(pid) == Some(start)
                    && drums_session::process::alive(pid)
            });
            let killed = c.manager.oom_kills(&id).unwrap_or(0);
            let seen = *ooms.entry(id.clone()).or_insert(killed);
            if init_runs && killed <= seen {
                continue;
            }
            // Recovered a moment ago, again: wait out the backoff before
            // even reading the catalog (this runs every tick meanwhile).
            let backoff = c.limits.backoff;
            let streak = match last.get(&id) {
                Some((at, n)) if at.elapsed() < backoff.reset_after() => *n,
                _ => 0,
            };
            if let Some((at, _)) = last.get(&id) {
                if at.elapsed() < backoff.delay(streak) {
                    continue;
                }
            }
            // Something changed: the catalog says what.
            inits.remove(&id);
            let died = match c.manager.processes_died(&id) {
                Ok(d) => d,
                // Removed meanwhile.
                Err(_) => continue,
            };
            let oom = !died && killed > seen;
            if !died && !oom {
                // Rebuilt (a rollback), or starting: its init is read again.
                continue;
            }
            let why = if died {
                "its processes died"
            } else {
                "the OOM killer killed in it"
            };
            let len = c.log.catalog().exchanges_len(&id).unwrap_or(0);
            let t = tries.entry(id.clone()).or_insert((len, 0));
            if len > t.0 {
                *t = (len, 0);
            }
            t.1 += 1;
            if t.1 > TRIES {
                warn!(session = %id, "{why}, again, {TRIES} recoveries without progress: the coordinator gives it up (`drums recover` by hand)");
                given_up.insert(id);
                continue;
            }
            // The rebuilt session has a new cgroup, with no OOM kills yet.
            ooms.remove(&id);
            c.turns.forget(&id);
            last.insert(id.clone(), (Instant::now(), streak + 1));
            if streak > 0 {
                info!(session = %id, streak, waited = ?backoff.delay(streak), "recovering the session again, after its backoff");
            }
            // In a task of the session's own: a restore waits for the
            // session's guest (its hygiene answer), which a hostile session
            // can make slow, and the watch goes on for the others meanwhile.
            recovering
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.clone());
            let (c, recovering) = (c.clone(), recovering.clone());
            tokio::spawn(async move {
                recover(&c, &id, why, oom).await;
                recovering
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
            });
        }
    }
}

/// Recover session `id` (after killing what is left of it, if the OOM
/// killer killed in it), and have its commands run again.
async fn recover<S: Sessions>(c: &Arc<Coordinator<S>>, id: &str, why: &str, oom: bool) {
    if oom {
        // What is left of it comes back whole from its version.
        let (m, sid) = (c.manager.clone(), id.to_owned());
        if let Err(e) = tokio::task::spawn_blocking(move || m.kill_processes(&sid))
            .await
            .expect("no panic")
        {
            warn!(session = %id, "watch: kill what is left of the session: {}", drums_api::error_chain(&e));
            return;
        }
    }
    // Its agent's execs wait from here: the session is neither what it was
    // nor yet what its agent had (replays.rs). A failed recovery drops the
    // gate, and they go on to the guest that is not there, as before.
    let gate = c.recovering(id);
    match c.manager.recover(id).await {
        Ok(s) => {
            info!(session = %s.name, "{why}: recovered by the coordinator");
            c.after_recovery(id, gate);
        }
        // A rollback or another recovery got there first.
        Err(SessionError::Conflict(_)) => {}
        Err(e) => {
            warn!(session = %id, "{why}, and recovering it failed: {}", drums_api::error_chain(&e))
        }
    }
}
