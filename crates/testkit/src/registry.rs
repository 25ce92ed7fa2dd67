//! A real distribution v2 registry (Debian's `docker-registry`) on
//! 127.0.0.1, a free port, its storage and config in a temporary directory:
//! what `drums pull` meets in the field rather than a mock of our own
//! reading of the spec. drumsd's image tests and `drums bench image` pull
//! from it.
//!
//! Images get into it through skopeo, as they would from any other client;
//! [`Registry::corrupt_blob`] reaches into its storage for the cases no
//! honest client can push (a blob whose bytes do not match its digest).
//! Dropping it kills and reaps the process and removes the directory, on
//! every path out, a failed start included.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Installed by scripts/setup.sh.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
/// Installed by scripts/setup.sh.
pub const SKOPEO_BIN: &str = "/usr/bin/skopeo";

/// A bind race (another process took the port between our probe and the
/// registry's bind) is retried with a new port this many times.
const START_TRIES: usize = 5;

/// How long a started registry has to answer `GET /v2/`.
const UP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(thiserror::Error)]
pub enum RegistryError {
    #[error("{0} is missing: scripts/setup.sh installs it")]
    Missing(&'static str),
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("hash the password for the registry's htpasswd")]
    Hash(#[source] bcrypt::BcryptError),
    #[error("find a free port on 127.0.0.1")]
    FreePort(#[source] io::Error),
    #[error("docker-registry did not come up on {addr}: {why}")]
    NotUp { addr: String, why: String },
    #[error("docker-registry lost the bind race {START_TRIES} times: {log}")]
    BindRace { log: String },
    #[error(
        "skopeo push of {from} as {to} failed ({status}):\n{stderr}\n--- registry log ---\n{log}"
    )]
    Push {
        from: String,
        to: String,
        status: ExitStatus,
        stderr: String,
        log: String,
    },
    #[error("{0:?} is not a sha256 digest")]
    NotSha256(String),
    #[error("no blob {0} in the registry's storage")]
    NoBlob(String),
    #[error("GET {path} from {addr}")]
    Get {
        addr: String,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// The message and its causes, for a test's `.expect` (`write_chain`).
impl fmt::Debug for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::write_chain(f, self)
    }
}

