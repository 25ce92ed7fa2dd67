//! Checkpoint, restore and fork end to end, against a real drumsd and CRIU,
//! as root. Every test ends by proving nothing is left on the host.

mod common;

use common::{assert_schema, run, TestDaemon};
use drums_api::{Checkpoint, CreateCheckpoint, CreateSession, Session};
use hyper::Method;

/// A server whose answers depend on its RNG, seeded identically before the
/// checkpoint: without hygiene every sibling would answer the same.
const SERVER: &str = r#"
import http.server, random, socket
random.seed(1234)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("%s %r" % (socket.gethostname(), random.random())).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
"#;

fn http_get(ip: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr = format!("{ip}:8000").parse().ok()?;
    for _ in 0..100 {
        if let Ok(mut s) =
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
        {
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .ok()?;
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            return out.split("\r\n\r\n").nth(1).map(str::to_owned);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

fn start_server(d: &TestDaemon, s: &Session) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("server.py");
    std::fs::write(&p, SERVER).unwrap();
    assert!(d
        .drums(&[
            "cp",
            p.to_str().unwrap(),
            &format!("{}:/root/server.py", s.id)
        ])
        .status
        .success());
    let (code, _, err) = d.sh(&s.id, "nohup python3 /root/server.py >/dev/null 2>&1 &");
    assert_eq!(code, 0, "{err}");
    assert!(
        http_get(s.ip.as_deref().unwrap()).is_some(),
        "server did not answer before the checkpoint"
    );
}

/// One warm session checkpointed, restored as 3 siblings: each serves, and
/// none is a clone of another.
#[test]
fn three_siblings_serve_and_are_not_clones() {
    let mut d = TestDaemon::start();
    run(async {
        let src = d.create(&CreateSession::default()).await.unwrap();
        start_server(&d, &src);
        let ck = d.checkpoint(&src.id, false, true).await;
        assert_schema("Checkpoint", &serde_json::to_value(&ck).unwrap());
        assert!(ck.images_bytes > 0);
        let r = d
            .restore(&ck.id, 3)
            .await
            .unwrap_or_else(|e| panic!("restore: {e}\n{}", d.log()));
        assert_schema("RestoreResult", &serde_json::to_value(&r).unwrap());
        assert_eq!(r.sessions.len(), 3);
        let mut answers = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for s in &r.sessions {
            assert_eq!(s.state, drums_api::SessionState::Running);
            assert_eq!(s.generation, 1);
            assert_eq!(s.origin.as_deref(), Some(ck.id.as_str()));
            let ip = s.ip.clone().unwrap();
            let body = http_get(&ip)
                .unwrap_or_else(|| panic!("sibling {} at {ip} does not serve\n{}", s.id, d.log()));
            let (host, draw) = body.split_once(' ').unwrap();
            assert_eq!(
                host, s.hostname,
                "the server sees its sibling's own hostname"
            );
            answers.push(draw.to_owned());
            let (_, mid, _) = d.sh(&s.id, "cat /etc/machine-id");
            let (_, gen, _) = d.sh(&s.id, "cat /run/drums/generation");
            let (_, addr, _) = d.sh(
                &s.id,
                "ip -o -4 addr show eth0 | awk '{print $4}'; cat /sys/class/net/eth0/address",
            );
            assert_eq!(gen, "1");
            for v in [s.hostname.clone(), mid, addr, s.mac.clone().unwrap()] {
                assert!(seen.insert(v.clone()), "{v} is shared between siblings");
            }
        }
        answers.sort();
        answers.dedup();
        assert_eq!(
            answers.len(),
            3,
            "the RNG draws of the siblings repeat: {answers:?}"
        );
        // The audit: isolated, not clones, and the Python draws were measured.
        let (a, b) = (&r.sessions[0].id, &r.sessions[1].id);
        let rep: serde_json::Value = d.audit(a, b).await;
        assert_schema("AuditReport", &rep);
        assert_eq!(rep["passed"], true, "{rep:#}");
        let py = rep["clone"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["what"] == "python random")
            .unwrap();
        assert!(
            !py["a"].as_str().unwrap().is_empty() && !py["b"].as_str().unwrap().is_empty(),
            "no draws measured: {py}"
        );
        // The source still runs (leave_running) and serves its own draw.
        assert!(http_get(src.ip.as_deref().unwrap()).is_some());
        for s in r.sessions.iter().chain([&src]) {
            d.rm(&s.id).await.unwrap();
        }
        d.client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", ck.id),
                None::<&()>,
            )
            .await
            .unwrap();
        assert!(d.store_subvolumes().is_empty());
        assert!(std::fs::read_dir(d.state.path().join("store/checkpoints"))
            .unwrap()
            .next()
            .is_none());
    });
    d.stop_and_check_leaks();
}

/// A checkpoint taken before a daemon restart restores after it; the default
/// checkpoint stops its session.
#[test]
fn checkpoint_survives_a_daemon_restart() {
    let mut d = TestDaemon::start();
    let subnet = d.subnet();
    let ck = run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(d.sh(&s.id, "echo kept > /root/state").0, 0);
        let ck = d.checkpoint(&s.id, false, false).await;
        let l: drums_api::SessionList = d
            .client
            .json(Method::GET, "/v1/sessions", None::<&()>)
            .await
            .unwrap();
        assert!(l.sessions.is_empty(), "the checkpointed session stopped");
        ck
    });
    d.stop();
    d.restart(&subnet);
    run(async {
        let l: drums_api::CheckpointList = d
            .client
            .json(Method::GET, "/v1/checkpoints", None::<&()>)
            .await
            .unwrap();
        assert_eq!(
            l.checkpoints
                .iter()
                .map(|c| c.id.clone())
                .collect::<Vec<_>>(),
            vec![ck.id.clone()]
        );
        let r = d
            .restore(&ck.id, 1)
            .await
            .unwrap_or_else(|e| panic!("restore: {e}\n{}", d.log()));
        let s = &r.sessions[0];
        assert_eq!(d.sh(&s.id, "cat /root/state").1, "kept");
        d.rm(&s.id).await.unwrap();
    });
    d.stop_and_check_leaks();
}

