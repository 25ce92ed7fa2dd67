//! Creating a session, one recorded step at a time. Each step is a fault point;
//! if any step fails, the ledger names everything made so far and
//! [`crate::teardown`] removes it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use drums_api::{CreateSession, Session};
use drums_catalog::{ResourceKind, SessionRecord};
use drums_init::{InitConfig, Report};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout, Command};

use crate::manager::{guest_client, Manager};
use crate::spec::{hostname_for, DesktopSpec, Egress, Network, Spec};
use crate::{io, process, SessionError};

impl Manager {
    /// Create a session and return once its guest agent answers.
    pub async fn create(&self, req: &CreateSession) -> Result<Session, SessionError> {
        let spec = Spec::from_request(req, &self.limits)?;
        let image = self.resolve_image(&spec.image)?;
        // The desktop's services and user come with the image's desktop
        // layer: without it the guest cannot start them, which is the
        // caller's choice of image, not drums failing.
        if spec.desktop.is_some() && !image.desktop {
            return Err(SessionError::Invalid(format!(
                "image {:?} has no desktop layer: the desktop profile needs a drums image built as desktop",
                spec.image
            )));
        }
        let id = random_hex(6);
        let name = spec.name.clone().unwrap_or_else(|| id.clone());
        let rec = SessionRecord {
            hostname: hostname_for(&name, &id),
            id,
            name,
            profile: spec.profile.clone(),
            image: image.key.clone(),
            state: "creating".into(),
            network: spec.network.as_str().into(),
            egress: spec.egress.as_str().into(),
            ip: None,
            mac: None,
            limits: serde_json::to_value(&spec.limits).expect("limits serialize"),
            init_pid: None,
            created_at_ms: drums_catalog::now_ms(),
            generation: 0,
            origin: None,
            privileged: spec.privileged,
            id_base: None,
            pool: None,
        };
        let pool = (spec.network == Network::Bridge).then(|| self.pool());
        // A privileged session keeps host root, as Podman's does.
        let ids = (!spec.privileged).then_some(crate::ids::POOL);
        // Reserves the name, the address and the id range atomically.
        // Refused before anything is made: an image with nothing to run.
        let run = match (req.run, &image.oci) {
            (false, _) => None,
            (true, Some(config)) => match crate::images::default_process(config) {
                Some(argv) => Some((argv, config.clone())),
                None => {
                    return Err(SessionError::Invalid(format!(
                        "image {:?} names no Entrypoint or Cmd to run",
                        spec.image
                    )))
                }
            },
            (true, None) => {
                return Err(SessionError::Invalid(format!(
                    "run needs an OCI image with an Entrypoint or Cmd; {:?} is a drums image",
                    spec.image
                )))
            }
        };
        let rec = self
            .catalog
            .insert_session(rec, pool, ids, self.cfg.max_sessions)?;
        let mut built = self.build(&rec, &spec, &image.rootfs, None).await;
        if let (Ok(pid), Some((argv, config))) = (&built, run) {
            if let Err(e) = start_default_process(*pid, argv, &config).await {
                built = Err(e);
            }
        }
        self.settle(&rec, built).await
    }

