//! The SQLite catalog: sessions, and the ownership ledger of every host resource
//! drums creates.
//!
//! The ledger's rule is *record before create*: a row naming the resource is
//! committed before the resource exists, and deleted only after the resource is
//! gone. Whatever a crash leaves behind is therefore named in the ledger, and the
//! daemon's sweep at start-up removes it. Removing a resource that a crash
//! prevented from being created is a no-op, so over-recording is harmless.
//!
//! The schema is versioned with `PRAGMA user_version`; see [`SCHEMA_VERSION`].

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

mod images;
mod journal;
mod pools;
mod versions;
pub use drums_api::{Egress, Network, Profile, SessionState, VersionState};
pub use images::{ImageRow, LayerRow};
pub use journal::{Command, Exchange, Logged};
pub use pools::{PoolRecord, MAX_POOL_SIZE};
pub use versions::VersionRecord;

/// The schema version this build reads and writes. A change to any table needs a
/// bump and a step in [`migrate`]; see docs/formats.md.
pub const SCHEMA_VERSION: i64 = 9;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("chmod 0600 {path}")]
    Chmod {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("open catalog {path}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("catalog schema version {found} is newer than this drums supports ({supported})")]
    TooNew { found: i64, supported: i64 },
    #[error("catalog {op}")]
    Sql {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("a session named {0:?} already exists")]
    NameTaken(String),
    #[error("a checkpoint named {0:?} already exists")]
    CheckpointNameTaken(String),
    /// Lookups try the id first, so a name equal to another row's id could
    /// never be reached by name.
    #[error("{name:?} is the id of another {what}: a {what} may not be named after it")]
    NameIsAnId { what: &'static str, name: String },
    #[error("version {0} is not being made: it cannot be published")]
    NotPending(String),
    #[error("no free address left in {0}")]
    PoolExhausted(String),
    /// `--max-sessions`: every session counts, pool members included.
    #[error("drumsd holds {held} sessions, its limit (--max-sessions {max}); remove one, or raise the limit")]
    TooManySessions { held: u64, max: u64 },
    #[error("a pool named {0:?} already exists")]
    PoolNameTaken(String),
    #[error("decode {what} of session {id}")]
    Decode {
        what: &'static str,
        id: String,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, CatalogError>;

fn sql(op: &'static str) -> impl FnOnce(rusqlite::Error) -> CatalogError {
    move |source| CatalogError::Sql { op, source }
}

/// `execute` and `query_row` through the connection's statement cache.
/// SQLite parses a statement in about as long as it runs a small one, and
/// the coordinator's turn boundary runs the same few statements on every
/// model call (docs/coordinator.md, "the turn boundary's cost").
trait Cached {
    fn exec_cached(&self, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<usize>;
    fn row_cached<T>(
        &self,
        sql: &str,
        p: impl rusqlite::Params,
        f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn exec_cached(&self, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(p)
    }

    fn row_cached<T>(
        &self,
        sql: &str,
        p: impl rusqlite::Params,
        f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        self.prepare_cached(sql)?.query_row(p, f)
    }
}

/// Statements kept parsed per connection: every distinct one of the
/// catalog's fits.
const STATEMENT_CACHE: usize = 256;

/// Whether `query` finds at least one row.
fn any_row(
    c: &Connection,
    query: &str,
    p: impl rusqlite::Params,
    op: &'static str,
) -> Result<bool> {
    c.row_cached(query, p, |_| Ok(()))
        .optional()
        .map(|row| row.is_some())
        .map_err(sql(op))
}

/// What kind of host resource a ledger row names. The string forms are stored,
/// so they are part of the on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceKind {
    /// A directory drums made (removed recursively).
    Dir,
    /// A btrfs subvolume.
    Subvolume,
    /// A cgroup, named `parent/name`, in every hierarchy; its processes are killed on removal.
    Cgroup,
    /// A host network link (the host end of a veth, or the bridge).
    Link,
    /// A mount point on the host.
    Mount,
    /// A process, keyed `pid:starttime` so a recycled pid is never killed.
    Process,
    /// The nftables firewall of a bridge, keyed by the bridge's name (both of
    /// its tables, `bridge` and `inet` `drums-<bridge>`).
    NftTable,
}

impl ResourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dir => "dir",
            Self::Subvolume => "subvolume",
            Self::Cgroup => "cgroup",
            Self::Link => "link",
            Self::Mount => "mount",
            Self::Process => "process",
            Self::NftTable => "nft-table",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "dir" => Self::Dir,
            "subvolume" => Self::Subvolume,
            "cgroup" => Self::Cgroup,
            "link" => Self::Link,
            "mount" => Self::Mount,
            "process" => Self::Process,
            "nft-table" => Self::NftTable,
            _ => return None,
        })
    }
}

/// A ledger row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub seq: i64,
    /// A session id, or "daemon" for resources of the daemon itself.
    pub owner: String,
    pub kind: ResourceKind,
    pub key: String,
}

