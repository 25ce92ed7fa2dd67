//! Warm pools (docs/pools.md): a pool names a checkpoint and how many of its
//! siblings to keep ready. Its members are ordinary session rows whose `pool`
//! column names it until they are taken, so a member is recorded, swept and
//! adopted after a crash exactly as any session is, and a take is one
//! statement that clears the column: two takers can never get one member.

use rusqlite::{params, OptionalExtension};

use crate::{
    any_row, decode, row_to_raw, sql, Cached, Catalog, CatalogError, Result, SessionRecord,
    SELECT_SESSION,
};

/// Most members one pool keeps ready (as many as one restore makes).
pub const MAX_POOL_SIZE: u32 = 64;

pub(crate) const MIGRATE_9: &str = "BEGIN;
     CREATE TABLE pools (
         id TEXT PRIMARY KEY,
         name TEXT NOT NULL UNIQUE,
         checkpoint_id TEXT NOT NULL,
         size INTEGER NOT NULL,
         created_at_ms INTEGER NOT NULL
     );
     ALTER TABLE sessions ADD COLUMN pool TEXT;
     CREATE INDEX sessions_pool ON sessions (pool);
     PRAGMA user_version = 9;
     COMMIT;";

/// A pool as the catalog stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRecord {
    pub id: String,
    pub name: String,
    /// The checkpoint's id (never its name, which may be reused).
    pub checkpoint_id: String,
    pub size: u32,
    pub created_at_ms: i64,
}

const SELECT_POOL: &str = "SELECT id, name, checkpoint_id, size, created_at_ms FROM pools";

fn row_to_pool(r: &rusqlite::Row<'_>) -> rusqlite::Result<PoolRecord> {
    Ok(PoolRecord {
        id: r.get(0)?,
        name: r.get(1)?,
        checkpoint_id: r.get(2)?,
        size: r.get(3)?,
        created_at_ms: r.get(4)?,
    })
}

