//! `POST`/`GET /v1/hygiene` against the real agent in its own UTS namespace
//! (see `common`), with real Python registrants using the shipped hook.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hyper::{Method, StatusCode};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

const MACHINE_ID: &str = "0123456789abcdef0123456789abcdef";

fn pids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

#[tokio::test]
async fn hygiene_renames_the_sibling_inside_its_namespace() {
    let host_before = hostname();
    let guest = SandboxedGuest::start().await;

    // The agent made the reseed directory at start-up, sticky and
    // writable by everyone. A cold session has no generation.
    let mode = std::fs::metadata(guest.reseed_dir())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o1777);
    let (status, body) = guest.json(Method::GET, "/v1/hygiene", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"generation": 0, "registered": [], "last": null})
    );

    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({
                "hostname": "sib-1",
                "machine_id": MACHINE_ID,
                "generation": 1,
                "ip": "10.213.0.7",
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}\n{}", guest.log());
    assert_eq!(body["hostname"], "sib-1");
    assert_eq!(body["generation"], 1);
    for list in ["signalled", "acked", "stale_removed", "unverified"] {
        assert_eq!(body[list], json!([]), "{list}");
    }
    assert!(body["elapsed_us"].as_u64().is_some(), "{body}");

    // The kernel's hostname changed, for the agent and for what it runs.
    let (_, health) = guest.json(Method::GET, "/v1/health", None).await;
    assert_eq!(health["hostname"], "sib-1");
    assert_eq!(guest.exec_stdout(&["hostname"]).await, "sib-1\n");

    let read = |name: &str| std::fs::read_to_string(guest.etc.join(name)).unwrap();
    assert_eq!(read("hostname"), "sib-1\n");
    assert_eq!(read("machine-id"), format!("{MACHINE_ID}\n"));
    assert_eq!(
        read("hosts"),
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         127.0.1.1\tsib-1\n10.213.0.7\tsib-1\n"
    );
    let generation = guest.run.join("generation");
    assert_eq!(std::fs::read_to_string(&generation).unwrap(), "1\n");
    assert_eq!(
        std::fs::metadata(&generation).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // Atomic replacement leaves no temporary files behind.
    assert_eq!(names(&guest.etc), ["hostname", "hosts", "machine-id"]);
    assert_eq!(names(&guest.run), ["generation", "reseed"]);

    // A later restore of this sibling, without an address this time.
    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({
                "hostname": "sib-2",
                "machine_id": "fedcba9876543210fedcba9876543210",
                "generation": 2,
                "ip": null,
                "ack_timeout_ms": 0,
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        read("hosts"),
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsib-2\n"
    );
    assert_eq!(guest.exec_stdout(&["hostname"]).await, "sib-2\n");
    let (_, body) = guest.json(Method::GET, "/v1/hygiene", None).await;
    assert_eq!(body["generation"], 2);
    assert_eq!(body["registered"], json!([]));
    assert_eq!(body["last"]["hostname"], "sib-2", "{body}");

    drop(guest);
    assert_eq!(
        hostname(),
        host_before,
        "the test machine's hostname changed"
    );
}

#[tokio::test]
async fn hygiene_refuses_bad_input_and_changes_nothing() {
    let guest = SandboxedGuest::start().await;
    let long = "x".repeat(64);
    let ok = json!({"hostname": "sib-1", "machine_id": MACHINE_ID, "generation": 1});
    let with = |key: &str, value: Value| {
        let mut body = ok.clone();
        body[key] = value;
        body
    };
    let cases = [
        with("hostname", json!("")),
        with("hostname", json!("-sib")),
        with("hostname", json!("sib.example")),
        with("hostname", json!("sib_1")),
        with("hostname", json!(long)),
        with("machine_id", json!("0123456789ABCDEF0123456789ABCDEF")),
        with("machine_id", json!("0123456789abcdef")),
        with("machine_id", json!("0123456789abcdef0123456789abcdeg")),
        with("machine_id", json!("00000000000000000000000000000000")),
        with("ip", json!("10.213.0.300")),
        with("ack_timeout_ms", json!(10_001)),
        with("generation", json!(-1)),
        with("surprise", json!(1)),
        json!({"hostname": "sib-1"}),
    ];
    for body in cases {
        let (status, answer) = guest
            .json(Method::POST, "/v1/hygiene", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["kind"], "bad_request", "{body}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(!message.starts_with(char::is_uppercase), "{message}");
    }
    let (_, answer) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(with("hostname", json!("a.b"))),
        )
        .await;
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid hostname \"a.b\""),
        "{answer}"
    );

    let (status, answer) = guest.json(Method::DELETE, "/v1/hygiene", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer["error"]["kind"], "method_not_allowed");

    // Nothing was applied.
    let (_, health) = guest.json(Method::GET, "/v1/health", None).await;
    assert_ne!(health["hostname"], "sib-1");
    assert_eq!(
        std::fs::read_to_string(guest.etc.join("hostname")).unwrap(),
        format!("{OLD_HOSTNAME}\n")
    );
    assert_eq!(
        std::fs::read_to_string(guest.etc.join("hosts")).unwrap(),
        OLD_HOSTS
    );
    assert!(!guest.run.join("generation").exists());
}

