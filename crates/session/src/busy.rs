//! Locks per version (checkpoint), held by the operations that must not
//! overlap on the same one.
//!
//! A session's dump and its remove do not overlap either, but that is the
//! checkpoint engine's: every dump is a job of drums_engine, which runs one
//! job per session at a time, and a remove waits for the session's running
//! job (`Scheduler::cancel_session`) before it kills anything. A remove
//! used to kill the session's processes while CRIU had them seized: CRIU
//! failed to cure or detach from tasks that were gone (compel: "unable to
//! detach ... no such process"), or found the network namespace half torn
//! down, and the dump answered 500.
//!
//! A version: restores, rollbacks, recoveries and exports share it; a removal
//! (`drums checkpoint rm`, retention, a session's history going with it)
//! takes it alone. A remove deleted the images and the snapshot under a
//! restore that was reading them: the restore answered 500 (a missing image
//! file, "is not a btrfs subvolume", or CRIU's "mnt: No root found for tree"
//! once the mount image had gone). Now a remove waits for the restores in
//! flight, and a restore that comes second finds the checkpoint gone (404).
//!
//! Entries live only while someone holds or waits for a lock, so a map never
//! outgrows the operations in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// One lock per id (a session's or a checkpoint's id, never a name: a name
/// can be taken again by another one).
type Map = Arc<Mutex<HashMap<String, Arc<RwLock<()>>>>>;

#[derive(Default)]
pub(crate) struct Locks {
    map: Map,
}

/// Never read: each guard is held only for its drop, which lets the lock go.
#[allow(dead_code)]
enum Guard {
    Shared(OwnedRwLockReadGuard<()>),
    Alone(OwnedRwLockWriteGuard<()>),
}

/// A lock held until dropped. It owns what it needs, so it can go with
/// work that outlives its caller (an export's streaming thread).
pub(crate) struct Held {
    guard: Option<Guard>,
    id: String,
    map: Map,
}

impl Locks {
    fn entry(&self, id: &str) -> Arc<RwLock<()>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// Wait until nobody else holds `id`, and hold it alone.
    pub(crate) async fn alone(&self, id: &str) -> Held {
        let guard = Guard::Alone(self.entry(id).write_owned().await);
        self.held(id, guard)
    }

    /// Hold `id` along with other sharers, once nobody holds it alone.
    pub(crate) async fn shared(&self, id: &str) -> Held {
        let guard = Guard::Shared(self.entry(id).read_owned().await);
        self.held(id, guard)
    }

    fn held(&self, id: &str, guard: Guard) -> Held {
        Held {
            guard: Some(guard),
            id: id.to_owned(),
            map: self.map.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
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
    async fn alone_waits_for_everyone_and_the_map_empties() {
        let locks = Arc::new(Locks::default());
        let first = locks.alone("a").await;
        // Another id is not held up.
        drop(locks.alone("b").await);
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.alone("a").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the second holder did not wait");
        drop(first);
        waiter.await.unwrap();
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn sharers_share_and_alone_waits_for_them() {
        let locks = Arc::new(Locks::default());
        let r1 = locks.shared("a").await;
        let r2 = locks.shared("a").await;
        let l2 = locks.clone();
        let writer = tokio::spawn(async move {
            let _g = l2.alone("a").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "alone did not wait for the sharers");
        drop(r1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !writer.is_finished(),
            "alone did not wait for the last sharer"
        );
        drop(r2);
        writer.await.unwrap();
        assert_eq!(locks.len(), 0);
    }
}
