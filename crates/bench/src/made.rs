//! What a bench made through drumsd (sessions, checkpoints), removed when the
//! bench ends, however it ends.
//!
//! Every bench that talks to drumsd makes its sessions and checkpoints
//! through a [`Made`], which records each one the moment drumsd answers with
//! it and forgets it once the bench itself removed it. The bench's body
//! returns its result to [`Made::finish`], which removes whatever is still
//! recorded (sessions first: a restored sibling may still hold its
//! checkpoint) and only then returns the result, so a `?` halfway through a
//! bench leaves nothing behind. An async removal cannot run in `Drop`; a
//! `Made` dropped without `finish` (a panic) says on stderr what it leaves
//! and how to remove it.

use std::sync::Mutex;
use std::time::Instant;

use drums_api::{
    Checkpoint, Client, ClientError, CreateCheckpoint, CreatePool, CreateSession, Pool,
    RestoreRequest, RestoreResult, Session, TakeRequest,
};
use hyper::Method;

use crate::exit::Failure;
use drums_api::exec::enc;

pub(crate) struct Made<'c> {
    c: &'c Client,
    /// Ids, in the order they were made.
    sessions: Mutex<Vec<String>>,
    checkpoints: Mutex<Vec<String>>,
    pools: Mutex<Vec<String>>,
}

impl<'c> Made<'c> {
    pub(crate) fn new(c: &'c Client) -> Made<'c> {
        Made {
            c,
            sessions: Mutex::new(Vec::new()),
            checkpoints: Mutex::new(Vec::new()),
            pools: Mutex::new(Vec::new()),
        }
    }

    /// The client, for calls that make nothing (exec, stats, turns).
    pub(crate) fn client(&self) -> &'c Client {
        self.c
    }

    /// A session made from `req`, and the seconds until it was ready.
    pub(crate) async fn create_with(&self, req: &CreateSession) -> Result<(Session, f64), Failure> {
        let t = Instant::now();
        let s: Session = self.c.json(Method::POST, "/v1/sessions", Some(req)).await?;
        let took = t.elapsed().as_secs_f64();
        self.adopt_session(&s.id);
        Ok((s, took))
    }

    /// `count` siblings of checkpoint `ck`, and the seconds until all were
    /// ready.
    pub(crate) async fn restore(
        &self,
        ck: &str,
        count: usize,
    ) -> Result<(Vec<Session>, f64), Failure> {
        let t = Instant::now();
        let r: RestoreResult = self
            .c
            .json(
                Method::POST,
                &format!("/v1/checkpoints/{}/restore", enc(ck)),
                Some(&RestoreRequest { count, name: None }),
            )
            .await?;
        let took = t.elapsed().as_secs_f64();
        for s in &r.sessions {
            self.adopt_session(&s.id);
        }
        Ok((r.sessions, took))
    }

    /// A checkpoint; without `leave_running` drumsd removes its session
    /// after the dump, so that is no longer the bench's to remove.
    pub(crate) async fn checkpoint(&self, req: &CreateCheckpoint) -> Result<Checkpoint, Failure> {
        let k: Checkpoint = self
            .c
            .json(Method::POST, "/v1/checkpoints", Some(req))
            .await?;
        lock(&self.checkpoints).push(k.id.clone());
        if !req.leave_running {
            self.forget_session(&k.session_id);
        }
        Ok(k)
    }

    /// A warm pool of checkpoint `ck` (docs/pools.md).
    pub(crate) async fn create_pool(&self, ck: &str, size: u32) -> Result<Pool, Failure> {
        let p: Pool = self
            .c
            .json(
                Method::POST,
                "/v1/pools",
                Some(&CreatePool {
                    checkpoint: ck.into(),
                    size,
                    name: None,
                }),
            )
            .await?;
        lock(&self.pools).push(p.id.clone());
        Ok(p)
    }

    /// A member taken from pool `p` (the bench's to remove from now on), and
    /// the seconds the take took.
    pub(crate) async fn take(&self, p: &str) -> Result<(Session, f64), Failure> {
        let t = Instant::now();
        let s: Session = self
            .c
            .json(
                Method::POST,
                &format!("/v1/pools/{}/take", enc(p)),
                Some(&TakeRequest {
                    timeout_ms: Some(600_000),
                }),
            )
            .await?;
        let took = t.elapsed().as_secs_f64();
        self.adopt_session(&s.id);
        Ok((s, took))
    }

    pub(crate) async fn remove_pool(&self, p: &str) -> Result<(), Failure> {
        remove_pool(self.c, p).await?;
        lock(&self.pools).retain(|x| x != p);
        Ok(())
    }

    /// Remove a session the bench is done with.
    pub(crate) async fn remove(&self, s: &Session) -> Result<(), Failure> {
        remove_session(self.c, &s.id).await?;
        self.forget_session(&s.id);
        Ok(())
    }

