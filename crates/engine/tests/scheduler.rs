//! The scheduler's rules, each checked through the public API with jobs whose
//! progress the test controls (oneshot gates) and, where time matters,
//! tokio's paused clock, so nothing depends on how fast the machine is.

use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drums_engine::{
    CancelReason, Config, EngineError, Failure, Job, JobId, Priority, Promoted, Scheduler, Status,
    Worker,
};
use futures::future::BoxFuture;
use futures::{poll, FutureExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("test work refused turn {0}")]
struct Refused(u32);

#[derive(Clone, Copy)]
enum Ending {
    Succeed,
    Fail,
    Panic,
}

type Merges = Arc<Mutex<Vec<(Vec<u32>, Vec<u32>)>>>;

/// A job that logs when it starts and ends, may wait on a gate, and outputs
/// the turns merged into it.
struct TestJob {
    session: String,
    turns: Vec<u32>,
    gate: Option<oneshot::Receiver<()>>,
    /// Gives its worker back before waiting on its gate, as drumsd's job
    /// does once CRIU has captured the session.
    releases: bool,
    ending: Ending,
    log: Arc<Mutex<Vec<String>>>,
    merges: Merges,
}

impl TestJob {
    fn label(&self) -> String {
        let turns: Vec<String> = self.turns.iter().map(u32::to_string).collect();
        format!("{}{}", self.session, turns.join("+"))
    }
}

impl Job for TestJob {
    type Output = Vec<u32>;
    type Error = Refused;

    fn session(&self) -> &str {
        &self.session
    }

    fn merge(&mut self, newer: Self) {
        self.merges
            .lock()
            .unwrap()
            .push((self.turns.clone(), newer.turns.clone()));
        self.turns.extend(newer.turns);
    }

    fn run(self, worker: Worker) -> BoxFuture<'static, Result<Vec<u32>, Refused>> {
        async move {
            let label = self.label();
            self.log.lock().unwrap().push(format!("start {label}"));
            let mut worker = Some(worker);
            if self.releases {
                self.log.lock().unwrap().push(format!("release {label}"));
                worker.take().expect("held").release();
            }
            if let Some(gate) = self.gate {
                // A dropped sender opens the gate too.
                let _ = gate.await;
            }
            self.log.lock().unwrap().push(format!("end {label}"));
            drop(worker);
            match self.ending {
                Ending::Succeed => Ok(self.turns),
                Ending::Fail => Err(Refused(self.turns[0])),
                Ending::Panic => panic!("boom in {label}"),
            }
        }
        .boxed()
    }
}

#[derive(Default)]
struct Harness {
    log: Arc<Mutex<Vec<String>>>,
    merges: Merges,
}

impl Harness {
    fn job(&self, session: &str, turn: u32) -> TestJob {
        TestJob {
            session: session.to_owned(),
            turns: vec![turn],
            gate: None,
            releases: false,
            ending: Ending::Succeed,
            log: Arc::clone(&self.log),
            merges: Arc::clone(&self.merges),
        }
    }

    fn ending(&self, session: &str, turn: u32, ending: Ending) -> TestJob {
        TestJob {
            ending,
            ..self.job(session, turn)
        }
    }

