//! What one session may make the coordinator do, whatever it does: how long
//! and how much its logged commands may take when they run again after a
//! recovery, and how soon the watch recovers it again (docs/security.md,
//! "drumsd against hostile input"). drumsd sets them from its flags.

use std::time::Duration;

/// The coordinator's bounds on one session's recoveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest one logged command may take when it runs again after a
    /// recovery; also the longest a re-issued command may take to give its
    /// caller's output again. The session's guest answers, or it does not:
    /// a guest stopped, or a command that never ends, fails its re-issue
    /// rather than hold it forever.
    pub reissue_command: Duration,
    /// The longest all of one recovery's commands may take together.
    pub reissue_total: Duration,
    /// The most output (bytes of the guest's exec frames) a command may
    /// produce when it runs again, and the most a re-issue compares with
    /// what its caller had. Output run again is dropped, never kept; this
    /// bounds the time a command that prints forever can hold its re-issue.
    pub reissue_output: u64,
    /// How soon the watch recovers one session again.
    pub backoff: Backoff,
    /// Bytes of request bodies being read and answers being kept for the
    /// exchange log, all of one session's connections together.
    pub session_memory: usize,
    /// How long a request's body may take to arrive, from its headers on.
    pub body_timeout: Duration,
    /// What one session's exchange log may hold.
    pub journal: crate::JournalBudget,
    /// Records of requests kept per session (the newest).
    pub records: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            reissue_command: Duration::from_secs(60),
            reissue_total: Duration::from_secs(300),
            reissue_output: 16 << 20,
            backoff: Backoff::default(),
            session_memory: crate::DEFAULT_SESSION_MEMORY,
            body_timeout: crate::DEFAULT_BODY_TIMEOUT,
            journal: crate::JournalBudget {
                rows: crate::DEFAULT_JOURNAL_ROWS,
                bytes: crate::DEFAULT_JOURNAL_BYTES,
            },
            records: crate::DEFAULT_JOURNAL_ROWS,
        }
    }
}

/// An exponential backoff of one session's recoveries: the first comes at
/// once, each next one in a row waits `first`, then twice as long, up to
/// `max`. A session that stayed up for twice `max` starts again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait before the recovery that follows `streak` recoveries in a
    /// row (0: the first, at once).
    pub fn delay(&self, streak: u32) -> Duration {
        if streak == 0 {
            return Duration::ZERO;
        }
        let doubled = self
            .first
            .checked_mul(1u32.checked_shl(streak - 1).unwrap_or(u32::MAX))
            .unwrap_or(self.max);
        doubled.min(self.max)
    }

    /// How long a session must stay up for its next recovery to be a first
    /// one again.
    pub fn reset_after(&self) -> Duration {
        self.max.saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_up_to_its_cap() {
        let b = Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        let got: Vec<u64> = (0..9).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(got, [0, 1, 2, 4, 8, 16, 32, 60, 60]);
        // However long the streak, no overflow.
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(60));
        assert_eq!(b.delay(40), Duration::from_secs(60));
    }

    #[test]
    fn a_zero_backoff_never_waits() {
        let b = Backoff {
            first: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert!((0..100).all(|n| b.delay(n).is_zero()));
    }
}
