//! The coordinator's view of each session's turns: whether one is open, how
//! many of its requests are being answered, and whether its agent was
//! looked for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What a request from a session is for the session's turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// It ends the open turn: its effects are classified and versioned.
    End,
    /// The session's first request: no turn is open yet; one begins when
    /// the answer is released.
    First,
    /// Another request of the session is being answered: the agent is
    /// mid-turn (parallel calls), so this is no boundary.
    Concurrent,
}

#[derive(Default)]
struct State {
    open: bool,
    in_flight: usize,
    /// The agent living in the session was looked for (from its connection).
    agent_sought: bool,
}

#[derive(Default)]
pub struct Turns {
    state: Mutex<HashMap<String, State>>,
    /// Per session: held while its turn changes hands (the next one begins
    /// after an answer's release; a request's end of the turn waits for
    /// that), so the agent never waits for the inspector before it has its
    /// answer, and no end overtakes the begin it ends.
    handover: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Records since the last prune.
    since_prune: AtomicUsize,
}

/// Prune every this many records.
const PRUNE_EVERY: usize = 1024;

impl Turns {
    /// A request of `session` arrives.
    pub fn enter(&self, session: &str) -> Boundary {
        let mut map = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = map.entry(session.to_owned()).or_default();
        s.in_flight += 1;
        match (s.in_flight, s.open) {
            (1, true) => {
                s.open = false;
                Boundary::End
            }
            (1, false) => Boundary::First,
            _ => Boundary::Concurrent,
        }
    }

    /// A request's answer was released; true if it was the last one being
    /// answered, so the next turn begins now.
    pub fn leave(&self, session: &str) -> bool {
        let mut map = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = map.get_mut(session) else {
            return false;
        };
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.open = true;
            true
        } else {
            false
        }
    }

    /// The turn could not begin (the session is gone, or its inspector
    /// failed): the next request has no turn to end.
    pub fn not_open(&self, session: &str) {
        let mut map = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get_mut(session) {
            s.open = false;
        }
    }

    /// Whether the session's agent is still to be looked for; it is not,
    /// from now on.
    pub fn seek_agent(&self, session: &str) -> bool {
        let mut map = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = map.entry(session.to_owned()).or_default();
        !std::mem::replace(&mut s.agent_sought, true)
    }

    /// Forget a session (it was removed, or rolled back: its turns start
    /// again).
    pub fn forget(&self, session: &str) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
    }

    /// The session's handover lock.
    pub fn handover(&self, session: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.handover
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(session.to_owned())
            .or_default()
            .clone()
    }

    /// Whether it is time to prune (every [`PRUNE_EVERY`] records).
    pub fn prune_due(&self) -> bool {
        self.since_prune.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1
    }

    /// Drop what is kept of sessions that `alive` says are gone.
    pub fn prune(&self, alive: impl Fn(&str) -> bool) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, s| s.in_flight > 0 || alive(id));
        self.handover
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, h| Arc::strong_count(h) > 1 || alive(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_follow_requests_and_releases() {
        let t = Turns::default();
        assert_eq!(t.enter("s"), Boundary::First);
        assert!(t.leave("s"));
        assert_eq!(t.enter("s"), Boundary::End);
        // A parallel call while the first is answered is no boundary, and
        // the turn begins when the last one is released.
        assert_eq!(t.enter("s"), Boundary::Concurrent);
        assert!(!t.leave("s"));
        assert!(t.leave("s"));
        assert_eq!(t.enter("s"), Boundary::End);
        t.not_open("s");
        assert!(t.leave("s"));
        t.forget("s");
        assert_eq!(t.enter("s"), Boundary::First);
    }
}
