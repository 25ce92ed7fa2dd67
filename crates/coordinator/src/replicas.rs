//! The replication gate: for a session whose versions are also copied to a
//! second host (drums.ray, `replicate=True`), the end of each model answer
//! is held until the replica of the turn's version is acknowledged, not
//! only until the version is durable here.
//!
//! The copier is outside drumsd (a Ray actor of the session's node): it turns
//! the gate on, takes the versions waiting for a replica one at a time
//! (`next`), copies each, and acknowledges it (`ack`). A version is queued
//! here when an answer's hold reaches it. A hold waits at most the gate's
//! timeout, then releases the answer and says so in its record: a replica
//! host that is gone slows the agent by that much once per turn, never
//! stops it. Turning the gate off releases every hold.
//!
//! State is in memory: a drumsd restart forgets every gate, and the copier
//! turns it on again.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// The most acknowledged version ids kept per session (older holds than
/// that have long been released).
const ACKED_KEPT: usize = 64;

struct Gate {
    timeout: Duration,
    /// Versions a hold waits on, oldest first, not yet acknowledged.
    pending: VecDeque<String>,
    acked: VecDeque<String>,
}

/// Every gate of this drumsd, by session id.
pub struct Replicas {
    gates: Mutex<HashMap<String, Gate>>,
    /// Bumped at every change, so waiters re-check.
    changed: watch::Sender<u64>,
}

/// How a hold for a replica ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// The session has no gate: nothing was waited for.
    Ungated,
    /// The replica was acknowledged.
    Acked,
    /// The gate was turned off while waiting.
    Off,
    /// Not acknowledged within the gate's timeout.
    TimedOut(Duration),
}

/// A gate's state, as `PUT /v1/sessions/{s}/replication` answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateState {
    pub timeout: Duration,
    pub pending: Vec<String>,
    pub last_acked: Option<String>,
}

impl Default for Replicas {
    fn default() -> Self {
        Self {
            gates: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl Replicas {
    fn gates(&self) -> std::sync::MutexGuard<'_, HashMap<String, Gate>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Turn the session's gate on (or change its timeout).
    pub fn on(&self, session: &str, timeout: Duration) -> GateState {
        let mut gates = self.gates();
        let g = gates.entry(session.to_owned()).or_insert_with(|| Gate {
            timeout,
            pending: VecDeque::new(),
            acked: VecDeque::new(),
        });
        g.timeout = timeout;
        let state = state_of(g);
        drop(gates);
        self.bump();
        state
    }

    /// Turn the session's gate off, releasing its holds; false if it had none.
    pub fn off(&self, session: &str) -> bool {
        let had = self.gates().remove(session).is_some();
        self.bump();
        had
    }

    /// The session's gate, if it has one.
    pub fn state(&self, session: &str) -> Option<GateState> {
        self.gates().get(session).map(state_of)
    }

    /// The replica of `version` is made; false if the session has no gate.
    pub fn ack(&self, session: &str, version: &str) -> bool {
        let mut gates = self.gates();
        let Some(g) = gates.get_mut(session) else {
            return false;
        };
        g.pending.retain(|v| v != version);
        if !g.acked.iter().any(|v| v == version) {
            g.acked.push_back(version.to_owned());
            while g.acked.len() > ACKED_KEPT {
                g.acked.pop_front();
            }
        }
        drop(gates);
        self.bump();
        true
    }

    /// Hold until the replica of `version` is acknowledged, the gate goes
    /// off, or its timeout passes. Queues `version` for the copier.
    pub async fn wait(&self, session: &str, version: &str) -> Waited {
        let mut rx = self.changed.subscribe();
        let timeout = {
            let mut gates = self.gates();
            let Some(g) = gates.get_mut(session) else {
                return Waited::Ungated;
            };
            if g.acked.iter().any(|v| v == version) {
                return Waited::Acked;
            }
            if !g.pending.iter().any(|v| v == version) {
                g.pending.push_back(version.to_owned());
            }
            g.timeout
        };
        self.bump();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.gates().get(session) {
                None => return Waited::Off,
                Some(g) if g.acked.iter().any(|v| v == version) => return Waited::Acked,
                Some(_) => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives as long as `self`.
                Ok(Err(_)) => return Waited::Off,
                Err(_) => {
                    // Given up on: no longer offered to the copier.
                    if let Some(g) = self.gates().get_mut(session) {
                        g.pending.retain(|v| v != version);
                    }
                    return Waited::TimedOut(timeout);
                }
            }
        }
    }

    /// The oldest version waiting for its replica, waiting up to `wait` for
    /// one; `None` if none came (or the session has no gate).
    pub async fn next(&self, session: &str, wait: Duration) -> Option<String> {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match self.gates().get(session) {
                None => return None,
                Some(g) => {
                    if let Some(v) = g.pending.front() {
                        return Some(v.clone());
                    }
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }
}

fn state_of(g: &Gate) -> GateState {
    GateState {
        timeout: g.timeout,
        pending: g.pending.iter().cloned().collect(),
        last_acked: g.acked.back().cloned(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_hold_waits_for_the_ack_and_the_copier_sees_it_queued() {
        let r = Arc::new(Replicas::default());
        assert_eq!(r.wait("s", "v1").await, Waited::Ungated);
        r.on("s", Duration::from_secs(10));
        let held = tokio::spawn({
            let r = r.clone();
            async move { r.wait("s", "v1").await }
        });
        assert_eq!(
            r.next("s", Duration::from_secs(5)).await.as_deref(),
            Some("v1")
        );
        assert!(!held.is_finished());
        assert!(r.ack("s", "v1"));
        assert_eq!(held.await.unwrap(), Waited::Acked);
        // Acknowledged already: no wait, nothing queued.
        assert_eq!(r.wait("s", "v1").await, Waited::Acked);
        assert_eq!(r.next("s", Duration::from_millis(20)).await, None);
        assert_eq!(r.state("s").unwrap().last_acked.as_deref(), Some("v1"));
    }

    #[tokio::test]
    async fn a_hold_ends_at_the_timeout_or_when_the_gate_goes_off() {
        let r = Arc::new(Replicas::default());
        r.on("s", Duration::from_millis(50));
        assert_eq!(
            r.wait("s", "v1").await,
            Waited::TimedOut(Duration::from_millis(50))
        );
        // Given up on: the copier is not offered it.
        assert_eq!(r.next("s", Duration::from_millis(10)).await, None);
        r.on("s", Duration::from_secs(60));
        let held = tokio::spawn({
            let r = r.clone();
            async move { r.wait("s", "v2").await }
        });
        r.next("s", Duration::from_secs(5)).await.expect("queued");
        assert!(r.off("s"));
        assert_eq!(held.await.unwrap(), Waited::Off);
        assert!(!r.off("s"));
        assert!(!r.ack("s", "v2"), "no gate, nothing to acknowledge");
    }

    #[tokio::test]
    async fn acknowledged_ids_are_bounded() {
        let r = Replicas::default();
        r.on("s", Duration::from_secs(1));
        for i in 0..(ACKED_KEPT + 10) {
            r.ack("s", &format!("v{i}"));
        }
        assert_eq!(r.gates().get("s").unwrap().acked.len(), ACKED_KEPT);
    }
}