    pub(crate) async fn delete_checkpoint(&self, id: &str) -> Result<(), Failure> {
        delete_checkpoint(self.c, id).await?;
        lock(&self.checkpoints).retain(|k| k != id);
        Ok(())
    }

    /// A session the bench made some other way (the image bench runs the
    /// `drums` CLI as a user would), to be removed like the others.
    pub(crate) fn adopt_session(&self, id: &str) {
        lock(&self.sessions).push(id.to_owned());
    }

    /// A session that is gone without [`Made::remove`] (the image bench's
    /// `drums rm`, a dump that stopped it).
    pub(crate) fn forget_session(&self, id: &str) {
        lock(&self.sessions).retain(|s| s != id);
    }

    /// Remove everything still recorded, then hand back the bench's
    /// `result`. A failure to remove fails a bench that succeeded; a bench
    /// that failed keeps its own error, with what could not be removed
    /// added to it, since the first error is what the user needs to see.
    pub(crate) async fn finish<T>(self, result: Result<T, Failure>) -> Result<T, Failure> {
        let left = self.remove_all().await;
        match (result, left) {
            (r, None) => r,
            (Ok(_), Some(e)) => Err(e),
            (Err(mut e), Some(left)) => {
                e.message = format!("{}; and cleaning up: {}", e.message, left.message);
                Err(e)
            }
        }
    }

    /// Remove every recorded session, then every recorded checkpoint, going
    /// on past failures; the failures, if any, as one.
    async fn remove_all(&self) -> Option<Failure> {
        let mut failed = Vec::new();
        // Pools first: a pool left while its members go would refill them.
        let pools = std::mem::take(&mut *lock(&self.pools));
        for id in pools.iter().rev() {
            if let Err(e) = gone_is_fine(remove_pool(self.c, id).await) {
                failed.push(format!("pool {id}: {}", e.message));
            }
        }
        let sessions = std::mem::take(&mut *lock(&self.sessions));
        for id in sessions.iter().rev() {
            if let Err(e) = gone_is_fine(remove_session(self.c, id).await) {
                failed.push(format!("session {id}: {}", e.message));
            }
        }
        let checkpoints = std::mem::take(&mut *lock(&self.checkpoints));
        for id in checkpoints.iter().rev() {
            if let Err(e) = gone_is_fine(delete_checkpoint(self.c, id).await) {
                failed.push(format!("checkpoint {id}: {}", e.message));
            }
        }
        (!failed.is_empty()).then(|| {
            Failure::new(
                crate::exit::INTERNAL,
                format!("left behind: {}", failed.join("; ")),
            )
        })
    }
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        let sessions = std::mem::take(&mut *lock(&self.sessions));
        let checkpoints = std::mem::take(&mut *lock(&self.checkpoints));
        let pools = std::mem::take(&mut *lock(&self.pools));
        if sessions.is_empty() && checkpoints.is_empty() && pools.is_empty() {
            return;
        }
        eprintln!(
            "drums: the bench ended without removing what it made; remove it with: {}{}{}{}",
            pools
                .iter()
                .map(|p| format!("drums pool rm {p}; "))
                .collect::<String>(),
            if sessions.is_empty() {
                String::new()
            } else {
                format!("drums rm {}", sessions.join(" "))
            },
            if sessions.is_empty() || checkpoints.is_empty() {
                ""
            } else {
                "; "
            },
            checkpoints
                .iter()
                .map(|k| format!("drums checkpoint rm {k}"))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}

/// A mutex whose holder cannot panic halfway through a change (a push, a
/// retain, a take): a poisoned one is still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn remove_pool(c: &Client, id: &str) -> Result<(), ClientError> {
    c.call(
        Method::DELETE,
        &format!("/v1/pools/{}", enc(id)),
        None::<&()>,
    )
    .await
    .map(drop)
}

async fn remove_session(c: &Client, id: &str) -> Result<(), ClientError> {
    c.call(
        Method::DELETE,
        &format!("/v1/sessions/{}", enc(id)),
        None::<&()>,
    )
    .await
    .map(drop)
}

async fn delete_checkpoint(c: &Client, id: &str) -> Result<(), ClientError> {
    c.call(
        Method::DELETE,
        &format!("/v1/checkpoints/{}", enc(id)),
        None::<&()>,
    )
    .await
    .map(drop)
}

/// In a clean-up, what is already gone is what was wanted: a session a
/// failed step of drumsd's removed itself, say.
fn gone_is_fine(r: Result<(), ClientError>) -> Result<(), Failure> {
    match r {
        Err(ClientError::Api { status: 404, .. }) => Ok(()),
        r => r.map_err(Failure::from),
    }
}
