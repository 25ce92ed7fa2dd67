//! The OSWorld protocol against a real Xvfb, driven in-process through the
//! axum router. Runs as root (CI does): each test creates a throwaway
//! system user (useradd --system, removed with its home by a Drop guard)
//! and checks that commands really run as that user.
//!
//! Host packages: xvfb, xdotool, x11-xserver-utils (xsetroot), ffmpeg,
//! wmctrl, python3 at /usr/bin/python3, passwd (useradd). Missing ones
//! make the tests fail, never skip.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::{assert_no_children, child_pids, serial, TestUser, Xvfb};
use drums_osworld::{router, OsworldConfig};
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use tower::ServiceExt as _;

struct Reply {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn call(app: &Router, req: Request<Body>) -> Reply {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        content_type,
        body,
    }
}

async fn get(app: &Router, path: &str) -> Reply {
    call(app, Request::get(path).body(Body::empty()).unwrap()).await
}

async fn post_empty(app: &Router, path: &str) -> Reply {
    call(app, Request::post(path).body(Body::empty()).unwrap()).await
}

async fn post_json(app: &Router, path: &str, v: Value) -> Reply {
    post_raw(app, path, "application/json", v.to_string()).await
}

async fn post_raw(app: &Router, path: &str, content_type: &str, body: impl Into<Body>) -> Reply {
    let req = Request::post(path)
        .header(header::CONTENT_TYPE, content_type)
        .body(body.into())
        .unwrap();
    call(app, req).await
}

