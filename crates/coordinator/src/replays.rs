//! The recoveries under way whose commands are to run again (commands.rs),
//! per session, as the session's other callers see them.
//!
//! A recovered session's state is its version's plus the commands its
//! agent ran since, which a task runs again after the recovery. Until that
//! task is done the session is between the two: a new exec (or a file
//! read) of its agent's would run beside the commands run again, and see,
//! or change, a state the agent never had. So from the moment a recovery
//! starts until its commands have run again, the session is *gated*, and
//! [`Replays::wait`] waits for the gate to open.
//!
//! A gate opens when its [`Gate`] is dropped: the recovery failed, the
//! commands ran again (or could not), or a newer recovery of the same
//! session took its place (whose own gate then holds the waiters).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Per session: the newest recovery's gate, while it is closed.
#[derive(Default)]
pub(crate) struct Replays {
    open: Arc<Mutex<HashMap<String, Entry>>>,
    next: AtomicU64,
}

struct Entry {
    /// Which gate this is: a gate that is dropped removes its own entry
    /// only, not a newer recovery's.
    generation: u64,
    /// The task running the commands again, once it is started: a newer
    /// recovery stops it (the guest it talks to is gone).
    task: Option<AbortHandle>,
    /// Ends (with an error: nothing is ever sent) when the gate is dropped.
    dropped: watch::Receiver<()>,
}

/// A closed gate of one session; it opens when dropped.
pub(crate) struct Gate {
    open: Arc<Mutex<HashMap<String, Entry>>>,
    ticket: Ticket,
    _dropped: watch::Sender<()>,
}

/// Which gate: for the task that holds it to be listed as its run.
#[derive(Clone)]
pub(crate) struct Ticket {
    session: String,
    generation: u64,
}

impl Gate {
    pub(crate) fn ticket(&self) -> Ticket {
        self.ticket.clone()
    }
}

impl Replays {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Close session `id`'s gate: a recovery of it starts. An older
    /// recovery's commands still running again are stopped.
    pub(crate) fn close(&self, id: &str) -> Gate {
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(());
        let old = self.lock().insert(
            id.to_owned(),
            Entry {
                generation,
                task: None,
                dropped: rx,
            },
        );
        if let Some(task) = old.and_then(|o| o.task) {
            task.abort();
        }
        Gate {
            open: self.open.clone(),
            ticket: Ticket {
                session: id.to_owned(),
                generation,
            },
            _dropped: tx,
        }
    }

    /// The gate of `ticket` is held by `task`, which runs its commands
    /// again.
    pub(crate) fn running(&self, ticket: &Ticket, task: AbortHandle) {
        match self.lock().get_mut(&ticket.session) {
            Some(e) if e.generation == ticket.generation => e.task = Some(task),
            // A newer recovery took its place (then the run is stopped), or
            // the run is done already (then this does nothing).
            _ => task.abort(),
        }
    }

    /// Whether session `id` is gated.
    #[cfg(test)]
    pub(crate) fn is_closed(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Until session `id` is not gated: no recovery of it is under way,
    /// and the commands of the last one have run again.
    pub(crate) async fn wait(&self, id: &str) {
        loop {
            let Some(mut dropped) = self.lock().get(id).map(|e| e.dropped.clone()) else {
                return;
            };
            // Nothing is ever sent: this ends when the gate is dropped,
            // which removes its entry first. A newer gate may be there by
            // then, which is waited for in turn.
            let _ = dropped.changed().await;
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let t = &self.ticket;
        if open
            .get(&t.session)
            .is_some_and(|e| e.generation == t.generation)
        {
            open.remove(&t.session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn waits(r: &Replays, id: &str) -> bool {
        tokio::time::timeout(Duration::from_millis(50), r.wait(id))
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_wait_ends_when_the_gate_drops_and_not_before() {
        let r = Replays::default();
        assert!(!waits(&r, "s").await, "no gate: no wait");
        let gate = r.close("s");
        assert!(r.is_closed("s") && !r.is_closed("t"));
        assert!(waits(&r, "s").await);
        assert!(!waits(&r, "t").await, "another session's gate holds no one");
        let waiter = tokio::spawn({
            let r = Arc::new(r);
            let w = r.clone();
            async move {
                w.wait("s").await;
                r
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(gate);
        let r = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait ends once the gate is dropped")
            .unwrap();
        assert!(!r.is_closed("s"));
    }

    #[tokio::test]
    async fn a_newer_recovery_holds_the_waiters_and_stops_the_older_run() {
        let r = Arc::new(Replays::default());
        let old = r.close("s");
        let run = tokio::spawn(std::future::pending::<()>());
        r.running(&old.ticket(), run.abort_handle());
        let waiter = tokio::spawn({
            let r = r.clone();
            async move { r.wait("s").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let new = r.close("s");
        // The older run is stopped; its gate, dropped, opens nothing.
        assert!(run.await.unwrap_err().is_cancelled());
        drop(old);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(r.is_closed("s") && !waiter.is_finished());
        drop(new);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the newer gate's drop ends the wait")
            .unwrap();
        assert!(!r.is_closed("s"));
    }

    #[tokio::test]
    async fn a_run_started_after_a_newer_recovery_is_stopped_at_once() {
        let r = Replays::default();
        let old = r.close("s");
        let _new = r.close("s");
        let run = tokio::spawn(std::future::pending::<()>());
        r.running(&old.ticket(), run.abort_handle());
        assert!(run.await.unwrap_err().is_cancelled());
    }
}
