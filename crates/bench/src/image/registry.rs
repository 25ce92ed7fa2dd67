//! The registry `drums bench image` pulls from: Debian's `docker-registry`
//! (distribution 2.8) on 127.0.0.1, a free port, its storage in a temporary
//! directory. Dropping it kills and reaps the process, on every path out of
//! the bench, errors included; the directory goes with it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Starting the registry, or pushing to it.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// `op`: "create the registry's directory", "write the registry's
    /// config", ...
    #[error("{op}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("start {REGISTRY_BIN}")]
    Start(#[source] std::io::Error),
    #[error("docker-registry did not come up on {addr}")]
    NotUp {
        addr: String,
        #[source]
        source: Down,
    },
    #[error("docker-registry lost the race for a free port {START_TRIES} times")]
    PortRace,
    #[error("run skopeo")]
    Skopeo(#[source] std::io::Error),
    #[error("skopeo push of {name}:{tag} failed ({status}): {stderr}\nregistry log: {log}")]
    Push {
        name: String,
        tag: String,
        status: ExitStatus,
        stderr: String,
        log: String,
    },
}

/// Why the registry did not come up, with its log.
#[derive(Debug, thiserror::Error)]
pub enum Down {
    #[error("exited with {status}: {log}")]
    Exited { status: ExitStatus, log: String },
    #[error("no answer in 30 s: {log}")]
    Silent { log: String },
}

impl Down {
    fn log(&self) -> &str {
        match self {
            Down::Exited { log, .. } | Down::Silent { log } => log,
        }
    }
}

type Result<T, E = RegistryError> = std::result::Result<T, E>;

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> RegistryError {
    move |source| RegistryError::Io { op, source }
}

/// Another process may take the free port between our probe and the
/// registry's bind; then it is tried again with a new port.
const START_TRIES: usize = 5;

pub struct Registry {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    /// A registry up and answering `GET /v2/`.
    pub fn start() -> Result<Registry> {
        let dir = tempfile::Builder::new()
            .prefix("drums-bench-registry")
            .tempdir()
            .map_err(io("create the registry's directory"))?;
        let mut reg = Registry {
            child: None,
            port: 0,
            dir,
        };
        for _ in 0..START_TRIES {
            reg.port = free_port()?;
            let d = reg.dir.path();
            // The access log is off: the log keeps only what went wrong.
            let config = format!(
                "version: 0.1\n\
                 log:\n  level: warn\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{}\n  secret: drums-bench-registry\n",
                d.join("storage").display(),
                reg.port,
            );
            std::fs::write(d.join("config.yml"), config)
                .map_err(io("write the registry's config"))?;
            let log =
                std::fs::File::create(reg.log_path()).map_err(io("create the registry's log"))?;
            reg.child = Some(
                Command::new(REGISTRY_BIN)
                    .arg("serve")
                    .arg(d.join("config.yml"))
                    // REGISTRY_* variables override the file: the caller's
                    // environment must not change what is measured.
                    .env_clear()
                    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().map_err(io("dup the registry's log"))?)
                    .stderr(log)
                    .spawn()
                    .map_err(RegistryError::Start)?,
            );
            match reg.wait_up() {
                Ok(()) => return Ok(reg),
                Err(down) => {
                    reg.stop();
                    if !down.log().contains("address already in use") {
                        return Err(RegistryError::NotUp {
                            addr: reg.addr(),
                            source: down,
                        });
                    }
                }
            }
        }
        Err(RegistryError::PortRace)
    }

    /// "127.0.0.1:PORT", as an image reference's host.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Push the layout's image tagged `tag` as `ADDR/name:tag`. Digests are
    /// kept: skopeo fails rather than recompress.
    pub fn push(&self, layout: &Path, tag: &str, name: &str) -> Result<()> {
        let out = Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--quiet", "--preserve-digests"])
            .arg("--dest-tls-verify=false")
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{name}:{tag}", self.addr()))
            .stdin(Stdio::null())
            .output()
            .map_err(RegistryError::Skopeo)?;
        if !out.status.success() {
            return Err(RegistryError::Push {
                name: name.to_owned(),
                tag: tag.to_owned(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                log: self.log(),
            });
        }
        Ok(())
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("registry.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Until `GET /v2/` answers 200 while our child runs; on failure, the
    /// registry's log. (If another process had won the port, ours exits
    /// with "address already in use", which the caller retries.)
    fn wait_up(&mut self) -> Result<(), Down> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(Down::Exited {
                    status,
                    log: self.log(),
                });
            }
            if get_status(self.port, "/v2/").is_ok_and(|s| s == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Down::Silent { log: self.log() })
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago (the kernel's pick for port 0).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_err(io("find a free port"))?
        .port())
}

/// `GET path` over HTTP/1.0 (the body ends at EOF): the status code.
fn get_status(port: u16, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n")?;
    let mut head = Vec::new();
    s.read_to_end(&mut head)?;
    String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))
}
