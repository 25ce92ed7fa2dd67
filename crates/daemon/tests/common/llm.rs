//! The mock LLM upstream the proxy's tests talk to (tests/proxy/mock_llm.py,
//! the OpenAI and Anthropic wire formats), on 127.0.0.1.

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