#[tokio::test]
async fn reseed_gives_clones_different_random_streams() {
    let guest = SandboxedGuest::start().await;
    let lib = write_python_path(guest.dir.path());
    let mut a = Proc::python(REGISTRANT, &lib, &guest.run);
    let mut b = Proc::python(REGISTRANT, &lib, &guest.run);
    // A third clone runs as nobody: processes of any user can register (the
    // directory is sticky and world-writable) and, owning their file, are
    // signalled. It must be able to reach the temporary directory.
    std::fs::set_permissions(guest.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = Proc::spawn(
        Command::new(python3())
            .args(["-S", "-c", REGISTRANT])
            .env("PYTHONPATH", &lib)
            .env("DRUMS_RUN_DIR", &guest.run)
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::null())
            .stdout(Stdio::piped()),
    );
    for p in [&mut a, &mut b, &mut c] {
        let pid = p.pid();
        assert_eq!(p.line(), format!("ready {pid}\n"));
        // Registered as the protocol says: the signal number, in a file the
        // process holds open.
        let file = guest.reseed_dir().join(pid.to_string());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "12\n");
    }
    let all = sorted(vec![a.pid(), b.pid(), c.pid()]);
    let (_, status) = guest.json(Method::GET, "/v1/hygiene", None).await;
    assert_eq!(pids(&status["registered"]), all);

    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({
                "hostname": "sib-1",
                "machine_id": MACHINE_ID,
                "generation": 5,
                "ack_timeout_ms": 5000,
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}\n{}", guest.log());
    assert_eq!(pids(&body["signalled"]), all, "{body}");
    assert_eq!(pids(&body["acked"]), all, "{body}");
    assert_eq!(pids(&body["stale_removed"]), Vec::<u32>::new());
    // The wait ends with the last ack, not at the timeout.
    assert!(body["elapsed_us"].as_u64().unwrap() < 4_000_000, "{body}");

    let mut draws = Vec::new();
    for p in [&mut a, &mut b, &mut c] {
        let line = p.line();
        let [draw, numpy, ack, peeked] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("unexpected output {line:?}");
        };
        assert_eq!(ack, "5", "the ack names the generation");
        assert_eq!(
            peeked, draw,
            "the ack's peeked next draw is the draw the program then made"
        );
        let draw: f64 = draw.parse().unwrap();
        assert_ne!(draw, SEED_1_DRAW, "random was not reseeded");
        assert_eq!(numpy, "1", "numpy's global generator was not reseeded");
        draws.push(draw);
        assert!(p.child.wait().unwrap().success());
    }
    let distinct: BTreeSet<u64> = draws.iter().map(|d| d.to_bits()).collect();
    assert_eq!(
        distinct.len(),
        3,
        "clones still draw the same numbers: {draws:?}"
    );

    // A normal exit deregisters (atexit). The acks stay until the next
    // hygiene call, so that one read late is still counted.
    let (_, status) = guest.json(Method::GET, "/v1/hygiene", None).await;
    assert_eq!(status["registered"], json!([]));
    let acks: Vec<String> = all.iter().map(|pid| format!("{pid}.ack")).collect();
    assert_eq!(names(&guest.reseed_dir()), acks);
    let (_, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({"hostname": "sib-2", "machine_id": MACHINE_ID, "generation": 6})),
        )
        .await;
    assert_eq!(body["signalled"], json!([]), "{body}");
    assert_eq!(names(&guest.reseed_dir()), Vec::<String>::new());
}

