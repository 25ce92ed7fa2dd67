//! The desktop profile end to end, as root, against a real drumsd, CRIU,
//! Xvfb and Chromium: agent-ready desktops, clean forks that are not clones
//! (down to V8's `Math.random`), OSWorld's own client driving a restored
//! sibling, and failures that leave nothing. Every test ends by proving
//! nothing is left on the host.
//!
//! Needs the `desktop` image that `scripts/setup.sh` builds.

mod common;

use std::path::Path;
use std::process::Command;

use common::{run, TestDaemon};
use drums_api::CreateSession;
use hyper::Method;

fn require_desktop_image() {
    let img = common::images_dir().join("desktop/image.json");
    assert!(
        img.exists(),
        "{} missing: scripts/setup.sh builds the desktop image. NOT SKIPPED: failing on purpose",
        img.display()
    );
}

fn desktop() -> CreateSession {
    CreateSession {
        profile: Some("desktop".into()),
        ..Default::default()
    }
}

/// `GET http://{ip}:5000{path}`: OSWorld's port, from the host.
fn osworld_get(ip: &str, path: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((ip, 5000)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response");
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, out[split + 4..].to_vec())
}

/// The size of a PNG, read from its IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be = |i: usize| u32::from_be_bytes(png[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

/// `Math.random()` in the first tab, over CDP at the session's port 9222.
async fn math_random(ip: &str) -> f64 {
    let pages = drums_desktop::cdp::pages(ip, 9222).await.unwrap();
    let page = pages.first().expect("a tab");
    let mut c = drums_desktop::cdp::Connection::open(&page.ws_url)
        .await
        .unwrap();
    let v = c.evaluate("Math.random()").await.unwrap();
    c.close().await;
    v.as_f64().unwrap()
}

/// One desktop, checkpointed clean, restored as 3 siblings: each is
/// agent-ready and takes screenshots, and hostname, address and V8's
/// `Math.random` differ between them; the audit passes. Then OSWorld's own
/// client drives one of them through a task of ours.
#[test]
fn clean_desktop_siblings_are_ready_and_not_clones() {
    require_desktop_image();
    let mut d = TestDaemon::start();
    run(async {
        let src = d
            .create(&desktop())
            .await
            .unwrap_or_else(|e| panic!("create a desktop: {e}\n{}", d.log()));
        assert_eq!(src.profile, drums_api::Profile::Desktop);
        let (status, png) = osworld_get(src.ip.as_deref().unwrap(), "/screenshot");
        assert_eq!(status, 200);
        assert_eq!(png_size(&png), (1280, 800));
        let ck = d.checkpoint(&src.id, true, false).await;
        assert!(ck.clean);

        let r = d
            .restore(&ck.id, 3)
            .await
            .unwrap_or_else(|e| panic!("restore 3 desktops: {e}\n{}", d.log()));
        assert_eq!(r.sessions.len(), 3);
        let mut hostnames = std::collections::HashSet::new();
        let mut ips = std::collections::HashSet::new();
        let mut draws = Vec::new();
        for s in &r.sessions {
            let ip = s.ip.as_deref().unwrap();
            // Agent-ready was part of the restore; the screen still works.
            let (status, png) = osworld_get(ip, "/screenshot");
            assert_eq!(status, 200, "screenshot of {}", s.id);
            assert_eq!(png_size(&png), (1280, 800));
            let (code, out, err) = d.sh(&s.id, "hostname");
            assert_eq!(code, 0, "{err}");
            hostnames.insert(out.trim().to_owned());
            ips.insert(ip.to_owned());
            draws.push(math_random(ip).await);
        }
        assert_eq!(hostnames.len(), 3, "{hostnames:?}");
        assert_eq!(ips.len(), 3, "{ips:?}");
        let mut distinct = draws.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            3,
            "Math.random() repeats across siblings: {draws:?}"
        );

        let (a, b) = (&r.sessions[0].id, &r.sessions[1].id);
        let audit: drums_api::AuditReport = d.audit(a, b).await;
        assert!(audit.passed, "{audit:#?}");
        assert!(
            audit
                .identical_by_design
                .iter()
                .any(|l| l.contains("a clean checkpoint resets cookies")),
            "{audit:#?}"
        );

        drive_with_osworld_client(r.sessions[2].ip.as_deref().unwrap());

        for s in &r.sessions {
            d.rm(&s.id).await.unwrap();
        }
    });
    d.stop_and_check_leaks();
}

