//! One lock per session, held by the operations that must not overlap on the
//! same session: a checkpoint's dump and a remove.
//!
//! A remove kills the session's processes while CRIU has them seized. CRIU
//! then fails to cure or detach from tasks that are gone (compel: "unable to
//! detach ... no such process"), or finds the session's network namespace
//! half torn down, and the dump answered 500; with two clients at once CRIU
//! could even hang on an init it had seized while the teardown waited for
//! it to exit. With the lock, a remove waits for the dump in flight (a few
//! hundred ms for a desktop), and a checkpoint that comes second finds the
//! session removing or gone (409 or 404), as it would have a moment later.
//!
//! Entries live only while someone holds or waits for a session's lock, so
//! the map never outgrows the operations in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub(crate) struct SessionLocks {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A session's lock, held until dropped.
pub(crate) struct Held<'a> {
    guard: Option<OwnedMutexGuard<()>>,
    id: String,
    locks: &'a SessionLocks,
}

impl SessionLocks {
    /// Wait for session `id`'s lock (its id, never its name: a name can be
    /// taken again by another session).
    pub(crate) async fn lock(&self, id: &str) -> Held<'_> {
        let m = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_owned())
            .or_default()
            .clone();
        Held {
            guard: Some(m.lock_owned().await),
            id: id.to_owned(),
            locks: self,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        // Waiters clone the entry under the map's lock, so a count of one
        // (the map's own) means nobody else holds or waits for it.
        if map.get(&self.id).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_second_holder_waits_and_the_map_empties() {
        let locks = Arc::new(SessionLocks::default());
        let first = locks.lock("a").await;
        // Another session is not held up.
        drop(locks.lock("b").await);
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock("a").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the second holder did not wait");
        drop(first);
        waiter.await.unwrap();
        assert_eq!(locks.len(), 0);
    }
}
