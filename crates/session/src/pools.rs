//! Warm pools (docs/pools.md): `size` hygienic siblings of a checkpoint kept
//! restored and ready, so that a take hands one out at once and a
//! replacement is restored in the background.
//!
//! A subsystem of its own over the manager's public restore and remove: it
//! owns only its refill tasks and what takers wait on. Everything durable is
//! in the catalog (the pool's row, and each member's `pool` column), so a
//! drumsd killed at any point leaves pool members that the next one adopts
//! (live) or sweeps (half-made), and a pool that refills.

use drums_api::SessionState;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drums_api::{CreatePool, Pool, Session};
use drums_catalog::{PoolRecord, SessionRecord, MAX_POOL_SIZE};
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::manager::{to_api, Manager};
use crate::{error_chain, SessionError};

/// How long a take waits for a ready member when the request names no
/// timeout.
pub const DEFAULT_TAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest wait a take may ask for.
pub const MAX_TAKE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How often a full pool looks at its members anyway: one removed by hand
/// (`drums rm`) or dead is replaced within this.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// Back-off after a refill failed, doubling up to the max: a checkpoint that
/// cannot be restored costs a restore attempt every few seconds, not a loop.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(8);
/// The most siblings one refill restores at once: a batch is all or
/// nothing, and past a few the 2-core host gains nothing.
const BATCH: usize = 4;

/// The warm pools of one drumsd.
pub struct Pools {
    manager: Arc<Manager>,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// drumsd is stopping: waiting takes answer at once instead of holding
    /// the graceful shutdown for their timeout.
    stopping: AtomicBool,
}

