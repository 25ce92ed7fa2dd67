//! The agent's rollback tool (docs/agent-tool.md), end to end: a process
//! inside a session lists its versions and rolls its own session back
//! through the guest agent's socket, which forwards to drumsd's session API
//! on the bridge address. As root, with real sessions, CRIU and btrfs; the
//! test ends by proving nothing is left.

mod common;

use std::time::{Duration, Instant};

use common::TestDaemon;
use drums_api::{CreateSession, EndTurn, Policy, SessionVersion, TurnEffects};
use hyper::Method;

/// A server that keeps a counter in memory only: `inc` adds one, anything
/// else reads it. Its pid goes to /tmp/server.pid.
const SERVER: &str = "cd / && nohup python3 -c \"exec('import socket\\ns=socket.socket()\\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\\ns.bind((\\'127.0.0.1\\',7000))\\ns.listen()\\nn=0\\nwhile True:\\n c,_=s.accept()\\n m=c.recv(16)\\n n+=m==b\\'inc\\'\\n c.sendall(str(n).encode())\\n c.close()')\" >/dev/null 2>&1 & echo $! > /tmp/server.pid; sleep 0.5";

fn ask(what: &str) -> String {
    format!("python3 -c \"import socket;c=socket.create_connection(('127.0.0.1',7000));c.sendall(b'{what}');print(c.recv(16).decode())\"")
}

