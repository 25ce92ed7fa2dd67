//! The scheduler's bookkeeping: queues, live and finished jobs, and the ids
//! that resolve to them. Everything here is synchronous and runs under the
//! scheduler's one lock, so each method leaves the state consistent.

use std::collections::{HashMap, VecDeque};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::{
    CancelReason, EngineError, Failure, Job, JobId, Outcome, Priority, Promoted, Status, Submitted,
};

/// A job that is queued or running, under the id of its oldest submission.
struct Entry<J: Job> {
    /// `None` once a worker took it.
    job: Option<J>,
    session: String,
    priority: Priority,
    /// Of the oldest submission: its caller has waited longest.
    submitted_at: Instant,
    ids: Vec<JobId>,
    /// Keeps the outcome for waiters that subscribed before it finished.
    done: watch::Sender<Option<Outcome<J>>>,
}

/// Says when a job finished, and with what.
pub(crate) type DoneRx<J> = watch::Receiver<Option<Outcome<J>>>;

struct Done<J: Job> {
    outcome: Outcome<J>,
    ids: Vec<JobId>,
}

/// A job a worker took, with what it needs to report its metrics.
pub(crate) struct Started<J: Job> {
    pub id: JobId,
    pub job: J,
    pub started_at: Instant,
    pub queued_for: std::time::Duration,
    pub priority: Priority,
    pub submissions: usize,
}

/// What a waiter gets: the outcome now, or a channel that will carry it.
pub(crate) enum Waitable<J: Job> {
    Ready(Outcome<J>),
    Pending(DoneRx<J>),
}

pub(crate) struct State<J: Job> {
    next_id: u64,
    high: VecDeque<JobId>,
    normal: VecDeque<JobId>,
    live: HashMap<JobId, Entry<J>>,
    queued_by_session: HashMap<String, JobId>,
    running_by_session: HashMap<String, JobId>,
    /// Every id still known, to the id of the job it stands for.
    alias: HashMap<JobId, JobId>,
    done: HashMap<JobId, Done<J>>,
    done_order: VecDeque<JobId>,
    retain: usize,
    pub closed: bool,
}

impl<J: Job> State<J> {
    pub fn new(retain: usize) -> Self {
        State {
            next_id: 1,
            high: VecDeque::new(),
            normal: VecDeque::new(),
            live: HashMap::new(),
            queued_by_session: HashMap::new(),
            running_by_session: HashMap::new(),
            alias: HashMap::new(),
            done: HashMap::new(),
            done_order: VecDeque::new(),
            retain,
            closed: false,
        }
    }

    pub fn queued(&self) -> usize {
        self.high.len() + self.normal.len()
    }

    fn fresh_id(&mut self) -> JobId {
        let id = JobId(self.next_id);
        self.next_id += 1;
        id
    }

    /// Merges `job` into its session's queued job, or hands it back when the
    /// session has none.
    pub fn merge(&mut self, session: &str, job: J, priority: Priority) -> Result<Submitted, J> {
        let Some(&target) = self.queued_by_session.get(session) else {
            return Err(job);
        };
        let entry = self.live.get_mut(&target).expect("queued job is live");
        entry.job.as_mut().expect("queued job not taken").merge(job);
        let id = self.fresh_id();
        let entry = self.live.get_mut(&target).expect("queued job is live");
        entry.ids.push(id);
        self.alias.insert(id, target);
        if priority == Priority::High && entry.priority == Priority::Normal {
            self.move_to_high(target);
        }
        Ok(Submitted {
            id,
            merged_into: Some(target),
        })
    }

    /// Queues `job` as a new entry; the caller checked there is room and
    /// nothing to merge into.
    pub fn enqueue(&mut self, session: String, job: J, priority: Priority) -> Submitted {
        let id = self.fresh_id();
        self.queued_by_session.insert(session.clone(), id);
        self.alias.insert(id, id);
        self.live.insert(
            id,
            Entry {
                job: Some(job),
                session,
                priority,
                submitted_at: Instant::now(),
                ids: vec![id],
                done: watch::Sender::new(None),
            },
        );
        match priority {
            Priority::High => self.high.push_back(id),
            Priority::Normal => self.normal.push_back(id),
        }
        Submitted {
            id,
            merged_into: None,
        }
    }

    fn move_to_high(&mut self, id: JobId) {
        self.normal.retain(|&queued| queued != id);
        self.high.push_back(id);
        self.live
            .get_mut(&id)
            .expect("promoted job is live")
            .priority = Priority::High;
    }

