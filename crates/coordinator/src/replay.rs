//! Each session's exchange log, and the fast-forward of an agent that a
//! rollback or a recovery took back (docs/coordinator.md).
//!
//! Every model call of a session that is answered in full (2xx) is logged
//! durably at its place (`seq`) with the version its turn end became. When
//! an agent living in the session comes back from a version, it is back in
//! the request that version was taken in, and sends it again (the restored
//! connection is closed; its HTTP client retries): from that request on,
//! requests are answered from the log, in order, without asking upstream,
//! until the log's end. A request that is not the logged one (by a hash of
//! its method, path and body; headers differ between attempts) means the
//! agent diverged: the rest of the log forks off, and the request goes
//! upstream.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use drums_catalog::{Catalog, CatalogError, Exchange};

use crate::writer::Call;
use sha2::{Digest, Sha256};

/// How a request met its session's log.
#[derive(Debug)]
pub enum Met {
    /// Past the log's end: ask upstream, log at `seq`.
    Live { seq: u64 },
    /// The logged request: answer with the logged answer.
    Replayed { seq: u64, logged: Exchange },
    /// Not the logged request: the log from `seq` on moved to a branch of
    /// its own; ask upstream, log at `seq`.
    Forked { seq: u64, branch: u64 },
}

impl Met {
    pub fn seq(&self) -> u64 {
        match self {
            Met::Live { seq } | Met::Replayed { seq, .. } | Met::Forked { seq, .. } => *seq,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Met::Live { .. } => "live",
            Met::Replayed { .. } => "replayed",
            Met::Forked { .. } => "forked",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The next request's place.
    next: u64,
    /// Requests before this place are answered from the log.
    replay_end: u64,
}

pub struct Log {
    catalog: Arc<Catalog>,
    writer: crate::writer::Writer,
    cursors: Mutex<HashMap<String, Cursor>>,
    /// Sessions whose log was still over its budget after pruning.
    full: Mutex<HashSet<String>>,
    /// Per session: at least what its log holds (measured, plus what was
    /// logged since), so that a log well within its budget is not measured
    /// again at every model call.
    bounds: Mutex<HashMap<String, Size>>,
}

/// Rows and bytes of a log, as [`Catalog::exchanges_size`] counts them.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    rows: u64,
    bytes: u64,
}

impl Size {
    fn within(self, budget: JournalBudget) -> bool {
        self.rows <= budget.rows && self.bytes <= budget.bytes
    }
}

/// What one session's exchange log may hold (drumsd's `--llm-journal-rows`
/// and `--llm-journal-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalBudget {
    /// Rows, every branch counted.
    pub rows: u64,
    /// Bytes of answers' bodies and headers.
    pub bytes: u64,
}

/// A log over its budget: what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Over {
    pub rows: u64,
    pub bytes: u64,
}