/// A restore failing at each step leaves nothing of the sibling, and the
/// checkpoint stays intact and restorable.
#[test]
fn failure_at_every_restore_step_leaves_nothing() {
    let mut d = TestDaemon::start();
    run(async {
        let src = d.create(&CreateSession::default()).await.unwrap();
        let ck = d.checkpoint(&src.id, false, false).await;
        for point in drums_session::faults::RESTORE_POINTS {
            d.arm(Some(point)).await;
            let e = d.restore(&ck.id, 2).await.expect_err(point);
            assert!(
                e.to_string()
                    .contains(&format!("injected fault at {point}")),
                "{point}: {e}"
            );
            d.arm(None).await;
            d.assert_no_session_left(point).await;
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(
                !mounts.contains(&d.state.path().join("sessions").display().to_string()),
                "{point}: a sibling root is still mounted"
            );
        }
        let r = d
            .restore(&ck.id, 1)
            .await
            .unwrap_or_else(|e| panic!("restore after the faults: {e}\n{}", d.log()));
        assert_eq!(d.sh(&r.sessions[0].id, "true").0, 0);
        d.rm(&r.sessions[0].id).await.unwrap();

        // A truncated image is refused before CRIU runs, and changes nothing.
        let images = d.checkpoint_dir(&ck.id).join("images");
        let pages = std::fs::read_dir(&images)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("pages-")
            })
            .unwrap();
        // A flipped byte (same size) is caught by the checksums, which are
        // checked again because the image changed since the last restore.
        let mut bytes = std::fs::read(&pages).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&pages, &bytes).unwrap();
        let e = d.restore(&ck.id, 1).await.unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        let len = std::fs::metadata(&pages).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&pages)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let e = d.restore(&ck.id, 1).await.unwrap_err();
        assert!(e.to_string().contains("is damaged"), "{e}");
        assert!(d.processes().is_empty());
    });
    d.stop_and_check_leaks();
}