async fn post_form(app: &Router, path: &str, key: &str, value: &str) -> Reply {
    let body = format!("{key}={}", urlencode(value));
    post_raw(app, path, "application/x-www-form-urlencoded", body).await
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The body requests_toolbelt's MultipartEncoder sends for SetupController.
fn multipart(file_path: &str, data: &[u8]) -> (String, Vec<u8>) {
    let boundary = "drumsboundary7d1e";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n{file_path}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file_data\"; filename=\"x.bin\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// One session: Xvfb, a user, a router. Runs `f` on a multi-threaded
/// runtime, waits until every process the router started is gone, and
/// checks nothing is left after the X server stops.
fn with_session<F, Fut>(f: F)
where
    F: FnOnce(Router, Arc<OsworldConfig>, Xvfb) -> Fut,
    Fut: std::future::Future<Output = Xvfb>,
{
    let _serial = serial();
    {
        let user = TestUser::create();
        let x = Xvfb::start();
        let cfg = OsworldConfig::for_user(&x.display, &user.name).expect("resolve test user");
        assert_eq!(cfg.user.home, user.home);
        let mut cfg = cfg;
        cfg.recordings_dir = user.home.join(".recordings");
        let cfg = Arc::new(cfg);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let x = rt.block_on(async {
            let app = router(cfg.clone());
            let x = f(app, cfg, x).await;
            // Detached launches are reaped by tasks of this runtime: give
            // them a moment, bounded, before judging.
            let deadline = Instant::now() + Duration::from_secs(10);
            let xvfb_only = |pids: &[u32]| pids.len() <= 1;
            while !xvfb_only(&child_pids()) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            x
        });
        drop(rt);
        drop(x);
        drop(user);
    }
    assert_no_children();
}

#[test]
fn display_endpoints() {
    with_session(|app, cfg, x| async move {
        x.run("xsetroot", &["-solid", "red"]);
        x.run("xdotool", &["mousemove", "300", "200"]);

        let r = get(&app, "/screenshot").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.content_type, "image/png");
        let mut dec = png::Decoder::new(&r.body[..]).read_info().expect("PNG");
        let mut buf = vec![0; dec.output_buffer_size()];
        let info = dec.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (1280, 800));
        // Red away from the cursor, something else under it.
        let px = |x: usize, y: usize| {
            let i = (y * 1280 + x) * 3;
            [buf[i], buf[i + 1], buf[i + 2]]
        };
        assert_eq!(px(10, 10), [255, 0, 0]);
        let near_cursor = (290..310).flat_map(|x| (190..210).map(move |y| (x, y)));
        assert!(
            near_cursor
                .into_iter()
                .any(|(x, y)| px(x, y) != [255, 0, 0]),
            "cursor not drawn"
        );

        let r = get(&app, "/cursor_position").await;
        assert_eq!(r.json(), json!([300, 200]));
        let r = post_empty(&app, "/screen_size").await;
        assert_eq!(r.json(), json!({"width": 1280, "height": 800}));
        let r = get(&app, "/platform").await;
        assert_eq!((r.status, r.text()), (StatusCode::OK, "Linux".to_string()));

        let r = post_empty(&app, "/window_size").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(r.json(), json!({"error": "app_class_name is required"}));
        let r = post_form(
            &app,
            "/window_size",
            "app_class_name",
            "nothing-has-this-class",
        )
        .await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);

        let r = post_empty(&app, "/desktop_path").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(
            r.json(),
            json!({"error": "Unsupported operating system or desktop path not found"})
        );
        std::fs::create_dir(cfg.user.home.join("Desktop")).unwrap();
        let r = post_empty(&app, "/desktop_path").await;
        let want = cfg.user.home.join("Desktop");
        assert_eq!(r.json(), json!({"desktop_path": want.to_str().unwrap()}));

        // Wrong method and unknown route: Flask's codes.
        assert_eq!(
            get(&app, "/execute").await.status,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(get(&app, "/nope").await.status, StatusCode::NOT_FOUND);

        // Window management without a window manager: wmctrl finds nothing,
        // and the original still answers 200.
        let r = post_json(&app, "/setup/activate_window", json!({"window_name": "x"})).await;
        assert_eq!(
            (r.status, r.text()),
            (StatusCode::OK, "Window activated successfully".into())
        );
        let r = post_json(&app, "/setup/activate_window", json!({})).await;
        assert_eq!(
            (r.status, r.text()),
            (StatusCode::BAD_REQUEST, "window_name required".into())
        );
        let r = post_json(
            &app,
            "/setup/close_window",
            json!({"window_name": "x", "strict": true}),
        )
        .await;
        assert_eq!(
            (r.status, r.text()),
            (StatusCode::OK, "Window closed successfully.".into())
        );
        let r = post_json(&app, "/setup/open_file", json!({})).await;
        assert_eq!(
            (r.status, r.text()),
            (StatusCode::BAD_REQUEST, "Path not supplied!".into())
        );
        let r = post_json(&app, "/setup/open_file", json!({"path": "/nope/x.txt"})).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(r.text(), "Application/file not found: /nope/x.txt");
        let r = post_json(
            &app,
            "/setup/open_file",
            json!({"path": "/tmp", "timeout_seconds": "soon"}),
        )
        .await;
        assert_eq!(
            (r.status, r.text()),
            (
                StatusCode::BAD_REQUEST,
                "Invalid timeout_seconds: soon".into()
            )
        );

        // Recording: start, refuse a second, stop and get an MP4.
        let r = post_empty(&app, "/start_recording").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.json()["status"], "success");
        let r = post_empty(&app, "/start_recording").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(r.json()["message"], "Recording is already in progress.");
        x.run("xsetroot", &["-solid", "blue"]);
        let r = post_empty(&app, "/end_recording").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert!(r.body.len() > 100 && &r.body[4..8] == b"ftyp", "not an MP4");
        let r = post_empty(&app, "/end_recording").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(r.json()["message"], "No recording in progress to stop.");
        x
    });
}