/// A session as the catalog stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub id: String,
    pub name: String,
    pub profile: Profile,
    pub image: String,
    /// creating | running | removing
    pub state: SessionState,
    pub hostname: String,
    /// none | bridge
    pub network: Network,
    /// none | nat: whether a bridge session may leave the host through NAT.
    pub egress: Egress,
    pub ip: Option<String>,
    pub mac: Option<String>,
    /// The session's limits as JSON (owned by the session layer).
    pub limits: serde_json::Value,
    pub init_pid: Option<i32>,
    pub created_at_ms: i64,
    /// How many restores separate this session from a cold start (0: cold).
    pub generation: u64,
    /// The checkpoint this session was restored from, if any.
    pub origin: Option<String>,
    /// Runs without the session's confinement (`--privileged`).
    pub privileged: bool,
    /// The host id that is uid and gid 0 in the session's user namespace (its
    /// range is [`IdPool::size`] ids); `None`: no user namespace (a
    /// privileged session, or a sibling of a checkpoint taken without one).
    pub id_base: Option<u32>,
    /// The warm pool holding the session until it is taken (pools.rs);
    /// `None` for a session of its own.
    pub pool: Option<String>,
}

/// An IPv4 pool to allocate session addresses from: `base` is the network
/// address, host offsets 2.. are handed out (1 is the bridge).
#[derive(Debug, Clone, Copy)]
pub struct IpPool {
    pub base: std::net::Ipv4Addr,
    pub prefix: u8,
}

/// Host id ranges to allocate user namespaces from: slot `i` is
/// `first + i * size .. + size`.
#[derive(Debug, Clone, Copy)]
pub struct IdPool {
    pub first: u32,
    pub size: u32,
    pub slots: u32,
}

pub struct Catalog {
    conn: Mutex<Connection>,
}

