//! The mock LLM upstream the proxy's tests talk to (tests/proxy/mock_llm.py,
//! the OpenAI and Anthropic wire formats), on 127.0.0.1.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory of the proxy tests' scripts.
pub fn proxy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy")
}

/// The mock upstream, killed when dropped.
pub struct Mock {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Mock {
    pub fn start() -> Mock {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let child = Command::new("python3")
            .arg(proxy_dir().join("mock_llm.py"))
            .arg(&port_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut mock = Mock {
            child,
            port: 0,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        mock.port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                if let Ok(p) = p.trim().parse() {
                    break p;
                }
            }
            assert!(Instant::now() < deadline, "the mock upstream did not start");
            std::thread::sleep(Duration::from_millis(50));
        };
        mock
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A model call of an agent outside session `s` to `model` of the mock, as
/// an SDK makes it: tried again while the proxy cannot be reached or
/// answers 5xx (drumsd restarting). The answer's text.
pub fn model_call(at: SocketAddr, s: &str, model: &str, text: &str) -> String {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = (|| -> Option<(u16, String)> {
            let mut c = std::net::TcpStream::connect(at).ok()?;
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\
                 Content-Type: application/json\r\nx-drums-session: {s}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            c.write_all(head.as_bytes()).ok()?;
            c.write_all(body.as_bytes()).ok()?;
            let mut out = Vec::new();
            c.read_to_end(&mut out).ok()?;
            let text = String::from_utf8_lossy(&out).into_owned();
            let status = text.split(' ').nth(1)?.parse().ok()?;
            Some((status, text.split_once("\r\n\r\n")?.1.to_owned()))
        })();
        match got {
            Some((200, body)) => {
                let v: serde_json::Value =
                    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
                return v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned();
            }
            Some((status, body)) if status < 500 => panic!("{status}: {body}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the proxy never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
}