    /// A job that runs until the returned sender fires.
    fn gated(&self, session: &str, turn: u32) -> (TestJob, oneshot::Sender<()>) {
        let (open, gate) = oneshot::channel();
        let job = TestJob {
            gate: Some(gate),
            ..self.job(session, turn)
        };
        (job, open)
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn starts(&self) -> Vec<String> {
        self.log()
            .iter()
            .filter_map(|line| line.strip_prefix("start ").map(str::to_owned))
            .collect()
    }

    fn merges(&self) -> Vec<(Vec<u32>, Vec<u32>)> {
        self.merges.lock().unwrap().clone()
    }
}

fn config(workers: usize, high_water: usize) -> Config {
    Config {
        workers,
        high_water,
        max_wait: Duration::from_secs(60),
        retain_finished: 1024,
    }
}

/// Lets the scheduler's tasks run until `cond` holds; fails rather than
/// hangs if it never does.
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

async fn until_running(sched: &Scheduler<TestJob>, id: JobId) {
    until(|| sched.status(id).unwrap() == Status::Running).await;
}

async fn submit(sched: &Scheduler<TestJob>, job: TestJob, priority: Priority) -> JobId {
    sched.submit(job, priority).await.unwrap().id
}

/// One worker busy with a gated job of session "G", so the test can fill the
/// queue before anything else starts.
async fn blocked(h: &Harness, cfg: Config) -> (Scheduler<TestJob>, JobId, oneshot::Sender<()>) {
    let sched = Scheduler::new(cfg).unwrap();
    let (gate_job, open) = h.gated("G", 0);
    let gate = submit(&sched, gate_job, Priority::Normal).await;
    until_running(&sched, gate).await;
    (sched, gate, open)
}

async fn output(sched: &Scheduler<TestJob>, id: JobId) -> Vec<u32> {
    sched.wait(id).await.unwrap().unwrap().output
}

#[tokio::test]
async fn a_queue_runs_in_submission_order() {
    let h = Harness::default();
    let (sched, _, open) = blocked(&h, config(1, 16)).await;
    let a = submit(&sched, h.job("A", 1), Priority::Normal).await;
    let b = submit(&sched, h.job("B", 1), Priority::Normal).await;
    let c = submit(&sched, h.job("C", 1), Priority::Normal).await;
    open.send(()).unwrap();
    for id in [a, b, c] {
        output(&sched, id).await;
    }
    assert_eq!(h.starts(), ["G0", "A1", "B1", "C1"]);
}

#[tokio::test]
async fn high_priority_runs_before_normal() {
    let h = Harness::default();
    let (sched, _, open) = blocked(&h, config(1, 16)).await;
    let n1 = submit(&sched, h.job("N", 1), Priority::Normal).await;
    let h1 = submit(&sched, h.job("H", 1), Priority::High).await;
    let m1 = submit(&sched, h.job("M", 1), Priority::Normal).await;
    let i1 = submit(&sched, h.job("I", 1), Priority::High).await;
    open.send(()).unwrap();
    for id in [n1, h1, m1, i1] {
        output(&sched, id).await;
    }
    assert_eq!(h.starts(), ["G0", "H1", "I1", "N1", "M1"]);
}

#[tokio::test]
async fn a_sessions_next_job_waits_for_its_running_one_even_with_a_free_worker() {
    let h = Harness::default();
    let sched = Scheduler::new(config(2, 16)).unwrap();
    let (a1_job, open) = h.gated("A", 1);
    let a1 = submit(&sched, a1_job, Priority::Normal).await;
    until_running(&sched, a1).await;
    let a2 = sched.submit(h.job("A", 2), Priority::High).await.unwrap();
    assert_eq!(a2.merged_into, None, "a running job is never merged into");
    let b1 = submit(&sched, h.job("B", 1), Priority::Normal).await;

    // The second worker passed A2 over for B1, a later, normal job.
    output(&sched, b1).await;
    assert!(matches!(
        sched.status(a2.id).unwrap(),
        Status::Queued { .. }
    ));
    assert!(!h.starts().contains(&"A2".to_owned()));

    open.send(()).unwrap();
    assert_eq!(output(&sched, a2.id).await, [2]);
    let log = h.log();
    let end_a1 = log.iter().position(|l| l == "end A1").unwrap();
    let start_a2 = log.iter().position(|l| l == "start A2").unwrap();
    assert!(end_a1 < start_a2, "{log:?}");
}

#[tokio::test]
async fn a_job_that_gives_its_worker_back_lets_another_session_run_but_not_its_own() {
    let h = Harness::default();
    let sched = Scheduler::new(config(1, 16)).unwrap();
    let (a1_job, open) = h.gated("A", 1);
    let a1 = submit(
        &sched,
        TestJob {
            releases: true,
            ..a1_job
        },
        Priority::Normal,
    )
    .await;
    until_running(&sched, a1).await;
    let a2 = submit(&sched, h.job("A", 2), Priority::High).await;
    let b1 = submit(&sched, h.job("B", 1), Priority::Normal).await;

    // The one worker, given back by A1 (still running), took B1, and passed
    // A2 over: A's jobs run one at a time whoever holds a worker.
    tokio::time::timeout(Duration::from_secs(5), output(&sched, b1))
        .await
        .expect("B1 ran on the worker A1 gave back");
    assert_eq!(sched.status(a1).unwrap(), Status::Running);
    assert!(matches!(sched.status(a2).unwrap(), Status::Queued { .. }));

    open.send(()).unwrap();
    assert_eq!(output(&sched, a2).await, [2]);
    assert_eq!(
        h.log(),
        [
            "start A1",
            "release A1",
            "start B1",
            "end B1",
            "end A1",
            "start A2",
            "end A2"
        ]
    );
}

#[tokio::test]
async fn a_job_that_keeps_its_worker_holds_it_to_its_end() {
    let h = Harness::default();
    let (sched, gate, open) = blocked(&h, config(1, 16)).await;
    let b1 = submit(&sched, h.job("B", 1), Priority::Normal).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(matches!(sched.status(b1).unwrap(), Status::Queued { .. }));
    open.send(()).unwrap();
    output(&sched, b1).await;
    output(&sched, gate).await;
    assert_eq!(h.starts(), ["G0", "B1"]);
}

#[tokio::test]
async fn queued_jobs_of_a_session_merge_and_both_ids_get_the_merged_outcome() {
    let h = Harness::default();
    let (sched, _, open) = blocked(&h, config(1, 16)).await;
    let first = sched.submit(h.job("A", 1), Priority::Normal).await.unwrap();
    let second = sched.submit(h.job("A", 2), Priority::Normal).await.unwrap();
    assert_eq!(first.merged_into, None);
    assert_eq!(second.merged_into, Some(first.id));
    assert_ne!(first.id, second.id);
    assert_eq!(h.merges(), [(vec![1], vec![2])]);
    open.send(()).unwrap();

    let older = sched.wait(first.id).await.unwrap().unwrap();
    let newer = sched.wait(second.id).await.unwrap().unwrap();
    assert_eq!(older.output, [1, 2]);
    assert_eq!(newer.output, [1, 2]);
    assert_eq!(older.metrics, newer.metrics);
    assert_eq!(older.metrics.submissions, 2);
    assert_eq!(h.starts(), ["G0", "A1+2"], "the merged job ran once");
}

#[tokio::test]
async fn a_submission_merges_into_the_queued_job_not_the_running_one() {
    let h = Harness::default();
    let sched = Scheduler::new(config(1, 16)).unwrap();
    let (a1_job, open) = h.gated("A", 1);
    let a1 = submit(&sched, a1_job, Priority::Normal).await;
    until_running(&sched, a1).await;
    let a2 = sched.submit(h.job("A", 2), Priority::Normal).await.unwrap();
    let a3 = sched.submit(h.job("A", 3), Priority::Normal).await.unwrap();
    assert_eq!(a2.merged_into, None);
    assert_eq!(a3.merged_into, Some(a2.id));
    open.send(()).unwrap();
    assert_eq!(output(&sched, a1).await, [1]);
    assert_eq!(output(&sched, a3.id).await, [2, 3]);
    assert_eq!(h.merges(), [(vec![2], vec![3])]);
}

#[tokio::test]
async fn a_high_priority_submission_promotes_the_job_it_merges_into() {
    let h = Harness::default();
    let (sched, _, open) = blocked(&h, config(1, 16)).await;
    let a1 = submit(&sched, h.job("A", 1), Priority::Normal).await;
    let b1 = submit(&sched, h.job("B", 1), Priority::Normal).await;
    let a2 = sched.submit(h.job("A", 2), Priority::High).await.unwrap();
    assert_eq!(a2.merged_into, Some(a1));
    assert_eq!(
        sched.status(a1).unwrap(),
        Status::Queued {
            priority: Priority::High,
            position: 0
        }
    );
    open.send(()).unwrap();
    let merged = sched.wait(a1).await.unwrap().unwrap();
    assert_eq!(merged.metrics.priority_when_started, Priority::High);
    output(&sched, b1).await;
    assert_eq!(h.starts(), ["G0", "A1+2", "B1"]);
}

#[tokio::test]
async fn promotion_moves_a_queued_job_ahead_and_says_what_it_did_otherwise() {
    let h = Harness::default();
    let (sched, gate, open) = blocked(&h, config(1, 16)).await;
    let a = submit(&sched, h.job("A", 1), Priority::Normal).await;
    let b = submit(&sched, h.job("B", 1), Priority::Normal).await;
    let c = submit(&sched, h.job("C", 1), Priority::Normal).await;
    assert_eq!(sched.promote(c).unwrap(), Promoted::Moved);
    assert_eq!(sched.promote(c).unwrap(), Promoted::AlreadyHigh);
    assert_eq!(sched.promote(gate).unwrap(), Promoted::AlreadyRunning);
    let unknown: JobId = "987654".parse().unwrap();
    assert!(matches!(
        sched.promote(unknown),
        Err(EngineError::UnknownJob(id)) if id == unknown
    ));

    open.send(()).unwrap();
    for id in [a, b, c] {
        output(&sched, id).await;
    }
    assert_eq!(h.starts(), ["G0", "C1", "A1", "B1"]);
    assert_eq!(sched.promote(a).unwrap(), Promoted::Finished);
}

#[tokio::test]
async fn the_high_queue_keeps_promotion_order() {
    let h = Harness::default();
    let (sched, _, open) = blocked(&h, config(1, 16)).await;
    let a = submit(&sched, h.job("A", 1), Priority::Normal).await;
    let b = submit(&sched, h.job("B", 1), Priority::Normal).await;
    let c = submit(&sched, h.job("C", 1), Priority::Normal).await;
    assert_eq!(sched.promote(b).unwrap(), Promoted::Moved);
    let d = submit(&sched, h.job("D", 1), Priority::High).await;
    assert_eq!(sched.promote(a).unwrap(), Promoted::Moved);
    open.send(()).unwrap();
    for id in [a, b, c, d] {
        output(&sched, id).await;
    }
    assert_eq!(h.starts(), ["G0", "B1", "D1", "A1", "C1"]);
}

#[tokio::test(start_paused = true)]
async fn a_submission_at_high_water_waits_and_proceeds_once_a_job_starts() {
    let h = Harness::default();
    let (sched, _, open) = blocked(&h, config(1, 2)).await;
    let a1 = submit(&sched, h.job("A", 1), Priority::Normal).await;
    submit(&sched, h.job("B", 1), Priority::Normal).await;
    let asked = Instant::now();

    let mut c = pin!(sched.submit(h.job("C", 1), Priority::High));
    assert!(poll!(c.as_mut()).is_pending(), "two queued: no room");
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(poll!(c.as_mut()).is_pending(), "still no room");

    // A merge adds nothing to the queue, so it never waits.
    let merged = sched.submit(h.job("A", 2), Priority::Normal).await.unwrap();
    assert_eq!(merged.merged_into, Some(a1));

    open.send(()).unwrap();
    let c = c.await.unwrap();
    assert_eq!(c.merged_into, None);
    assert!(
        asked.elapsed() < Duration::from_secs(60),
        "it did not time out"
    );
    assert_eq!(output(&sched, c.id).await, [1]);
}

#[tokio::test(start_paused = true)]
async fn a_submission_at_high_water_fails_busy_after_max_wait() {
    let h = Harness::default();
    let cfg = Config {
        max_wait: Duration::from_secs(7),
        ..config(1, 2)
    };
    let (sched, _, open) = blocked(&h, cfg).await;
    submit(&sched, h.job("A", 1), Priority::Normal).await;
    submit(&sched, h.job("B", 1), Priority::Normal).await;

    let err = sched
        .submit(h.job("C", 1), Priority::Normal)
        .await
        .unwrap_err();
    match err {
        EngineError::Busy { queued, waited } => {
            assert_eq!(queued, 2);
            assert!(waited >= Duration::from_secs(7), "{waited:?}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }

    // The refused job was not queued behind the others.
    open.send(()).unwrap();
    sched.shutdown().await;
    assert!(!h.starts().contains(&"C1".to_owned()), "{:?}", h.starts());
}

// Paused, so that if the panic took the worker down, the waits below fail at
// once (the idle runtime jumps the clock to the timeout) instead of hanging.
#[tokio::test(start_paused = true)]
async fn a_panicking_job_fails_only_itself() {
    let h = Harness::default();
    let sched = Scheduler::new(config(1, 16)).unwrap();
    let bad = submit(&sched, h.ending("P", 1, Ending::Panic), Priority::Normal).await;
    let good = submit(&sched, h.job("Q", 1), Priority::Normal).await;
    let bounded = |id| tokio::time::timeout(Duration::from_secs(3600), sched.wait(id));

    let outcome = bounded(bad).await.expect("the panic was answered");
    match outcome.unwrap() {
        Err(Failure::Panicked { message, .. }) => assert_eq!(message, "boom in P1"),
        other => panic!("expected a panic failure, got {other:?}"),
    }
    assert_eq!(sched.status(bad).unwrap(), Status::Failed);
    let good = bounded(good).await.expect("the worker survived the panic");
    assert_eq!(good.unwrap().unwrap().output, [1]);
    let later = submit(&sched, h.job("P", 2), Priority::Normal).await;
    let later = bounded(later).await.expect("the worker still takes jobs");
    assert_eq!(later.unwrap().unwrap().output, [2]);
}

#[tokio::test]
async fn a_failing_job_reports_its_error_as_the_source() {
    let h = Harness::default();
    let sched = Scheduler::new(config(1, 16)).unwrap();
    let id = submit(&sched, h.ending("F", 4, Ending::Fail), Priority::Normal).await;
    let failure = sched.wait(id).await.unwrap().unwrap_err();
    assert!(matches!(&failure, Failure::Job { error, .. } if *error == Refused(4)));
    let source = std::error::Error::source(&failure).expect("the job's error is kept");
    assert_eq!(source.to_string(), "test work refused turn 4");
    assert_eq!(sched.status(id).unwrap(), Status::Failed);
}

#[tokio::test]
async fn every_waiter_gets_the_outcome_and_late_ones_too_within_retention() {
    let h = Harness::default();
    let sched = Scheduler::new(Config {
        retain_finished: 2,
        ..config(1, 16)
    })
    .unwrap();
    let (job, open) = h.gated("A", 1);
    let first = submit(&sched, job, Priority::Normal).await;
    let waiters = futures::future::join3(sched.wait(first), sched.wait(first), async {
        until_running(&sched, first).await;
        open.send(()).unwrap();
        sched.wait(first).await
    });
    let (w1, w2, w3) = waiters.await;
    for outcome in [w1, w2, w3] {
        assert_eq!(outcome.unwrap().unwrap().output, [1]);
    }
    assert_eq!(output(&sched, first).await, [1], "after it finished");

    let second = submit(&sched, h.job("B", 1), Priority::Normal).await;
    output(&sched, second).await;
    let third = submit(&sched, h.job("C", 1), Priority::Normal).await;
    output(&sched, third).await;
    assert!(matches!(
        sched.wait(first).await,
        Err(EngineError::UnknownJob(id)) if id == first
    ));
    assert!(matches!(
        sched.status(first),
        Err(EngineError::UnknownJob(_))
    ));
    assert_eq!(output(&sched, second).await, [1], "still retained");
}

#[tokio::test]
async fn cancel_session_drops_its_queued_job_and_waits_for_its_running_one() {
    let h = Harness::default();
    let sched = Scheduler::new(config(1, 16)).unwrap();
    let (a1_job, open) = h.gated("A", 1);
    let a1 = submit(&sched, a1_job, Priority::Normal).await;
    until_running(&sched, a1).await;
    let a2 = sched.submit(h.job("A", 2), Priority::Normal).await.unwrap();
    let a3 = sched.submit(h.job("A", 3), Priority::Normal).await.unwrap();
    let b1 = submit(&sched, h.job("B", 1), Priority::Normal).await;

    let mut cancel = pin!(sched.cancel_session("A"));
    assert!(poll!(cancel.as_mut()).is_pending(), "A1 still runs");
    assert_eq!(sched.status(a2.id).unwrap(), Status::Cancelled);
    for id in [a2.id, a3.id] {
        assert!(matches!(
            sched.wait(id).await.unwrap(),
            Err(Failure::Cancelled {
                reason: CancelReason::Session
            })
        ));
    }
    assert!(matches!(sched.status(b1).unwrap(), Status::Queued { .. }));

    open.send(()).unwrap();
    let cancelled = cancel.await;
    assert_eq!(cancelled, [a2.id, a3.id]);
    assert!(h.log().contains(&"end A1".to_owned()));
    assert_eq!(output(&sched, a1).await, [1]);
    assert_eq!(output(&sched, b1).await, [1]);
    assert_eq!(h.starts(), ["A1", "B1"]);
}

#[tokio::test]
async fn shutdown_cancels_the_queue_and_waits_for_running_jobs() {
    let h = Harness::default();
    let (sched, gate, open) = blocked(&h, config(1, 16)).await;
    let a = submit(&sched, h.job("A", 1), Priority::Normal).await;

    let mut shutdown = pin!(sched.shutdown());
    assert!(poll!(shutdown.as_mut()).is_pending(), "G0 still runs");
    assert!(matches!(
        sched.submit(h.job("B", 1), Priority::High).await,
        Err(EngineError::ShutDown)
    ));
    assert!(matches!(
        sched.wait(a).await.unwrap(),
        Err(Failure::Cancelled {
            reason: CancelReason::Shutdown
        })
    ));

    open.send(()).unwrap();
    shutdown.await;
    assert_eq!(output(&sched, gate).await, [0]);
    assert_eq!(h.starts(), ["G0"]);
}

#[tokio::test]
async fn status_follows_a_job_from_queue_to_done() {
    let h = Harness::default();
    let (sched, gate, open) = blocked(&h, config(1, 16)).await;
    assert_eq!(sched.status(gate).unwrap(), Status::Running);
    let a = submit(&sched, h.job("A", 1), Priority::Normal).await;
    let b = submit(&sched, h.job("B", 1), Priority::Normal).await;
    let normal = |position| Status::Queued {
        priority: Priority::Normal,
        position,
    };
    assert_eq!(sched.status(a).unwrap(), normal(0));
    assert_eq!(sched.status(b).unwrap(), normal(1));

    sched.promote(b).unwrap();
    assert_eq!(
        sched.status(b).unwrap(),
        Status::Queued {
            priority: Priority::High,
            position: 0
        }
    );
    assert_eq!(sched.status(a).unwrap(), normal(1));

    open.send(()).unwrap();
    output(&sched, a).await;
    for id in [gate, a, b] {
        assert_eq!(sched.status(id).unwrap(), Status::Done);
    }
}

#[tokio::test(start_paused = true)]
async fn queue_wait_is_measured_from_the_oldest_merged_submission() {
    let h = Harness::default();
    let (sched, gate, open) = blocked(&h, config(1, 16)).await;
    let first = submit(&sched, h.job("A", 1), Priority::Normal).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    let second = submit(&sched, h.job("A", 2), Priority::Normal).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    open.send(()).unwrap();

    let merged = sched.wait(second).await.unwrap().unwrap();
    assert_eq!(merged.metrics.queued_for, Duration::from_secs(15));
    assert_eq!(merged.metrics.ran_for, Duration::ZERO);
    assert_eq!(merged.metrics.priority_when_started, Priority::Normal);
    assert_eq!(
        sched.wait(first).await.unwrap().unwrap().metrics,
        merged.metrics
    );
    let gate = sched.wait(gate).await.unwrap().unwrap();
    assert_eq!(gate.metrics.ran_for, Duration::from_secs(15));
    assert_eq!(gate.metrics.queued_for, Duration::ZERO);
}

#[tokio::test]
async fn a_config_that_could_never_run_a_job_is_refused() {
    for (cfg, field) in [(config(0, 4), "workers"), (config(1, 0), "high_water")] {
        match Scheduler::<TestJob>::new(cfg) {
            Err(EngineError::InvalidConfig { field: got, .. }) => assert_eq!(got, field),
            Err(other) => panic!("expected InvalidConfig for {field}, got {other:?}"),
            Ok(_) => panic!("{field} 0 was accepted"),
        }
    }
}

#[test]
fn the_default_config_uses_half_the_cores_and_a_queue_for_every_session_of_a_dense_host() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let cfg = Config::default();
    assert_eq!(cfg.workers, (cores / 2).max(1));
    assert_eq!(
        cfg.high_water,
        drums_engine::HIGH_WATER.max(4 * cfg.workers)
    );
    assert!(cfg.high_water >= 128);
}

#[test]
fn a_scheduler_needs_a_runtime() {
    assert!(matches!(
        Scheduler::<TestJob>::new(config(1, 1)),
        Err(EngineError::NoRuntime(_))
    ));
}

#[test]
fn job_ids_read_back_what_they_display() {
    let id: JobId = "42".parse().unwrap();
    assert_eq!(id.to_string(), "42");
    assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
    let err = "job-7".parse::<JobId>().unwrap_err();
    assert!(matches!(&err, EngineError::BadJobId { text, .. } if text == "job-7"));
    assert!(std::error::Error::source(&err).is_some());
}