/// Export, remove, import, restore: the round trip keeps files and
/// processes. An archive from another kernel is refused before anything is
/// kept, with an error that says so.
#[test]
fn export_import_round_trips_and_refuses_another_host() {
    let mut d = TestDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("ck.tar");
    let ck = run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            d.sh(
                &s.id,
                "mkdir -p /root/d && echo kept > /root/d/state && rm /etc/issue \
                 && rm -rf /etc/apt && mkdir /etc/apt && touch /etc/apt/only \
                 && touch \"$(printf '/root/\\377-not-utf8')\""
            )
            .0,
            0
        );
        d.checkpoint(&s.id, false, false).await
    });
    let ok = |o: std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    ok(d.drums(&["checkpoint", "export", &ck.id, archive.to_str().unwrap()]));
    ok(d.drums(&["checkpoint", "rm", &ck.id]));
    // A fresh local id; the name (here the old id) is kept, the old id is
    // provenance.
    let imported = ok(d.drums(&["checkpoint", "import", archive.to_str().unwrap()]));
    assert_ne!(imported, ck.id, "an import must not take the archive's id");
    let got: drums_api::Checkpoint =
        serde_json::from_slice(&d.drums(&["checkpoints", "--json"]).stdout)
            .map(|l: drums_api::CheckpointList| l.checkpoints[0].clone())
            .unwrap();
    assert_eq!(
        (got.id.as_str(), got.name.as_str()),
        (imported.as_str(), ck.name.as_str())
    );
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.checkpoint_dir(&imported).join("manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["origin"], ck.id.as_str());
    let sib = ok(d.drums(&["restore", &imported]));
    assert_eq!(d.sh(&sib, "cat /root/d/state").1, "kept");
    // A whiteout survived the trip: the file deleted before the checkpoint stays deleted.
    assert_ne!(
        d.sh(&sib, "test -e /etc/issue").0,
        0,
        "a deleted file came back: whiteouts were lost"
    );
    // An opaque directory survived too (its trusted.overlay.opaque xattr):
    // the image's /etc/apt stays hidden behind the one the session made.
    assert_eq!(d.sh(&sib, "ls -A /etc/apt").1, "only");
    // A file name that is not UTF-8 is kept.
    assert_eq!(
        d.sh(&sib, "test -e \"$(printf '/root/\\377-not-utf8')\"").0,
        0
    );
    ok(d.drums(&["rm", &sib]));
    ok(d.drums(&["checkpoint", "rm", &imported]));

    // The same archive, as if taken on another kernel (re-packed, so
    // unsigned: accepted only with --trust-unsigned, and then refused for
    // its kernel).
    let x = dir.path().join("x");
    std::fs::create_dir(&x).unwrap();
    let tar = |args: &[&str]| {
        let o = std::process::Command::new("tar")
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "tar {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    tar(&[
        "--xattrs",
        "--xattrs-include=*",
        "-xf",
        archive.to_str().unwrap(),
        "-C",
        x.to_str().unwrap(),
    ]);
    let mpath = x.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    m["host"]["kernel"] = "0.0.0-other".into();
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
    let other = dir.path().join("other.tar");
    tar(&[
        "--xattrs",
        "--xattrs-include=*",
        "-cf",
        other.to_str().unwrap(),
        "-C",
        x.to_str().unwrap(),
        "manifest.json",
        "images",
        "fs",
    ]);
    let o = d.drums(&["checkpoint", "import", other.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(err.contains("the archive is not signed"), "{err}");
    let o = d.drums(&[
        "checkpoint",
        "import",
        "--trust-unsigned",
        other.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    // Bad input for this host (2), not a name taken (4).
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("checkpoint was taken on kernel 0.0.0-other"),
        "{err}"
    );
    let l: drums_api::CheckpointList =
        serde_json::from_slice(&d.drums(&["checkpoints", "--json"]).stdout).unwrap();
    assert!(l.checkpoints.is_empty(), "a refused import was kept");
    let staging: Vec<_> = std::fs::read_dir(d.state.path().join("store/checkpoints"))
        .unwrap()
        .flatten()
        .collect();
    assert!(staging.is_empty(), "import left {staging:?}");
    assert!(d.store_subvolumes().is_empty());
    d.stop_and_check_leaks();
}

/// A checkpoint failing at each step leaves no checkpoint, no images and no
/// snapshot, and the session keeps running (the post-dump failure thaws it).
#[test]
fn failure_at_every_checkpoint_step_leaves_nothing() {
    let mut d = TestDaemon::start();
    run(async {
        let s = d.create(&CreateSession::default()).await.unwrap();
        for point in drums_session::faults::CHECKPOINT_POINTS {
            d.arm(Some(point)).await;
            let req = CreateCheckpoint {
                session: s.id.clone(),
                name: None,
                clean: false,
                leave_running: true,
            };
            let e = d
                .client
                .json::<Checkpoint>(Method::POST, "/v1/checkpoints", Some(&req))
                .await
                .expect_err(point);
            assert!(
                e.to_string()
                    .contains(&format!("injected fault at {point}")),
                "{point}: {e}"
            );
            d.arm(None).await;
            let l: drums_api::CheckpointList = d
                .client
                .json(Method::GET, "/v1/checkpoints", None::<&()>)
                .await
                .unwrap();
            assert!(
                l.checkpoints.is_empty(),
                "{point}: a checkpoint was published"
            );
            for dir in d.checkpoint_places() {
                let left: Vec<_> = std::fs::read_dir(&dir)
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .collect();
                assert!(left.is_empty(), "{point}: left {left:?}");
            }
            assert_eq!(
                d.sh(&s.id, "echo alive").1,
                "alive",
                "{point}: the session did not survive"
            );
        }
        d.rm(&s.id).await.unwrap();
    });
    d.stop_and_check_leaks();
}

/// A status a checkpoint or fork racing a remove may answer: its result, or,
/// when the remove came first, the session removing (409) or gone (404).
/// Never a 500 from CRIU finding its seized tasks killed.
fn raced<T>(what: &str, r: &Result<T, drums_api::ClientError>, log: &str) -> bool {
    match r {
        Ok(_) => true,
        Err(drums_api::ClientError::Api { status, .. }) if [404, 409].contains(status) => false,
        Err(e) => panic!("{what}: {e}\n{log}"),
    }
}

/// The checkpoints this daemon holds, removed through the API.
async fn remove_checkpoints(d: &TestDaemon) {
    let l: drums_api::CheckpointList = d
        .client
        .json(Method::GET, "/v1/checkpoints", None::<&()>)
        .await
        .unwrap();
    for c in &l.checkpoints {
        d.client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", c.id),
                None::<&()>,
            )
            .await
            .unwrap();
    }
}

/// A remove sent while a checkpoint or a fork dumps its session waits for
/// the dump: the checkpoint is published, the fork's sibling runs, the
/// remove succeeds, and nothing is left. Before, the remove killed the tasks
/// CRIU had seized and the dump answered 500 ("unable to detach"), or CRIU
/// hung on the seized init.
#[test]
fn a_remove_during_a_dump_waits_for_it() {
    let mut d = TestDaemon::start();
    run(async {
        let mut published = 0;
        for (i, delay_ms) in [0u64, 10, 30, 60, 100, 150].into_iter().enumerate() {
            let fork = i % 2 == 1;
            let s = d
                .create(&CreateSession {
                    network: Some("none".into()),
                    ..Default::default()
                })
                .await
                .unwrap();
            let dump = async {
                if fork {
                    d.client
                        .json::<drums_api::RestoreResult>(
                            Method::POST,
                            &format!("/v1/sessions/{}/fork", s.id),
                            Some(&drums_api::RestoreRequest {
                                count: 1,
                                name: None,
                            }),
                        )
                        .await
                        .map(|r| r.sessions.len())
                } else {
                    let req = CreateCheckpoint {
                        session: s.id.clone(),
                        name: None,
                        clean: false,
                        leave_running: true,
                    };
                    d.client
                        .json::<Checkpoint>(Method::POST, "/v1/checkpoints", Some(&req))
                        .await
                        .map(|_| 1)
                }
            };
            let rm = async {
                tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                d.rm(&s.id).await
            };
            let (dumped, removed) = tokio::join!(dump, rm);
            let what = format!(
                "{} with a remove after {delay_ms} ms",
                if fork { "fork" } else { "checkpoint" }
            );
            if raced(&what, &dumped, &d.log()) {
                published += 1;
            }
            removed.unwrap_or_else(|e| panic!("{what}: the remove: {e}\n{}", d.log()));
            // The fork's sibling, if any, is the only session left.
            let l: drums_api::SessionList = d
                .client
                .json(Method::GET, "/v1/sessions", None::<&()>)
                .await
                .unwrap();
            assert!(
                l.sessions.iter().all(|x| x.id != s.id),
                "{what}: the source is left"
            );
            for x in &l.sessions {
                d.rm(&x.id).await.unwrap();
            }
            remove_checkpoints(&d).await;
        }
        // A remove sent after the dump began waited for it at least once.
        assert!(published > 0, "every dump lost the race to its remove");
        d.assert_no_session_left("after the races").await;
    });
    d.stop_and_check_leaks();
}

/// A process of the session SIGKILLed from outside (as the OOM killer would)
/// while CRIU has it seized fails that dump; drumsd dumps the session again
/// once, and the checkpoint succeeds. The kill lands at a few offsets into
/// the dump until one hits it (the log says so), each checkpoint must succeed.
#[test]
fn a_process_killed_during_a_dump_is_dumped_again() {
    let mut d = TestDaemon::start();
    run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let retried = |d: &TestDaemon| {
            d.log()
                .matches("a process of the session exited during the dump")
                .count()
        };
        for attempt in 0..24u64 {
            if retried(&d) > 0 {
                break;
            }
            let (code, _, err) = d.sh(
                &s.id,
                "nohup sleep 1000 >/dev/null 2>&1 </dev/null & echo started",
            );
            assert_eq!(code, 0, "{err}");
            // The shell returns once it forked; nohup then execs sleep.
            let started = std::time::Instant::now();
            let victim = loop {
                let found = d.processes().into_iter().find(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default()
                        == b"sleep\x001000\x00"
                });
                match found {
                    Some(p) => break p,
                    None if started.elapsed() < std::time::Duration::from_secs(5) => {
                        std::thread::sleep(std::time::Duration::from_millis(10))
                    }
                    None => panic!("the sleep never ran"),
                }
            };
            let req = CreateCheckpoint {
                session: s.id.clone(),
                name: None,
                clean: false,
                leave_running: true,
            };
            let dump = d
                .client
                .json::<Checkpoint>(Method::POST, "/v1/checkpoints", Some(&req));
            let kill = async {
                tokio::time::sleep(std::time::Duration::from_millis(5 + (attempt % 8) * 10)).await;
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(victim),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
            };
            let (ck, ()) = tokio::join!(dump, kill);
            ck.unwrap_or_else(|e| panic!("a checkpoint as a process was killed: {e}\n{}", d.log()));
            assert_eq!(d.sh(&s.id, "echo alive").1, "alive");
            remove_checkpoints(&d).await;
        }
        assert!(
            retried(&d) > 0,
            "no kill landed within a dump in 24 tries\n{}",
            d.log()
        );
        d.rm(&s.id).await.unwrap();
        d.assert_no_session_left("after the kills").await;
    });
    d.stop_and_check_leaks();
}

