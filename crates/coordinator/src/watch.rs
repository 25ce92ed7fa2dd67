//! The coordinator's watch over the sessions it coordinates: one whose
//! processes died (its init killed, so its pid namespace) or in whose cgroup
//! the OOM killer killed is recovered from its newest done version, under
//! the same identity, and carries on (docs/coordinator.md, "Failures").
//!
//! It polls: a session's init and its OOM count are two small reads, and a
//! tenth of a second is nothing next to a model's turn. A restarted drumsd
//! recovers the sessions that died with the previous one at its start
//! (`Manager::open`), and this watch takes over from the catalog's list.
//!
//! An agent process that ends while its session lives is not a failure: it
//! is an agent that finished (without its exit status, which only its
//! parent in the session sees, a kill looks the same).

use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::Duration;

use drums_session::SessionError;
use tracing::{info, warn};

use crate::Coordinator;

/// How often sessions are looked at.
const EVERY: Duration = Duration::from_millis(100);

/// Recoveries in a row that fail, or that bring the session back to a
/// failure before its agent got one more answer, before the watch gives
/// the session up (until drumsd restarts, or `drums recover` by hand): an
/// agent whose own work runs out of memory would otherwise be brought back
/// into the same failure forever.
const TRIES: u32 = 3;

pub(crate) async fn run(c: Weak<Coordinator>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Per session: OOM kills seen in its cgroup; (log length at the last
    // recovery, recoveries since it grew).
    let mut ooms: HashMap<String, u64> = HashMap::new();
    let mut tries: HashMap<String, (u64, u32)> = HashMap::new();
    let mut given_up: HashSet<String> = HashSet::new();
    // Sessions a restarted drumsd recovered at its start (their processes
    // died with the previous one): an agent outside has its commands since
    // the version run again, as after a recovery by this watch.
    if let Some(c) = c.upgrade() {
        for (id, agent) in c.log.catalog().coordinated().unwrap_or_default() {
            if agent.is_none() && c.manager.take_restored(&id).is_some() {
                c.after_recovery(&id).await;
            }
        }
    }
    loop {
        tick.tick().await;
        let Some(c) = c.upgrade() else {
            return;
        };
        let sessions = match c.log.catalog().coordinated() {
            Ok(s) => s,
            Err(e) => {
                warn!("watch: list coordinated sessions: {e}");
                continue;
            }
        };
        // What is kept of sessions that are gone goes too.
        ooms.retain(|id, _| sessions.iter().any(|(s, _)| s == id));
        tries.retain(|id, _| sessions.iter().any(|(s, _)| s == id));
        given_up.retain(|id| sessions.iter().any(|(s, _)| s == id));
        for (id, _) in sessions {
            if given_up.contains(&id) {
                continue;
            }
            let died = match c.manager.processes_died(&id) {
                Ok(d) => d,
                // Removed meanwhile, or being rebuilt (a rollback).
                Err(_) => continue,
            };
            let cg = drums_cgroup::Cgroup::open(&c.manager.config().cgroup_parent, &id);
            let killed = cg.oom_kills().unwrap_or(0);
            let seen = *ooms.entry(id.clone()).or_insert(killed);
            let oom = !died && killed > seen;
            if !died && !oom {
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
            if oom {
                // What is left of it comes back whole from its version.
                if let Err(e) = tokio::task::spawn_blocking(move || cg.kill_all())
                    .await
                    .expect("no panic")
                {
                    warn!(session = %id, "watch: kill what is left of the session: {e}");
                    continue;
                }
            }
            // The rebuilt session has a new cgroup, with no OOM kills yet.
            ooms.remove(&id);
            c.turns.forget(&id);
            match c.manager.recover(&id).await {
                Ok(s) => {
                    info!(session = %s.name, "{why}: recovered by the coordinator");
                    c.after_recovery(&id).await;
                }
                // A rollback or another recovery got there first.
                Err(SessionError::Conflict(m)) if !m.contains("no done version") => {}
                Err(e) => {
                    warn!(session = %id, "{why}, and recovering it failed: {}", drums_session::error_chain(&e))
                }
            }
        }
    }
}