/// A warm pool of a clean desktop checkpoint: each taken desktop is
/// agent-ready at once (a screenshot answers), its page's `Math.random`
/// differs from its sibling's, and the two pass the audit; removing the
/// pool removes the members not taken.
#[test]
fn a_desktop_pool_hands_out_ready_desktops_that_are_not_clones() {
    require_desktop_image();
    let mut d = TestDaemon::start();
    run(async {
        let src = d
            .create(&desktop())
            .await
            .unwrap_or_else(|e| panic!("create a desktop: {e}\n{}", d.log()));
        let ck = d.checkpoint(&src.id, true, false).await;
        let pool: drums_api::Pool = d
            .client
            .json(
                Method::POST,
                "/v1/pools",
                Some(&drums_api::CreatePool {
                    checkpoint: ck.id.clone(),
                    size: 2,
                    name: Some("desks".into()),
                }),
            )
            .await
            .unwrap_or_else(|e| panic!("create pool: {e}\n{}", d.log()));
        assert_eq!(pool.size, 2);
        let mut taken = Vec::new();
        for _ in 0..2 {
            let s: drums_api::Session = d
                .client
                .json(
                    Method::POST,
                    "/v1/pools/desks/take",
                    Some(&drums_api::TakeRequest {
                        timeout_ms: Some(120_000),
                    }),
                )
                .await
                .unwrap_or_else(|e| panic!("take a desktop: {e}\n{}", d.log()));
            assert_eq!((s.profile.as_str(), s.pool.as_deref()), ("desktop", None));
            let ip = s.ip.clone().unwrap();
            let (status, png) = osworld_get(&ip, "/screenshot");
            assert_eq!(status, 200, "screenshot of a taken desktop {}", s.id);
            assert_eq!(png_size(&png), (1280, 800));
            taken.push((s, math_random(&ip).await));
        }
        assert_ne!(
            taken[0].1, taken[1].1,
            "Math.random repeats across taken siblings"
        );
        let audit: drums_api::AuditReport = d.audit(&taken[0].0.id, &taken[1].0.id).await;
        assert!(audit.passed, "{audit:#?}");
        d.client
            .call(Method::DELETE, "/v1/pools/desks", None::<&()>)
            .await
            .unwrap();
        let l: drums_api::SessionList = d
            .client
            .json(Method::GET, "/v1/sessions", None::<&()>)
            .await
            .unwrap();
        let ids: Vec<&str> = l.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids.len(), 2, "only the taken desktops stay: {ids:?}");
        for (s, _) in &taken {
            assert!(ids.contains(&s.id.as_str()));
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
    });
    d.stop_and_check_leaks();
}

/// OSWorld's `PythonController` and `SetupController` (desktop-env 1.0.2,
/// unmodified, in a virtualenv) against a restored sibling: a PNG
/// screenshot, a pyautogui command, a shell script, an `execute` set-up
/// step, and a task of ours scoring 0 before and 1 after the action.
fn drive_with_osworld_client(ip: &str) {
    let venv = osworld_venv();
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/osworld");
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(venv.join("bin/python"))
        .arg(here.join("drive.py"))
        .arg(ip)
        .arg(here.join("task.json"))
        .current_dir(work.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drive.py failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("drive.py printed {stdout:?}: {e}"));
    assert_eq!(v["screenshot_png"], true, "{v}");
    assert!(
        v["python"]
            .as_str()
            .unwrap()
            .starts_with("pyautogui 1280 800"),
        "{v}"
    );
    assert_eq!(v["bash"], "shell user", "{v}");
    assert_eq!(v["setup_ok"], true, "{v}");
    assert_eq!(v["score_before"], 0.0, "{v}");
    assert_eq!(v["score_after"], 1.0, "{v}");
}

/// A virtualenv with desktop-env 1.0.2 and nothing heavy: `--no-deps`, plus
/// only what its controllers, `desktop_env.py` and the vmware provider import
/// at module level (requests and a few small packages; gymnasium brings
/// numpy). Built once per target directory; tests share it, one at a time.
fn osworld_venv() -> std::path::PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("osworld-venv-1.0.2");
    let python = venv.join("bin/python");
    let ok = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let marker = venv.join(".drums-ready-2");
    if !marker.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        ok(Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv));
        let pip = |args: &[&str]| {
            let mut c = Command::new(&python);
            c.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .args(args);
            c
        };
        ok(&mut pip(&["--no-deps", "desktop-env==1.0.2"]));
        ok(&mut pip(&[
            "requests",
            "requests-toolbelt",
            "python-dotenv",
            "gymnasium",
            "psutil",
            "filelock",
            "tqdm",
        ]));
        std::fs::write(&marker, "").unwrap();
    }
    venv
}