impl Catalog {
    pub fn open(path: &Path) -> Result<Catalog> {
        let open_err = |source| CatalogError::Open {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        // Root's alone; SQLite gives its -wal and -shm files the same mode.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|source| CatalogError::Chmod {
                path: path.display().to_string(),
                source,
            })?;
        // WAL: readers (ps, get) never wait for a writer; synchronous=FULL because a
        // ledger row that is lost in a power cut is a resource that leaks.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        migrate(&conn)?;
        Ok(Catalog {
            conn: Mutex::new(conn),
        })
    }

    /// A second connection for the coordinator's journal (journal.rs), with
    /// `synchronous=NORMAL`: in WAL mode its commits survive drumsd being
    /// killed, not a power cut, and cost no fsync each. Losing the newest of
    /// the journal in a power cut loses no state: versions are fsynced, and a
    /// fast-forward that finds less of the log asks upstream again.
    pub fn open_for_journal(path: &Path) -> Result<Catalog> {
        let c = Catalog::open(path)?;
        c.conn()
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(|source| CatalogError::Open {
                path: path.display().to_string(),
                source,
            })?;
        Ok(c)
    }

    pub fn in_memory() -> Result<Catalog> {
        let conn = Connection::open_in_memory().map_err(sql("open in-memory"))?;
        migrate(&conn)?;
        Ok(Catalog {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (each call is one
        // statement or one transaction), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- ledger ------------------------------------------------------------

    /// Record a resource *before* creating it. Recording the same (kind, key) twice
    /// returns the existing row, so retries are safe.
    pub fn record(&self, owner: &str, kind: ResourceKind, key: &str) -> Result<i64> {
        let c = self.conn();
        c.exec_cached(
            "INSERT INTO resources (owner, kind, key, created_at_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (kind, key) DO NOTHING",
            params![owner, kind.as_str(), key, now_ms()],
        )
        .map_err(sql("record resource"))?;
        c.row_cached(
            "SELECT seq FROM resources WHERE kind = ?1 AND key = ?2",
            params![kind.as_str(), key],
            |r| r.get(0),
        )
        .map_err(sql("record resource"))
    }

    /// Forget a resource, *after* it is gone.
    pub fn release(&self, seq: i64) -> Result<()> {
        self.conn()
            .exec_cached("DELETE FROM resources WHERE seq = ?1", params![seq])
            .map_err(sql("release resource"))?;
        Ok(())
    }

    /// The resources of one owner, newest first: the order to remove them in.
    pub fn owned_by(&self, owner: &str) -> Result<Vec<Resource>> {
        self.resources("WHERE owner = ?1 ORDER BY seq DESC", params![owner])
    }

    /// Every resource, newest first.
    pub fn all_resources(&self) -> Result<Vec<Resource>> {
        self.resources("ORDER BY seq DESC", params![])
    }

    fn resources(&self, tail: &str, p: impl rusqlite::Params) -> Result<Vec<Resource>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(&format!(
                "SELECT seq, owner, kind, key FROM resources {tail}"
            ))
            .map_err(sql("list resources"))?;
        let rows = st
            .query_map(p, |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .map_err(sql("list resources"))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, owner, kind, key) = row.map_err(sql("list resources"))?;
            // An unknown kind can only come from a newer drums; the version check
            // refuses such a catalog, so skipping is unreachable in practice.
            if let Some(kind) = ResourceKind::parse(&kind) {
                out.push(Resource {
                    seq,
                    owner,
                    kind,
                    key,
                });
            }
        }
        Ok(out)
    }

    // ---- sessions ----------------------------------------------------------

    /// Insert a session in state `creating`, allocating its address from `pool`
    /// and its id range from `ids` (when given) in the same transaction, so two
    /// concurrent creates can never get one name, one address or one range.
    /// With `max`, refused when that many sessions are already recorded, in
    /// the same transaction, so concurrent creates cannot pass it together.
    pub fn insert_session(
        &self,
        mut rec: SessionRecord,
        pool: Option<IpPool>,
        ids: Option<IdPool>,
        max: Option<u64>,
    ) -> Result<SessionRecord> {
        let mut c = self.conn();
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql("begin insert session"))?;
        if let Some(max) = max {
            let held: u64 = tx
                .row_cached("SELECT COUNT(*) FROM sessions", [], |r| r.get(0))
                .map_err(sql("count sessions"))?;
            if held >= max {
                return Err(CatalogError::TooManySessions { held, max });
            }
        }
        let taken = any_row(
            &tx,
            "SELECT 1 FROM sessions WHERE name = ?1",
            params![rec.name],
            "check session name",
        )?;
        if taken {
            return Err(CatalogError::NameTaken(rec.name));
        }
        let shadows = any_row(
            &tx,
            "SELECT 1 FROM sessions WHERE id = ?1 OR name = ?2",
            params![rec.name, rec.id],
            "check session name",
        )?;
        if shadows {
            return Err(CatalogError::NameIsAnId {
                what: "session",
                name: rec.name,
            });
        }
        if let Some(pool) = pool {
            let used: std::collections::HashSet<u32> = {
                let mut st = tx
                    .prepare_cached("SELECT ip FROM sessions WHERE ip IS NOT NULL")
                    .map_err(sql("list addresses"))?;
                let ips = st
                    .query_map([], |r| r.get::<_, String>(0))
                    .map_err(sql("list addresses"))?
                    .filter_map(|r| r.ok())
                    .filter_map(|s| s.parse::<std::net::Ipv4Addr>().ok())
                    .map(u32::from)
                    .collect();
                ips
            };
            let base = u32::from(pool.base);
            let size = 1u32 << (32 - pool.prefix as u32);
            // offset 0 is the network, 1 the bridge, size-1 the broadcast.
            let ip = (2..size - 1)
                .map(|off| base + off)
                .find(|a| !used.contains(a))
                .ok_or_else(|| {
                    CatalogError::PoolExhausted(format!("{}/{}", pool.base, pool.prefix))
                })?;
            let ip = std::net::Ipv4Addr::from(ip);
            let o = ip.octets();
            rec.ip = Some(ip.to_string());
            // Locally administered unicast MAC derived from the address: unique as
            // long as the address is, and readable when debugging.
            rec.mac = Some(format!(
                "02:64:{:02x}:{:02x}:{:02x}:{:02x}",
                o[0], o[1], o[2], o[3]
            ));
        }
        if let Some(ids) = ids {
            let used: std::collections::HashSet<u32> = {
                let mut st = tx
                    .prepare_cached("SELECT id_base FROM sessions WHERE id_base IS NOT NULL")
                    .map_err(sql("list id ranges"))?;
                let bases = st
                    .query_map([], |r| r.get::<_, u32>(0))
                    .map_err(sql("list id ranges"))?
                    .filter_map(|r| r.ok())
                    .collect();
                bases
            };
            let base = (0..ids.slots)
                .map(|i| ids.first + i * ids.size)
                .find(|b| !used.contains(b))
                .ok_or_else(|| {
                    CatalogError::PoolExhausted(format!(
                        "{} id ranges of {} from {}",
                        ids.slots, ids.size, ids.first
                    ))
                })?;
            rec.id_base = Some(base);
        }
        tx.exec_cached(
            "INSERT INTO sessions (id, name, profile, image, state, hostname, network, ip, mac, limits, init_pid, created_at_ms, generation, origin, egress, privileged, id_base, pool)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
            params![
                rec.id, rec.name, rec.profile, rec.image, rec.state, rec.hostname, rec.network, rec.ip, rec.mac,
                rec.limits.to_string(), rec.init_pid, rec.created_at_ms, rec.generation as i64, rec.origin,
                rec.egress,
                rec.privileged,
                rec.id_base,
                rec.pool
            ],
        )
        .map_err(sql("insert session"))?;
        tx.commit().map_err(sql("commit insert session"))?;
        Ok(rec)
    }

    pub fn set_session_state(
        &self,
        id: &str,
        state: SessionState,
        init_pid: Option<i32>,
    ) -> Result<()> {
        self.conn()
            .exec_cached(
                "UPDATE sessions SET state = ?2, init_pid = COALESCE(?3, init_pid) WHERE id = ?1",
                params![id, state, init_pid],
            )
            .map_err(sql("update session"))?;
        Ok(())
    }

    /// A session's row, with the coordinator's journal of it.
    pub fn delete_session(&self, id: &str) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(sql("delete session"))?;
        tx.exec_cached("DELETE FROM sessions WHERE id = ?1", params![id])
            .map_err(sql("delete session"))?;
        for statement in journal::DELETE_SESSION.split_terminator(';') {
            if !statement.trim().is_empty() {
                tx.exec_cached(statement, params![id])
                    .map_err(sql("delete session's journal"))?;
            }
        }
        tx.commit().map_err(sql("delete session"))?;
        Ok(())
    }

    /// A session by id or by name.
    pub fn session(&self, id_or_name: &str) -> Result<Option<SessionRecord>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(&format!("{SELECT_SESSION} WHERE id = ?1 OR name = ?1"))
            .map_err(sql("get session"))?;
        let row = st
            .query_row(params![id_or_name], row_to_raw)
            .optional()
            .map_err(sql("get session"))?;
        row.map(decode).transpose()
    }

    pub fn sessions(&self) -> Result<Vec<SessionRecord>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(&format!("{SELECT_SESSION} ORDER BY created_at_ms, id"))
            .map_err(sql("list sessions"))?;
        let rows = st.query_map([], row_to_raw).map_err(sql("list sessions"))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(decode(r.map_err(sql("list sessions"))?)?);
        }
        Ok(out)
    }
}

