//! Per-session budgets of costly things a session can make drumsd do on its
//! own (docs/security.md, "drumsd against hostile input"): at most `n` in
//! any window of `window`, as a sliding log of when each was granted. A
//! self rollback restores a version with CRIU; a turn end (one per model
//! call through the proxy) takes a version, a CRIU dump when processes
//! changed. One session asking for them back to back would keep drumsd's
//! CRIU and store busy for everyone.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Budget {
    n: u32,
    window: Duration,
    /// Per session, when each grant still inside the window was made,
    /// oldest first: at most `n` each.
    granted: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Budget {
    /// At most `n` a minute per session; 0 grants none.
    pub fn per_minute(n: u32) -> Budget {
        Budget::new(n, Duration::from_secs(60))
    }

    pub fn new(n: u32, window: Duration) -> Budget {
        Budget {
            n,
            window,
            granted: Mutex::default(),
        }
    }

    /// The most granted in a window.
    pub fn limit(&self) -> u32 {
        self.n
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// Take one for session `key` at `now`: granted, or refused with how
    /// long until one will be.
    pub fn take(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut all = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        // What fell out of the window goes, and so do sessions with nothing
        // left in it: the map holds only sessions that asked lately.
        let window = self.window;
        all.retain(|_, q| {
            while q
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= window)
            {
                q.pop_front();
            }
            !q.is_empty()
        });
        if self.n == 0 {
            return Err(window);
        }
        let q = all.entry(key.to_owned()).or_default();
        if q.len() < self.n as usize {
            q.push_back(now);
            return Ok(());
        }
        let oldest = *q.front().expect("n > 0 grants");
        Err((oldest + window).saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_n_per_window_and_then_the_wait_until_the_oldest_leaves() {
        let b = Budget::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        for s in 0..3 {
            assert_eq!(b.take("a", t0 + Duration::from_secs(s)), Ok(()));
        }
        assert_eq!(
            b.take("a", t0 + Duration::from_secs(10)),
            Err(Duration::from_secs(50))
        );
        // Another session has its own budget.
        assert_eq!(b.take("b", t0 + Duration::from_secs(10)), Ok(()));
        // A refusal takes nothing: once the oldest left, one more.
        assert_eq!(b.take("a", t0 + Duration::from_secs(60)), Ok(()));
        assert_eq!(
            b.take("a", t0 + Duration::from_secs(60)),
            Err(Duration::from_secs(1))
        );
    }

    #[test]
    fn zero_grants_nothing_and_old_sessions_are_forgotten() {
        let none = Budget::per_minute(0);
        assert!(none.take("a", Instant::now()).is_err());
        let b = Budget::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..1000 {
            assert_eq!(b.take(&format!("s{i}"), t0), Ok(()));
        }
        assert_eq!(b.take("x", t0 + Duration::from_secs(2)), Ok(()));
        assert_eq!(b.granted.lock().unwrap().len(), 1);
    }
}