/// OSWorld's own `DesktopEnv(provider_name="vmware")`, with `vmrun` on its
/// PATH being drums-vmrun: its reset after use reverts the snapshot, which
/// is a drums restore (a new sibling: new machine-id, the set-up step's file
/// gone), and its close stops the session.
#[test]
fn osworld_desktop_env_resets_by_a_drums_restore() {
    require_desktop_image();
    let mut d = TestDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let vmx = dir.path().join("osworld.vmx");
    std::fs::write(
        &vmx,
        "drums.version = \"1\"\ndisplayName = \"osworld-env\"\ndrums.profile = \"desktop\"\n",
    )
    .unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let vmrun = common::bin_dir().join("drums-vmrun");
    assert!(vmrun.exists(), "{} missing", vmrun.display());
    std::os::unix::fs::symlink(&vmrun, bin.join("vmrun")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let with_env = |c: &mut Command| {
        c.env("PATH", &path)
            .env("DRUMS_STATE_DIR", d.state.path())
            .env("DRUMS_SOCKET", d.client.socket())
            .env("DRUMS_NO_AUTOSTART", "true")
            .env("DRUMS_VMRUN_REGISTRY", dir.path().join("registry.json"))
            .current_dir(dir.path());
    };
    // What an OSWorld user does once: start the VM and take its snapshot.
    let vmx_arg = vmx.to_str().unwrap();
    for args in [
        vec!["-T", "ws", "start", vmx_arg, "nogui"],
        vec!["-T", "ws", "snapshot", vmx_arg, "init_state"],
    ] {
        let mut c = Command::new("vmrun");
        with_env(&mut c);
        let o = c.args(&args).output().unwrap();
        assert!(
            o.status.success(),
            "vmrun {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            d.log()
        );
    }

    let venv = osworld_venv();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/osworld/drive_desktop_env.py");
    let mut c = Command::new(venv.join("bin/python"));
    with_env(&mut c);
    let o = c.arg(script).arg(&vmx).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "drive_desktop_env.py failed\nstdout:\n{stdout}\nstderr:\n{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        d.log()
    );
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("drive_desktop_env.py printed {stdout:?}: {e}"));
    assert_eq!(v["screenshot_png"], true, "{v}");
    assert_eq!(v["file_after_setup"], "draft", "{v}");
    assert_eq!(v["file_after_revert"], "absent", "{v}");
    assert_ne!(
        v["machine_id_1"], v["machine_id_2"],
        "the revert made no new sibling: {v}"
    );
    assert_eq!(v["hostname"], "osworld-env", "{v}");

    run(async {
        // DesktopEnv.close() stopped the VM; the snapshot stays until removed.
        d.assert_no_session_left("DesktopEnv.close").await;
        let l: drums_api::CheckpointList = d
            .client
            .json(Method::GET, "/v1/checkpoints", None::<&()>)
            .await
            .unwrap();
        assert_eq!(l.checkpoints.len(), 1, "{l:?}");
        d.client
            .call(
                Method::DELETE,
                &format!("/v1/checkpoints/{}", l.checkpoints[0].id),
                None::<&()>,
            )
            .await
            .unwrap();
    });
    d.stop_and_check_leaks();
}