/// `POST /v1/hygiene` as a restore to `sib-1` would send it; its body,
/// which must come with 200.
async fn reseed_as_sib_1(guest: &SandboxedGuest, generation: u64, ack_timeout_ms: u64) -> Value {
    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({
                "hostname": "sib-1",
                "machine_id": MACHINE_ID,
                "generation": generation,
                "ack_timeout_ms": ack_timeout_ms,
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}\n{}", guest.log());
    body
}

/// The agent of a confined session holds no CAP_SYS_PTRACE. It must still
/// tie another user's registration to its process, and never take "may not
/// look" for "does not hold its file": that deleted every registration of
/// a desktop user's Python, and its siblings drew alike.
#[tokio::test]
async fn a_confined_agent_reseeds_another_users_process() {
    let guest = SandboxedGuest::start_confined().await;
    let caps = std::fs::read_to_string(format!("/proc/{}/status", guest.pid())).unwrap();
    let bounding = caps
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        bounding & (1 << 19),
        0,
        "the agent still holds CAP_SYS_PTRACE"
    );
    let lib = write_python_path(guest.dir.path());
    std::fs::set_permissions(guest.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut p = Proc::spawn(
        Command::new(python3())
            .args(["-S", "-c", REGISTRANT])
            .env("PYTHONPATH", &lib)
            .env("DRUMS_RUN_DIR", &guest.run)
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::null())
            .stdout(Stdio::piped()),
    );
    let pid = p.pid();
    assert_eq!(p.line(), format!("ready {pid}\n"));
    let body = reseed_as_sib_1(&guest, 3, 5000).await;
    assert_eq!(pids(&body["stale_removed"]), Vec::<u32>::new(), "{body}");
    assert_eq!(pids(&body["signalled"]), vec![pid], "{body}");
    assert_eq!(pids(&body["acked"]), vec![pid], "{body}");
    let line = p.line();
    let draw: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
    assert_ne!(draw, SEED_1_DRAW, "not reseeded: {line}");
    // The outcome stays readable, for `drums audit`.
    let (_, status) = guest.json(Method::GET, "/v1/hygiene", None).await;
    assert_eq!(status["last"]["acked"], body["acked"], "{status}");
}

