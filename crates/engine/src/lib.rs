//! The host-wide checkpoint job scheduler of the checkpoint engine.
//!
//! It is generic on purpose: it knows a session only by its key string, and a
//! job's work is whatever the caller's [`Job`] does (drumsd's session manager
//! plugs in the real checkpoint). That keeps every ordering rule below
//! testable without CRIU, btrfs or root.
//!
//! # Semantics, and why
//!
//! - **Two FIFO queues, high before normal.** A worker always takes from the
//!   high queue first. High priority is for a checkpoint someone is waiting
//!   on right now (the agent's LLM answer came back and the next turn must
//!   not start before the checkpoint is durable); normal is for the ones
//!   taken ahead of need. Within each queue the order is arrival order
//!   (for the high queue: submission or promotion order), so nobody starves
//!   inside a class.
//! - **A bounded pool of workers** ([`Config::workers`]). The default is
//!   `max(1, available_parallelism / 2)`: a checkpoint is CPU- and
//!   IO-heavy (CRIU walks and copies memory), and using every core for it
//!   would starve the sessions themselves. On a 2-core host that is one
//!   worker. A job may give its worker back before it is done
//!   ([`Job::run`]'s [`Worker`]): drumsd's does once CRIU has captured the
//!   session, so the next session's dump overlaps with this one's images
//!   being copied, checksummed and synced. The session itself stays busy
//!   (the rule below) until the job is done.
//! - **A session's jobs run in turn order, one at a time.** A job never
//!   starts while an earlier job of its session runs, even with a free
//!   worker: two dumps of one process tree cannot run at once, and a later
//!   turn's checkpoint must not be published before an earlier one. A job
//!   blocked this way does not block the queue: workers skip it and take the
//!   next job of another session.
//! - **Coalescing.** A job that has not started captures its session as it is
//!   when it runs, not when it was submitted, so two queued jobs of one
//!   session would capture the same state twice. A submit for a session
//!   that already has a queued job therefore merges into it
//!   ([`Job::merge`], the caller decides what a merge means) instead of
//!   queueing a second one. Both ids then resolve to the one merged job and
//!   its outcome. A job that is running is never merged into (it may already
//!   have captured its state): the new job queues behind it. So a session
//!   has at most one running and one queued job, and the queue is bounded by
//!   the number of sessions.
//! - **Promotion.** [`Scheduler::promote`] moves a queued job to the back of
//!   the high queue, for when the job became urgent while it waited.
//!   Promoting a job that runs, already is high, or finished changes nothing
//!   and says so ([`Promoted`]); the caller raced the worker and that is
//!   normal, not an error. An id the scheduler never knew (or forgot, see
//!   below) is an error. A merge with a high-priority submission promotes
//!   the queued job the same way.
//! - **Back-pressure.** When the number of queued (not running) jobs is at or
//!   above [`Config::high_water`] (default [`HIGH_WATER`]), a submit that would
//!   queue a new job waits until the queue is below the mark again, up to
//!   [`Config::max_wait`] (default 10 s), then fails with
//!   [`EngineError::Busy`] (drumsd answers 503). Waiting first absorbs a
//!   short burst without failing anyone; failing after a bound keeps an
//!   overloaded host from hiding its overload behind ever longer latencies.
//!   A merge never waits: it adds nothing to the queue. Submitting with
//!   [`Priority::High`] is allowed and is subject to the same mark.
//! - **Outcomes.** [`Scheduler::wait`] resolves once the job's work returned
//!   (the caller's work returns only once its result is durable), with an
//!   [`Outcome`]: the caller's output or a [`Failure`]. Any number of
//!   waiters get a clone of it. The outcomes of the last
//!   [`Config::retain_finished`] (default 1024) finished jobs are kept so a
//!   late waiter still gets its answer; older ids are [`EngineError::UnknownJob`].
//!   Keeping them all would grow without bound in a long-lived daemon.
//! - **Metrics.** Every job that ran reports its [`Metrics`]: how long it
//!   queued, measured from its *oldest* merged submission (that is how long
//!   the first caller waited), how long it ran, and its priority when it
//!   started.
//! - **Cancellation.** [`Scheduler::cancel_session`] drops a session's queued
//!   job (its waiters get [`Failure::Cancelled`]) and returns only once the
//!   session's running job, if any, finished: the caller (session removal or
//!   rollback) is about to change what that job reads, so it must be done.
//!   A running job is never interrupted: a half-written checkpoint is worse
//!   than a late one.
//! - **Shutdown.** [`Scheduler::shutdown`] stops taking jobs, cancels the
//!   queued ones and waits for the running ones, for the same reason.
//! - **Panics.** A panic in a job's work is caught and becomes that job's
//!   [`Failure::Panicked`]; the worker goes on and the waiters are answered.
//!   One bad checkpoint must not stop every later one on the host.
//!
//! The state lives behind one `std::sync::Mutex`, never held across an
//! `await`; workers and waiting submitters are woken by [`tokio::sync::Notify`],
//! waiters of one job by a watch channel that keeps its outcome.

mod scheduler;
mod state;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use futures::future::BoxFuture;

pub use scheduler::Scheduler;

/// A unit of checkpoint work, as the caller defines it.
pub trait Job: Send + 'static {
    type Output: Clone + Send + Sync + 'static;
    type Error: Clone + Send + Sync + std::error::Error + 'static;

    /// The key of the session this job captures. Jobs with equal keys run in
    /// turn order and merge while queued.
    fn session(&self) -> &str;

    /// Fold a newer submission of the same session into this queued job.
    ///
    /// It runs under the scheduler's lock, so it must be quick and must not
    /// block. A panic here reaches the submitter; the scheduler's own
    /// bookkeeping is updated only after it returns.
    fn merge(&mut self, newer: Self);

    /// Do the work. The future should resolve only once its result is
    /// durable: waiters are answered as soon as it does.
    ///
    /// `worker` is the job's hold on one of the scheduler's workers: the
    /// work keeps it for as long as it needs one, and drops it (or calls
    /// [`Worker::release`]) when what is left is not the workers' to bound,
    /// such as writing out what it captured. The worker then takes the next
    /// job; this one's session stays busy until the future resolves.
    fn run(self, worker: Worker) -> BoxFuture<'static, Result<Self::Output, Self::Error>>;
}