impl Catalog {
    pub fn insert_pool(&self, p: &PoolRecord) -> Result<()> {
        let mut c = self.conn();
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql("begin insert pool"))?;
        if any_row(
            &tx,
            "SELECT 1 FROM pools WHERE name = ?1",
            params![p.name],
            "check pool name",
        )? {
            return Err(CatalogError::PoolNameTaken(p.name.clone()));
        }
        // Lookups try the id first (as for sessions).
        if any_row(
            &tx,
            "SELECT 1 FROM pools WHERE id = ?1 OR name = ?2",
            params![p.name, p.id],
            "check pool name",
        )? {
            return Err(CatalogError::NameIsAnId {
                what: "pool",
                name: p.name.clone(),
            });
        }
        tx.exec_cached(
            "INSERT INTO pools (id, name, checkpoint_id, size, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![p.id, p.name, p.checkpoint_id, p.size, p.created_at_ms],
        )
        .map_err(sql("insert pool"))?;
        tx.commit().map_err(sql("commit insert pool"))
    }

    /// A pool by id or by name.
    pub fn pool(&self, id_or_name: &str) -> Result<Option<PoolRecord>> {
        self.conn()
            .row_cached(
                &format!("{SELECT_POOL} WHERE id = ?1 OR name = ?1 ORDER BY id = ?1 DESC LIMIT 1"),
                params![id_or_name],
                row_to_pool,
            )
            .optional()
            .map_err(sql("get pool"))
    }

    pub fn pools(&self) -> Result<Vec<PoolRecord>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(&format!("{SELECT_POOL} ORDER BY created_at_ms, id"))
            .map_err(sql("list pools"))?;
        let rows = st.query_map([], row_to_pool).map_err(sql("list pools"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql("list pools"))
    }

    /// The pools that restore from a checkpoint (which may not go while any does).
    pub fn pools_of_checkpoint(&self, checkpoint_id: &str) -> Result<Vec<String>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached("SELECT name FROM pools WHERE checkpoint_id = ?1 ORDER BY name")
            .map_err(sql("list pools of checkpoint"))?;
        let rows = st
            .query_map(params![checkpoint_id], |r| r.get(0))
            .map_err(sql("list pools of checkpoint"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(sql("list pools of checkpoint"))
    }

    pub fn delete_pool(&self, id: &str) -> Result<()> {
        self.conn()
            .exec_cached("DELETE FROM pools WHERE id = ?1", params![id])
            .map_err(sql("delete pool"))?;
        Ok(())
    }

    /// The sessions a pool still holds, in every state, oldest first.
    pub fn pool_members(&self, pool_id: &str) -> Result<Vec<SessionRecord>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(&format!(
                "{SELECT_SESSION} WHERE pool = ?1 ORDER BY created_at_ms, id"
            ))
            .map_err(sql("list pool members"))?;
        let rows = st
            .query_map(params![pool_id], row_to_raw)
            .map_err(sql("list pool members"))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(decode(r.map_err(sql("list pool members"))?)?);
        }
        Ok(out)
    }

    /// Hand out the pool's oldest running member: one statement clears its
    /// `pool`, so each member is taken once however many ask at a time.
    pub fn take_member(&self, pool_id: &str) -> Result<Option<String>> {
        self.conn()
            .row_cached(
                "UPDATE sessions SET pool = NULL WHERE id = (
                     SELECT id FROM sessions
                     WHERE pool = ?1 AND state = 'running'
                     ORDER BY created_at_ms, id LIMIT 1)
                 RETURNING id",
                params![pool_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("take pool member"))
    }

    /// Take one member out of its pool (one found dead, before it is
    /// removed): whether it was still in one.
    pub fn leave_pool(&self, session_id: &str) -> Result<bool> {
        self.conn()
            .exec_cached(
                "UPDATE sessions SET pool = NULL WHERE id = ?1 AND pool IS NOT NULL",
                params![session_id],
            )
            .map(|n| n == 1)
            .map_err(sql("leave pool"))
    }

    /// How many sessions are recorded, in every state (what `--max-sessions`
    /// counts).
    pub fn session_count(&self) -> Result<u64> {
        self.conn()
            .row_cached("SELECT COUNT(*) FROM sessions", [], |r| r.get(0))
            .map_err(sql("count sessions"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, pool: &str, state: &str, at: i64) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            name: id.into(),
            profile: crate::Profile::Headless,
            image: "default".into(),
            state: state.parse().expect("a session state"),
            hostname: id.into(),
            network: crate::Network::None,
            egress: crate::Egress::None,
            ip: None,
            mac: None,
            limits: serde_json::json!({}),
            init_pid: None,
            created_at_ms: at,
            generation: 1,
            origin: Some("ck".into()),
            privileged: false,
            id_base: None,
            pool: Some(pool.into()),
        }
    }

    fn pool(id: &str, name: &str) -> PoolRecord {
        PoolRecord {
            id: id.into(),
            name: name.into(),
            checkpoint_id: "ck".into(),
            size: 2,
            created_at_ms: 1,
        }
    }

    #[test]
    fn a_member_is_taken_once_oldest_running_first() {
        let c = Catalog::in_memory().unwrap();
        c.insert_pool(&pool("p1", "warm")).unwrap();
        c.insert_session(member("a", "p1", "running", 2), None, None, None)
            .unwrap();
        c.insert_session(member("b", "p1", "running", 1), None, None, None)
            .unwrap();
        c.insert_session(member("c", "p1", "creating", 0), None, None, None)
            .unwrap();
        assert_eq!(c.take_member("p1").unwrap().as_deref(), Some("b"));
        assert_eq!(c.take_member("p1").unwrap().as_deref(), Some("a"));
        // Still being restored: not ready, not handed out.
        assert_eq!(c.take_member("p1").unwrap(), None);
        assert_eq!(c.session("a").unwrap().unwrap().pool, None);
        let left: Vec<String> = c
            .pool_members("p1")
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(left, ["c"]);
    }

    #[test]
    fn a_member_that_left_its_pool_is_not_taken() {
        let c = Catalog::in_memory().unwrap();
        c.insert_session(member("a", "p1", "running", 1), None, None, None)
            .unwrap();
        c.insert_session(member("b", "p1", "running", 2), None, None, None)
            .unwrap();
        assert!(c.leave_pool("a").unwrap());
        assert!(!c.leave_pool("a").unwrap(), "once");
        assert_eq!(c.take_member("p1").unwrap().as_deref(), Some("b"));
        assert_eq!(c.take_member("p1").unwrap(), None);
    }

    #[test]
    fn pool_names_are_unique_and_never_another_pools_id() {
        let c = Catalog::in_memory().unwrap();
        c.insert_pool(&pool("p1", "warm")).unwrap();
        assert!(matches!(
            c.insert_pool(&pool("p2", "warm")),
            Err(CatalogError::PoolNameTaken(n)) if n == "warm"
        ));
        assert!(matches!(
            c.insert_pool(&pool("p3", "p1")),
            Err(CatalogError::NameIsAnId { .. })
        ));
        assert_eq!(c.pool("warm").unwrap().unwrap().id, "p1");
        assert_eq!(c.pool("p1").unwrap().unwrap().name, "warm");
        assert_eq!(c.pools_of_checkpoint("ck").unwrap(), ["warm"]);
        c.delete_pool("p1").unwrap();
        assert!(c.pool("warm").unwrap().is_none());
    }

    #[test]
    fn max_sessions_counts_every_session() {
        let c = Catalog::in_memory().unwrap();
        c.insert_session(member("a", "p1", "creating", 1), None, None, Some(2))
            .unwrap();
        let mut own = member("b", "p1", "running", 2);
        own.pool = None;
        c.insert_session(own, None, None, Some(2)).unwrap();
        assert!(matches!(
            c.insert_session(member("c", "p1", "running", 3), None, None, Some(2)),
            Err(CatalogError::TooManySessions { held: 2, max: 2 })
        ));
        assert_eq!(c.session_count().unwrap(), 2);
    }
}