/// What a pool has besides its row: its refill task and its takers' signal.
struct Live {
    record: PoolRecord,
    /// Wakes the refill task (a take, a removal).
    wake: Notify,
    /// Bumped whenever a refill finishes or fails: takers wait on it.
    refilled: watch::Sender<u64>,
    taken: AtomicU64,
    /// Why the pool is short and not restoring, for `GET` and a take that
    /// timed out.
    waiting_on: Mutex<Option<String>>,
    closing: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Live {
    fn new(record: PoolRecord) -> Arc<Live> {
        Arc::new(Live {
            record,
            wake: Notify::new(),
            refilled: watch::channel(0).0,
            taken: AtomicU64::new(0),
            waiting_on: Mutex::new(None),
            closing: AtomicBool::new(false),
            task: Mutex::new(None),
        })
    }

    fn set_waiting_on(&self, why: Option<String>) {
        *self.waiting_on.lock().unwrap_or_else(|p| p.into_inner()) = why;
        self.refilled.send_modify(|n| *n += 1);
    }

    fn waiting_on(&self) -> Option<String> {
        self.waiting_on
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Pools {
    /// The pools a previous drumsd left, refilling again. Members whose pool
    /// is gone (drumsd killed while removing it) are removed.
    pub async fn start(manager: Arc<Manager>) -> Result<Arc<Pools>, SessionError> {
        let pools = Arc::new(Pools {
            manager,
            live: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
        });
        let records = pools.manager.host.catalog.pools()?;
        let known: std::collections::HashSet<&str> =
            records.iter().map(|p| p.id.as_str()).collect();
        for s in pools.manager.host.catalog.sessions()? {
            if s.pool.as_deref().is_some_and(|p| !known.contains(p)) {
                info!(session = %s.id, "removing a member of a pool that was removed");
                if let Err(e) = pools.manager.remove(&s.id).await {
                    warn!("remove orphaned pool member {}: {}", s.id, error_chain(&e));
                }
            }
        }
        for r in records {
            info!(pool = %r.name, size = r.size, "warm pool: refilling");
            pools.spawn(r);
        }
        Ok(pools)
    }

    fn spawn(self: &Arc<Self>, record: PoolRecord) -> Arc<Live> {
        let live = Live::new(record);
        let task = tokio::spawn(refill(self.manager.clone(), live.clone()));
        *live.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(live.record.id.clone(), live.clone());
        live
    }

    /// `POST /v1/pools`: checked as a restore would be, then recorded and
    /// refilled in the background.
    pub async fn create(self: &Arc<Self>, req: CreatePool) -> Result<Pool, SessionError> {
        if req.size == 0 || req.size > MAX_POOL_SIZE {
            return Err(SessionError::Invalid(format!(
                "size {}: a pool keeps 1 to {MAX_POOL_SIZE} members ready",
                req.size
            )));
        }
        if let Some(max) = self.manager.config().max_sessions {
            if u64::from(req.size) > max {
                return Err(SessionError::Invalid(format!(
                    "size {} is more than the {max} sessions drumsd may hold (--max-sessions)",
                    req.size
                )));
            }
        }
        if let Some(n) = &req.name {
            crate::spec::validate_name_of("pool", n)?;
        }
        // What a restore would refuse, refused now rather than in every refill.
        let (ck, m) = self.manager.manifest(&req.checkpoint)?;
        m.host.check_restorable_on(&self.manager.host.fingerprint)?;
        crate::restore::process_artifact(&m)?;
        let id = crate::create::random_hex(6);
        let record = PoolRecord {
            name: req.name.unwrap_or_else(|| id.clone()),
            id,
            checkpoint_id: ck.id,
            size: req.size,
            created_at_ms: drums_catalog::now_ms(),
        };
        self.manager.host.catalog.insert_pool(&record)?;
        info!(pool = %record.name, checkpoint = %record.checkpoint_id, size = record.size, "warm pool created");
        let live = self.spawn(record);
        self.view(&live)
    }

    fn find(&self, id_or_name: &str) -> Result<Arc<Live>, SessionError> {
        let id = self
            .manager
            .host
            .catalog
            .pool(id_or_name)?
            .ok_or_else(|| SessionError::PoolNotFound(id_or_name.to_owned()))?
            .id;
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            // Its row is there but it is being removed.
            .ok_or_else(|| SessionError::PoolNotFound(id_or_name.to_owned()))
    }

    fn view(&self, live: &Live) -> Result<Pool, SessionError> {
        let members = self.manager.host.catalog.pool_members(&live.record.id)?;
        let count =
            |state: SessionState| members.iter().filter(|m| m.state == state).count() as u32;
        let r = &live.record;
        Ok(Pool {
            id: r.id.clone(),
            name: r.name.clone(),
            checkpoint: r.checkpoint_id.clone(),
            size: r.size,
            ready: count(SessionState::Running),
            restoring: count(SessionState::Creating),
            taken: live.taken.load(Ordering::Relaxed),
            created_at_ms: r.created_at_ms,
            waiting_on: live.waiting_on(),
        })
    }

    pub fn get(&self, id_or_name: &str) -> Result<Pool, SessionError> {
        self.view(&*self.find(id_or_name)?)
    }

    pub fn list(&self) -> Result<Vec<Pool>, SessionError> {
        let mut live: Vec<Arc<Live>> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        live.sort_by(|a, b| {
            (a.record.created_at_ms, &a.record.id).cmp(&(b.record.created_at_ms, &b.record.id))
        });
        live.iter().map(|l| self.view(l)).collect()
    }

    /// `POST /v1/pools/{p}/take`: a ready member, handed out once (one
    /// catalog statement takes it out of the pool), as an ordinary session.
    /// With none ready, waits up to `timeout` for the refill.
    pub async fn take(&self, id_or_name: &str, timeout: Duration) -> Result<Session, SessionError> {
        if timeout > MAX_TAKE_TIMEOUT {
            return Err(SessionError::Invalid(format!(
                "timeout_ms {}: wait at most {} ms",
                timeout.as_millis(),
                MAX_TAKE_TIMEOUT.as_millis()
            )));
        }
        let live = self.find(id_or_name)?;
        let started = Instant::now();
        let deadline = started + timeout;
        // Subscribed before looking, so a refill that ends in between is seen.
        let mut refilled = live.refilled.subscribe();
        loop {
            while let Some(id) = self.manager.host.catalog.take_member(&live.record.id)? {
                let Some(rec) = self.manager.host.catalog.session(&id)? else {
                    continue;
                };
                // The replacement, at once.
                live.wake.notify_one();
                if self.manager.host.live_init(&rec).is_some() {
                    live.taken.fetch_add(1, Ordering::Relaxed);
                    return Ok(to_api(rec));
                }
                // Died while pooled: out of the pool already, so nobody else
                // gets it; it goes in the background.
                self.discard(rec);
            }
            live.wake.notify_one();
            let now = Instant::now();
            if now >= deadline
                || live.closing.load(Ordering::Acquire)
                || self.stopping.load(Ordering::Acquire)
            {
                return Err(self.empty(&live, started.elapsed()));
            }
            // A refill's end, or the deadline.
            let _ = tokio::time::timeout(deadline - now, refilled.changed()).await;
        }
    }

    fn discard(&self, rec: SessionRecord) {
        warn!(session = %rec.id, "a pool member's processes died; removing it");
        let m = self.manager.clone();
        tokio::spawn(async move {
            if let Err(e) = m.remove(&rec.id).await {
                warn!("remove dead pool member {}: {}", rec.id, error_chain(&e));
            }
        });
    }

    fn empty(&self, live: &Live, waited: Duration) -> SessionError {
        let restoring = self
            .manager
            .host
            .catalog
            .pool_members(&live.record.id)
            .map(|m| {
                m.iter()
                    .filter(|s| s.state == SessionState::Creating)
                    .count()
            })
            .unwrap_or(0);
        let why = if self.stopping.load(Ordering::Acquire) {
            "drumsd is stopping".into()
        } else if live.closing.load(Ordering::Acquire) {
            "the pool is being removed".into()
        } else {
            match live.waiting_on() {
                Some(why) => why,
                None if restoring > 0 => format!("{restoring} member(s) still being restored"),
                None => "its refill has not started a member yet".into(),
            }
        };
        SessionError::PoolEmpty {
            pool: live.record.name.clone(),
            waited_ms: waited.as_millis() as u64,
            why,
        }
    }

    /// `DELETE /v1/pools/{p}`: its refill stops (a restore under way
    /// finishes), then the row goes, then every member not taken. Taken
    /// sessions are their takers'.
    pub async fn remove(&self, id_or_name: &str) -> Result<(), SessionError> {
        let live = self.find(id_or_name)?;
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&live.record.id);
        self.stop(&live).await;
        // The row first: members found after a crash here have no pool and
        // are swept at the next start (see `start`).
        self.manager.host.catalog.delete_pool(&live.record.id)?;
        let members = self.manager.host.catalog.pool_members(&live.record.id)?;
        let results =
            futures::future::join_all(members.iter().map(|m| self.manager.remove(&m.id))).await;
        let mut first_err = None;
        for (m, r) in members.iter().zip(results) {
            if let Err(e) = r {
                warn!("remove pool member {}: {}", m.id, error_chain(&e));
                first_err.get_or_insert(e);
            }
        }
        info!(pool = %live.record.name, members = members.len(), "warm pool removed");
        first_err.map_or(Ok(()), Err)
    }

    async fn stop(&self, live: &Live) {
        live.closing.store(true, Ordering::Release);
        live.wake.notify_one();
        live.refilled.send_modify(|n| *n += 1);
        let task = live.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            if let Err(e) = task.await {
                warn!(pool = %live.record.name, "refill task: {e}");
            }
        }
    }

    /// drumsd received its stop signal: takes waiting for a member answer
    /// now, so that they do not hold the graceful shutdown.
    pub fn end_takes(&self) {
        self.stopping.store(true, Ordering::Release);
        for l in self.live.lock().unwrap_or_else(|p| p.into_inner()).values() {
            l.refilled.send_modify(|n| *n += 1);
        }
    }

    /// drumsd's shutdown: refills stop; the pools stay recorded and refill
    /// at the next start (their members go with every other session).
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Live>> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, l)| l)
            .collect();
        for l in all {
            self.stop(&l).await;
        }
    }
}

