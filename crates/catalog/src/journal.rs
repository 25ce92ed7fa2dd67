//! The coordinator's journal (docs/coordinator.md): what it must still know
//! after drumsd or a session died.
//!
//! - `coordinated`: the sessions whose agent talks through the proxy, and
//!   whether that agent lives in the session (its pid there), which decides
//!   how such a session is recovered.
//! - `llm_exchanges`: per session, the agent's conversation as the proxy
//!   answered it, request by request (`seq` from 0): a hash of the request,
//!   the answer's status, headers and body, and the version the request's
//!   turn end became. A recovered agent is fast-forwarded from it. Branch 0
//!   is the live log; when an agent diverges from it, the rest of the live
//!   log moves to a new branch (1, 2, …) and the live one goes on from there.
//! - `coordinated_turns`: the record of each request, as `drums turns` shows.
//! - `commands`: the commands an agent outside a session ran in it through
//!   drumsd, each with where in the conversation it ran, re-issued after a
//!   recovery.
//!
//! Rows go with their session (`Catalog::delete_session`).

use drums_api::CommandState;
use rusqlite::{params, OptionalExtension};

use crate::{sql, Cached, Catalog, Result};

/// One answered request of a session's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub seq: u64,
    /// sha256 (hex) of the request's method, path and body.
    pub request_sha: String,
    pub status: u16,
    /// The answer's headers that a replay gives back (content type and the
    /// like), in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The version the request's turn end became, once durable.
    pub version: Option<String>,
}

/// A command run in a session for an agent outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub seq: u64,
    /// Requests the agent had had answered when the command started: the
    /// command belongs to the turn after that many boundaries.
    pub position: u64,
    /// The inspector's turn it ran in, if one was open.
    pub turn: Option<u64>,
    /// The exec request, as JSON.
    pub request: String,
    pub state: CommandState,
    pub started_at_ms: i64,
}

pub(crate) const MIGRATE_6: &str = "BEGIN;
     CREATE TABLE coordinated (
         session_id TEXT PRIMARY KEY,
         agent_pid INTEGER,
         since_ms INTEGER NOT NULL
     );
     CREATE TABLE llm_exchanges (
         session_id TEXT NOT NULL,
         branch INTEGER NOT NULL,
         seq INTEGER NOT NULL,
         request_sha TEXT NOT NULL,
         status INTEGER NOT NULL,
         headers TEXT NOT NULL,
         body BLOB NOT NULL,
         version TEXT,
         at_ms INTEGER NOT NULL,
         PRIMARY KEY (session_id, branch, seq)
     );
     CREATE INDEX llm_exchanges_version ON llm_exchanges (session_id, version);
     CREATE TABLE coordinated_turns (
         session_id TEXT NOT NULL,
         seq INTEGER NOT NULL,
         record TEXT NOT NULL,
         PRIMARY KEY (session_id, seq)
     );
     CREATE TABLE commands (
         session_id TEXT NOT NULL,
         seq INTEGER NOT NULL,
         position INTEGER NOT NULL,
         turn INTEGER,
         request TEXT NOT NULL,
         state TEXT NOT NULL,
         started_at_ms INTEGER NOT NULL,
         ended_at_ms INTEGER,
         PRIMARY KEY (session_id, seq)
     );
     PRAGMA user_version = 6;
     COMMIT;";

/// Removes a session's journal (inside `delete_session`'s transaction).
pub(crate) const DELETE_SESSION: &str = "DELETE FROM coordinated WHERE session_id = ?1;
     DELETE FROM llm_exchanges WHERE session_id = ?1;
     DELETE FROM coordinated_turns WHERE session_id = ?1;
     DELETE FROM commands WHERE session_id = ?1;";

impl Catalog {
    /// Session `id`'s agent talks through the proxy; `agent_pid`, once known,
    /// is its pid inside the session.
    /// A session an agent outside coordinates has no agent inside, whatever
    /// the session says ([`Catalog::coordinate_outside`]).
    pub fn coordinate(&self, id: &str, agent_pid: Option<i32>) -> Result<()> {
        self.conn()
            .exec_cached(
                "INSERT INTO coordinated (session_id, agent_pid, since_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (session_id) DO UPDATE SET agent_pid =
                     CASE WHEN outside = 1 THEN NULL ELSE COALESCE(?2, agent_pid) END",
                params![id, agent_pid, crate::now_ms()],
            )
            .map_err(sql("record a coordinated session"))?;
        Ok(())
    }