/// A job's hold on a scheduler worker; see [`Job::run`]. Dropping it
/// releases the worker.
#[derive(Debug)]
pub struct Worker {
    free: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Worker {
    pub(crate) fn new() -> (Worker, tokio::sync::oneshot::Receiver<()>) {
        let (free, freed) = tokio::sync::oneshot::channel();
        (Worker { free: Some(free) }, freed)
    }

    /// Lets the worker take the next job while this one goes on.
    pub fn release(mut self) {
        self.free_it();
    }

    fn free_it(&mut self) {
        if let Some(free) = self.free.take() {
            // The worker may have gone (the scheduler shut down): then there
            // is nobody to tell.
            let _ = free.send(());
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.free_it();
    }
}

/// A job's id; merged submissions keep their own ids, which resolve to the
/// job they merged into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for JobId {
    type Err = EngineError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse()
            .map(JobId)
            .map_err(|source| EngineError::BadJobId {
                text: text.to_owned(),
                source,
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Normal,
    High,
}

/// How the scheduler is sized; see the crate docs for why the defaults are
/// what they are.
#[derive(Debug, Clone)]
pub struct Config {
    /// Jobs that may run at once, host-wide.
    pub workers: usize,
    /// Queued (not running) jobs at which a new submission starts to wait.
    pub high_water: usize,
    /// How long a submission waits for room before it fails with
    /// [`EngineError::Busy`].
    pub max_wait: Duration,
    /// Finished jobs whose outcome [`Scheduler::wait`] still returns.
    pub retain_finished: usize,
}

/// The default back-pressure mark. A session has at most one queued job
/// (merges), so the queue is bounded by the sessions; the mark is for a host
/// with more sessions than its checkpoints can keep up with, not for the
/// burst of many sessions ending turns at once. It was `4 × workers` (4 on a
/// 2-core host): at 128 sessions, turn ends then waited for room, up to the
/// 10 s bound and a 503 (the version lost, the next one full), and that
/// wait was three quarters of the agents' exposed delay (docs/engine.md,
/// "The scheduler").
pub const HIGH_WATER: usize = 256;

impl Config {
    /// The defaults, with `workers` workers (at least one).
    pub fn with_workers(workers: usize) -> Config {
        let workers = workers.max(1);
        Config {
            workers,
            high_water: HIGH_WATER.max(4 * workers),
            max_wait: Duration::from_secs(10),
            retain_finished: 1024,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Config::with_workers(cores / 2)
    }
}

/// What [`Scheduler::submit`] did with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// The submission's own id; [`Scheduler::wait`] and the others accept it
    /// whether or not it was merged.
    pub id: JobId,
    /// The queued job this submission was merged into, if it was.
    pub merged_into: Option<JobId>,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting. `position` is the number of queued jobs a worker would
    /// consider before this one (all of the high queue comes first); a job
    /// whose session is busy may be passed over, so it is an order, not a
    /// promise.
    Queued {
        priority: Priority,
        position: usize,
    },
    Running,
    Done,
    Failed,
    /// Dropped before it started, by [`Scheduler::cancel_session`] or
    /// [`Scheduler::shutdown`].
    Cancelled,
}

/// What [`Scheduler::promote`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promoted {
    /// It was in the normal queue and now is at the back of the high queue.
    Moved,
    AlreadyHigh,
    AlreadyRunning,
    /// It finished, failed or was cancelled.
    Finished,
}

/// Timings of a job that ran, for the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metrics {
    /// From the oldest submission merged into the job to its start.
    pub queued_for: Duration,
    /// From its start to its work's return.
    pub ran_for: Duration,
    pub priority_when_started: Priority,
    /// Submissions the job stands for (1 when nothing was merged into it).
    pub submissions: usize,
}

/// A job whose work succeeded.
#[derive(Debug, Clone)]
pub struct Finished<T> {
    pub output: T,
    pub metrics: Metrics,
}

/// Why a job gave no output.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Failure<E: std::error::Error + 'static> {
    #[error("checkpoint job failed")]
    Job {
        #[source]
        error: E,
        metrics: Metrics,
    },
    #[error("checkpoint job panicked: {message}")]
    Panicked { message: String, metrics: Metrics },
    #[error("checkpoint job cancelled before it started: {reason}")]
    Cancelled { reason: CancelReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    Session,
    Shutdown,
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CancelReason::Session => "its session's jobs were cancelled",
            CancelReason::Shutdown => "the scheduler shut down",
        })
    }
}

/// A job's outcome, as every waiter of it gets it.
pub type Outcome<J> = Result<Finished<<J as Job>::Output>, Failure<<J as Job>::Error>>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("checkpoint scheduler busy: {queued} jobs queued, no room after waiting {waited:?}")]
    Busy { queued: usize, waited: Duration },
    #[error("unknown checkpoint job {0}")]
    UnknownJob(JobId),
    #[error("checkpoint job id {text:?} is not a job id")]
    BadJobId {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("checkpoint scheduler is shut down")]
    ShutDown,
    #[error("checkpoint scheduler config: {field} {reason}")]
    InvalidConfig {
        field: &'static str,
        reason: &'static str,
    },
    #[error("start checkpoint scheduler workers: not inside a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
}