/// A registrant whose ids are mixed (a setuid program: real and effective
/// uid differ) cannot be looked at without CAP_SYS_PTRACE. It is reported
/// as unverified: neither signalled (it might be a recycled pid) nor
/// removed (it might be live).
#[tokio::test]
async fn a_registration_the_agent_may_not_check_is_reported_not_removed() {
    let guest = SandboxedGuest::start_confined().await;
    let lib = write_python_path(guest.dir.path());
    std::fs::set_permissions(guest.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!(
        "import os\nos.setresgid(65534, 65534, 0)\nos.setresuid(65534, 65534, 0)\n{REGISTRANT}"
    );
    let mut p = Proc::python(&script, &lib, &guest.run);
    let pid = p.pid();
    assert_eq!(p.line(), format!("ready {pid}\n"));
    let body = reseed_as_sib_1(&guest, 4, 200).await;
    assert_eq!(pids(&body["unverified"]), vec![pid], "{body}");
    assert_eq!(pids(&body["signalled"]), Vec::<u32>::new(), "{body}");
    assert_eq!(pids(&body["stale_removed"]), Vec::<u32>::new(), "{body}");
    assert!(guest.reseed_dir().join(pid.to_string()).exists());
    assert!(p.is_running());
}

#[tokio::test]
async fn forked_children_register_themselves() {
    let guest = SandboxedGuest::start().await;
    let lib = write_python_path(guest.dir.path());
    // The parent forks after seeding: parent and child are clones of each
    // other, and the child is a pid the parent's registration does not cover.
    // The parent reaps the child before it exits.
    let script = REGISTRANT.replace("random.seed(1)\n", "random.seed(1)\nchild = os.fork()\n")
        + "if child:\n    os.waitpid(child, 0)\n";
    let mut p = Proc::python(&script, &lib, &guest.run);
    let first = p.line();
    let second = p.line();
    let mut ready: Vec<u32> = [first, second]
        .iter()
        .map(|l| match l.trim().strip_prefix("ready ").map(str::parse) {
            Some(Ok(pid)) => pid,
            _ => panic!("expected `ready <pid>`, got {l:?}"),
        })
        .collect();
    ready.sort_unstable();
    assert!(ready.contains(&p.pid()));

    let (_, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({"hostname": "sib-1", "machine_id": MACHINE_ID, "generation": 1, "ack_timeout_ms": 5000})),
        )
        .await;
    assert_eq!(pids(&body["signalled"]), ready, "{body}");
    assert_eq!(pids(&body["acked"]), ready, "{body}");
    let draws: BTreeSet<String> = [p.line(), p.line()]
        .iter()
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(draws.len(), 2, "parent and child draw the same: {draws:?}");
    assert!(p.child.wait().unwrap().success());
    let child = *ready.iter().find(|&&pid| pid != p.pid()).unwrap();
    assert!(!std::path::Path::new(&format!("/proc/{child}")).exists());
}

#[tokio::test]
async fn stale_registrations_are_removed_and_never_signalled() {
    let guest = SandboxedGuest::start().await;
    let lib = write_python_path(guest.dir.path());
    let reseed = guest.reseed_dir();

    // 1. A registrant that died without deregistering (killed).
    let dead = {
        let mut p = Proc::python(REGISTRANT, &lib, &guest.run);
        p.line();
        let pid = p.pid();
        drop(p); // SIGKILL and reap: no atexit
        pid
    };
    assert!(reseed.join(dead.to_string()).exists());

    // 2. A pid that now belongs to another process: the file names a live
    // process that never registered (here with a start time after the
    // signal, the format a naive registrant might use). SIGUSR2 would kill it.
    let mut recycled = Proc::spawn(Command::new("sleep").arg("60").stdout(Stdio::null()));
    std::fs::write(reseed.join(recycled.pid().to_string()), "12 4711\n").unwrap();

    // 3. A registrant that exec'd another program: same pid, same start
    // time, but the new program has no handler. The registration fd was
    // close-on-exec, which is how the agent tells.
    let mut execd = Proc::python(
        "import drums_reseed, os, sys\nprint('ready', flush=True)\nsys.stdout.close()\n\
         os.execv('/bin/sleep', ['sleep', '60'])\n",
        &lib,
        &guest.run,
    );
    execd.line();
    let execd_pid = execd.pid();
    wait_until("the registrant has exec'd sleep", || {
        std::fs::read_to_string(format!("/proc/{execd_pid}/comm")).is_ok_and(|c| c == "sleep\n")
    });
    assert!(reseed.join(execd_pid.to_string()).exists());

    // 4. A registration file that someone else owns: only root or the
    // process's own user may register a process.
    let mut foreign = Proc::python(REGISTRANT, &lib, &guest.run);
    foreign.line();
    let foreign_file = reseed.join(foreign.pid().to_string());
    std::os::unix::fs::chown(&foreign_file, Some(65534), Some(65534)).unwrap();

    // 5. Junk that is not a registration at all is left alone.
    std::fs::write(reseed.join("notes.txt"), "hello").unwrap();

    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({"hostname": "sib-1", "machine_id": MACHINE_ID, "generation": 1, "ack_timeout_ms": 100})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["signalled"], json!([]), "{body}\n{}", guest.log());
    assert_eq!(
        pids(&body["stale_removed"]),
        sorted(vec![dead, recycled.pid(), execd_pid, foreign.pid()])
    );
    assert_eq!(names(&reseed), ["notes.txt"]);

    // Nobody got a signal: SIGUSR2 would have killed the sleeps, and the
    // foreign-owned registrant would have acked.
    std::thread::sleep(Duration::from_millis(100));
    assert!(recycled.is_running());
    assert!(execd.is_running());
    assert!(foreign.is_running());
    assert!(!reseed.join(format!("{}.ack", foreign.pid())).exists());
}

