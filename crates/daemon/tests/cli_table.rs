//! Issue 15's table, asserted: each bad input it lists gets the exit code (or
//! HTTP status) and message it should, and changes nothing; and each exit code
//! in the README's table is produced by the real `drums` against a real drumsd.
//! One test per group, each ending with the leak check.
//!
//! Needs root (real daemon, btrfs store, CRIU), like every daemon test.

mod common;
#[path = "common/tamper.rs"]
mod tamper;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::{bin_dir, run, TestDaemon};
use drums_api::ErrorBody;
use drums_checkpoint::archive;
use drums_checkpoint::keys::HostKey;
use http_body_util::Full;
use hyper::{Method, Request};
use tamper::{pack, read_members, with_manifest};

/// `drums ARGS` exits with `code` and says `msg` on stderr; returns stderr.
fn expect(d: &TestDaemon, args: &[&str], code: i32, msg: &str) -> String {
    let o = d.drums(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "drums {args:?}: {err}");
    assert!(err.contains(msg), "drums {args:?}: {err:?} lacks {msg:?}");
    err
}

/// `drums ARGS` succeeds; returns its stdout.
fn ok(d: &TestDaemon, args: &[&str]) -> String {
    let o = d.drums(args);
    assert!(
        o.status.success(),
        "drums {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn session_count(d: &TestDaemon) -> usize {
    let l: drums_api::SessionList =
        serde_json::from_str(&ok(d, &["ps", "--json"])).expect("ps --json");
    l.sessions.len()
}

fn catalog_checkpoints(d: &TestDaemon) -> Vec<drums_catalog::VersionRecord> {
    drums_catalog::Catalog::open(&d.state.path().join("catalog.db"))
        .unwrap()
        .versions()
        .unwrap()
}

/// Names in a directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// drumsd's log lines at INFO that say `event`, without their colours.
fn log_lines(log: &str, event: &str) -> Vec<String> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains(event) && l.contains(" INFO "))
        .collect()
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Sessions: limits, names, images, cp, exec, and the codes that are not
/// about input (no daemon, an internal error).
#[test]
fn sessions_rows_and_exit_codes() {
    let mut d = TestDaemon::start();
    let id = ok(&d, &["create", "--name", "only", "--network", "none"]);
    assert_eq!(session_count(&d), 1);

    // 2: limits the CLI used to drop or wrap, the same rules as the API's.
    expect(&d, &["create", "--cpus", "inf"], 2, "not a finite number");
    expect(&d, &["create", "--cpus", "nan"], 2, "not a finite number");
    expect(
        &d,
        &["create", "--memory", "99999999999G"],
        2,
        "exceeds the largest size",
    );
    expect(
        &d,
        &["create", "--image", "../../etc"],
        2,
        "invalid image name",
    );
    // 4: a name taken, and a name that is another session's id.
    expect(&d, &["create", "--name", "only"], 4, "already exists");
    expect(
        &d,
        &["create", "--name", &id],
        4,
        "is the id of another session",
    );
    // 3: not found.
    expect(&d, &["rm", "ghost"], 3, "no session named");
    expect(&d, &["create", "--image", "nope"], 3, "no image named");
    // 2: cp of a directory, either way.
    let dir = tempfile::tempdir().unwrap();
    let host_dir = dir.path().to_str().unwrap();
    expect(
        &d,
        &["cp", host_dir, "only:/root/"],
        2,
        "not a regular file",
    );
    let copy = dir.path().join("etc");
    expect(
        &d,
        &["cp", "only:/etc", copy.to_str().unwrap()],
        2,
        "is a directory",
    );
    assert!(!copy.exists(), "a refused cp wrote {}", copy.display());
    assert_eq!(session_count(&d), 1, "a refused create kept a session");

    // exec passes the command's code through; 127 and 124 are drums' own.
    expect(&d, &["exec", "only", "--", "sh", "-c", "exit 7"], 7, "");
    expect(&d, &["exec", "only", "--", "no-such-command"], 127, "");
    expect(
        &d,
        &["exec", "only", "--timeout", "0.5", "--", "sleep", "30"],
        124,
        "timed out",
    );
    // A session removed while its command runs is named as such.
    let exec = Command::new(bin_dir().join("drums"))
        .arg("--state-dir")
        .arg(d.state.path())
        .args(["--no-autostart", "exec", "only", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    ok(&d, &["rm", "only"]);
    let o = exec.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("session only was removed while the command ran"),
        "{err}"
    );

    // 1: an internal error (a fault injected in create), which keeps nothing.
    run(d.arm(Some("create.ready")));
    expect(&d, &["create"], 1, "injected fault");
    assert_eq!(session_count(&d), 0);

    // 5: no daemon.
    let nowhere = tempfile::tempdir().unwrap();
    let o = Command::new(bin_dir().join("drums"))
        .arg("--state-dir")
        .arg(nowhere.path())
        .args(["--no-autostart", "ps"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    d.stop_and_check_leaks();
}

/// A raw request to drumsd: its status, its `x-request-id`, its body.
async fn raw(
    d: &TestDaemon,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, Option<String>, Bytes) {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "drums");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = d
        .client
        .send(b.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let rid = resp
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, rid, body)
}

/// POST `len` bytes of JSON whitespace over a plain socket, the write's
/// errors ignored; drumsd's status and body.
fn oversized(d: &TestDaemon, uri: &str, len: usize) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(d.client.socket()).unwrap();
    let head = format!(
        "POST {uri} HTTP/1.1\r\nhost: drums\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(&vec![b' '; len]);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let body_at = text.find("\r\n\r\n").expect("a header end") + 4;
    (status, answer[body_at..].to_vec())
}

type BodyCase = (
    &'static str,
    Method,
    Vec<(&'static str, &'static str)>,
    Vec<u8>,
    u16,
    &'static str,
);

/// The API's refusals are ErrorBodies with the right status, and change
/// nothing; lifecycle events are logged with the caller's request id.
#[test]
fn api_rows_are_error_bodies() {
    let mut d = TestDaemon::start();
    run(async {
        let json = [("content-type", "application/json")];
        // (what, method, headers, body, status, kind)
        let cases: Vec<BodyCase> = vec![
            (
                "array body",
                Method::POST,
                json.to_vec(),
                b"[]".to_vec(),
                400,
                "bad_request",
            ),
            (
                "string body",
                Method::POST,
                json.to_vec(),
                b"\"x\"".to_vec(),
                400,
                "bad_request",
            ),
            (
                "form body",
                Method::POST,
                vec![("content-type", "application/x-www-form-urlencoded")],
                b"name=x".to_vec(),
                415,
                "unsupported_media_type",
            ),
            (
                "no content type",
                Method::POST,
                vec![],
                b"{}".to_vec(),
                415,
                "unsupported_media_type",
            ),
            (
                "wrong method",
                Method::PATCH,
                vec![],
                vec![],
                405,
                "method_not_allowed",
            ),
        ];
        for (what, method, headers, body, status, kind) in cases {
            let (got, _, body) = raw(&d, method, "/v1/sessions", &headers, body).await;
            assert_eq!(got, status, "{what}: {}", String::from_utf8_lossy(&body));
            let e: ErrorBody = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("{what}: not an ErrorBody ({e}): {body:?}"));
            assert_eq!(e.error.kind, kind, "{what}");
            common::assert_schema("ErrorBody", &serde_json::from_slice(&body).unwrap());
        }
        // A long request target (hyper's own limit, 64 KiB, answers with
        // no body: not drumsd's to shape).
        let long = format!("/v1/sessions?{}", "a".repeat(20 << 10));
        let (got, _, body) = raw(&d, Method::GET, &long, &[], vec![]).await;
        assert_eq!(got, 414);
        let e: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.error.kind, "uri_too_long");
        // Too large: drumsd answers before reading it all and closes, so the
        // writer sees a broken pipe; the answer is read from the socket.
        let (got, body) = oversized(&d, "/v1/sessions", 2 << 20);
        assert_eq!(got, 413, "{}", String::from_utf8_lossy(&body));
        let e: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.error.kind, "payload_too_large");
        // The same extractor guards the other JSON routes.
        let (got, _, _) = raw(&d, Method::POST, "/v1/checkpoints", &json, b"[]".to_vec()).await;
        assert_eq!(got, 400);
        assert_eq!(session_count(&d), 0, "a refused body created a session");

        // A caller's request id is echoed and names the lifecycle log lines;
        // without one drumsd makes one.
        let body = br#"{"name":"logged","network":"none"}"#.to_vec();
        let mut h = json.to_vec();
        h.push(("x-request-id", "req-create-15"));
        let (got, rid, _) = raw(&d, Method::POST, "/v1/sessions", &h, body).await;
        assert_eq!((got, rid.as_deref()), (201, Some("req-create-15")));
        let (got, rid, _) = raw(&d, Method::DELETE, "/v1/sessions/logged", &[], vec![]).await;
        assert_eq!(got, 204);
        let made = rid.expect("a request id is always answered");
        assert!(!made.is_empty());
        let log = d.log();
        let created = log_lines(&log, "session created");
        assert_eq!(created.len(), 1, "{log}");
        assert!(
            created[0].contains("request{id=req-create-15}"),
            "{}",
            created[0]
        );
        let removed = log_lines(&log, "session removed");
        assert_eq!(removed.len(), 1, "{log}");
        assert!(
            removed[0].contains(&format!("request{{id={made}}}")),
            "{}",
            removed[0]
        );
    });
    d.stop_and_check_leaks();
}

