//! A real distribution v2 registry (Debian's `docker-registry`) on loopback,
//! one per test, with its storage in a temporary directory, so that `drums
//! pull` is tested against the server it meets in the field rather than a
//! mock of our own reading of the spec.
//!
//! Images get into it through skopeo, as they would from any other client;
//! [`Registry::corrupt_blob`] reaches into its storage for the cases no
//! honest client can push (a blob whose bytes do not match its digest).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Installed by scripts/setup.sh.
const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const SKOPEO_BIN: &str = "/usr/bin/skopeo";

/// A bind race (another test took the port between our probe and the
/// registry's bind) is retried with a new port this many times.
const START_TRIES: usize = 5;

pub struct Registry {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    creds: Option<(String, String)>,
}

impl Registry {
    /// An anonymous registry on 127.0.0.1, up and answering `GET /v2/`.
    pub fn start() -> Registry {
        Registry::start_inner(None)
    }

    /// A registry that takes only `user`/`pass` (htpasswd, bcrypt: the only
    /// hash distribution's htpasswd reads).
    pub fn start_with_basic_auth(user: &str, pass: &str) -> Registry {
        Registry::start_inner(Some((user.to_owned(), pass.to_owned())))
    }

    fn start_inner(creds: Option<(String, String)>) -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists() && Path::new(SKOPEO_BIN).exists(),
            "{REGISTRY_BIN} or {SKOPEO_BIN} missing: run scripts/setup.sh. NOT SKIPPED: failing on purpose"
        );
        let dir = tempfile::Builder::new()
            .prefix("drumsreg")
            .tempdir()
            .unwrap();
        if let Some((user, pass)) = &creds {
            // The lowest cost bcrypt allows: the registry checks the hash on
            // every request, and these credentials guard nothing.
            let hash = bcrypt::hash_with_result(pass, 4)
                .unwrap()
                .format_for_version(bcrypt::Version::TwoY);
            std::fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n")).unwrap();
        }
        let mut reg = Registry {
            child: None,
            port: 0,
            creds,
            dir,
        };
        let mut last_log = String::new();
        for _ in 0..START_TRIES {
            reg.port = free_port();
            reg.write_config();
            let log = std::fs::File::create(reg.log_path()).unwrap();
            reg.child = Some(
                Command::new(REGISTRY_BIN)
                    .arg("serve")
                    .arg(reg.dir.path().join("config.yml"))
                    // The registry lets REGISTRY_* variables override its
                    // file; a developer's shell must not change the test.
                    .env_clear()
                    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .unwrap(),
            );
            match reg.wait_up() {
                Ok(()) => return reg,
                Err(log) => {
                    reg.stop();
                    if !log.contains("address already in use") {
                        panic!("docker-registry did not come up on {}: {log}", reg.addr());
                    }
                    last_log = log;
                }
            }
        }
        panic!("docker-registry lost the bind race {START_TRIES} times: {last_log}");
    }

    fn write_config(&self) {
        let d = self.dir.path();
        // `delete` lets tests remove a manifest or blob through the API;
        // `secret` is fixed so that the registry does not warn about making
        // one up; the access log is off so that the log holds only what went
        // wrong.
        let mut cfg = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: drums-test-registry\n",
            storage = d.join("storage").display(),
            port = self.port,
        );
        if self.creds.is_some() {
            cfg.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: drums-test\n    path: {}\n",
                d.join("htpasswd").display()
            ));
        }
        std::fs::write(d.join("config.yml"), cfg).unwrap();
    }

    /// Until our registry listens on the port and `GET /v2/` answers (200,
    /// or 401 with auth); on failure, the registry's log. Whoever answers
    /// must be our child: if another process took the port in the bind
    /// race, our registry is about to exit with "address already in use".
    fn wait_up(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let pid = self.pid();
        while Instant::now() < deadline {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "exited with {st}:
{}",
                    self.log()
                ));
            }
            if listens(pid, self.port) {
                if let Ok((status, _)) = self.try_get("/v2/", false) {
                    let want = if self.creds.is_some() { 401 } else { 200 };
                    if status == want {
                        return Ok(());
                    }
                    return Err(format!(
                        "GET /v2/ answered {status}, not {want}:\n{}",
                        self.log()
                    ));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("no answer in 30 s:\n{}", self.log()))
    }

    /// "127.0.0.1:PORT", as an image reference's host part.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The registry's process id (to check that it is gone after drop).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// The credentials it takes, if any.
    pub fn creds(&self) -> Option<(&str, &str)> {
        self.creds.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Push the one image of the OCI layout at `layout` as `name_tag`
    /// ("drums/two:latest"). An image index is pushed whole (`--all`), and
    /// digests are kept (`--preserve-digests`): skopeo fails rather than
    /// recompress, so what the registry serves is byte for byte what the
    /// test wrote.
    pub fn push_layout(&self, layout: &Path, name_tag: &str) {
        let mut cmd = Command::new(SKOPEO_BIN);
        cmd.args(["--insecure-policy", "copy", "--quiet", "--all"])
            .args(["--preserve-digests", "--dest-tls-verify=false"]);
        if let Some((u, p)) = self.creds() {
            cmd.arg(format!("--dest-creds={u}:{p}"));
        }
        let out = cmd
            .arg(format!("oci:{}", layout.display()))
            .arg(format!("docker://{}/{name_tag}", self.addr()))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo push of {} as {name_tag} failed ({}):\n{}\n--- registry log ---\n{}",
            layout.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Overwrite a blob in the registry's storage, so that it serves `bytes`
    /// under `digest` ("sha256:HEX"): what a compromised or broken registry
    /// does, and no client can push (the registry checks uploads).
    pub fn corrupt_blob(&self, digest: &str, bytes: &[u8]) {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let data = self
            .dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data");
        assert!(data.exists(), "no blob {digest} in the registry's storage");
        std::fs::write(data, bytes).unwrap();
    }

    /// `GET path` without credentials: the status code.
    pub fn get_status(&self, path: &str) -> u16 {
        self.try_get(path, false).unwrap().0
    }

    /// `GET path` (with the registry's credentials, if it has any): status
    /// and body.
    pub fn get(&self, path: &str) -> (u16, Vec<u8>) {
        self.try_get(path, true).unwrap()
    }

    /// One HTTP/1.0 request, so the registry closes and the body ends at EOF.
    fn try_get(&self, path: &str, auth: bool) -> std::io::Result<(u16, Vec<u8>)> {
        use base64::Engine;
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut req = format!(
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAccept: application/vnd.oci.image.index.v1+json, \
             application/vnd.oci.image.manifest.v1+json, \
             application/vnd.docker.distribution.manifest.v2+json, \
             application/vnd.docker.distribution.manifest.list.v2+json\r\n",
            self.addr()
        );
        if let (true, Some((u, p))) = (auth, self.creds()) {
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            req.push_str(&format!("Authorization: Basic {b}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes())?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)?;
        let end = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no end of headers"))?;
        let head = String::from_utf8_lossy(&resp[..end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
        Ok((status, resp[end + 4..].to_vec()))
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    /// Kill and reap it; the temporary directory (its storage) goes with
    /// the struct.
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago: the kernel picks it for a bind to
/// port 0, and the listener is closed for the registry to take it (a race
/// [`Registry::start`] retries).
fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port`:
/// the socket's inode from /proc/net/tcp, looked for among the process's
/// fds.
fn listens(pid: u32, port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    let Some(inode) = std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .find_map(|l| {
            // sl local_address rem_address st ... uid timeout inode
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| f[9].to_owned())
        })
    else {
        return false;
    };
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| {
            rd.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
        })
        .unwrap_or(false)
}