/// The hash a request is matched by.
pub fn request_sha(method: &str, path: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update([0]);
    h.update(path.as_bytes());
    h.update([0]);
    h.update(body);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Log {
    pub fn new(catalog: Arc<Catalog>) -> Log {
        Log {
            writer: crate::writer::Writer::start(catalog.clone()),
            catalog,
            cursors: Mutex::default(),
            full: Mutex::default(),
            bounds: Mutex::default(),
        }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn cursors(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cursor>> {
        self.cursors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's cursor, loaded from the log's length the first time.
    fn load(&self, session: &str) -> Result<(), CatalogError> {
        if self.cursors().contains_key(session) {
            return Ok(());
        }
        let len = self.catalog.exchanges_len(session)?;
        self.cursors().entry(session.to_owned()).or_insert(Cursor {
            next: len,
            replay_end: len,
        });
        Ok(())
    }

    /// Session `session`'s agent, living in it, was taken back to
    /// `version`: it is in the request whose turn end became that version,
    /// and is fast-forwarded from there. A version the log does not know
    /// (a checkpoint taken by hand) leaves it live.
    pub fn restored(&self, session: &str, version: &str) -> Result<Option<u64>, CatalogError> {
        let at = self.catalog.exchange_of_version(session, version)?;
        let len = self.catalog.exchanges_len(session)?;
        let c = match at {
            Some(seq) => Cursor {
                next: seq,
                replay_end: len,
            },
            None => Cursor {
                next: len,
                replay_end: len,
            },
        };
        self.cursors().insert(session.to_owned(), c);
        Ok(at)
    }

    /// A model call of `session` with hash `sha` arrives: its place, and
    /// whether it is answered from the log.
    pub fn meet(&self, session: &str, sha: &str) -> Result<Met, CatalogError> {
        self.load(session)?;
        // One place per request, however many arrive at once.
        let (seq, replay_end) = {
            let mut all = self.cursors();
            let c = all.get_mut(session).expect("loaded above");
            c.next += 1;
            (c.next - 1, c.replay_end)
        };
        if seq >= replay_end {
            return Ok(Met::Live { seq });
        }
        match self.catalog.exchange(session, seq)? {
            Some(logged) if logged.request_sha == sha => Ok(Met::Replayed { seq, logged }),
            _ => {
                let branch = self.catalog.fork_exchanges(session, seq)?;
                if let Some(c) = self.cursors().get_mut(session) {
                    c.replay_end = c.replay_end.min(seq);
                }
                Ok(Met::Forked { seq, branch })
            }
        }
    }

    /// The request at `seq` was not answered in full: its place is free
    /// again if no later request took one (the agent will send it again).
    pub fn give_back(&self, session: &str, seq: u64) {
        if let Some(c) = self.cursors().get_mut(session) {
            if c.next == seq + 1 {
                c.next = seq;
            }
        }
    }

    /// Log an answered request (its replay too: the version its turn end
    /// became now, or the one it had).
    /// With `record` ((the request's record, how many to keep)), that
    /// record goes in the same commit (writer.rs).
    pub async fn keep(
        &self,
        session: &str,
        x: &Exchange,
        replayed: bool,
        record: Option<(String, u64)>,
    ) -> Result<(), CatalogError> {
        let mut x = x.clone();
        if replayed && x.version.is_none() {
            x.version = self
                .catalog
                .exchange(session, x.seq)?
                .filter(|old| old.request_sha == x.request_sha)
                .and_then(|old| old.version);
        }
        let added = self
            .writer
            .log(Call {
                session: session.to_owned(),
                exchange: Some(x),
                record,
            })
            .await?;
        // A replaced row is counted twice: still a bound.
        if let Some(b) = self.bounds().get_mut(session) {
            b.rows += 1;
            b.bytes += added;
        }
        Ok(())
    }

    /// Keep a request's record alone (no exchange of it is logged),
    /// committed with whatever else is queued.
    pub async fn record(
        &self,
        session: &str,
        record: String,
        keep: u64,
    ) -> Result<(), CatalogError> {
        self.writer
            .log(Call {
                session: session.to_owned(),
                exchange: None,
                record: Some((record, keep)),
            })
            .await
            .map(drop)
    }

    pub fn forget(&self, session: &str) {
        self.cursors().remove(session);
        self.bounds().remove(session);
    }

    /// Drop what is kept of sessions that `alive` says are gone.
    pub fn prune(&self, alive: impl Fn(&str) -> bool) {
        self.cursors().retain(|id, _| alive(id));
        self.bounds().retain(|id, _| alive(id));
        self.full().retain(|id| alive(id));
    }

    fn bounds(&self) -> std::sync::MutexGuard<'_, HashMap<String, Size>> {
        self.bounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What session `session`'s log holds, measured, and kept as its bound.
    fn measure(&self, session: &str) -> Result<Size, CatalogError> {
        let (rows, bytes) = self.catalog.exchanges_size(session)?;
        let size = Size { rows, bytes };
        self.bounds().insert(session.to_owned(), size);
        Ok(size)
    }

    fn full(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.full.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the session's log was over its budget when last measured.
    pub fn is_full(&self, session: &str) -> bool {
        self.full().contains(session)
    }

    /// Whether the session's next request is answered from the log (a
    /// fast-forward, which replaces rows rather than add them).
    pub fn replaying(&self, session: &str) -> bool {
        self.cursors()
            .get(session)
            .is_some_and(|c| c.next < c.replay_end)
    }

    /// Hold the session's log to `budget`: if it is over, drop what no
    /// fast-forward can reach any more, the exchanges before place
    /// `floor()` (the place of the oldest version the session can still be
    /// taken back to; never at or past a fast-forward under way). `Some`
    /// if it is still over then.
    pub fn enforce(
        &self,
        session: &str,
        budget: JournalBudget,
        floor: impl FnOnce() -> u64,
    ) -> Result<Option<Over>, CatalogError> {
        let bound = self.bounds().get(session).copied();
        if bound.is_some_and(|b| b.within(budget)) {
            self.full().remove(session);
            return Ok(None);
        }
        if self.measure(session)?.within(budget) {
            self.full().remove(session);
            return Ok(None);
        }
        let mut floor = floor();
        if let Some(c) = self.cursors().get(session) {
            if c.next < c.replay_end {
                floor = floor.min(c.next);
            }
        }
        self.catalog.prune_exchanges(session, floor)?;
        let size = self.measure(session)?;
        if size.within(budget) {
            self.full().remove(session);
            return Ok(None);
        }
        self.full().insert(session.to_owned());
        Ok(Some(Over {
            rows: size.rows,
            bytes: size.bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    fn answer(seq: u64, sha: &str, version: Option<&str>) -> Exchange {
        Exchange {
            seq,
            request_sha: sha.into(),
            status: 200,
            headers: vec![],
            body: vec![seq as u8],
            version: version.map(str::to_owned),
        }
    }

    #[test]
    fn a_restored_agent_is_fast_forwarded_then_forks_where_it_differs() {
        let log = Log::new(Arc::new(Catalog::in_memory().unwrap()));
        for (i, v) in [None, Some("v1"), Some("v2"), Some("v3")]
            .into_iter()
            .enumerate()
        {
            let sha = format!("r{i}");
            assert!(matches!(log.meet("s", &sha).unwrap(), Met::Live { seq } if seq == i as u64));
            block_on(log.keep("s", &answer(i as u64, &sha, v), false, None)).unwrap();
        }
        // Back at v1: requests 1 and 2 come from the log, 3 differs.
        assert_eq!(log.restored("s", "v1").unwrap(), Some(1));
        assert!(matches!(
            log.meet("s", "r1").unwrap(),
            Met::Replayed { seq: 1, .. }
        ));
        // Its replay is logged again without a version of its own (the
        // first request after a restore ends no turn): it keeps v1.
        block_on(log.keep("s", &answer(1, "r1", None), true, None)).unwrap();
        assert_eq!(
            log.catalog().exchange_of_version("s", "v1").unwrap(),
            Some(1)
        );
        // An answer that did not reach the agent: the same place again.
        assert!(matches!(
            log.meet("s", "r2").unwrap(),
            Met::Replayed { seq: 2, .. }
        ));
        log.give_back("s", 2);
        assert!(matches!(
            log.meet("s", "r2").unwrap(),
            Met::Replayed { seq: 2, .. }
        ));
        assert!(matches!(
            log.meet("s", "other").unwrap(),
            Met::Forked { seq: 3, branch: 1 }
        ));
        assert!(matches!(log.meet("s", "r4").unwrap(), Met::Live { seq: 4 }));
        // A version the log never saw leaves the agent live.
        assert_eq!(log.restored("s", "by-hand").unwrap(), None);
        assert!(matches!(log.meet("s", "r1").unwrap(), Met::Live { seq: 3 }));
    }

    #[test]
    fn a_log_over_its_budget_keeps_what_recovery_needs_or_says_it_is_full() {
        let log = Log::new(Arc::new(Catalog::in_memory().unwrap()));
        for i in 0..6u64 {
            let sha = format!("r{i}");
            log.meet("s", &sha).unwrap();
            let v = format!("v{i}");
            block_on(log.keep("s", &answer(i, &sha, Some(&v)), false, None)).unwrap();
        }
        let budget = JournalBudget {
            rows: 3,
            bytes: 1 << 20,
        };
        // Within budget: nothing is pruned, whatever the floor.
        let roomy = JournalBudget {
            rows: 6,
            bytes: 1 << 20,
        };
        assert_eq!(log.enforce("s", roomy, || 100).unwrap(), None);
        assert_eq!(log.catalog().exchanges_size("s").unwrap().0, 6);
        // The oldest version left is v3: 0 to 2 go, the rest is replayable.
        assert_eq!(log.enforce("s", budget, || 3).unwrap(), None);
        assert!(!log.is_full("s"));
        assert_eq!(log.catalog().exchange("s", 2).unwrap(), None);
        assert_eq!(log.restored("s", "v3").unwrap(), Some(3));
        assert!(matches!(
            log.meet("s", "r3").unwrap(),
            Met::Replayed { seq: 3, .. }
        ));
        // Mid fast-forward, nothing at or past its place goes, even if the
        // versions say so: the log is full.
        let tight = JournalBudget {
            rows: 1,
            bytes: 1 << 20,
        };
        let over = log.enforce("s", tight, || 100).unwrap();
        assert_eq!(over.map(|o| o.rows), Some(2));
        assert!(log.is_full("s") && log.replaying("s"));
        assert!(matches!(
            log.meet("s", "r4").unwrap(),
            Met::Replayed { seq: 4, .. }
        ));
    }
}