    /// Build the session of `rec` cold: its upper layer empty, or (`files`)
    /// a snapshot of a files-only version's files, which is how such a
    /// version comes back (docs/engine.md).
    pub(crate) async fn build(
        &self,
        rec: &SessionRecord,
        spec: &Spec,
        lower: &Path,
        files: Option<&Path>,
    ) -> Result<i32, SessionError> {
        let id = &rec.id;
        let record = |kind, key: &str| self.catalog.record(id, kind, key);

        self.faults.check("create.dir")?;
        let dir = self.cfg.state_dir.join("sessions").join(id);
        record(ResourceKind::Dir, &dir.display().to_string())?;
        std::fs::create_dir_all(dir.join("root")).map_err(io("create", dir.join("root")))?;

        self.faults.check("create.subvolume")?;
        let sv = self.store_root.join("sessions").join(id);
        record(ResourceKind::Subvolume, &sv.display().to_string())?;
        let sv2 = sv.clone();
        // Born in the sessions' qgroup with its own quota: never unlimited.
        let inherit = drums_store::QgroupInherit::session(spec.limits.disk_bytes);
        match files {
            // The version's upper and work directories, owned as the session
            // that took it owned them (the same identity, so the same ids).
            Some(src) => {
                let src = src.to_owned();
                tokio::task::spawn_blocking(move || {
                    drums_store::snapshot_with(&src, &sv2, false, &inherit)
                })
                .await
                .expect("no panic")?;
            }
            None => {
                tokio::task::spawn_blocking(move || {
                    drums_store::create_subvolume_with(&sv2, &inherit)
                })
                .await
                .expect("no panic")?;
                for d in ["upper", "work"] {
                    std::fs::create_dir(sv.join(d)).map_err(io("create", sv.join(d)))?;
                }
                crate::ids::own_upper(&sv.join("upper"), rec.id_base)?;
            }
        }

        self.faults.check("create.cgroup")?;
        record(
            ResourceKind::Cgroup,
            &format!("{}/{}", self.cfg.cgroup_parent, id),
        )?;
        let limits = crate::limits::cgroup_limits(&spec.limits);
        let (parent, name) = (self.cfg.cgroup_parent.clone(), id.clone());
        let devices = crate::spec::devices(spec.privileged);
        let cg = tokio::task::spawn_blocking(move || {
            drums_cgroup::Cgroup::create(&parent, &name, &limits, devices)
        })
        .await
        .expect("no panic")?;

        self.faults.check("create.mount")?;
        let root = dir.join("root");
        record(ResourceKind::Mount, &root.display().to_string())?;
        let (r, l, s, base) = (root.clone(), lower.to_owned(), sv.clone(), rec.id_base);
        let sys = self.sys.clone();
        tokio::task::spawn_blocking(move || crate::ids::mount_root(&*sys, &r, &l, &s, base))
            .await
            .expect("no panic")?;

        let cfg = InitConfig {
            session_id: id.clone(),
            hostname: rec.hostname.clone(),
            machine_id: random_hex(16),
            ip: rec.ip.clone(),
            cgroup_procs: cg.procs_files(),
            root: root.clone(),
            user_namespace: rec.id_base.is_some(),
            bin_dir: self.bin_dir.clone(),
            privileged: spec.privileged,
            nameservers: if spec.egress == Egress::Nat {
                self.cfg
                    .nameservers
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            } else {
                Vec::new()
            },
            session_api_port: self.cfg.session_api_port.filter(|_| rec.ip.is_some()),
            fault: self.faults.for_init(),
        };
        self.faults.check("create.spawn")?;
        let (mut init, pid) = InitPipe::spawn(
            &*self.sys,
            &self.bin_dir.join("drums-init"),
            &cfg,
            rec.id_base,
        )
        .await?;
        // The cgroup already holds the process; this row is for reaping it.
        if let Some(key) = process::ledger_key(pid) {
            record(ResourceKind::Process, &key)?;
        }
        self.catalog.set_session_state(id, "creating", Some(pid))?;

        // The network is configured while stage 1 builds the root.
        if let Err(e) = self.network(rec, spec, pid).await {
            // Stage 1 runs meanwhile: the network error may only be a
            // consequence of its exit.
            return Err(init.cause(e).await);
        }
        init.go().await?;
        // Stage 1 made its mounts private and bound the root: the host's copy
        // goes, so no session mount stays visible on the host.
        self.release_host_root(id, &root)?;

        self.faults.check("create.ready")?;
        self.wait_ready(id, pid).await?;
        if let Some(desktop) = &spec.desktop {
            self.faults.check("create.desktop")?;
            self.start_desktop(pid, desktop).await?;
        }
        Ok(pid)
    }

    /// The desktop profile: the guest agent starts Xvfb, dbus, openbox and
    /// Chromium and answers when the desktop is agent-ready.
    async fn start_desktop(&self, pid: i32, desktop: &DesktopSpec) -> Result<(), SessionError> {
        let body = drums_api::guest::DesktopStart {
            screen: Some(desktop.screen.clone()),
            url: desktop.url.clone(),
            user: None,
            timeout_ms: Some(crate::manager::DESKTOP_START_TIMEOUT.as_millis() as u64),
        };
        let _: serde_json::Value = crate::manager::desktop_start_client(pid)
            .json(hyper::Method::POST, "/v1/desktop", Some(&body))
            .await
            .map_err(|e| SessionError::Desktop(e.into()))?;
        Ok(())
    }