#[tokio::test]
async fn late_acks_are_not_counted_and_the_wait_is_bounded() {
    let guest = SandboxedGuest::start().await;
    let lib = write_python_path(guest.dir.path());
    let mut p = Proc::python(REGISTRANT, &lib, &guest.run);
    p.line();
    // Stopped: the signal stays pending until it continues.
    let pid = Pid::from_raw(p.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // A leftover ack of the same generation (a checkpoint restored twice
    // with one number) must not count: the agent removes acks first.
    std::fs::write(guest.reseed_dir().join(format!("{}.ack", p.pid())), "3\n").unwrap();

    let (status, body) = guest
        .json(
            Method::POST,
            "/v1/hygiene",
            Some(json!({"hostname": "sib-1", "machine_id": MACHINE_ID, "generation": 3, "ack_timeout_ms": 150})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(pids(&body["signalled"]), vec![p.pid()]);
    assert_eq!(body["acked"], json!([]));
    let elapsed = body["elapsed_us"].as_u64().unwrap();
    assert!((150_000..3_000_000).contains(&elapsed), "{elapsed}");

    // Once it runs again it handles the signal and acks after all.
    kill(pid, Signal::SIGCONT).unwrap();
    let line = p.line();
    assert_ne!(
        line.split(' ').next().unwrap().parse::<f64>().unwrap(),
        SEED_1_DRAW
    );
    assert!(p.child.wait().unwrap().success());
}

#[tokio::test]
async fn the_hook_leaves_an_application_handler_alone() {
    let guest = SandboxedGuest::start().await;
    let lib = write_python_path(guest.dir.path());
    // SIGUSR2 already has a handler when the hook is imported (as if a
    // wrapper had set it before exec'ing Python): the hook must not take it,
    // and so must not register.
    let mut p = Proc::python(
        "import signal\nsignal.signal(signal.SIGUSR2, lambda *a: None)\nimport drums_reseed, os\n\
         print(os.getpid(), signal.getsignal(signal.SIGUSR2).__name__, flush=True)\n\
         import time\ntime.sleep(60)\n",
        &lib,
        &guest.run,
    );
    assert_eq!(p.line(), format!("{} <lambda>\n", p.pid()));
    assert_eq!(names(&guest.reseed_dir()), Vec::<String>::new());
    // DRUMS_RESEED=0 turns the hook off entirely.
    let out = Command::new(python3())
        .args([
            "-S",
            "-c",
            "import drums_reseed, signal; print(signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)",
        ])
        .env("PYTHONPATH", &lib)
        .env("DRUMS_RUN_DIR", &guest.run)
        .env("DRUMS_RESEED", "0")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "True\n");
    assert_eq!(names(&guest.reseed_dir()), Vec::<String>::new());
}