/// One pool's refill: keep `size` members, restoring what is missing, until
/// the pool closes.
async fn refill(m: Arc<Manager>, live: Arc<Live>) {
    let r = &live.record;
    let mut retry = RETRY_FIRST;
    loop {
        if live.closing.load(Ordering::Acquire) {
            return;
        }
        let pause = match short_by(&m, &live) {
            Err(e) => {
                live.set_waiting_on(Some(format!("read its members: {}", error_chain(&e))));
                Some(retry)
            }
            Ok(0) => {
                live.set_waiting_on(None);
                Some(IDLE_CHECK)
            }
            Ok(short) => match room(&m, short) {
                Err(why) => {
                    live.set_waiting_on(Some(error_chain(&why)));
                    Some(IDLE_CHECK)
                }
                Ok(batch) => match m.restore_into_pool(&r.checkpoint_id, batch, &r.id).await {
                    Ok(_) => {
                        retry = RETRY_FIRST;
                        live.set_waiting_on(None);
                        None
                    }
                    Err(e) => {
                        let why = format!("its last refill failed: {}", error_chain(&e));
                        warn!(pool = %r.name, "{why}");
                        live.set_waiting_on(Some(why));
                        let wait = retry;
                        retry = (retry * 2).min(RETRY_MAX);
                        Some(wait)
                    }
                },
            },
        };
        if let Some(pause) = pause {
            let _ = tokio::time::timeout(pause, live.wake.notified()).await;
        }
    }
}