/// A failure at the desktop's own steps (its start, and the browser's
/// hygiene after a restore) leaves no session, process, link, mount or
/// cgroup behind, and the checkpoint stays restorable.
#[test]
fn desktop_failures_leave_nothing() {
    require_desktop_image();
    let mut d = TestDaemon::start();
    run(async {
        d.arm(Some("create.desktop")).await;
        let e = d.create(&desktop()).await.expect_err("create.desktop");
        assert!(
            e.to_string().contains("injected fault at create.desktop"),
            "{e}"
        );
        d.arm(None).await;
        d.assert_no_session_left("create.desktop").await;

        let src = d.create(&desktop()).await.unwrap();
        let ck = d.checkpoint(&src.id, false, false).await;
        d.arm(Some("restore.desktop")).await;
        let e = d.restore(&ck.id, 2).await.expect_err("restore.desktop");
        assert!(
            e.to_string().contains("injected fault at restore.desktop"),
            "{e}"
        );
        d.arm(None).await;
        d.assert_no_session_left("restore.desktop").await;

        // Not clean: the browser is kept exactly as checkpointed, by design.
        let r = d
            .restore(&ck.id, 2)
            .await
            .unwrap_or_else(|e| panic!("restore after the fault: {e}\n{}", d.log()));
        let a = math_random(r.sessions[0].ip.as_deref().unwrap()).await;
        let b = math_random(r.sessions[1].ip.as_deref().unwrap()).await;
        assert_eq!(a, b, "without --clean the renderer is the checkpointed one");
        let (x, y) = (&r.sessions[0].id, &r.sessions[1].id);
        let audit: drums_api::AuditReport = d.audit(x, y).await;
        assert!(
            audit
                .identical_by_design
                .iter()
                .any(|l| l.contains("Math.random sequence")),
            "the audit says the browser is kept: {audit:#?}"
        );
        for s in &r.sessions {
            d.rm(&s.id).await.unwrap();
        }

        // Bad input changes nothing.
        let bad = CreateSession {
            profile: Some("desktop".into()),
            desktop: Some(drums_api::DesktopOptions {
                screen: Some("12x3".into()),
                url: None,
            }),
            ..Default::default()
        };
        let e = d.create(&bad).await.unwrap_err();
        assert!(e.to_string().contains("invalid screen"), "{e}");
        d.assert_no_session_left("bad screen").await;
    });
    d.stop_and_check_leaks();
}