fn io_error(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> RegistryError {
    let path = path.into();
    move |source| RegistryError::Io { op, path, source }
}

pub struct Registry {
    /// `None` only while a start is between tries, and after [`Registry::stop`].
    child: Option<Child>,
    pid: u32,
    port: u16,
    creds: Option<(String, String)>,
    /// Dropped after `Drop::drop` has reaped the process, so nothing writes
    /// into it while it is removed.
    dir: tempfile::TempDir,
}

impl Registry {
    /// An anonymous registry on 127.0.0.1, up and answering `GET /v2/`.
    pub fn start() -> Result<Registry, RegistryError> {
        Registry::start_inner(None)
    }

    /// A registry that takes only `user`/`pass` (htpasswd, bcrypt: the only
    /// hash distribution's htpasswd reads).
    pub fn start_with_basic_auth(user: &str, pass: &str) -> Result<Registry, RegistryError> {
        Registry::start_inner(Some((user.to_owned(), pass.to_owned())))
    }

    fn start_inner(creds: Option<(String, String)>) -> Result<Registry, RegistryError> {
        // Both, before anything starts: a registry is only any use with
        // something to push into it.
        for bin in [REGISTRY_BIN, SKOPEO_BIN] {
            if !Path::new(bin).exists() {
                return Err(RegistryError::Missing(bin));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("drums-registry")
            .tempdir()
            .map_err(io_error("create a directory in", std::env::temp_dir()))?;
        if let Some((user, pass)) = &creds {
            // The lowest cost bcrypt allows: the registry checks the hash on
            // every request, and these credentials guard nothing.
            let hash = bcrypt::hash_with_result(pass, 4)
                .map_err(RegistryError::Hash)?
                .format_for_version(bcrypt::Version::TwoY);
            let path = dir.path().join("htpasswd");
            std::fs::write(&path, format!("{user}:{hash}\n")).map_err(io_error("write", &path))?;
        }
        // From here on a failure drops `reg`, which reaps any child and
        // removes the directory.
        let mut reg = Registry {
            child: None,
            pid: 0,
            port: 0,
            creds,
            dir,
        };
        let mut last_log = String::new();
        for _ in 0..START_TRIES {
            reg.port = free_port()?;
            let config = reg.write_config()?;
            let log_path = reg.log_path();
            let log = std::fs::File::create(&log_path).map_err(io_error("create", &log_path))?;
            let log2 = log.try_clone().map_err(io_error("reopen", &log_path))?;
            let child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                // The registry lets REGISTRY_* variables override its file:
                // the caller's environment must change neither a test nor
                // what a bench measures.
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .stdin(Stdio::null())
                .stdout(log2)
                .stderr(log)
                .spawn()
                .map_err(io_error("start", REGISTRY_BIN))?;
            reg.pid = child.id();
            reg.child = Some(child);
            match reg.wait_up() {
                Ok(()) => return Ok(reg),
                Err(log) => {
                    reg.stop();
                    if !log.contains("address already in use") {
                        return Err(RegistryError::NotUp {
                            addr: reg.addr(),
                            why: log,
                        });
                    }
                    last_log = log;
                }
            }
        }
        Err(RegistryError::BindRace { log: last_log })
    }

    /// The registry's config for the current port: its path.
    fn write_config(&self) -> Result<PathBuf, RegistryError> {
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
        let path = d.join("config.yml");
        std::fs::write(&path, cfg).map_err(io_error("write", &path))?;
        Ok(path)
    }

    /// Until our registry listens on the port and `GET /v2/` answers (200,
    /// or 401 with auth); on failure, why, with the registry's log. Whoever
    /// answers must be our child: if another process took the port in the
    /// bind race, our registry is about to exit with "address already in
    /// use", which the caller retries.
    fn wait_up(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + UP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!("exited with {st}:\n{}", self.log()));
            }
            if listens(self.pid, self.port) {
                if let Ok((status, _)) = self.request("/v2/", false) {
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
        Err(format!(
            "no answer in {} s:\n{}",
            UP_TIMEOUT.as_secs(),
            self.log()
        ))
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
        self.pid
    }

    /// Its directory: config, storage, htpasswd and log, removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The credentials it takes, if any.
    pub fn creds(&self) -> Option<(&str, &str)> {
        self.creds.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// What the registry logged (warnings and errors); empty if unreadable,
    /// as it only ever adds to an error.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Push the one image of the OCI layout at `layout` as `name_tag`
    /// ("drums/two:latest").
    pub fn push_layout(&self, layout: &Path, name_tag: &str) -> Result<(), RegistryError> {
        self.push(format!("oci:{}", layout.display()), name_tag)
    }

    /// Push the image tagged `tag` in the OCI layout at `layout` (which may
    /// hold several) as `name_tag`.
    pub fn push_layout_tag(
        &self,
        layout: &Path,
        tag: &str,
        name_tag: &str,
    ) -> Result<(), RegistryError> {
        self.push(format!("oci:{}:{tag}", layout.display()), name_tag)
    }

    /// An image index is pushed whole (`--all`), and digests are kept
    /// (`--preserve-digests`): skopeo fails rather than recompress, so what
    /// the registry serves is byte for byte what the caller wrote.
    fn push(&self, from: String, name_tag: &str) -> Result<(), RegistryError> {
        let mut cmd = Command::new(SKOPEO_BIN);
        cmd.args(["--insecure-policy", "copy", "--quiet", "--all"])
            .args(["--preserve-digests", "--dest-tls-verify=false"]);
        if let Some((u, p)) = self.creds() {
            cmd.arg(format!("--dest-creds={u}:{p}"));
        }
        let to = format!("docker://{}/{name_tag}", self.addr());
        let out = cmd
            .arg(&from)
            .arg(&to)
            .stdin(Stdio::null())
            .output()
            .map_err(io_error("run", SKOPEO_BIN))?;
        if !out.status.success() {
            return Err(RegistryError::Push {
                from,
                to,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
                log: self.log(),
            });
        }
        Ok(())
    }

    /// Overwrite a blob in the registry's storage, so that it serves `bytes`
    /// under `digest` ("sha256:HEX"): what a compromised or broken registry
    /// does, and no client can push (the registry checks uploads).
    pub fn corrupt_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), RegistryError> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| RegistryError::NotSha256(digest.to_owned()))?;
        let data = self
            .dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data");
        if !data.exists() {
            return Err(RegistryError::NoBlob(digest.to_owned()));
        }
        std::fs::write(&data, bytes).map_err(io_error("write", &data))
    }

    /// `GET path` without credentials: the status code.
    pub fn get_status(&self, path: &str) -> Result<u16, RegistryError> {
        Ok(self.get_as(path, false)?.0)
    }

    /// `GET path` (with the registry's credentials, if it has any): status
    /// and body.
    pub fn get(&self, path: &str) -> Result<(u16, Vec<u8>), RegistryError> {
        self.get_as(path, true)
    }

    fn get_as(&self, path: &str, auth: bool) -> Result<(u16, Vec<u8>), RegistryError> {
        self.request(path, auth)
            .map_err(|source| RegistryError::Get {
                addr: self.addr(),
                path: path.to_owned(),
                source,
            })
    }

    /// One HTTP/1.0 request, so the registry closes and the body ends at EOF.
    fn request(&self, path: &str, auth: bool) -> io::Result<(u16, Vec<u8>)> {
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
            .ok_or_else(|| io::Error::other("no end of headers"))?;
        let head = String::from_utf8_lossy(&resp[..end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad status line: {head}")))?;
        Ok((status, resp[end + 4..].to_vec()))
    }

    /// Kill and reap the process. A registry holds no state worth a clean
    /// shutdown: its storage goes with the directory.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    /// Kill and reap it; the directory (its storage) goes with the struct,
    /// after this.
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago: the kernel picks it for a bind to
/// port 0, and the listener is closed for the registry to take it (a race
/// [`Registry::start`] retries).
fn free_port() -> Result<u16, RegistryError> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(RegistryError::FreePort)
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

#[cfg(test)]
mod tests {
    //! These start the real registry and skopeo: without them they fail
    //! (`RegistryError::Missing`), they never pass by skipping.

    use super::*;
    use sha2::{Digest, Sha256};

    /// Gone within a few seconds: the process reaped (no /proc entry, not
    /// even a zombie), its directory removed, its port closed.
    fn assert_left_nothing(pid: u32, dir: &Path, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "registry process {pid} left behind"
        );
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "something still listens on {port}"
        );
    }

    fn start() -> Registry {
        Registry::start().expect("start docker-registry (NOT SKIPPED: failing on purpose)")
    }

    #[test]
    fn starts_serves_v2_and_leaves_nothing_behind() {
        let reg = start();
        let (pid, dir, port) = (reg.pid(), reg.dir().to_owned(), reg.port());
        assert_eq!(reg.addr(), format!("127.0.0.1:{port}"));
        assert!(listens(pid, port), "pid {pid} does not listen on {port}");
        assert_eq!(reg.get_status("/v2/").unwrap(), 200);
        assert_eq!(reg.get("/v2/").unwrap().0, 200);
        assert!(reg.creds().is_none());
        assert!(dir.join("config.yml").exists());
        drop(reg);
        assert_left_nothing(pid, &dir, port);
    }

    #[test]
    fn basic_auth_refuses_anonymous_clients() {
        let reg = Registry::start_with_basic_auth("drums", "s3cret-pass")
            .expect("start docker-registry (NOT SKIPPED: failing on purpose)");
        let (pid, dir, port) = (reg.pid(), reg.dir().to_owned(), reg.port());
        assert_eq!(reg.creds(), Some(("drums", "s3cret-pass")));
        assert_eq!(reg.get_status("/v2/").unwrap(), 401, "anonymous GET /v2/");
        assert_eq!(reg.get("/v2/").unwrap().0, 200, "GET /v2/ with credentials");
        drop(reg);
        assert_left_nothing(pid, &dir, port);
    }

    /// A two-image OCI layout, written by hand: each image one layer of
    /// `bytes` (a layer's content is opaque to skopeo and the registry).
    /// Returns the layers' digests.
    fn write_layout(dir: &Path, images: &[(&str, &[u8])]) -> Vec<String> {
        let blob = |bytes: &[u8]| {
            let hex = format!("{:x}", Sha256::digest(bytes));
            std::fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
            (format!("sha256:{hex}"), bytes.len())
        };
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let mut manifests = Vec::new();
        let mut layers = Vec::new();
        for (tag, bytes) in images {
            let (layer, layer_size) = blob(bytes);
            let config = format!(
                r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{layer}"]}}}}"#
            );
            let (config, config_size) = blob(config.as_bytes());
            let manifest = format!(
                r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":{config_size}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer}","size":{layer_size}}}]}}"#
            );
            let (manifest, manifest_size) = blob(manifest.as_bytes());
            manifests.push(format!(
                r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest}","size":{manifest_size},"annotations":{{"org.opencontainers.image.ref.name":"{tag}"}}}}"#
            ));
            layers.push(layer);
        }
        std::fs::write(
            dir.join("index.json"),
            format!(
                r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
                manifests.join(",")
            ),
        )
        .unwrap();
        layers
    }

    #[test]
    fn push_serves_the_blob_and_corrupt_blob_replaces_it() {
        let layout = tempfile::tempdir().unwrap();
        let layers = write_layout(
            layout.path(),
            &[("one", b"first layer"), ("two", b"second")],
        );
        let reg = start();
        reg.push_layout_tag(layout.path(), "two", "t/two:v1")
            .unwrap();
        let blob = format!("/v2/t/two/blobs/{}", layers[1]);
        assert_eq!(reg.get(&blob).unwrap(), (200, b"second".to_vec()));
        assert_eq!(reg.get_status("/v2/t/two/manifests/v1").unwrap(), 200);
        // Only the tag asked for went.
        assert_eq!(
            reg.get_status(&format!("/v2/t/two/blobs/{}", layers[0]))
                .unwrap(),
            404
        );
        reg.corrupt_blob(&layers[1], b"tampered").unwrap();
        assert_eq!(reg.get(&blob).unwrap(), (200, b"tampered".to_vec()));

        // A layout of several images, without a tag: skopeo refuses, and
        // the error says so with its words.
        let e = reg.push_layout(layout.path(), "t/any:v1").unwrap_err();
        assert!(matches!(e, RegistryError::Push { .. }), "{e:?}");
    }

    #[test]
    fn push_with_basic_auth() {
        let layout = tempfile::tempdir().unwrap();
        let layers = write_layout(layout.path(), &[("only", b"the layer")]);
        let reg = Registry::start_with_basic_auth("u", "p")
            .expect("start docker-registry (NOT SKIPPED: failing on purpose)");
        reg.push_layout(layout.path(), "t/only:v1").unwrap();
        let blob = format!("/v2/t/only/blobs/{}", layers[0]);
        assert_eq!(reg.get_status(&blob).unwrap(), 401);
        assert_eq!(reg.get(&blob).unwrap(), (200, b"the layer".to_vec()));
    }

    #[test]
    fn corrupt_blob_refuses_what_it_cannot_find() {
        let reg = start();
        for bad in [
            "md5:abc",
            "sha256:ab",
            "sha256:",
            &format!("sha256:{}", "g".repeat(64)),
        ] {
            let e = reg.corrupt_blob(bad, b"x").unwrap_err();
            assert!(matches!(e, RegistryError::NotSha256(_)), "{bad}: {e:?}");
        }
        let absent = format!("sha256:{}", "0".repeat(64));
        let e = reg.corrupt_blob(&absent, b"x").unwrap_err();
        assert!(matches!(e, RegistryError::NoBlob(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("no blob {absent} in the registry's storage")
        );
    }

    #[test]
    fn errors_name_the_operation_and_keep_the_source() {
        let e = RegistryError::Get {
            addr: "127.0.0.1:1".into(),
            path: "/v2/".into(),
            source: io::Error::other("refused"),
        };
        assert_eq!(e.to_string(), "GET /v2/ from 127.0.0.1:1");
        assert_eq!(
            std::error::Error::source(&e).map(|s| s.to_string()),
            Some("refused".into())
        );
        assert_eq!(format!("{e:?}"), "GET /v2/ from 127.0.0.1:1: refused");
    }
}
