//! The checkpointability corpus: what agents and their tools really leave
//! running in a session (file watchers, ptys and a tmux-like pty server,
//! unlinked scratch files of 100 MiB and 1 GiB, POSIX and OFD locks, SQLite
//! in WAL mode with an open writer, 64 threads, a stopped process, a zombie,
//! TCP, a socketpair, memfd, /dev/shm, eventfd, timerfd, signalfd, epoll, a
//! deleted working directory), each in a default (confined) session, through
//! every way drums takes and gives back a session: a checkpoint, 2 siblings
//! restored from it, a turn-end version, a rollback to it, and a recovery
//! after the session's processes are killed from the host. After each, the
//! workload must still answer its check *with its state*
//! (`tests/workloads/wl.py` says what each checks). As root, with real CRIU;
//! every test ends by proving nothing is left on the host.

mod common;

use common::{ok, run, TestDaemon};
use drums_api::{CreateSession, Policy, Session};
use hyper::Method;

const WL: &str = include_str!("workloads/wl.py");

/// The workload's own answer in session `s`: "ok …" or "fail …".
fn probe(d: &TestDaemon, s: &str) -> String {
    let (code, out, err) = d.sh(s, "python3 /root/wl.py probe");
    assert_eq!(code, 0, "probe in {s}: {out} {err}");
    out
}

fn expect_ok(d: &TestDaemon, name: &str, s: &str, when: &str) {
    let out = probe(d, s);
    assert!(
        out.starts_with("ok"),
        "{name}, {when}: {out}\nits log: {}\n{}",
        d.sh(s, "cat /root/wl.log").1,
        d.log()
    );
}

/// A new session running workload `name`, answering.
async fn start(d: &TestDaemon, name: &str) -> Session {
    let s = d
        .create(&CreateSession {
            name: Some(name.replace('_', "-")),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("wl.py");
    std::fs::write(&script, WL).unwrap();
    ok(
        &d.drums(&[
            "cp",
            script.to_str().unwrap(),
            &format!("{}:/root/wl.py", s.id),
        ]),
        "cp wl.py",
    );
    let (code, out, err) = d.sh(
        &s.id,
        &format!("cd /root && nohup python3 /root/wl.py serve {name} >/root/wl.log 2>&1 &"),
    );
    assert_eq!(code, 0, "{out} {err}");
    expect_ok(d, name, &s.id, "at start");
    s
}

/// Starts workload `name` in a new session and takes it through the corpus.
fn corpus(name: &str, daemon_args: &[&str]) {
    let mut d = TestDaemon::start_with(daemon_args);
    run(async {
        let s = start(&d, name).await;

        // A checkpoint of the running session, then 2 siblings of it.
        let ck = d.checkpoint(&s.id, false, true).await;
        expect_ok(&d, name, &s.id, "after its checkpoint");
        let r = d
            .restore(&ck.id, 2)
            .await
            .unwrap_or_else(|e| panic!("{name}: restore: {e}\n{}", d.log()));
        for sib in &r.sessions {
            expect_ok(&d, name, &sib.id, "in a restored sibling");
            d.rm(&sib.id).await.unwrap();
        }

        // A turn's end takes a version with the processes in it.
        let version = d
            .turn_version(&s.id, "echo turn > /root/turn", Policy::Full)
            .await;
        expect_ok(&d, name, &s.id, "after its turn-end version");

        // Back to that version.
        ok(
            &d.drums(&["rollback", &s.id, "--to", &version.number.to_string()]),
            &format!("{name}: rollback"),
        );
        expect_ok(&d, name, &s.id, "after a rollback to its version");

        // Its processes killed from the host: recovered from the version.
        d.kill_and_recover(&s.id).await;
        expect_ok(&d, name, &s.id, "after a recovery");

        d.rm(&s.id).await.unwrap();
        d.client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", ck.id),
                None::<&()>,
            )
            .await
            .unwrap();
    });
    d.stop_and_check_leaks();
}

/// What CRIU cannot dump fails the checkpoint with what the user reads: the
/// process, the object, and what to do; not CRIU's log. And it changes
/// nothing: the session runs on, and no checkpoint is left.
#[test]
fn a_shell_keeping_dev_tty_open_is_refused_clearly() {
    let mut d = TestDaemon::start();
    run(async {
        let s = start(&d, "pty_dash").await;
        let o = d.drums(&["checkpoint", &s.id, "--leave-running"]);
        let err = common::fails(&o, "checkpoint of a dash on a pty");
        assert_eq!(
            o.status.code(),
            Some(4),
            "a conflict with the session's state: {err}"
        );
        assert!(
            err.contains("cannot be checkpointed")
                && err.contains("(sh, host pid")
                && err.contains("/dev/tty")
                && err.contains("set +m")
                && !err.contains("criu/tty.c"),
            "{err}"
        );
        let cks: drums_api::CheckpointList = d
            .client
            .json(Method::GET, "/v1/checkpoints", None::<&()>)
            .await
            .unwrap();
        assert!(cks.checkpoints.is_empty(), "{cks:?}");
        expect_ok(&d, "pty_dash", &s.id, "after its refused checkpoint");
        d.rm(&s.id).await.unwrap();
    });
    d.stop_and_check_leaks();
}

macro_rules! workloads {
    ($($name:ident $(: $($arg:literal),+)?;)*) => {$(
        #[test]
        fn $name() {
            corpus(stringify!($name), &[$($($arg),+)?]);
        }
    )*};
}

workloads! {
    inotify_own;
    inotify_image;
    pty_shell;
    pty_server;
    ghost_100m;
    // The checkpoint, 2 siblings, the version and the recovered session
    // each hold a copy of the 1 GiB file.
    ghost_1g: "--store-gib", "12";
    locks;
    sqlite_wal;
    threads64;
    stopped;
    zombie;
    deleted_cwd;
    tcp;
    socketpair;
    memfd;
    shm;
    eventfd;
    timerfd;
    signalfd;
    epoll;
}