/// A checkpoint removed while a restore of it runs waits for the restore:
/// the siblings run, the remove succeeds, nothing is left. Before, the remove
/// deleted the images and snapshot under the restore, which answered 500 (a
/// missing image, "is not a btrfs subvolume", or CRIU reading a deleted image
/// as empty: "No kIDs provided", "mnt: No root found for tree").
#[test]
fn a_checkpoint_remove_during_a_restore_waits_for_it() {
    let mut d = TestDaemon::start();
    run(async {
        let s = d
            .create(&CreateSession {
                network: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut restored = 0;
        for delay_ms in [0u64, 10, 20, 25, 30, 35, 40, 50, 70] {
            let ck = d.checkpoint(&s.id, false, true).await;
            let rm = async {
                tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                d.client
                    .call(
                        Method::DELETE,
                        &format!("/v1/checkpoints/{}", ck.id),
                        None::<&()>,
                    )
                    .await
            };
            let (r, removed) = tokio::join!(d.restore(&ck.id, 2), rm);
            let what = format!("a restore with a remove after {delay_ms} ms");
            if raced(&what, &r, &d.log()) {
                restored += 1;
            }
            removed.unwrap_or_else(|e| panic!("{what}: the remove: {e}\n{}", d.log()));
            let l: drums_api::SessionList = d
                .client
                .json(Method::GET, "/v1/sessions", None::<&()>)
                .await
                .unwrap();
            for x in l.sessions.iter().filter(|x| x.id != s.id) {
                assert_eq!(d.sh(&x.id, "echo alive").1, "alive", "{what}");
                d.rm(&x.id).await.unwrap();
            }
        }
        assert!(restored > 0, "every restore lost the race to its remove");
        let l: drums_api::CheckpointList = d
            .client
            .json(Method::GET, "/v1/checkpoints", None::<&()>)
            .await
            .unwrap();
        assert!(l.checkpoints.is_empty(), "checkpoints left: {l:?}");
        for dir in d.checkpoint_places() {
            let left: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "{}: left {left:?}", dir.display());
        }
        d.rm(&s.id).await.unwrap();
        d.assert_no_session_left("after the races").await;
    });
    d.stop_and_check_leaks();
}

/// `drums fork` says that it made a checkpoint, and that checkpoint goes
/// with the last of its siblings, unless `--keep`: then it stays, and the
/// CLI says so. The API's answer says which (`checkpoint_kept`).
#[test]
fn a_forks_checkpoint_goes_with_its_last_sibling_unless_kept() {
    let mut d = TestDaemon::start();
    let checkpoints = |d: &TestDaemon| -> Vec<String> {
        let o = d.drums(&["checkpoints", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let l: drums_api::CheckpointList = serde_json::from_slice(&o.stdout).unwrap();
        l.checkpoints.into_iter().map(|c| c.id).collect()
    };
    run(async {
        d.create(&CreateSession {
            name: Some("src".into()),
            network: Some("none".into()),
            ..Default::default()
        })
        .await
        .unwrap();
        let o = d.drums(&["fork", "src", "--count", "2"]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}\n{}", d.log());
        let siblings: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(siblings.len(), 2, "stdout stays the siblings' ids");
        let made = checkpoints(&d);
        assert_eq!(made.len(), 1);
        assert!(
            err.contains(&format!(
                "checkpoint {} made for the fork: removed when its last sibling goes",
                made[0]
            )),
            "{err}"
        );
        d.rm(&siblings[0]).await.unwrap();
        assert_eq!(checkpoints(&d), made, "another sibling still uses it");
        d.rm(&siblings[1]).await.unwrap();
        assert!(checkpoints(&d).is_empty(), "it went with its last sibling");
        assert!(
            d.log()
                .contains("the fork's checkpoint went with its last sibling"),
            "{}",
            d.log()
        );

        // Kept: it stays after its sibling, until removed by hand.
        let r: drums_api::RestoreResult = d
            .client
            .json(
                Method::POST,
                "/v1/sessions/src/fork",
                Some(&drums_api::ForkRequest {
                    count: 1,
                    name: None,
                    at: None,
                    keep: true,
                }),
            )
            .await
            .unwrap();
        assert!(r.checkpoint_kept);
        d.rm(&r.sessions[0].id).await.unwrap();
        assert_eq!(checkpoints(&d), vec![r.checkpoint.clone()]);
        let o = d.drums(&["fork", "src", "--keep"]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        assert!(err.contains("kept (`drums checkpoint rm"), "{err}");
        let sibling = String::from_utf8_lossy(&o.stdout).trim().to_owned();
        d.rm(&sibling).await.unwrap();
        assert_eq!(checkpoints(&d).len(), 2);
        remove_checkpoints(&d).await;
        d.rm("src").await.unwrap();
    });
    d.stop_and_check_leaks();
}
