//! Requests passed through to a session's guest that are still open (`drums
//! exec`, file transfers): CRIU cannot dump the guest's end of such a
//! connection, whose peer is drumsd, so a version that dumps processes
//! waits for them to end, briefly, or is refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a checkpoint waits for a guest stream that is ending.
const GRACE: Duration = Duration::from_millis(500);

/// The open streams, per session.
#[derive(Default)]
pub(crate) struct GuestStreams {
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// An open request to a session's guest: counted until dropped.
pub struct GuestStream {
    streams: Arc<Mutex<HashMap<String, usize>>>,
    id: String,
}

impl Drop for GuestStream {
    fn drop(&mut self) {
        let mut all = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = all.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                all.remove(&self.id);
            }
        }
    }
}

impl GuestStreams {
    /// Count a request to session `id`'s guest as open until the guard goes.
    pub(crate) fn open(&self, id: &str) -> GuestStream {
        *self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_owned())
            .or_default() += 1;
        GuestStream {
            streams: self.open.clone(),
            id: id.to_owned(),
        }
    }

    /// Requests to session `id`'s guest still open.
    pub(crate) fn count(&self, id: &str) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    /// [`GuestStreams::count`], given a moment to reach zero: a stream's
    /// guard goes when drumsd's side of the response ends, which can be just
    /// after its caller has read the last byte and asked for a checkpoint
    /// (seen under load in `drums bench corpus`). A stream still open after
    /// [`GRACE`] is a real one.
    pub(crate) async fn settled(&self, id: &str) -> usize {
        let deadline = Instant::now() + GRACE;
        loop {
            let open = self.count(id);
            if open == 0 || Instant::now() >= deadline {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_counts_until_its_guard_goes() {
        let s = GuestStreams::default();
        let a = s.open("x");
        let b = s.open("x");
        assert_eq!((s.count("x"), s.count("y")), (2, 0));
        drop(a);
        assert_eq!(s.count("x"), 1);
        drop(b);
        assert_eq!(s.count("x"), 0);
        assert!(s.open.lock().unwrap().is_empty());
    }
}