/// A desktop whose limits leave Xvfb and Chromium too little to start is
/// refused before anything is made (400, `drums create` exit 2, naming the
/// minimum) instead of failing inside the guest (500), whether the request's
/// own limits or drumsd's defaults are too small; one at exactly the minimums
/// starts, is agent-ready and forks.
#[test]
fn a_desktop_below_its_minimum_limits_is_refused_and_one_at_them_runs() {
    require_desktop_image();
    // A default that suits a shell but not a desktop.
    let mut d = TestDaemon::start_with(&["--default-pids", "128"]);
    let min_pids = drums_session::limits::MIN_DESKTOP_PIDS.to_string();
    let min_memory = drums_session::limits::MIN_DESKTOP_MEMORY_BYTES.to_string();
    for (args, msg) in [
        (
            vec!["--pids", "32", "--memory", "4G"],
            "needs a pids limit of at least 256",
        ),
        (
            vec!["--pids", "255", "--memory", "4G"],
            "needs a pids limit of at least 256",
        ),
        (
            vec!["--pids", "2048", "--memory", "8M"],
            "needs a memory limit of at least 512 MiB",
        ),
        (
            vec!["--pids", &min_pids, "--memory", "511M"],
            "needs a memory limit of at least 512 MiB",
        ),
        // No pids of its own: drumsd's default of 128 is too few.
        (vec!["--memory", "4G"], "not 128"),
    ] {
        let mut all = vec!["create", "--profile", "desktop"];
        all.extend(&args);
        let o = d.drums(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "drums {all:?}: {err}");
        assert!(err.contains(msg), "drums {all:?}: {err:?} lacks {msg:?}");
        run(d.assert_no_session_left(&format!("{args:?}")));
    }
    // The API says 400 bad_request.
    let small = CreateSession {
        profile: Some("desktop".into()),
        limits: drums_api::Limits {
            pids_max: Some(32),
            ..Default::default()
        },
        ..Default::default()
    };
    match run(d.create(&small)) {
        Err(drums_api::ClientError::Api { status, kind, .. }) => {
            assert_eq!((status, kind.as_str()), (400, "bad_request"))
        }
        other => panic!("a desktop with 32 pids: {other:?}"),
    }
    // A headless session still starts with the general minimum.
    let shell = d.drums(&["create", "--pids", "32", "--network", "none"]);
    assert!(
        shell.status.success(),
        "headless at 32 pids: {}",
        String::from_utf8_lossy(&shell.stderr)
    );
    let shell = String::from_utf8_lossy(&shell.stdout).trim().to_owned();

    let o = d.drums(&[
        "create",
        "--profile",
        "desktop",
        "--pids",
        &min_pids,
        "--memory",
        &min_memory,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "a desktop at the minimums: {err}\n{}",
        d.log()
    );
    let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let (code, out, err) = d.sh(&id, "echo up");
    assert_eq!((code, out.as_str()), (0, "up"), "{err}");
    let o = d.drums(&["fork", &id]);
    assert!(
        o.status.success(),
        "a fork of a desktop at the minimums: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        d.log()
    );
    let sibling = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    for s in [&sibling, &id, &shell] {
        run(d.rm(s)).unwrap();
    }
    run(d.assert_no_session_left("after the minimums"));
    d.stop_and_check_leaks();
}

/// A JavaScript expression in the first tab, over CDP at the session's port.
async fn eval(ip: &str, expr: &str) -> serde_json::Value {
    let pages = drums_desktop::cdp::pages(ip, 9222).await.unwrap();
    let page = pages.first().expect("a tab");
    let mut c = drums_desktop::cdp::Connection::open(&page.ws_url)
        .await
        .unwrap();
    let v = c.evaluate(expr).await.unwrap();
    c.close().await;
    v
}

/// `kill -9` of drumsd with a live desktop: the next drumsd adopts it as it
/// is (the same processes, the browser's memory, its versions, the OSWorld
/// port), and it rolls back to a version taken before the crash, browser
/// state included.
#[test]
fn a_desktop_outlives_a_daemon_kill9_with_its_versions_and_rolls_back() {
    require_desktop_image();
    let mut d = TestDaemon::start();
    let subnet = d.subnet();
    run(async {
        let s = d
            .create(&desktop())
            .await
            .unwrap_or_else(|e| panic!("create a desktop: {e}\n{}", d.log()));
        let ip = s.ip.clone().unwrap();
        eval(&ip, "window.__mark = 'v1'").await;
        d.client
            .call(
                Method::POST,
                &format!("/v1/sessions/{}/turn/begin", s.id),
                None::<&()>,
            )
            .await
            .unwrap();
        assert_eq!(d.sh(&s.id, "echo v1 > /root/mark").0, 0);
        let e: drums_api::TurnEffects = d
            .client
            .json(
                Method::POST,
                &format!("/v1/sessions/{}/turn/end", s.id),
                Some(&drums_api::EndTurn {
                    checkpoint: true,
                    policy: None,
                    wait: true,
                }),
            )
            .await
            .unwrap_or_else(|e| panic!("a desktop version: {e}\n{}", d.log()));
        let v1 = e.checkpoint.unwrap().version.unwrap();
        assert_eq!(v1.took, "full", "the first version of a session is full");

        d.kill9();
        d.restart(&subnet);
        let now: drums_api::Session = d
            .client
            .json(Method::GET, &format!("/v1/sessions/{}", s.id), None::<&()>)
            .await
            .unwrap();
        assert_eq!(
            now.init_pid,
            s.init_pid,
            "adopted, not restarted\n{}",
            d.log()
        );
        let l: drums_api::SessionVersions = d
            .client
            .json(
                Method::GET,
                &format!("/v1/sessions/{}/versions", s.id),
                None::<&()>,
            )
            .await
            .unwrap();
        assert_eq!(
            l.versions.iter().map(|v| &v.id).collect::<Vec<_>>(),
            vec![&v1.id]
        );
        assert_eq!(
            eval(&ip, "window.__mark").await,
            "v1",
            "the browser lived through"
        );
        let (status, _) = osworld_get(&ip, "/screenshot");
        assert_eq!(status, 200);

        eval(&ip, "window.__mark = 'later'").await;
        assert_eq!(d.sh(&s.id, "echo later > /root/mark").0, 0);
        let o = d.drums(&["rollback", &s.id, "--to", &v1.number.to_string()]);
        assert!(
            o.status.success(),
            "{}{}",
            String::from_utf8_lossy(&o.stderr),
            d.log()
        );
        assert_eq!(eval(&ip, "window.__mark").await, "v1");
        assert_eq!(d.sh(&s.id, "cat /root/mark").1, "v1");
        let (status, png) = osworld_get(&ip, "/screenshot");
        assert_eq!(status, 200);
        assert_eq!(png_size(&png), (1280, 800));
        d.rm(&s.id).await.unwrap();
    });
    d.stop_and_check_leaks();
}

/// A long-lived Python of the desktop's user, as an agent's tool or a
/// task's set-up leaves one: seeded alike, it prints its next draw when
/// asked (`/tmp/draw.ask` appears) into `/tmp/draw.<pid>`.
const USER_PYTHON: &str = r#"
import os, random, time
random.seed(99)
while True:
    if os.path.exists('/tmp/draw.ask'):
        p = '/tmp/draw.%d' % os.getpid()
        if not os.path.exists(p):
            open(p, 'w').write(repr(random.random()))
    time.sleep(0.05)
"#;

/// OSWorld's first `/accessibility` call starts the AT-SPI bus, whose
/// dbus-daemon watches its configuration with inotify: the desktop must
/// stay checkpointable, and its clean siblings, their versions, rollbacks
/// and recoveries must answer `/accessibility` again. A Python of the
/// desktop's user (not root), registered for reseeds, is reseeded in every
/// sibling: the audit says so process by process, and their draws differ.
#[test]
fn an_accessibility_call_leaves_the_desktop_checkpointable_and_user_pythons_reseeded() {
    require_desktop_image();
    let mut d = TestDaemon::start();
    run(async {
        let src = d
            .create(&desktop())
            .await
            .unwrap_or_else(|e| panic!("create a desktop: {e}\n{}", d.log()));
        let ip = src.ip.clone().unwrap();
        let (status, body) = osworld_get(&ip, "/accessibility");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        // Seen from the host: the desktop user's processes are not root's
        // to look into from inside.
        let watching_bus = d.processes().into_iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "dbus-daemon")
                && std::fs::read_dir(format!("/proc/{p}/fd")).is_ok_and(|fds| {
                    fds.flatten().any(|f| {
                        std::fs::read_link(f.path())
                            .is_ok_and(|l| l.as_os_str() == "anon_inode:inotify")
                    })
                })
        });
        assert!(
            watching_bus,
            "no dbus-daemon watches anything: the a11y call did not start the bus"
        );
        let o = d.drums(&[
            "exec",
            "-d",
            "--user",
            "user",
            &src.id,
            "--",
            "python3",
            "-c",
            USER_PYTHON,
        ]);
        common::ok(&o, "start the user's python");
        // Registered (the hook runs at start-up).
        assert!(common::gone(|| {
            d.sh(&src.id, "ls /run/drums/reseed | grep -c '^[0-9]*$'").1 != "0"
        }));

        let ck = d.checkpoint(&src.id, true, true).await;
        let r = d
            .restore(&ck.id, 2)
            .await
            .unwrap_or_else(|e| panic!("restore 2 desktops: {e}\n{}", d.log()));
        let mut draws = Vec::new();
        for s in &r.sessions {
            let sip = s.ip.as_deref().unwrap();
            let (status, body) = osworld_get(sip, "/accessibility");
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            assert_eq!(d.sh(&s.id, "touch /tmp/draw.ask").0, 0);
            assert!(common::gone(|| d.sh(&s.id, "cat /tmp/draw.[0-9]*").0 == 0));
            draws.push(d.sh(&s.id, "cat /tmp/draw.[0-9]*").1);
        }
        assert_ne!(
            draws[0], draws[1],
            "the user's python draws alike in both siblings"
        );
        let audit: drums_api::AuditReport = d.audit(&r.sessions[0].id, &r.sessions[1].id).await;
        let reseeds: Vec<_> = audit
            .clone
            .iter()
            .filter(|c| c.what.starts_with("reseed of pid"))
            .collect();
        assert!(!reseeds.is_empty(), "{audit:#?}");
        assert!(
            reseeds
                .iter()
                .all(|c| c.ok && c.a == "acked" && c.b == "acked"),
            "{reseeds:#?}"
        );
        assert!(audit.passed, "{audit:#?}");

        // A sibling's version, a rollback to it, and a recovery.
        let s = &r.sessions[0];
        let v = d.turn_version(&s.id, "true", drums_api::Policy::Full).await;
        common::ok(
            &d.drums(&["rollback", &s.id, "--to", &v.number.to_string()]),
            "rollback",
        );
        let sip = s.ip.as_deref().unwrap();
        assert_eq!(osworld_get(sip, "/accessibility").0, 200);
        d.kill_and_recover(&s.id).await;
        assert_eq!(osworld_get(sip, "/accessibility").0, 200);

        for s in r.sessions.iter().chain([&src]) {
            d.rm(&s.id).await.unwrap();
        }
    });
    d.stop_and_check_leaks();
}
