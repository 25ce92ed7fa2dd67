//! The coordinator's watch over a fake of the sessions (fake/mod.rs): which
//! failures it recovers, in what order, and when it gives a session up.
//! The daemon's tests prove the same with real sessions and a real OOM kill.

mod fake;

use std::time::Duration;

use drums_coordinator::{Backoff, Limits};

use fake::{count, position, seen, setup_with};

/// A backoff of tens of milliseconds, so the give-up is reached in a
/// fraction of a second.
fn quick() -> Limits {
    Limits {
        backoff: Backoff {
            first: Duration::from_millis(20),
            max: Duration::from_millis(80),
        },
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_kill_kills_what_is_left_then_recovers_once() {
    let t = setup_with(quick()).await;
    t.catalog.coordinate("s1", None).unwrap();
    let watch = t.coordinator.spawn_watch();
    // Seen once with no OOM kill: that count is the baseline.
    seen(&t.events, "oom_kills s1").await;
    *t.fake.ooms.lock().unwrap() = 1;
    seen(&t.events, "recover s1").await;
    assert!(position(&t.events, "kill_processes s1") < position(&t.events, "recover s1"));
    // The count stays at 1: the rebuilt session's baseline, no second
    // recovery. Ten ticks of the watch.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        count(&t.events, "recover s1"),
        1,
        "{:?}",
        t.events.lock().unwrap()
    );
    assert_eq!(count(&t.events, "kill_processes s1"), 1);
    watch.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_keeps_dying_without_progress_is_given_up_after_three_recoveries() {
    let t = setup_with(quick()).await;
    t.catalog.coordinate("s1", None).unwrap();
    *t.fake.died.lock().unwrap() = true;
    let watch = t.coordinator.spawn_watch();
    for _ in 0..300 {
        if count(&t.events, "recover s1") >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        count(&t.events, "recover s1"),
        3,
        "{:?}",
        t.events.lock().unwrap()
    );
    // Its processes died, not the OOM killer: nothing is killed.
    assert_eq!(count(&t.events, "kill_processes s1"), 0);
    // Given up: no fourth, however long the backoff's longest wait (80 ms)
    // is waited out, ten times over.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        count(&t.events, "recover s1"),
        3,
        "{:?}",
        t.events.lock().unwrap()
    );
    watch.abort();
}
