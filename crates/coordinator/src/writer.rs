//! The journal's writer: one thread that commits the model calls' exchanges
//! and records. Many sessions' calls end at once, and a commit of the
//! journal costs more than its rows (WAL frames, locks, the checkpoint
//! it brings on): the thread takes whatever is queued when it is free and
//! commits it in one transaction (`Catalog::log_many`), so the busier
//! drumsd is, the fewer commits a call costs. One queue, so a session's
//! rows are committed in the order they were written.

use std::sync::mpsc;
use std::sync::Arc;

use drums_catalog::{Catalog, CatalogError, Exchange, Logged};
use tokio::sync::oneshot;

/// At most this many calls in one commit: a batch holds the journal's
/// lock, which the proxy's reads of the log wait for.
const MAX_BATCH: usize = 64;

/// A model call to log: its exchange, its record ((JSON, how many of the
/// session's to keep)), or both.
pub(crate) struct Call {
    pub session: String,
    pub exchange: Option<Exchange>,
    pub record: Option<(String, u64)>,
}

struct Queued {
    call: Call,
    done: oneshot::Sender<Result<u64, CatalogError>>,
}

/// The handle; the thread ends when it is dropped.
pub(crate) struct Writer {
    queue: mpsc::Sender<Queued>,
}

impl Writer {
    pub(crate) fn start(catalog: Arc<Catalog>) -> Writer {
        let (queue, calls) = mpsc::channel::<Queued>();
        std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || {
                while let Ok(first) = calls.recv() {
                    let mut batch = vec![first];
                    batch.extend(calls.try_iter().take(MAX_BATCH - 1));
                    commit(&catalog, batch);
                }
            })
            .expect("start the journal's writer thread");
        Writer { queue }
    }

    /// Log `call`, committed with whatever else is queued; what its
    /// exchange adds to the log's size ([`Catalog::log_many`]).
    pub(crate) async fn log(&self, call: Call) -> Result<u64, CatalogError> {
        let (done, logged) = oneshot::channel();
        self.queue
            .send(Queued { call, done })
            .expect("the journal's writer lives as long as its handle");
        logged
            .await
            .expect("the journal's writer answers every call it takes")
    }
}

fn logged(q: &Queued) -> Logged<'_> {
    Logged {
        session: &q.call.session,
        exchange: q.call.exchange.as_ref(),
        record: q.call.record.as_ref().map(|(r, keep)| (r.as_str(), *keep)),
    }
}

fn commit(catalog: &Catalog, batch: Vec<Queued>) {
    let calls: Vec<Logged<'_>> = batch.iter().map(logged).collect();
    let result = catalog.log_many(&calls);
    drop(calls);
    match result {
        Ok(done) => {
            for (q, r) in batch.into_iter().zip(done) {
                let _ = q.done.send(r);
            }
        }
        Err(e) if batch.len() == 1 => {
            if let Some(q) = batch.into_iter().next() {
                let _ = q.done.send(Err(e));
            }
        }
        // The commit failed, so none is logged: each is tried alone, and
        // answered with its own error.
        Err(_) => {
            for q in batch {
                let r = catalog
                    .log_many(&[logged(&q)])
                    .and_then(|mut r| r.pop().expect("one result a call"));
                let _ = q.done.send(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_from_many_tasks_at_once_are_all_committed_each_session_in_order() {
        let catalog = Arc::new(Catalog::in_memory().unwrap());
        let writer = Arc::new(Writer::start(catalog.clone()));
        let threads: Vec<_> = (0..8)
            .map(|s| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let call = Call {
                            session: format!("s{s}"),
                            exchange: (i % 2 == 0).then(|| Exchange {
                                seq: i,
                                request_sha: format!("r{i}"),
                                status: 200,
                                headers: vec![],
                                body: vec![b'x'; i as usize],
                                version: None,
                            }),
                            record: Some((i.to_string(), 1000)),
                        };
                        let added = futures::executor::block_on(writer.log(call)).unwrap();
                        assert_eq!(added, if i % 2 == 0 { 2 + i } else { 0 });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for s in 0..8 {
            let id = format!("s{s}");
            let want: Vec<String> = (0..50).map(|i: u64| i.to_string()).collect();
            assert_eq!(catalog.turn_records(&id, 1000).unwrap(), want);
            assert_eq!(catalog.exchanges_len(&id).unwrap(), 49);
        }
    }
}
