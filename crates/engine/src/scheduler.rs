//! The async face of the scheduler: submissions, waiters and the workers.

use std::any::Any;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::state::{DoneRx, Started, State, Waitable};
use crate::{
    CancelReason, Config, EngineError, Failure, Finished, Job, JobId, Metrics, Outcome, Priority,
    Promoted, Status, Submitted, Worker,
};

struct Shared<J: Job> {
    state: Mutex<State<J>>,
    /// Something may have become runnable, or the scheduler closed.
    work: Notify,
    /// The queue may have shrunk, or the scheduler closed.
    room: Notify,
}

impl<J: Job> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // Only the caller's code can panic under the lock: its `merge`, which
        // runs before any bookkeeping changes, or its job's drop, which runs
        // after. So the state behind a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The host-wide checkpoint job scheduler; see the crate docs for its rules.
///
/// Dropping it closes it like [`Scheduler::shutdown`] without waiting: queued
/// jobs are cancelled, running ones finish, and the workers then exit.
pub struct Scheduler<J: Job> {
    shared: Arc<Shared<J>>,
    config: Config,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl<J: Job> Scheduler<J> {
    /// Starts the workers on the current tokio runtime.
    pub fn new(config: Config) -> Result<Self, EngineError> {
        if config.workers == 0 {
            return Err(EngineError::InvalidConfig {
                field: "workers",
                reason: "must be at least 1",
            });
        }
        if config.high_water == 0 {
            return Err(EngineError::InvalidConfig {
                field: "high_water",
                reason: "must be at least 1 (0 would refuse every new job)",
            });
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(EngineError::NoRuntime)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(config.retain_finished)),
            work: Notify::new(),
            room: Notify::new(),
        });
        let workers = (0..config.workers)
            .map(|_| runtime.spawn(work(Arc::clone(&shared))))
            .collect();
        Ok(Scheduler {
            shared,
            config,
            workers: Mutex::new(workers),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Queues `job`, or merges it into its session's queued job.
    ///
    /// A new entry waits for room while the queue is at the high-water mark,
    /// and fails with [`EngineError::Busy`] after [`Config::max_wait`].
    /// Waiting submissions are all woken when room appears and race for it:
    /// the wait is bounded, so a strict order among them buys little.
    pub async fn submit(&self, job: J, priority: Priority) -> Result<Submitted, EngineError> {
        let session = job.session().to_owned();
        let asked = Instant::now();
        let deadline = asked + self.config.max_wait;
        let mut job = job;
        loop {
            // Armed before the queue is looked at, so a job a worker takes
            // between the look and the wait still wakes this submission.
            let mut room = pin!(self.shared.room.notified());
            room.as_mut().enable();
            let queued = {
                let mut state = self.shared.lock();
                if state.closed {
                    return Err(EngineError::ShutDown);
                }
                // Merging is tried on every round: while this submission
                // waited, another one of its session may have queued a job.
                job = match state.merge(&session, job, priority) {
                    Ok(submitted) => return Ok(submitted),
                    Err(job) => job,
                };
                let queued = state.queued();
                if queued < self.config.high_water {
                    let submitted = state.enqueue(session, job, priority);
                    drop(state);
                    self.shared.work.notify_waiters();
                    return Ok(submitted);
                }
                queued
            };
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return Err(EngineError::Busy {
                    queued,
                    waited: asked.elapsed(),
                });
            }
        }
    }

    /// The job's outcome, once it finished (or at once if it already did).
    pub async fn wait(&self, id: JobId) -> Result<Outcome<J>, EngineError> {
        let waitable = self.shared.lock().waitable(id)?;
        match waitable {
            Waitable::Ready(outcome) => Ok(outcome),
            Waitable::Pending(done) => Ok(outcome_of::<J>(done).await),
        }
    }

    pub fn status(&self, id: JobId) -> Result<Status, EngineError> {
        self.shared.lock().status(id)
    }

    /// Moves a queued job to the back of the high queue.
    pub fn promote(&self, id: JobId) -> Result<Promoted, EngineError> {
        self.shared.lock().promote(id)
    }

    /// Cancels the session's queued job and returns, with the ids that were
    /// cancelled, once its running job (if any) finished.
    ///
    /// It does not stop new submissions for the session; the caller stops
    /// submitting first.
    pub async fn cancel_session(&self, session: &str) -> Vec<JobId> {
        let (cancelled, running) = self.shared.lock().cancel_session(session);
        if !cancelled.is_empty() {
            self.shared.room.notify_waiters();
        }
        if let Some(done) = running {
            until_finished(done).await;
        }
        cancelled
    }

    /// Stops taking jobs, cancels the queued ones and returns once the
    /// running ones finished and the workers exited.
    pub async fn shutdown(&self) {
        let running = self.close();
        for done in running {
            until_finished(done).await;
        }
        let workers =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(PoisonError::into_inner));
        for worker in workers {
            if let Err(error) = worker.await {
                tracing::error!(%error, "checkpoint scheduler worker ended abnormally");
            }
        }
    }