#[test]
fn commands_run_as_the_user() {
    with_session(|app, cfg, x| async move {
        let uid = cfg.user.uid.to_string();
        for path in ["/execute", "/setup/execute"] {
            let r = post_json(&app, path, json!({"command": ["id", "-u"], "shell": false})).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(
                r.json(),
                json!({"status": "success", "output": format!("{uid}\n"), "error": "", "returncode": 0})
            );
        }
        // Shell form: environment, working directory and `~` are the user's.
        let r = post_json(
            &app,
            "/execute",
            json!({"command": "echo $USER $HOME $DISPLAY; pwd; echo oops >&2; exit 3", "shell": true}),
        )
        .await;
        let v = r.json();
        let home = cfg.user.home.to_str().unwrap();
        assert_eq!(
            v["output"],
            format!("{} {home} {}\n{home}\n", cfg.user.name, x.display)
        );
        assert_eq!(v["error"], "oops\n");
        assert_eq!(v["returncode"], 3);
        assert_eq!(v["status"], "success");
        // A string without shell is split; ~/ is expanded.
        let r = post_json(&app, "/execute", json!({"command": "ls -d ~/"})).await;
        assert_eq!(r.json()["output"], format!("{home}/\n"));
        // A missing program is the original's 500.
        let r = post_json(
            &app,
            "/execute",
            json!({"command": ["no-such-program-xyz"]}),
        )
        .await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            r.json(),
            json!({"status": "error", "message": "[Errno 2] No such file or directory: 'no-such-program-xyz'"})
        );
        // Bad bodies.
        let r = post_raw(&app, "/execute", "application/json", "{not json").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(r.content_type.starts_with("text/html"));
        let r = post_raw(&app, "/execute", "text/plain", "{}").await;
        assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let r = post_json(&app, "/execute", json!({"command": 7})).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);

        // /run_python
        let r = post_json(
            &app,
            "/run_python",
            json!({"code": "import os,sys\nprint(os.getuid())\nprint('e', file=sys.stderr)"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.json(),
            json!({"status": "success", "message": format!("{uid}\n\ne\n"), "need_more": false,
                   "output": format!("{uid}\n"), "error": "e\n", "return_code": 0})
        );
        let r = post_json(
            &app,
            "/run_python",
            json!({"code": "import sys; sys.exit(4)"}),
        )
        .await;
        let v = r.json();
        assert_eq!(
            (v["status"].clone(), v["return_code"].clone()),
            (json!("error"), json!(4))
        );
        assert_eq!(v["error"], "Process exited with code 4");
        let r = post_json(&app, "/run_python", json!({"code": ""})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            r.json(),
            json!({"status": "error", "message": "Code not supplied!"})
        );
        assert!(
            !std::fs::read_dir("/tmp").unwrap().flatten().any(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("python_exec_")
                && e.metadata()
                    .map(|m| m.uid() == cfg.user.uid)
                    .unwrap_or(false)),
            "run_python left its file in /tmp"
        );

        // /run_bash_script: stderr merged into output, in order.
        let r = post_json(
            &app,
            "/run_bash_script",
            json!({"script": "echo one; echo two >&2; id -u; exit 2", "working_dir": "~"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.json(),
            json!({"status": "error", "output": format!("one\ntwo\n{uid}\n"), "error": "", "returncode": 2})
        );
        let r = post_json(&app, "/run_bash_script", json!({})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            r.json(),
            json!({"status": "error", "output": "Script not supplied!", "error": "", "returncode": -1})
        );
        let r = post_json(
            &app,
            "/run_bash_script",
            json!({"script": "true", "working_dir": "/nope"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            r.json()["output"],
            "Working directory does not exist: /nope"
        );
        // A timeout kills the script and what it started.
        let t = Instant::now();
        let r = post_json(
            &app,
            "/run_bash_script",
            json!({"script": "sleep 60 & sleep 60", "timeout": 1}),
        )
        .await;
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            r.json()["output"],
            "Script execution timed out after 1 seconds"
        );

        // /setup/launch: detached into its own session, running as the user.
        let marker = cfg.user.home.join("launched");
        let script = format!(
            "echo $(id -u) $(cut -d' ' -f6 /proc/$$/stat) $$ > {}.tmp && mv {0}.tmp {0}",
            marker.display()
        );
        let r = post_json(
            &app,
            "/setup/launch",
            json!({"command": script, "shell": true}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text(), format!("{script} launched successfully"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !marker.exists() {
            assert!(Instant::now() < deadline, "launched command never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let fields: Vec<String> = std::fs::read_to_string(&marker)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(fields[0], uid);
        assert_eq!(
            fields[1], fields[2],
            "launched process is not a session leader"
        );
        let r = post_json(
            &app,
            "/setup/launch",
            json!({"command": ["no-such-program-xyz"]}),
        )
        .await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.json()["status"], "error");
        x
    });
}

#[test]
fn files_round_trip() {
    with_session(|app, cfg, x| async move {
        let r = post_empty(&app, "/file").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(r.json(), json!({"error": "file_path is required"}));
        let r = post_form(&app, "/file", "file_path", "~/missing.txt").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(r.json(), json!({"error": "File not found"}));

        // Upload into a directory that does not exist yet, then read back.
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (ct, body) = multipart("~/docs/new/report.bin", &data);
        let r = post_raw(&app, "/setup/upload", &ct, body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text(), format!("File Uploaded: {} bytes", data.len()));
        let target = cfg.user.home.join("docs/new/report.bin");
        for p in [target.as_path(), target.parent().unwrap()] {
            assert_eq!(
                std::fs::metadata(p).unwrap().uid(),
                cfg.user.uid,
                "{} not the user's",
                p.display()
            );
        }
        let r = post_form(&app, "/file", "file_path", "$HOME/docs/new/report.bin").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, data);

        let r = post_raw(
            &app,
            "/setup/upload",
            "multipart/form-data; boundary=x",
            "--x--\r\n",
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            r.json(),
            json!({"error": "file_path and file_data are required"})
        );
        let r = post_json(&app, "/setup/upload", json!({})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);

        let r = post_form(&app, "/file", "file_path", "~/docs").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(r.json()["error"]
            .as_str()
            .unwrap()
            .contains("[Errno 21] Is a directory"));

        let docs = cfg.user.home.join("docs");
        let r = post_json(&app, "/list_directory", json!({"path": docs})).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.json(),
            json!({"directory_tree": {"type": "directory", "name": "docs", "children": [
                {"type": "directory", "name": "new", "children": [{"type": "file", "name": "report.bin"}]}
            ]}})
        );
        let r = post_json(&app, "/list_directory", json!({})).await;
        assert_eq!(
            (r.status, r.json()),
            (
                StatusCode::BAD_REQUEST,
                json!({"error": "Missing 'path' parameter"})
            )
        );
        let r = post_json(&app, "/list_directory", json!({"path": target})).await;
        assert_eq!(
            (r.status, r.json()),
            (
                StatusCode::BAD_REQUEST,
                json!({"error": "The provided path is not a directory"})
            )
        );
        let r = post_raw(&app, "/list_directory", "application/json", "[").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        x
    });
}

#[test]
fn accessibility_without_a_session_bus_is_an_error() {
    with_session(|app, _cfg, x| async move {
        // No DBUS_SESSION_BUS_ADDRESS configured: no AT-SPI, so an error
        // that says why, and no tree.
        for (path, what) in [
            ("/accessibility", "accessibility tree"),
            ("/terminal", "terminal output"),
        ] {
            let r = get(&app, path).await;
            assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
            let v = r.json();
            assert_eq!(v["status"], "error");
            let msg = v["message"].as_str().unwrap();
            assert!(msg.starts_with(&format!("{what} unavailable")), "{msg}");
            assert!(msg.contains("DBUS_SESSION_BUS_ADDRESS"), "{msg}");
            assert!(v.get("AT").is_none());
        }
        x
    });
}