/// What a process inside the session runs to call the guest agent on its
/// unix socket (the image has python3, not curl): METHOD PATH [BODY];
/// prints the status, then the body.
const CALL_GUEST: &str = r#"
import http.client, socket, sys
class Guest(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect('/run/drums/guest.sock')
c = Guest('guest', timeout=60)
body = sys.argv[3] if len(sys.argv) > 3 else None
headers = {'content-type': 'application/json'} if body is not None else {}
c.request(sys.argv[1], sys.argv[2], body=body, headers=headers)
r = c.getresponse()
print(r.status)
print(r.read().decode())
"#;

/// A call to the guest agent from inside `session`: (status, JSON body).
fn from_inside(
    d: &TestDaemon,
    session: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut args = vec![
        "exec", session, "--", "python3", "-c", CALL_GUEST, method, path,
    ];
    args.extend(body);
    let o = d.drums(&args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{method} {path} from inside {session}: {out}{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        d.log()
    );
    let (status, body) = out.trim().split_once('\n').unwrap_or((out.trim(), ""));
    let body = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {out}"));
    (status.parse().unwrap(), body)
}

fn numbers(list: &serde_json::Value) -> Vec<(u64, String)> {
    list["versions"]
        .as_array()
        .unwrap_or_else(|| panic!("no versions in {list}"))
        .iter()
        .map(|v| {
            (
                v["number"].as_u64().unwrap(),
                v["session_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn turn(d: &TestDaemon, s: &str, script: &str) -> SessionVersion {
    d.client
        .call(
            Method::POST,
            &format!("/v1/sessions/{s}/turn/begin"),
            None::<&()>,
        )
        .await
        .unwrap_or_else(|e| panic!("turn begin: {e}\n{}", d.log()));
    let (code, out, err) = d.sh(s, script);
    assert_eq!(code, 0, "{script}: {out} {err}");
    let e: TurnEffects = d
        .client
        .json(
            Method::POST,
            &format!("/v1/sessions/{s}/turn/end"),
            Some(&EndTurn {
                checkpoint: true,
                policy: Some(Policy::Full),
                wait: true,
            }),
        )
        .await
        .unwrap();
    e.checkpoint
        .and_then(|c| c.version)
        .unwrap_or_else(|| panic!("turn {script:?} took no version\n{}", d.log()))
}

async fn session(d: &TestDaemon, s: &str) -> drums_api::Session {
    d.client
        .json(Method::GET, &format!("/v1/sessions/{s}"), None::<&()>)
        .await
        .unwrap()
}

/// The state a turn breaks and a rollback brings back: the project's file
/// and the server's in-memory counter.
fn state(d: &TestDaemon, s: &str) -> (String, String) {
    let file = d.sh(s, "cat /root/project/main.py 2>&1; true").1;
    let (_, counter, _) = d.sh(s, &format!("{} 2>/dev/null || echo down", ask("get")));
    (file, counter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_rolls_its_own_session_back_from_inside() {
    let mut d = TestDaemon::start();
    let s = d
        .create(&CreateSession {
            name: Some("agent".into()),
            ..Default::default()
        })
        .await
        .unwrap();

    // A good turn: a project and a server that has counted one request.
    let good = turn(
        &d,
        "agent",
        &format!(
            "mkdir -p /root/project && echo 'print(42)' > /root/project/main.py; {SERVER}; {}",
            ask("inc")
        ),
    )
    .await;
    assert_eq!(state(&d, "agent"), ("print(42)".into(), "1".into()));
    // A turn that breaks it: the project deleted, the server killed.
    let broken = turn(
        &d,
        "agent",
        "rm -rf /root/project; kill $(cat /tmp/server.pid); sleep 0.2",
    )
    .await;
    assert_eq!(broken.number, good.number + 1);
    let (file, counter) = state(&d, "agent");
    assert!(file.contains("No such file"), "{file}");
    assert_eq!(counter, "down");

    // The tool's listing, from inside: this session's versions.
    let (status, list) = from_inside(&d, "agent", "GET", "/v1/versions", None);
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        numbers(&list),
        [(good.number, s.id.clone()), (broken.number, s.id.clone())]
    );

    // An unknown version: 404, and nothing changes.
    let (status, err) = from_inside(&d, "agent", "POST", "/v1/rollback", Some(r#"{"to": "99"}"#));
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["error"]["kind"], "not_found", "{err}");
    let (status, err) = from_inside(&d, "agent", "POST", "/v1/rollback", Some(r#"{"to": 99}"#));
    assert_eq!(status, 404, "a number too: {err}");
    // Not a JSON object, or an unknown field: 400 from drumsd's body rules.
    let (status, err) = from_inside(&d, "agent", "POST", "/v1/rollback", Some(r#"{"too": 1}"#));
    assert_eq!(status, 400, "{err}");
    // Another route of drumsd's session API does not exist.
    let (status, _) = from_inside(&d, "agent", "GET", "/v1/sessions", None);
    assert_eq!(status, 404);
    let now = session(&d, "agent").await;
    assert_eq!((now.state.as_str(), now.init_pid), ("running", s.init_pid));
    assert_eq!(state(&d, "agent").1, "down", "nothing rolled back");

    // A second session reaches only its own versions: none, so the first's
    // numbers and ids are unknown to it. (With egress, so its guest finds
    // drumsd through its default route, where the first's uses its link's.)
    let other = d
        .create(&CreateSession {
            name: Some("other".into()),
            egress: Some("nat".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let (status, list) = from_inside(&d, "other", "GET", "/v1/versions", None);
    assert_eq!((status, numbers(&list)), (200, vec![]), "{list}");
    for to in [
        format!(r#"{{"to": {}}}"#, good.number),
        format!(r#"{{"to": "{}"}}"#, good.id),
    ] {
        let (status, err) = from_inside(&d, "other", "POST", "/v1/rollback", Some(&to));
        assert_eq!(status, 404, "{to}: {err}");
    }
    let now = session(&d, "agent").await;
    assert_eq!(
        now.init_pid, s.init_pid,
        "the first session was not touched"
    );
    // Once it has a version, that is all it sees.
    let mine = turn(&d, "other", "echo mine > /root/mine").await;
    let (_, list) = from_inside(&d, "other", "GET", "/v1/versions", None);
    assert_eq!(numbers(&list), [(mine.number, other.id.clone())]);

    // A session without a network cannot reach drumsd: 501, saying so.
    let _offline = d
        .create(&CreateSession {
            name: Some("offline".into()),
            network: Some("none".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let (status, err) = from_inside(&d, "offline", "GET", "/v1/versions", None);
    assert_eq!(status, 501, "{err}");
    assert_eq!(err["error"]["kind"], "not_supported", "{err}");

    // An address that is no session's is refused whatever it asks: the
    // host's own connection to the bridge address comes from the bridge
    // address itself.
    let gw = d.subnet().replace(".0/24", ".1");
    for path in ["/v1/self/versions", "/v1/nothing"] {
        let mut c = std::net::TcpStream::connect((gw.as_str(), drums_api::SESSION_API_PORT))
            .unwrap_or_else(|e| panic!("connect to the session api at {gw}: {e}"));
        use std::io::{Read, Write};
        write!(
            c,
            "GET {path} HTTP/1.1\r\nHost: drums\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        assert!(answer.contains("is no session's address"), "{answer}");
    }

    // The tool call: answered first, then the session is rolled back.
    let (status, answer) = from_inside(
        &d,
        "agent",
        "POST",
        "/v1/rollback",
        Some(&format!(r#"{{"to": "{}"}}"#, good.number)),
    );
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["rolling_back_to"], good.number, "{answer}");
    assert_eq!(answer["version"], good.id.as_str(), "{answer}");
    // Running again, with a new init (the version's processes), and its
    // guest answering.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = session(&d, "agent").await;
        if now.state == drums_api::SessionState::Running
            && now.init_pid != s.init_pid
            && d.sh("agent", "true").0 == 0
        {
            assert_eq!((&now.id, &now.ip), (&s.id, &s.ip), "same identity");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the session did not come back: {now:?}\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The state is back: the project's file, and the server with its count.
    assert_eq!(state(&d, "agent"), ("print(42)".into(), "1".into()));
    // Its history is kept: the broken version can be gone back to.
    let (_, list) = from_inside(&d, "agent", "GET", "/v1/versions", None);
    assert_eq!(numbers(&list).len(), 2, "{list}");
    assert!(
        d.log().contains("session rolled itself back"),
        "{}",
        d.log()
    );

    for name in ["agent", "other", "offline"] {
        d.rm(name).await.unwrap();
    }
    d.stop_and_check_leaks();
}

/// Code in a session is hostile: one that opens connections to drumsd's
/// session API and sends nothing gets at most
/// `MAX_CONNECTIONS_PER_ADDRESS` of them (the next is closed unanswered),
/// has them closed after `HEADER_TIMEOUT`, and meanwhile another session is
/// served as usual. Once they are closed, it is served again too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_floods_the_session_api_gets_its_share_only() {
    let mut d = TestDaemon::start();
    for name in ["flood", "calm"] {
        d.create(&CreateSession {
            name: Some(name.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let gw = d.subnet().replace(".0/24", ".1");
    let port = drums_api::SESSION_API_PORT;
    let held = drums_daemon::session_api::MAX_CONNECTIONS_PER_ADDRESS;
    // Holds `held` idle connections, then tries one more with a request;
    // writes what that one got, and how long the held ones stayed open.
    let flood = format!(
        "import socket,time\n\
         held=[socket.create_connection(('{gw}',{port})) for _ in range({held})]\n\
         time.sleep(0.5)\n\
         x=socket.create_connection(('{gw}',{port}))\n\
         x.settimeout(5)\n\
         try:\n x.sendall(b'GET /v1/self/versions HTTP/1.1\\r\\nHost: d\\r\\n\\r\\n'); extra=x.recv(100)\n\
         except OSError: extra=b''\n\
         t=time.time()\n\
         for s in held:\n s.settimeout(30)\n try: s.recv(10)\n except OSError: pass\n\
         open('/tmp/flood.out','w').write(repr(extra)+' '+str(round(time.time()-t)))\n"
    );
    std::fs::write(d.state.path().join("flood.py"), &flood).unwrap();
    let put = d.drums(&[
        "cp",
        d.state.path().join("flood.py").to_str().unwrap(),
        "flood:/root/flood.py",
    ]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let (code, _, err) = d.sh(
        "flood",
        "nohup python3 /root/flood.py >/dev/null 2>&1 & sleep 1",
    );
    assert_eq!(code, 0, "{err}");

    let versions = format!(
        "python3 -c \"import http.client;c=http.client.HTTPConnection('{gw}',{port},timeout=10);\
         c.request('GET','/v1/self/versions');print(c.getresponse().status)\""
    );
    let (code, out, err) = d.sh("calm", &versions);
    assert_eq!(
        (code, out.as_str()),
        (0, "200"),
        "another session is served: {err}"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let result = loop {
        let (_, out, _) = d.sh("flood", "cat /tmp/flood.out 2>/dev/null; true");
        if !out.is_empty() {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the held connections stayed open"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let (extra, open_for) = result.split_once(' ').unwrap();
    assert_eq!(extra, "b''", "the connection past the limit was answered");
    let open_for: u64 = open_for.parse().unwrap();
    let timeout = drums_daemon::session_api::HEADER_TIMEOUT.as_secs();
    assert!(
        open_for <= timeout + 2,
        "idle connections were closed after {open_for} s, not {timeout} s"
    );
    let (code, out, err) = d.sh("flood", &versions);
    assert_eq!((code, out.as_str()), (0, "200"), "served again: {err}");

    for name in ["flood", "calm"] {
        d.rm(name).await.unwrap();
    }
    d.stop_and_check_leaks();
}

/// The tool's schemas in docs/agent-tool.md: valid JSON, the same two tools
/// in both formats, and arguments that fit them are what both endpoints
/// take. No root needed.
#[test]
fn the_documented_tool_schemas_agree_with_each_other_and_the_endpoints() {
    let doc = include_str!("../../../docs/agent-tool.md");
    let blocks: Vec<serde_json::Value> = doc
        .split("```json\n")
        .skip(1)
        .map(|b| {
            let json = b.split("```").next().unwrap();
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
        })
        .collect();
    assert_eq!(blocks.len(), 2, "an OpenAI and an Anthropic tool list");
    let (openai, anthropic) = (blocks[0].as_array().unwrap(), blocks[1].as_array().unwrap());
    assert_eq!(openai.len(), anthropic.len());
    let mut names = Vec::new();
    for (o, a) in openai.iter().zip(anthropic) {
        assert_eq!(o["type"], "function", "{o}");
        let f = &o["function"];
        assert_eq!(f["name"], a["name"]);
        assert_eq!(f["description"], a["description"]);
        assert!(!a["description"].as_str().unwrap().is_empty());
        // The same schema, but for OpenAI's additionalProperties.
        let mut params = f["parameters"].clone();
        assert_eq!(params["additionalProperties"], false, "{o}");
        params
            .as_object_mut()
            .unwrap()
            .remove("additionalProperties");
        assert_eq!(params, a["input_schema"], "{}", a["name"]);
        assert_eq!(params["type"], "object");
        names.push(a["name"].as_str().unwrap().to_owned());
    }
    assert_eq!(names, ["sandbox_versions", "sandbox_rollback"]);
    let to = &anthropic[1]["input_schema"]["properties"]["to"];
    assert_eq!(to["type"], "string", "{to}");
    assert_eq!(
        anthropic[1]["input_schema"]["properties"]
            .as_object()
            .unwrap()
            .len(),
        1
    );
    // A call's arguments are a body both endpoints take as they are.
    for args in [r#"{"to": "3"}"#, r#"{"to": "a1b2c3"}"#, "{}"] {
        serde_json::from_str::<drums_api::Rollback>(args).unwrap();
        serde_json::from_str::<drums_api::SelfRollback>(args).unwrap();
    }
    let n: drums_api::SelfRollback = serde_json::from_str(r#"{"to": 3}"#).unwrap();
    assert_eq!(
        n.to.unwrap().to_string(),
        "3",
        "a number is taken inside too"
    );
}