    /// Session `id`'s turns and exchange log are an agent's outside it (it
    /// names the session by path or header): from now on the session's own
    /// model calls are none of its turns, and an agent the session had
    /// claimed to have inside (by calling first) is forgotten. The host's
    /// agent decides, not the session (docs/security.md).
    pub fn coordinate_outside(&self, id: &str) -> Result<()> {
        self.conn()
            .exec_cached(
                "INSERT INTO coordinated (session_id, agent_pid, since_ms, outside)
                 VALUES (?1, NULL, ?2, 1)
                 ON CONFLICT (session_id) DO UPDATE SET agent_pid = NULL, outside = 1",
                params![id, crate::now_ms()],
            )
            .map_err(sql("record a session coordinated from outside"))?;
        Ok(())
    }

    /// Whether an agent outside session `id` coordinates it.
    pub fn coordinated_outside(&self, id: &str) -> Result<bool> {
        crate::any_row(
            &self.conn(),
            "SELECT 1 FROM coordinated WHERE session_id = ?1 AND outside = 1",
            params![id],
            "read a coordinated session",
        )
    }

    /// Every coordinated session, with its agent's pid inside it if it has one.
    pub fn coordinated(&self) -> Result<Vec<(String, Option<i32>)>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(
                "SELECT session_id, CASE WHEN outside = 1 THEN NULL ELSE agent_pid END
                 FROM coordinated ORDER BY since_ms",
            )
            .map_err(sql("list coordinated sessions"))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql("list coordinated sessions"))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql("list coordinated sessions"))?;
        Ok(rows)
    }

    /// Whether session `id`'s agent talks through the proxy.
    pub fn is_coordinated(&self, id: &str) -> Result<bool> {
        crate::any_row(
            &self.conn(),
            "SELECT 1 FROM coordinated WHERE session_id = ?1",
            params![id],
            "read a coordinated session",
        )
    }

    /// The pid inside session `id` of the agent living there, if one does.
    pub fn agent_of(&self, id: &str) -> Result<Option<i32>> {
        self.conn()
            .row_cached(
                "SELECT agent_pid FROM coordinated WHERE session_id = ?1 AND outside = 0",
                params![id],
                |r| r.get(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(sql("read a session's agent"))
    }

    /// Log an answered request at its place in the live log (replacing what
    /// a replay of it finds there).
    /// Returns what the row adds to [`Catalog::exchanges_size`]'s bytes at
    /// most (its headers are counted there in characters, here in bytes).
    pub fn log_exchange(&self, id: &str, x: &Exchange) -> Result<u64> {
        self.log_one(Logged {
            session: id,
            exchange: Some(x),
            record: None,
        })
    }

    /// Log many model calls' exchanges and records in one commit: the
    /// coordinator's journal writer takes whatever is queued, since a
    /// commit costs more than its rows (WAL frames, locks). Each call is a
    /// savepoint of its own, so one that fails is taken back alone, whole.
    /// What each exchange adds to [`Catalog::exchanges_size`]'s bytes at
    /// most (0 for a record alone), or why that call failed; `Err` if the
    /// commit did (then none of them is logged).
    pub fn log_many(&self, calls: &[Logged<'_>]) -> Result<Vec<Result<u64>>> {
        let mut c = self.conn();
        let mut tx = c.transaction().map_err(sql("log model calls"))?;
        let mut done = Vec::with_capacity(calls.len());
        for call in calls {
            let mut sp = tx.savepoint().map_err(sql("log model calls"))?;
            let logged = log_call(&sp, call);
            if logged.is_ok() {
                sp.commit().map_err(sql("log model calls"))?;
            } else {
                sp.rollback().map_err(sql("log model calls"))?;
            }
            done.push(logged);
        }
        tx.commit().map_err(sql("log model calls"))?;
        Ok(done)
    }

    /// The live log's entry `seq` of session `id`.
    pub fn exchange(&self, id: &str, seq: u64) -> Result<Option<Exchange>> {
        let row = self
            .conn()
            .row_cached(
                "SELECT seq, request_sha, status, headers, body, version FROM llm_exchanges
                 WHERE session_id = ?1 AND branch = 0 AND seq = ?2",
                params![id, seq as i64],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, u16>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Vec<u8>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                    ))
                },
            )
            .optional()
            .map_err(sql("read an exchange"))?;
        Ok(row.map(
            |(seq, request_sha, status, headers, body, version)| Exchange {
                seq: seq as u64,
                request_sha,
                status,
                // Written by log_exchange; a row that does not parse replays
                // with no headers rather than not at all.
                headers: serde_json::from_str(&headers).unwrap_or_default(),
                body,
                version,
            },
        ))
    }

    /// The length of session `id`'s live log.
    pub fn exchanges_len(&self, id: &str) -> Result<u64> {
        self.conn()
            .row_cached(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM llm_exchanges
                 WHERE session_id = ?1 AND branch = 0",
                params![id],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(sql("count exchanges"))
    }

    /// The place in the live log of the request whose turn end became
    /// `version`.
    pub fn exchange_of_version(&self, id: &str, version: &str) -> Result<Option<u64>> {
        self.conn()
            .row_cached(
                "SELECT seq FROM llm_exchanges
                 WHERE session_id = ?1 AND branch = 0 AND version = ?2",
                params![id, version],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|s| s.map(|s| s as u64))
            .map_err(sql("find a version's exchange"))
    }

    /// The agent diverged at `seq`: the live log from there on becomes a
    /// branch of its own (returned), and the live log goes on from `seq`.
    pub fn fork_exchanges(&self, id: &str, seq: u64) -> Result<u64> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(sql("fork the exchange log"))?;
        let branch: i64 = tx
            .row_cached(
                "SELECT COALESCE(MAX(branch), 0) + 1 FROM llm_exchanges WHERE session_id = ?1",
                params![id],
                |r| r.get(0),
            )
            .map_err(sql("fork the exchange log"))?;
        tx.exec_cached(
            "UPDATE llm_exchanges SET branch = ?3
             WHERE session_id = ?1 AND branch = 0 AND seq >= ?2",
            params![id, seq as i64, branch],
        )
        .map_err(sql("fork the exchange log"))?;
        tx.commit().map_err(sql("fork the exchange log"))?;
        Ok(branch as u64)
    }

    /// How many branches the log of session `id` has forked off.
    pub fn exchange_forks(&self, id: &str) -> Result<u64> {
        self.conn()
            .row_cached(
                "SELECT COALESCE(MAX(branch), 0) FROM llm_exchanges WHERE session_id = ?1",
                params![id],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(sql("count forks"))
    }

    /// The rows of session `id`'s exchange log (every branch) and their
    /// bytes (bodies and headers): what its journal budget counts.
    pub fn exchanges_size(&self, id: &str) -> Result<(u64, u64)> {
        // length() of a blob is read from the row's header, not its content.
        self.conn()
            .row_cached(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(body) + LENGTH(headers)), 0)
                 FROM llm_exchanges WHERE session_id = ?1",
                params![id],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .map_err(sql("measure the exchange log"))
    }

    /// Drop the exchanges of session `id` before place `floor`, in every
    /// branch: no fast-forward starts before the oldest version the session
    /// can still go back to, so the caller passes that version's place. The
    /// newest exchange of the live log always stays, since the log's length
    /// (a command's position, the watch's progress) is counted from it.
    /// Returns how many went.
    pub fn prune_exchanges(&self, id: &str, floor: u64) -> Result<u64> {
        self.conn()
            .exec_cached(
                "DELETE FROM llm_exchanges WHERE session_id = ?1 AND seq < ?2
                 AND NOT (branch = 0 AND seq = (SELECT MAX(seq) FROM llm_exchanges
                                                WHERE session_id = ?1 AND branch = 0))",
                params![id, floor.min(i64::MAX as u64) as i64],
            )
            .map(|n| n as u64)
            .map_err(sql("prune the exchange log"))
    }

    /// Keep the record of a coordinated request (JSON), and only the newest
    /// `keep` of session `id`'s records: they are for people to read, and
    /// a session making model calls for days must not grow the catalog
    /// without bound.
    pub fn log_turn_record(&self, id: &str, record: &str, keep: u64) -> Result<()> {
        self.log_one(Logged {
            session: id,
            exchange: None,
            record: Some((record, keep)),
        })
        .map(drop)
    }

    fn log_one(&self, call: Logged<'_>) -> Result<u64> {
        self.log_many(&[call])?.pop().expect("one result a call")
    }

    /// The last `limit` records of session `id`'s requests, oldest first.
    pub fn turn_records(&self, id: &str, limit: u64) -> Result<Vec<String>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(
                "SELECT record FROM (SELECT seq, record FROM coordinated_turns
                 WHERE session_id = ?1 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
            )
            .map_err(sql("read turn records"))?;
        let rows = st
            .query_map(params![id, limit as i64], |r| r.get(0))
            .map_err(sql("read turn records"))?
            .collect::<rusqlite::Result<Vec<String>>>()
            .map_err(sql("read turn records"))?;
        Ok(rows)
    }

    /// A command starts: logged before it runs. Returns its number.
    pub fn begin_command(
        &self,
        id: &str,
        position: u64,
        turn: Option<u64>,
        request: &str,
    ) -> Result<u64> {
        let c = self.conn();
        c.row_cached(
            "INSERT INTO commands (session_id, seq, position, turn, request, state, started_at_ms)
             VALUES (?1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM commands WHERE session_id = ?1),
                     ?2, ?3, ?4, 'running', ?5)
             RETURNING seq",
            params![
                id,
                position as i64,
                turn.map(|t| t as i64),
                request,
                crate::now_ms()
            ],
            |r| r.get::<_, i64>(0),
        )
        .map(|s| s as u64)
        .map_err(sql("log a command"))
    }

    /// A command ended (`done`, `failed`), or was re-issued after a
    /// recovery (`reissued`).
    pub fn end_command(&self, id: &str, seq: u64, state: CommandState) -> Result<()> {
        self.conn()
            .exec_cached(
                "UPDATE commands SET state = ?3, ended_at_ms = ?4 WHERE session_id = ?1 AND seq = ?2",
                params![id, seq as i64, state, crate::now_ms()],
            )
            .map_err(sql("end a command"))?;
        Ok(())
    }

    /// Commands still `running` when drumsd stopped (crashed) are
    /// `interrupted`: their connection went with that drumsd. Returns how
    /// many.
    pub fn interrupt_running_commands(&self) -> Result<usize> {
        self.conn()
            .exec_cached(
                "UPDATE commands SET state = 'interrupted', ended_at_ms = ?1 WHERE state = 'running'",
                params![crate::now_ms()],
            )
            .map_err(sql("mark interrupted commands"))
    }

    /// Session `id`'s commands, oldest first.
    pub fn commands(&self, id: &str) -> Result<Vec<Command>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(
                "SELECT seq, position, turn, request, state, started_at_ms FROM commands
                 WHERE session_id = ?1 ORDER BY seq",
            )
            .map_err(sql("read commands"))?;
        let rows = st
            .query_map(params![id], |r| {
                Ok(Command {
                    seq: r.get::<_, i64>(0)? as u64,
                    position: r.get::<_, i64>(1)? as u64,
                    turn: r.get::<_, Option<i64>>(2)?.map(|t| t as u64),
                    request: r.get(3)?,
                    state: r.get(4)?,
                    started_at_ms: r.get(5)?,
                })
            })
            .map_err(sql("read commands"))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql("read commands"))?;
        Ok(rows)
    }
}