/// Checkpoints: names, export targets, and imports of archives that are
/// present already, damaged, or from elsewhere.
#[test]
fn checkpoint_rows_and_exports() {
    let mut d = TestDaemon::start();
    ok(&d, &["create", "--name", "box", "--network", "none"]);
    expect(
        &d,
        &["checkpoint", "box", "--leave-running", "--name", "bad/name"],
        2,
        "invalid checkpoint name",
    );
    let ck = ok(
        &d,
        &["checkpoint", "box", "--leave-running", "--name", "warm"],
    );
    expect(
        &d,
        &["checkpoint", "box", "--leave-running", "--name", &ck],
        4,
        "is the id of another checkpoint",
    );
    expect(&d, &["checkpoint", "rm", "ghost"], 3, "no checkpoint named");

    // Export: a temporary file of its own; a regular file is replaced;
    // anything else only with --force, a directory never.
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    std::fs::write(p("notes.partial"), "data\n").unwrap();
    ok(&d, &["checkpoint", "export", "warm", &p("notes.tar")]);
    assert_eq!(
        std::fs::read_to_string(p("notes.partial")).unwrap(),
        "data\n"
    );
    std::fs::write(p("old.tar"), "old\n").unwrap();
    ok(&d, &["checkpoint", "export", "warm", &p("old.tar")]);
    assert_eq!(
        std::fs::read(p("old.tar")).unwrap(),
        std::fs::read(p("notes.tar")).unwrap()
    );
    nix::unistd::mkfifo(
        p("fifo").as_str(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    expect(
        &d,
        &["checkpoint", "export", "warm", &p("fifo")],
        2,
        "not a regular file",
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(p("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    std::fs::create_dir(p("adir")).unwrap();
    expect(
        &d,
        &["checkpoint", "export", "warm", &p("adir")],
        2,
        "is a directory",
    );
    expect(
        &d,
        &["checkpoint", "export", "--force", "warm", &p("adir")],
        2,
        "is a directory",
    );
    assert_eq!(
        listing(dir.path()),
        ["adir", "fifo", "notes.partial", "notes.tar", "old.tar"],
        "a refused export left a file"
    );
    ok(&d, &["checkpoint", "export", "--force", "warm", &p("fifo")]);
    assert!(std::fs::symlink_metadata(p("fifo")).unwrap().is_file());
    // /dev/full stays the device it is.
    expect(
        &d,
        &["checkpoint", "export", "warm", "/dev/full"],
        2,
        "not a regular file",
    );
    assert!(std::fs::metadata("/dev/full")
        .unwrap()
        .file_type()
        .is_char_device());

    // Import: present already is a conflict; a directory is bad input.
    expect(
        &d,
        &["checkpoint", "import", &p("notes.tar")],
        4,
        "already exists",
    );
    expect(
        &d,
        &["checkpoint", "import", &p("adir")],
        2,
        "not a regular file",
    );

    // Manifests an import must refuse before writing anything, each signed
    // by this host, so each is refused for what it holds; renamed, so none
    // is refused for its name.
    let key = HostKey::load_or_create(&d.state.path().join("keys")).unwrap();
    let members = read_members(&std::fs::read(p("notes.tar")).unwrap());
    let renamed = with_manifest(&members, |m| m["name"] = "other".into());
    let seal = |m: &[tamper::Member]| archive::seal(&pack(m), &key);
    let no_fs: Vec<tamper::Member> = renamed
        .iter()
        .filter(|m| !m.path.starts_with(b"fs"))
        .cloned()
        .collect();
    let mut unsigned = pack(&renamed);
    unsigned.extend_from_slice(&[0u8; 1024]);
    let corpus: Vec<(&str, Vec<u8>, i32, &str)> = vec![
        (
            "format 999",
            seal(&with_manifest(&renamed, |m| {
                m["format_version"] = 999.into()
            })),
            2,
            "format 999 is newer than this drums",
        ),
        (
            "another kernel",
            seal(&with_manifest(&renamed, |m| {
                m["host"]["kernel"] = "2.6.32-other".into()
            })),
            2,
            "cannot be restored on this host",
        ),
        (
            "memory_bytes 1",
            seal(&with_manifest(&renamed, |m| {
                m["session"]["limits"]["memory_bytes"] = 1.into()
            })),
            2,
            "limits this host refuses",
        ),
        ("no fs/", seal(&no_fs), 2, "no fs/"),
        (
            "traversing name",
            seal(&with_manifest(&renamed, |m| m["name"] = "../../x".into())),
            2,
            "invalid checkpoint name",
        ),
        (
            "traversing id",
            seal(&with_manifest(&renamed, |m| m["id"] = "../../x".into())),
            2,
            "invalid checkpoint id",
        ),
        ("unsigned", unsigned, 6, "not signed"),
    ];
    for (what, bytes, code, msg) in corpus {
        let f = p("bad.tar");
        std::fs::write(&f, bytes).unwrap();
        let err = expect(&d, &["checkpoint", "import", &f], code, msg);
        assert!(!err.contains("tar: tar:"), "{what}: {err}");
        // Nothing kept: only warm, no pending row blocking a name.
        let rows = catalog_checkpoints(&d);
        assert_eq!(rows.len(), 1, "{what}: {rows:?}");
        assert_eq!(rows[0].state, drums_api::VersionState::Done, "{what}");
    }

    // The whole lifecycle, each event one INFO line naming its request.
    ok(&d, &["checkpoint", "rm", "warm"]);
    let imported = ok(&d, &["checkpoint", "import", &p("notes.tar")]);
    let sibling = ok(&d, &["restore", &imported]);
    ok(&d, &["rm", &sibling, "box"]);
    ok(&d, &["checkpoint", "rm", &imported]);
    let log = d.log();
    for (event, n) in [
        ("session created", 1),
        ("checkpoint created", 1),
        ("checkpoint imported", 1),
        ("checkpoint restored", 1),
        ("session removed", 2),
        ("checkpoint removed", 2),
    ] {
        let lines = log_lines(&log, event);
        assert_eq!(lines.len(), n, "{event}: {lines:#?}");
        assert!(
            lines.iter().all(|l| l.contains("request{id=")),
            "{event}: {lines:#?}"
        );
    }
    d.stop_and_check_leaks();
}