/// How many members the pool lacks. A running member whose processes died
/// is taken out and removed here, so that it is replaced.
fn short_by(m: &Arc<Manager>, live: &Live) -> Result<usize, SessionError> {
    let members = m.host.catalog.pool_members(&live.record.id)?;
    let mut held = 0usize;
    for s in members {
        if s.state == SessionState::Running && m.host.live_init(&s).is_none() {
            // Out of the pool first, so it is removed once and never taken.
            if !m.host.catalog.leave_pool(&s.id)? {
                continue;
            }
            warn!(session = %s.id, pool = %live.record.name, "a pool member died; replacing it");
            let (m, id) = (m.clone(), s.id.clone());
            tokio::spawn(async move {
                if let Err(e) = m.remove(&id).await {
                    warn!("remove dead pool member {id}: {}", error_chain(&e));
                }
            });
            continue;
        }
        if s.state != SessionState::Removing {
            held += 1;
        }
    }
    Ok((live.record.size as usize).saturating_sub(held))
}

/// Why a pool restores no member now; its status shows the chain.
#[derive(Debug, thiserror::Error)]
enum NoRoom {
    #[error("count sessions")]
    Count(#[source] drums_catalog::CatalogError),
    #[error(
        "the host is out of room: drumsd holds {held} sessions, its limit (--max-sessions {max})"
    )]
    Full { held: u64, max: u64 },
}

/// How many of `short` members to restore now: at most [`BATCH`], and no more
/// than `--max-sessions` leaves room for; `Err` says why none.
fn room(m: &Manager, short: usize) -> Result<usize, NoRoom> {
    let mut batch = short.min(BATCH);
    if let Some(max) = m.config().max_sessions {
        let held = m.host.catalog.session_count().map_err(NoRoom::Count)?;
        let free = max.saturating_sub(held) as usize;
        if free == 0 {
            return Err(NoRoom::Full { held, max });
        }
        batch = batch.min(free);
    }
    Ok(batch)
}