/// One model call for [`Catalog::log_many`]: its exchange, its record
/// ((the record, how many of the session's to keep)), or both.
#[derive(Debug, Clone, Copy)]
pub struct Logged<'a> {
    pub session: &'a str,
    pub exchange: Option<&'a Exchange>,
    pub record: Option<(&'a str, u64)>,
}

fn log_call(tx: &rusqlite::Connection, call: &Logged<'_>) -> Result<u64> {
    let mut size = 0;
    if let Some(x) = call.exchange {
        let headers = serde_json::to_string(&x.headers).expect("strings serialize");
        size = (headers.len() + x.body.len()) as u64;
        tx.exec_cached(
            "INSERT OR REPLACE INTO llm_exchanges
             (session_id, branch, seq, request_sha, status, headers, body, version, at_ms)
             VALUES (?1, 0, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                call.session,
                x.seq as i64,
                x.request_sha,
                x.status,
                headers,
                x.body,
                x.version,
                crate::now_ms()
            ],
        )
        .map_err(sql("log an exchange"))?;
    }
    if let Some((record, keep)) = call.record {
        insert_turn_record(tx, call.session, record, keep)?;
    }
    Ok(size)
}

/// Add a turn record and prune session `id`'s to the newest `keep`.
fn insert_turn_record(tx: &rusqlite::Connection, id: &str, record: &str, keep: u64) -> Result<()> {
    let seq: i64 = tx
        .row_cached(
            "INSERT INTO coordinated_turns (session_id, seq, record)
             VALUES (?1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM coordinated_turns
                          WHERE session_id = ?1), ?2)
             RETURNING seq",
            params![id, record],
            |r| r.get(0),
        )
        .map_err(sql("log a turn record"))?;
    tx.exec_cached(
        "DELETE FROM coordinated_turns WHERE session_id = ?1 AND seq <= ?2",
        params![id, seq - keep.min(i64::MAX as u64) as i64],
    )
    .map_err(sql("prune turn records"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(seq: u64, sha: &str, version: Option<&str>) -> Exchange {
        Exchange {
            seq,
            request_sha: sha.into(),
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: format!("answer {seq}").into_bytes(),
            version: version.map(str::to_owned),
        }
    }

    #[test]
    fn an_agent_outside_overrides_the_one_a_session_claims_inside() {
        let c = Catalog::in_memory().unwrap();
        // The session called first, from inside, and a process of it held
        // the connection.
        c.coordinate("s", None).unwrap();
        c.coordinate("s", Some(42)).unwrap();
        assert_eq!(c.agent_of("s").unwrap(), Some(42));
        assert!(!c.coordinated_outside("s").unwrap());
        c.coordinate_outside("s").unwrap();
        assert!(c.coordinated_outside("s").unwrap());
        assert_eq!(c.agent_of("s").unwrap(), None);
        // Nothing the session does later brings its agent back.
        c.coordinate("s", Some(43)).unwrap();
        assert_eq!(c.agent_of("s").unwrap(), None);
        assert_eq!(c.coordinated().unwrap(), vec![("s".to_owned(), None)]);
        // From the start, too.
        c.coordinate_outside("t").unwrap();
        c.coordinate("t", Some(7)).unwrap();
        assert_eq!(c.agent_of("t").unwrap(), None);
    }

    #[test]
    fn an_exchange_and_its_record_commit_together_or_not_at_all() {
        let c = Catalog::in_memory().unwrap();
        fn one(c: &Catalog, session: &str, x: &Exchange, record: (&str, u64)) -> Result<u64> {
            let call = Logged {
                session,
                exchange: Some(x),
                record: Some(record),
            };
            c.log_many(&[call]).unwrap().pop().unwrap()
        }
        let added = one(&c, "s", &x(0, "r0", None), ("{\"seq\":0}", 2)).unwrap();
        assert_eq!(added, c.log_exchange("t", &x(0, "r0", None)).unwrap());
        assert_eq!(c.exchange("s", 0).unwrap(), Some(x(0, "r0", None)));
        assert_eq!(c.turn_records("s", 10).unwrap(), vec!["{\"seq\":0}"]);
        // The records are pruned to `keep` as log_turn_record's are.
        for i in 1..4 {
            one(&c, "s", &x(i, "r", None), (&i.to_string(), 2)).unwrap();
        }
        assert_eq!(c.turn_records("s", 10).unwrap(), vec!["2", "3"]);
        // A record that cannot be written takes its exchange back with it,
        // and only its own: the calls logged with it stay.
        c.conn()
            .execute_batch(
                "CREATE TEMP TRIGGER refuse BEFORE INSERT ON coordinated_turns
                 WHEN NEW.record = 'bad' BEGIN SELECT RAISE(ABORT, 'injected'); END;",
            )
            .unwrap();
        let (a, b) = (x(10, "a", None), x(11, "b", None));
        let done = c
            .log_many(&[
                Logged {
                    session: "u",
                    exchange: Some(&a),
                    record: Some(("fine", 9)),
                },
                Logged {
                    session: "u",
                    exchange: Some(&b),
                    record: Some(("bad", 9)),
                },
                Logged {
                    session: "u",
                    exchange: None,
                    record: Some(("alone", 9)),
                },
            ])
            .unwrap();
        assert!(
            matches!(done[..], [Ok(n), Err(_), Ok(0)] if n > 0),
            "{done:?}"
        );
        assert_eq!(c.exchange("u", 10).unwrap(), Some(a));
        assert_eq!(c.exchange("u", 11).unwrap(), None);
        assert_eq!(c.turn_records("u", 10).unwrap(), vec!["fine", "alone"]);
        c.conn()
            .execute_batch(
                "DROP TRIGGER refuse;
                 CREATE TEMP TRIGGER refuse BEFORE INSERT ON coordinated_turns
                 BEGIN SELECT RAISE(ABORT, 'injected'); END;",
            )
            .unwrap();
        let e = one(&c, "s", &x(4, "r4", None), ("4", 2)).unwrap_err();
        assert!(format!("{e:?}").contains("injected"), "{e:?}");
        assert_eq!(c.exchange("s", 4).unwrap(), None);
        assert_eq!(c.turn_records("s", 10).unwrap(), vec!["2", "3"]);
    }

    #[test]
    fn the_exchange_log_forks_where_the_agent_diverged() {
        let c = Catalog::in_memory().unwrap();
        for i in 0..4 {
            c.log_exchange("s", &x(i, &format!("h{i}"), Some(&format!("v{i}"))))
                .unwrap();
        }
        assert_eq!(c.exchanges_len("s").unwrap(), 4);
        assert_eq!(c.exchange_of_version("s", "v2").unwrap(), Some(2));
        assert_eq!(c.exchange("s", 1).unwrap().unwrap(), x(1, "h1", Some("v1")));
        assert_eq!(c.fork_exchanges("s", 2).unwrap(), 1);
        assert_eq!(c.exchanges_len("s").unwrap(), 2);
        assert_eq!(c.exchange("s", 2).unwrap(), None);
        assert_eq!(c.exchange_of_version("s", "v3").unwrap(), None);
        c.log_exchange("s", &x(2, "other", None)).unwrap();
        assert_eq!(c.exchanges_len("s").unwrap(), 3);
        assert_eq!(c.fork_exchanges("s", 2).unwrap(), 2);
        assert_eq!(c.exchange_forks("s").unwrap(), 2);
        // Another session's log is its own, and a session's goes with it.
        assert_eq!(c.exchanges_len("t").unwrap(), 0);
        c.delete_session("s").unwrap();
        assert_eq!(c.exchange_forks("s").unwrap(), 0);
    }

    #[test]
    fn pruning_keeps_what_a_fast_forward_can_reach_and_the_log_s_length() {
        let c = Catalog::in_memory().unwrap();
        for i in 0..6 {
            c.log_exchange("s", &x(i, &format!("h{i}"), Some(&format!("v{i}"))))
                .unwrap();
        }
        c.log_exchange("t", &x(0, "h0", None)).unwrap();
        // A fork at 4: places 4 and 5 move to branch 1.
        assert_eq!(c.fork_exchanges("s", 4).unwrap(), 1);
        let one = x(0, "h0", Some("v0"));
        let row = (one.body.len() + serde_json::to_string(&one.headers).unwrap().len()) as u64;
        assert_eq!(c.exchanges_size("s").unwrap(), (6, 6 * row));
        // The oldest version left is at 2: 0 and 1 go, in every branch.
        assert_eq!(c.prune_exchanges("s", 2).unwrap(), 2);
        assert_eq!(c.exchange("s", 1).unwrap(), None);
        assert_eq!(c.exchange_of_version("s", "v2").unwrap(), Some(2));
        assert_eq!(c.exchanges_len("s").unwrap(), 4);
        // Past the log's end: everything but its newest entry, whose place
        // is the log's length; the forked branch goes too.
        assert_eq!(c.prune_exchanges("s", 100).unwrap(), 3);
        assert_eq!(c.exchanges_len("s").unwrap(), 4);
        assert_eq!(c.exchanges_size("s").unwrap().0, 1);
        assert_eq!(
            c.exchanges_size("t").unwrap().0,
            1,
            "another session's log stays"
        );
    }

    #[test]
    fn commands_and_records_are_kept_in_order() {
        let c = Catalog::in_memory().unwrap();
        assert_eq!(c.begin_command("s", 0, None, "{}").unwrap(), 0);
        assert_eq!(c.begin_command("s", 1, Some(1), "{\"a\":1}").unwrap(), 1);
        c.end_command("s", 0, CommandState::Done).unwrap();
        let all = c.commands("s").unwrap();
        assert_eq!(
            all.iter()
                .map(|c| (c.seq, c.position, c.state))
                .collect::<Vec<_>>(),
            vec![(0, 0, CommandState::Done), (1, 1, CommandState::Running)]
        );
        for i in 0..5 {
            c.log_turn_record("s", &i.to_string(), 3).unwrap();
        }
        assert_eq!(c.turn_records("s", 2).unwrap(), vec!["3", "4"]);
        // Only the newest 3 are kept.
        assert_eq!(c.turn_records("s", 10).unwrap(), vec!["2", "3", "4"]);
        c.coordinate("s", None).unwrap();
        assert_eq!(c.agent_of("s").unwrap(), None);
        c.coordinate("s", Some(7)).unwrap();
        c.coordinate("s", None).unwrap();
        assert_eq!(c.agent_of("s").unwrap(), Some(7));
        assert_eq!(c.coordinated().unwrap(), vec![("s".to_owned(), Some(7))]);
        c.delete_session("s").unwrap();
        assert!(c.commands("s").unwrap().is_empty());
        assert!(c.coordinated().unwrap().is_empty());
    }
}
