//! Uploads that drumsd may refuse before it has read them.
//!
//! An import refused early (a bad name, no room, a spool over the room)
//! used to answer while the client was still writing the archive; drumsd
//! then closed the connection, and the client, whose write failed first,
//! saw a broken pipe instead of drumsd's reason (CI of cfe7cad:
//! `import --name "Bad Name"` printed "error writing a body to connection:
//! Broken pipe"). HTTP/1.1 has no way to refuse mid-upload that every
//! client reads, so the rest of a refused upload is read and dropped before
//! the refusal is sent, within bounds a hostile client cannot stretch.

use std::time::Duration;

use axum::body::BodyDataStream;
use futures::StreamExt;

/// At most this much of a refused upload is read and dropped; past it the
/// connection closes as before.
const DRAIN_MAX: u64 = 256 << 20;
/// And for at most this long.
const DRAIN_FOR: Duration = Duration::from_secs(30);

/// Read and drop what is left of `body`, within [`DRAIN_MAX`] and
/// [`DRAIN_FOR`]; call it only once the upload is refused.
pub async fn drain_refused(body: &mut BodyDataStream) {
    let read = async {
        let mut n = 0u64;
        while let Some(Ok(chunk)) = body.next().await {
            n += chunk.len() as u64;
            if n > DRAIN_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, read).await;
}