    /// Takes the first queued job, high queue first, whose session has no
    /// job running.
    pub fn take_next(&mut self) -> Option<Started<J>> {
        let runnable = |queue: &VecDeque<JobId>| {
            queue.iter().position(|id| {
                let session = &self.live[id].session;
                !self.running_by_session.contains_key(session)
            })
        };
        let id = if let Some(at) = runnable(&self.high) {
            self.high.remove(at)
        } else if let Some(at) = runnable(&self.normal) {
            self.normal.remove(at)
        } else {
            None
        }?;
        let entry = self.live.get_mut(&id).expect("queued job is live");
        self.queued_by_session.remove(&entry.session);
        self.running_by_session.insert(entry.session.clone(), id);
        let started_at = Instant::now();
        Some(Started {
            id,
            job: entry.job.take().expect("queued job not taken"),
            started_at,
            queued_for: started_at.saturating_duration_since(entry.submitted_at),
            priority: entry.priority,
            submissions: entry.ids.len(),
        })
    }

    /// Records a running job's outcome and answers its waiters.
    pub fn finish(&mut self, id: JobId, outcome: Outcome<J>) {
        let entry = self.live.remove(&id).expect("running job is live");
        self.running_by_session.remove(&entry.session);
        self.retire(id, entry, outcome);
    }

    fn retire(&mut self, id: JobId, entry: Entry<J>, outcome: Outcome<J>) {
        entry.done.send_replace(Some(outcome.clone()));
        self.done.insert(
            id,
            Done {
                outcome,
                ids: entry.ids,
            },
        );
        self.done_order.push_back(id);
        while self.done_order.len() > self.retain {
            let Some(old) = self.done_order.pop_front() else {
                break;
            };
            if let Some(forgotten) = self.done.remove(&old) {
                for id in forgotten.ids {
                    self.alias.remove(&id);
                }
            }
        }
    }

    fn cancel_queued(&mut self, id: JobId, reason: CancelReason) -> Vec<JobId> {
        let entry = self.live.remove(&id).expect("queued job is live");
        self.high.retain(|&queued| queued != id);
        self.normal.retain(|&queued| queued != id);
        self.queued_by_session.remove(&entry.session);
        let ids = entry.ids.clone();
        self.retire(id, entry, Err(Failure::Cancelled { reason }));
        ids
    }

    /// Cancels the session's queued job; returns its ids and, if the session
    /// has a job running, a channel that says when it finished.
    pub fn cancel_session(&mut self, session: &str) -> (Vec<JobId>, Option<DoneRx<J>>) {
        let cancelled = match self.queued_by_session.get(session) {
            Some(&id) => self.cancel_queued(id, CancelReason::Session),
            None => Vec::new(),
        };
        let running = self
            .running_by_session
            .get(session)
            .map(|id| self.live[id].done.subscribe());
        (cancelled, running)
    }

    /// Cancels every queued job; returns channels for the running ones.
    pub fn cancel_all(&mut self) -> Vec<DoneRx<J>> {
        let queued: Vec<JobId> = self.high.iter().chain(&self.normal).copied().collect();
        for id in queued {
            self.cancel_queued(id, CancelReason::Shutdown);
        }
        self.live
            .values()
            .map(|entry| entry.done.subscribe())
            .collect()
    }

    fn resolve(&self, id: JobId) -> Result<JobId, EngineError> {
        self.alias
            .get(&id)
            .copied()
            .ok_or(EngineError::UnknownJob(id))
    }

    pub fn waitable(&self, id: JobId) -> Result<Waitable<J>, EngineError> {
        let id = self.resolve(id)?;
        if let Some(done) = self.done.get(&id) {
            return Ok(Waitable::Ready(done.outcome.clone()));
        }
        Ok(Waitable::Pending(self.live[&id].done.subscribe()))
    }

    pub fn status(&self, id: JobId) -> Result<Status, EngineError> {
        let id = self.resolve(id)?;
        if let Some(done) = self.done.get(&id) {
            return Ok(match &done.outcome {
                Ok(_) => Status::Done,
                Err(Failure::Cancelled { .. }) => Status::Cancelled,
                Err(_) => Status::Failed,
            });
        }
        let entry = &self.live[&id];
        if entry.job.is_none() {
            return Ok(Status::Running);
        }
        let position = self
            .high
            .iter()
            .chain(&self.normal)
            .position(|&queued| queued == id)
            .expect("queued job is in a queue");
        Ok(Status::Queued {
            priority: entry.priority,
            position,
        })
    }

    pub fn promote(&mut self, id: JobId) -> Result<Promoted, EngineError> {
        let id = self.resolve(id)?;
        let Some(entry) = self.live.get(&id) else {
            return Ok(Promoted::Finished);
        };
        if entry.job.is_none() {
            return Ok(Promoted::AlreadyRunning);
        }
        if entry.priority == Priority::High {
            return Ok(Promoted::AlreadyHigh);
        }
        self.move_to_high(id);
        Ok(Promoted::Moved)
    }
}