    async fn network(
        &self,
        rec: &SessionRecord,
        spec: &Spec,
        pid: i32,
    ) -> Result<(), SessionError> {
        let id = &rec.id;
        self.faults.check("create.network")?;
        match spec.network {
            Network::Bridge => {
                let host_name = veth_name(id);
                self.catalog.record(id, ResourceKind::Link, &host_name)?;
                let ip = rec
                    .ip
                    .as_deref()
                    .and_then(|s| s.parse().ok())
                    .expect("bridge sessions have an address");
                let egress = spec.egress == Egress::Nat;
                if egress {
                    self.ip_forward
                        .enable()
                        .map_err(drums_net::NetError::from)?;
                }
                self.net
                    .create_session_veth(&drums_net::VethSpec {
                        host_name,
                        bridge: self.cfg.bridge.clone(),
                        netns_pid: pid,
                        mac: parse_mac(rec.mac.as_deref().unwrap_or_default()),
                        ip,
                        prefix: self.cfg.prefix,
                        gateway: self.gateway(),
                        egress,
                        listed: false,
                    })
                    .await?;
            }
            Network::None => drums_net::loopback_up(pid).await?,
        }
        Ok(())
    }

    /// Ready means the guest agent answers its health check. The socket appears
    /// only when the agent listens, so a failed connect costs microseconds.
    pub(crate) async fn wait_ready(&self, id: &str, pid: i32) -> Result<(), SessionError> {
        let client = guest_client(pid);
        let start = Instant::now();
        loop {
            if client
                .call(hyper::Method::GET, "/v1/health", None::<&()>)
                .await
                .is_ok()
            {
                return Ok(());
            }
            let waited_ms = start.elapsed().as_millis() as u64;
            if !process::alive(pid) {
                return Err(SessionError::NotReady {
                    id: id.into(),
                    waited_ms,
                    detail: ": its init exited".into(),
                });
            }
            if start.elapsed() > self.cfg.ready_timeout {
                // The session's own file: read inside its root, never through
                // a symlink it made, never a FIFO that would block drumsd
                // (O_NONBLOCK, then a regular file only), and at most 64 KiB.
                let log = drums_sys::open_in_root(
                    &crate::manager::session_root(pid),
                    std::path::Path::new(drums_init::INIT_LOG),
                    nix::fcntl::OFlag::O_RDONLY
                        | nix::fcntl::OFlag::O_NOFOLLOW
                        | nix::fcntl::OFlag::O_NONBLOCK,
                )
                .ok()
                .filter(|fd| {
                    nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(fd))
                        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
                })
                .map(|fd| {
                    let mut text = String::new();
                    let _ = std::io::Read::read_to_string(
                        &mut std::io::Read::take(std::fs::File::from(fd), 64 << 10),
                        &mut text,
                    );
                    text
                })
                .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                let detail = if tail.is_empty() {
                    String::new()
                } else {
                    format!("; init log: {}", tail.join(" | "))
                };
                return Err(SessionError::NotReady {
                    id: id.into(),
                    waited_ms,
                    detail,
                });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The pipe to drums-init during stages 0 and 1.
struct InitPipe {
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl InitPipe {
    /// Start stage 0 with `cfg`; with an id range (`base`), write the maps of
    /// its new user namespace when it asks.
    async fn spawn(
        sys: &(dyn drums_sys::Syscall + Send + Sync),
        bin: &Path,
        cfg: &InitConfig,
        base: Option<u32>,
    ) -> Result<(InitPipe, i32), SessionError> {
        // Never drumsd's own environment (drums_init::environment says why);
        // stage 1 sets the session's own at its exec.
        let mut child = Command::new(bin)
            .env_clear()
            .env("PATH", drums_init::PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io("spawn", bin))?;
        let stage0 = child.id().expect("not yet reaped") as i32;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        // Stage 0 exits right after the fork; reap it.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let mut pipe = InitPipe {
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        let mut line = serde_json::to_string(cfg).expect("config serializes");
        line.push('\n');
        pipe.send(&line).await?;
        let mut report = pipe.next().await?;
        if let (Report::MapIds, Some(base)) = (&report, base) {
            sys.write_id_maps(stage0, &crate::ids::session_map(base))?;
            pipe.send("mapped\n").await?;
            report = pipe.next().await?;
        }
        match report {
            Report::Pid(pid) => Ok((pipe, pid)),
            other => Err(unexpected(other)),
        }
    }

    async fn send(&mut self, line: &str) -> Result<(), SessionError> {
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|source| SessionError::InitPipe {
                op: "write to",
                source,
            })
    }

    async fn next(&mut self) -> Result<Report, SessionError> {
        let line = tokio::time::timeout(Duration::from_secs(15), self.lines.next_line())
            .await
            .map_err(|_| SessionError::Init("drums-init did not report within 15 s".into()))?
            .map_err(|source| SessionError::InitPipe {
                op: "read from",
                source,
            })?
            .ok_or_else(|| SessionError::Init("drums-init exited without reporting".into()))?;
        let r: Report = serde_json::from_str(&line)
            .map_err(|source| SessionError::InitReport { line, source })?;
        match r {
            Report::Error(m) => Err(SessionError::Init(m)),
            r => Ok(r),
        }
    }

    /// The root cause of `e`, a failure that stage 1's exit may explain: if
    /// stage 1 failed, its own report (already on the pipe, or about to be)
    /// names the cause. A healthy stage 1 says nothing until `go`, so the
    /// short wait only costs time on a failure path.
    async fn cause(&mut self, e: SessionError) -> SessionError {
        match tokio::time::timeout(Duration::from_millis(300), self.next()).await {
            Ok(Err(init_err)) => init_err,
            _ => e,
        }
    }

    /// Let stage 1 go on to start the services, and wait for its `ok`.
    async fn go(&mut self) -> Result<(), SessionError> {
        if let Err(e) = self.send("go\n").await {
            // Stage 1 exited without reading it (a broken pipe).
            return Err(self.cause(e).await);
        }
        match self.next().await? {
            Report::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(r: Report) -> SessionError {
    SessionError::Init(format!("unexpected report {r:?}"))
}

/// The host end of a session's veth: `drums` + 10 hex digits of the id, 15
/// characters, the kernel's limit.
pub fn veth_name(id: &str) -> String {
    format!("drums{}", &id[..10.min(id.len())])
}

pub(crate) fn parse_mac(s: &str) -> [u8; 6] {
    let mut mac = [0u8; 6];
    for (i, part) in s.split(':').take(6).enumerate() {
        mac[i] = u8::from_str_radix(part, 16).unwrap_or(0);
    }
    mac
}

/// Random lowercase hex from the kernel's RNG.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut f = std::fs::File::open("/dev/urandom").expect("/dev/urandom is always there");
    std::io::Read::read_exact(&mut f, &mut buf).expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a session's default process writes, inside the session.
pub const MAIN_LOG: &str = "/var/log/drums/main.log";

/// The image's default process, detached, with the image's config: its
/// failure to start (no such program, no such user) fails the create.
async fn start_default_process(
    pid: i32,
    argv: Vec<String>,
    config: &drums_oci::ImageConfig,
) -> Result<(), SessionError> {
    let mut req = drums_api::ExecRequest {
        argv,
        detach: true,
        log: Some(MAIN_LOG.into()),
        ..Default::default()
    };
    crate::images::apply_defaults(&mut req, config);
    let _: serde_json::Value = guest_client(pid)
        .json(hyper::Method::POST, "/v1/exec", Some(&req))
        .await
        .map_err(|e| {
            SessionError::Invalid(format!(
                "start the image's default process {:?}: {}",
                req.argv,
                crate::error_chain(&e)
            ))
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_macs() {
        assert_eq!(veth_name("0123456789abcdef"), "drums0123456789");
        assert_eq!(veth_name("0123456789abcdef").len(), 15);
        assert_eq!(parse_mac("02:64:0a:d5:00:02"), [2, 0x64, 10, 0xd5, 0, 2]);
        assert_eq!(random_hex(6).len(), 12);
        assert_ne!(random_hex(8), random_hex(8));
    }
}