const SELECT_SESSION: &str = "SELECT id, name, profile, image, state, hostname, network, ip, mac, limits, init_pid, created_at_ms, generation, origin, egress, privileged, id_base, pool FROM sessions";

type Raw = (SessionRecord, String);

fn row_to_raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok((
        SessionRecord {
            id: r.get(0)?,
            name: r.get(1)?,
            profile: r.get(2)?,
            image: r.get(3)?,
            state: r.get(4)?,
            hostname: r.get(5)?,
            network: r.get(6)?,
            ip: r.get(7)?,
            mac: r.get(8)?,
            limits: serde_json::Value::Null,
            init_pid: r.get(10)?,
            created_at_ms: r.get(11)?,
            generation: r.get::<_, i64>(12)? as u64,
            origin: r.get(13)?,
            egress: r.get(14)?,
            privileged: r.get(15)?,
            id_base: r.get(16)?,
            pool: r.get(17)?,
        },
        r.get(9)?,
    ))
}

fn decode((mut rec, limits): Raw) -> Result<SessionRecord> {
    rec.limits = serde_json::from_str(&limits).map_err(|source| CatalogError::Decode {
        what: "limits",
        id: rec.id.clone(),
        source,
    })?;
    Ok(rec)
}

fn migrate(conn: &Connection) -> Result<()> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql("read schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(CatalogError::TooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < 1 {
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE sessions (
                 id TEXT PRIMARY KEY,
                 name TEXT NOT NULL UNIQUE,
                 profile TEXT NOT NULL,
                 image TEXT NOT NULL,
                 state TEXT NOT NULL,
                 hostname TEXT NOT NULL,
                 network TEXT NOT NULL,
                 ip TEXT UNIQUE,
                 mac TEXT,
                 limits TEXT NOT NULL,
                 init_pid INTEGER,
                 created_at_ms INTEGER NOT NULL
             );
             CREATE TABLE resources (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 owner TEXT NOT NULL,
                 kind TEXT NOT NULL,
                 key TEXT NOT NULL,
                 created_at_ms INTEGER NOT NULL,
                 UNIQUE (kind, key)
             );
             CREATE INDEX resources_owner ON resources (owner);
             PRAGMA user_version = 1;
             COMMIT;",
        )
        .map_err(sql("migrate to schema 1"))?;
    }
    if version < 2 {
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE sessions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE sessions ADD COLUMN origin TEXT;
             CREATE TABLE checkpoints (
                 id TEXT PRIMARY KEY,
                 name TEXT NOT NULL UNIQUE,
                 session_id TEXT NOT NULL,
                 state TEXT NOT NULL,
                 created_at_ms INTEGER NOT NULL,
                 manifest TEXT NOT NULL
             );
             PRAGMA user_version = 2;
             COMMIT;",
        )
        .map_err(sql("migrate to schema 2"))?;
    }
    if version < 3 {
        // Sessions made before egress existed had none, and none was
        // privileged. The new ledger kind `nft-table` needs no column, only a
        // reader that knows it.
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE sessions ADD COLUMN egress TEXT NOT NULL DEFAULT 'none';
             ALTER TABLE sessions ADD COLUMN privileged INTEGER NOT NULL DEFAULT 0;
             PRAGMA user_version = 3;
             COMMIT;",
        )
        .map_err(sql("migrate to schema 3"))?;
    }
    if version < 4 {
        // Sessions made before user namespaces have none (NULL). The index
        // makes a range belong to one session at a time.
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE sessions ADD COLUMN id_base INTEGER;
             CREATE UNIQUE INDEX sessions_id_base ON sessions (id_base);
             PRAGMA user_version = 4;
             COMMIT;",
        )
        .map_err(sql("migrate to schema 4"))?;
    }
    if version < 5 {
        // Versions (see versions.rs): every checkpoint made before them was
        // a full one that a person asked for, so pinned, with both artifacts
        // its own, and outside any session's numbered history.
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE checkpoints ADD COLUMN version INTEGER;
             ALTER TABLE checkpoints ADD COLUMN parent TEXT;
             ALTER TABLE checkpoints ADD COLUMN pinned INTEGER NOT NULL DEFAULT 1;
             ALTER TABLE checkpoints ADD COLUMN files_of TEXT;
             ALTER TABLE checkpoints ADD COLUMN process_of TEXT;
             UPDATE checkpoints SET files_of = id, process_of = id;
             CREATE UNIQUE INDEX checkpoints_session_version ON checkpoints (session_id, version);
             PRAGMA user_version = 5;
             COMMIT;",
        )
        .map_err(sql("migrate to schema 5"))?;
    }
    if version < 6 {
        // The coordinator's journal (journal.rs): new tables only.
        conn.execute_batch(journal::MIGRATE_6)
            .map_err(sql("migrate to schema 6"))?;
    }
    if version < 7 {
        // OCI images (images.rs): new tables only.
        conn.execute_batch(images::MIGRATE_7)
            .map_err(sql("migrate to schema 7"))?;
    }
    if version < 8 {
        // Which agent a coordinated session's turns belong to (journal.rs),
        // and the checkpoints a fork made, which go with their last sibling
        // (versions.rs). Older rows: an agent found in the session or none;
        // checkpoints kept until removed by hand, as they were.
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE coordinated ADD COLUMN outside INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE checkpoints ADD COLUMN with_siblings INTEGER NOT NULL DEFAULT 0;
             PRAGMA user_version = 8;
             COMMIT;",
        )
        .map_err(sql("migrate to schema 8"))?;
    }
    if version < 9 {
        // Warm pools (pools.rs). Older sessions belong to none.
        conn.execute_batch(pools::MIGRATE_9)
            .map_err(sql("migrate to schema 9"))?;
    }
    Ok(())
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, name: &str) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            name: name.into(),
            profile: Profile::Headless,
            image: "default".into(),
            state: SessionState::Creating,
            hostname: name.into(),
            network: Network::Bridge,
            ip: None,
            mac: None,
            limits: serde_json::json!({"memory_bytes": 1}),
            init_pid: None,
            created_at_ms: 1,
            generation: 0,
            origin: None,
            egress: Egress::None,
            privileged: false,
            id_base: None,
            pool: None,
        }
    }

    const POOL: IpPool = IpPool {
        base: std::net::Ipv4Addr::new(10, 9, 0, 0),
        prefix: 29,
    };

    #[test]
    fn a_session_read_again_is_what_the_last_write_left() {
        let c = Catalog::in_memory().unwrap();
        c.insert_session(rec("a", "one"), None, None, None).unwrap();
        // Read twice (the second from what the first kept), by id and name.
        for key in ["a", "one", "a", "one"] {
            assert_eq!(
                c.session(key).unwrap().unwrap().state,
                SessionState::Creating
            );
        }
        c.set_session_state("a", SessionState::Running, Some(42))
            .unwrap();
        for key in ["a", "one"] {
            let r = c.session(key).unwrap().unwrap();
            assert_eq!((r.state, r.init_pid), (SessionState::Running, Some(42)));
        }
        c.delete_session("a").unwrap();
        assert!(c.session("a").unwrap().is_none());
        assert!(c.session("one").unwrap().is_none());
    }

    #[test]
    fn id_ranges_are_allocated_lowest_first_and_freed_with_the_session() {
        let ids = IdPool {
            first: 1 << 20,
            size: 65536,
            slots: 2,
        };
        let c = Catalog::in_memory().unwrap();
        let a = c
            .insert_session(rec("a", "one"), None, Some(ids), None)
            .unwrap();
        assert_eq!(a.id_base, Some(1 << 20));
        let b = c
            .insert_session(rec("b", "two"), None, Some(ids), None)
            .unwrap();
        assert_eq!(b.id_base, Some((1 << 20) + 65536));
        assert_eq!(c.session("b").unwrap().unwrap().id_base, b.id_base);
        assert!(matches!(
            c.insert_session(rec("c", "three"), None, Some(ids), None),
            Err(CatalogError::PoolExhausted(_))
        ));
        let p = c
            .insert_session(rec("p", "privileged"), None, None, None)
            .unwrap();
        assert_eq!(p.id_base, None);
        c.delete_session("a").unwrap();
        let d = c
            .insert_session(rec("d", "four"), None, Some(ids), None)
            .unwrap();
        assert_eq!(d.id_base, Some(1 << 20), "a freed range is reused");
    }

    #[test]
    fn names_are_unique_and_addresses_allocated_lowest_first() {
        let c = Catalog::in_memory().unwrap();
        let a = c
            .insert_session(rec("a", "one"), Some(POOL), None, None)
            .unwrap();
        assert_eq!(a.ip.as_deref(), Some("10.9.0.2"));
        assert_eq!(a.mac.as_deref(), Some("02:64:0a:09:00:02"));
        let b = c
            .insert_session(rec("b", "two"), Some(POOL), None, None)
            .unwrap();
        assert_eq!(b.ip.as_deref(), Some("10.9.0.3"));
        assert!(
            matches!(c.insert_session(rec("c", "one"), Some(POOL), None, None), Err(CatalogError::NameTaken(n)) if n == "one")
        );
        // Lookups try the id first: a name equal to another session's id (or
        // an id equal to another's name) would leave one of them unreachable.
        assert!(
            matches!(c.insert_session(rec("c", "b"), Some(POOL), None, None), Err(CatalogError::NameIsAnId { name, .. }) if name == "b")
        );
        assert!(matches!(
            c.insert_session(rec("two", "four"), Some(POOL), None, None),
            Err(CatalogError::NameIsAnId { .. })
        ));
        c.delete_session("a").unwrap();
        let d = c
            .insert_session(rec("d", "three"), Some(POOL), None, None)
            .unwrap();
        assert_eq!(d.ip.as_deref(), Some("10.9.0.2"), "freed address is reused");
        // /29: offsets 2..=6 usable
        for (i, n) in ["x4", "x5", "x6"].iter().enumerate() {
            c.insert_session(rec(&format!("e{i}"), n), Some(POOL), None, None)
                .unwrap();
        }
        assert!(matches!(
            c.insert_session(rec("f", "full"), Some(POOL), None, None),
            Err(CatalogError::PoolExhausted(_))
        ));
        assert_eq!(c.session("two").unwrap().unwrap().id, "b");
        assert_eq!(
            c.session("b").unwrap().unwrap().limits,
            serde_json::json!({"memory_bytes": 1})
        );
        assert!(c.session("nope").unwrap().is_none());
    }

    #[test]
    fn ledger_is_newest_first_and_idempotent() {
        let c = Catalog::in_memory().unwrap();
        let s1 = c.record("s", ResourceKind::Dir, "/a").unwrap();
        let s2 = c.record("s", ResourceKind::Cgroup, "drums/s").unwrap();
        assert_eq!(c.record("s", ResourceKind::Dir, "/a").unwrap(), s1);
        c.record("daemon", ResourceKind::Mount, "/m").unwrap();
        let owned: Vec<_> = c
            .owned_by("s")
            .unwrap()
            .into_iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(owned, vec![s2, s1]);
        c.release(s2).unwrap();
        assert_eq!(c.owned_by("s").unwrap().len(), 1);
        assert_eq!(c.all_resources().unwrap().len(), 2);
    }

    #[test]
    fn a_version_1_catalog_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.db");
        {
            let conn = Connection::open(&p).unwrap();
            conn.execute_batch("CREATE TABLE sessions (id TEXT); CREATE TABLE resources (seq INTEGER); PRAGMA user_version = 1;")
                .unwrap();
        }
        let c = Catalog::open(&p).unwrap();
        assert!(c.versions().unwrap().is_empty());
        let v: i64 = c
            .conn()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        // Schema 3's column is there, with its default.
        let privileged: i64 = c
            .conn()
            .row_cached(
                "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name = 'privileged'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(privileged, 1);
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&p).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "catalog.db is root's alone");
    }

    #[test]
    fn a_version_2_session_reads_as_egress_none() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.db");
        {
            let conn = Connection::open(&p).unwrap();
            conn.execute_batch(
                "CREATE TABLE sessions (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                     profile TEXT NOT NULL, image TEXT NOT NULL, state TEXT NOT NULL,
                     hostname TEXT NOT NULL, network TEXT NOT NULL, ip TEXT UNIQUE, mac TEXT,
                     limits TEXT NOT NULL, init_pid INTEGER, created_at_ms INTEGER NOT NULL,
                     generation INTEGER NOT NULL DEFAULT 0, origin TEXT);
                 CREATE TABLE resources (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                     owner TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,
                     created_at_ms INTEGER NOT NULL, UNIQUE (kind, key));
                 CREATE TABLE checkpoints (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                     session_id TEXT NOT NULL, state TEXT NOT NULL,
                     created_at_ms INTEGER NOT NULL, manifest TEXT NOT NULL);
                 INSERT INTO sessions VALUES ('s1', 'old', 'headless', 'default', 'running',
                     'old', 'bridge', '10.9.0.2', NULL, '{}', NULL, 1, 0, NULL);
                 INSERT INTO checkpoints VALUES ('c1', 'warm', 's1', 'done', 1, '{}');
                 PRAGMA user_version = 2;",
            )
            .unwrap();
        }
        let c = Catalog::open(&p).unwrap();
        let old = c.session("old").unwrap().unwrap();
        assert_eq!(old.egress, Egress::None);
        assert!(!old.privileged);
        // Schema 5: a checkpoint from before versions is a pinned full one,
        // outside any numbered history.
        let ck = c.version("warm").unwrap().unwrap();
        assert!(ck.pinned);
        assert_eq!(ck.files_of.as_deref(), Some("c1"));
        assert_eq!(ck.process_of.as_deref(), Some("c1"));
        assert_eq!(ck.number, None);
        assert!(c.session_versions("s1").unwrap().is_empty());
    }

    #[test]
    fn nft_table_kind_round_trips() {
        let c = Catalog::in_memory().unwrap();
        c.record("daemon", ResourceKind::NftTable, "drums0")
            .unwrap();
        let rows = c.owned_by("daemon").unwrap();
        assert_eq!(rows[0].kind, ResourceKind::NftTable);
        assert_eq!(ResourceKind::NftTable.as_str(), "nft-table");
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.db");
        drop(Catalog::open(&p).unwrap());
        Connection::open(&p)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let e = Catalog::open(&p).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "catalog schema version 99 is newer than this drums supports ({SCHEMA_VERSION})"
            )
        );
    }
}