    fn close(&self) -> Vec<DoneRx<J>> {
        let running = {
            let mut state = self.shared.lock();
            state.closed = true;
            state.cancel_all()
        };
        self.shared.work.notify_waiters();
        self.shared.room.notify_waiters();
        running
    }
}

impl<J: Job> Drop for Scheduler<J> {
    fn drop(&mut self) {
        self.close();
    }
}

/// Waits until a job finished, whatever its outcome (the job's own waiters
/// read that); a dropped sender also means it is over.
async fn until_finished<T>(mut done: watch::Receiver<Option<T>>) {
    let _over = done.wait_for(Option::is_some).await;
}

/// Waits for the outcome a job's channel will carry.
async fn outcome_of<J: Job>(mut done: DoneRx<J>) -> Outcome<J> {
    match done.wait_for(Option::is_some).await {
        Ok(outcome) => outcome.clone().expect("waited for an outcome"),
        // The sender went away without an outcome only if the worker running
        // the job was dropped with its runtime.
        Err(_) => Err(Failure::Cancelled {
            reason: CancelReason::Shutdown,
        }),
    }
}

async fn work<J: Job>(shared: Arc<Shared<J>>) {
    loop {
        let started = loop {
            // Armed before looking, so a job queued between the look and the
            // wait is not missed.
            let mut wake = pin!(shared.work.notified());
            wake.as_mut().enable();
            {
                let mut state = shared.lock();
                if state.closed {
                    return;
                }
                if let Some(started) = state.take_next() {
                    break started;
                }
            }
            wake.await;
        };
        shared.room.notify_waiters();
        let id = started.id;
        let (worker, freed) = Worker::new();
        let finisher = Arc::clone(&shared);
        // The job finishes on its own task: it may release this worker
        // before it is done (Job::run), and the session stays busy until
        // it is.
        tokio::spawn(async move {
            let outcome = run(started, worker).await;
            finisher.lock().finish(id, outcome);
            // The session's next job may be runnable now.
            finisher.work.notify_waiters();
        });
        // Released, or dropped with the job's work (done, failed or
        // panicked).
        let _ = freed.await;
    }
}

async fn run<J: Job>(started: Started<J>, worker: Worker) -> Outcome<J> {
    let Started {
        id,
        job,
        started_at,
        queued_for,
        priority,
        submissions,
    } = started;
    let session = job.session().to_owned();
    tracing::debug!(%id, session, ?priority, ?queued_for, "checkpoint job started");
    // Its own task, so that a panic in the work (or in building it) ends
    // that task and not the worker.
    let result = tokio::spawn(async move { job.run(worker).await }).await;
    let metrics = Metrics {
        queued_for,
        ran_for: started_at.elapsed(),
        priority_when_started: priority,
        submissions,
    };
    match result {
        Ok(Ok(output)) => {
            tracing::debug!(%id, session, ran_for = ?metrics.ran_for, "checkpoint job done");
            Ok(Finished { output, metrics })
        }
        Ok(Err(error)) => {
            tracing::warn!(%id, session, %error, "checkpoint job failed");
            Err(Failure::Job { error, metrics })
        }
        Err(join) if join.is_panic() => {
            let message = panic_message(join.into_panic());
            tracing::error!(%id, session, message, "checkpoint job panicked");
            Err(Failure::Panicked { message, metrics })
        }
        // Only the runtime shutting down cancels the job's task.
        Err(_) => Err(Failure::Cancelled {
            reason: CancelReason::Shutdown,
        }),
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "a panic without a message".to_owned(),
        },
    }
}
