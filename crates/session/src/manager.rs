//! The session manager: drumsd's façade over the subsystems. [`Host`] holds
//! the host's resources, `boot` takes a root to a ready session, `checkpoint`
//! and `versions` take and keep versions, `restore` makes siblings; this file
//! starts and stops them together and answers the API's plain questions.

use drums_api::{Egress, Network, SessionState, VersionState};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use drums_api::{Limits, Session};
use drums_catalog::{ResourceKind, SessionRecord};
use drums_image::ImageStore;
use tracing::{info, warn};

pub use crate::host::{
    installed_bin_dir, Host, ManagerConfig, DAEMON, DEFAULT_DISK_BYTES, MIN_STORE_RESERVE,
};
pub use crate::streams::GuestStream;
use crate::{teardown, SessionError};

pub struct Manager {
    /// The host's resources, made once at start and shared read-only.
    pub(crate) host: Arc<Host>,
    /// Versions: the engine, each session's position, retention, budgets.
    pub(crate) versions: crate::versions::Versions,
    /// Checkpoints: which were verified, and who reads which right now.
    pub(crate) checkpoints: crate::checkpoint::Checkpoints,
    /// Requests passed through to each session's guest that are still open.
    pub(crate) guest_streams: crate::streams::GuestStreams,
    /// The eBPF inspector and the news of turns it tells subscribers.
    pub(crate) turns: crate::inspect::Turns,
}

/// The sessions a previous daemon left that the sweep keeps.
#[derive(Default)]
pub(crate) struct Found {
    /// Their init still runs: adopted as they are.
    adopted: Vec<SessionRecord>,
    /// Running, but their processes died: recovered from their newest version.
    dead: Vec<SessionRecord>,
}

impl Manager {
    /// Open everything, sweep what a previous daemon left, and make the bridge.
    pub async fn start(cfg: ManagerConfig) -> Result<Manager, SessionError> {
        let host = Arc::new(Host::open(cfg).await?);
        let m = Manager {
            versions: crate::versions::Versions::new(
                host.cfg.turn_versions_per_minute,
                host.cfg.checkpoint_workers,
            )?,
            checkpoints: Default::default(),
            guest_streams: Default::default(),
            turns: crate::inspect::Turns::new(&host.cfg.cgroup_parent),
            host,
        };
        let found = m.sweep().await;

        m.host
            .catalog
            .record(DAEMON, ResourceKind::Link, &m.host.cfg.bridge)?;
        // The bridge's firewall (made by ensure_bridge) is the daemon's too,
        // and goes before the bridge at shutdown (newest row first).
        m.host
            .catalog
            .record(DAEMON, ResourceKind::NftTable, &m.host.cfg.bridge)?;
        m.host
            .net
            .ensure_bridge(
                &m.host.cfg.bridge,
                m.host.gateway(),
                m.host.cfg.prefix,
                &m.host.cfg.bridge_services,
            )
            .await?;
        drums_net::firewall::set_resolvers(&m.host.cfg.bridge, &m.host.cfg.nameservers)
            .map_err(drums_net::NetError::from)?;
        // The cgroup parent, with the caps on all sessions together; after the
        // sweep, so a previous daemon's sessions no longer count against them.
        m.host
            .catalog
            .record(DAEMON, ResourceKind::Cgroup, &m.host.cfg.cgroup_parent)?;
        let (parent, caps) = (m.host.cfg.cgroup_parent.clone(), m.host.cfg.sessions_caps);
        tokio::task::spawn_blocking(move || drums_cgroup::ensure_parent(&parent, &caps))
            .await
            .expect("no panic")?;
        m.take_over(found).await;
        Ok(m)
    }

    /// The sessions a previous daemon left, once the bridge and its firewall
    /// are back: the live ones get their firewall ports again (installing
    /// the firewall forgot them), the dead ones with a version come back
    /// from their newest (see docs/engine.md, "A daemon restart").
    async fn take_over(&self, found: Found) {
        for s in &found.adopted {
            if s.network != Network::Bridge {
                continue;
            }
            let port = drums_net::firewall::Port {
                ifname: crate::create::veth_name(&s.id),
                mac: crate::create::parse_mac(s.mac.as_deref().unwrap_or_default()),
                ip: match s.ip.as_deref().and_then(|ip| ip.parse().ok()) {
                    Some(ip) => ip,
                    None => continue,
                },
                egress: s.egress == Egress::Nat,
            };
            if port.egress {
                if let Err(e) = self.host.ip_forward.enable() {
                    warn!("adopt {}: ip_forward: {e}", s.name);
                }
            }
            if let Err(e) = drums_net::firewall::add_port(&self.host.cfg.bridge, &port) {
                warn!(
                    "adopt {}: firewall port: {}",
                    s.name,
                    crate::error_chain(&e)
                );
            }
        }
        for s in found.dead {
            info!(session = %s.id, name = %s.name, "recovering a session whose processes died with the previous daemon");
            if let Err(e) = self.recover_record(&s).await {
                warn!("recover {}: {}", s.name, crate::error_chain(&e));
            }
        }
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.host.cfg
    }

    /// The limits every session is held to, with the defaults resolved.
    pub fn limit_policy(&self) -> &crate::limits::LimitPolicy {
        &self.host.limits
    }

    /// The bridge's own address: the sessions' gateway, where drumsd serves
    /// its session API.
    pub fn bridge_address(&self) -> Ipv4Addr {
        self.host.gateway()
    }

    /// The running session whose network address is `ip`, if any. What a
    /// connection's source address says about who is calling is only as
    /// good as the network's anti-spoofing: see drumsd's session API.
    pub fn session_at(&self, ip: Ipv4Addr) -> Result<Option<Session>, SessionError> {
        let ip = ip.to_string();
        Ok(self
            .host
            .catalog
            .sessions()?
            .into_iter()
            .find(|r| r.network == Network::Bridge && r.ip.as_deref() == Some(ip.as_str()))
            .map(to_api))
    }

    /// The fault points drumsd's test API arms.
    pub fn faults(&self) -> &crate::faults::Faults {
        &self.host.faults
    }

    pub fn images(&self) -> &ImageStore {
        &self.host.images
    }

    /// What a previous daemon left: a session whose init still runs is
    /// adopted as it is (as Docker's live-restore and containerd's shims
    /// keep containers); one that was running but whose processes died and
    /// that has a done version is kept to be recovered once the network is
    /// back; every other session is removed, then any resource whose owner
    /// is gone. Errors are logged, not fatal: the sweep runs again at the
    /// next start, and the rows it could not remove stay in the ledger.
    async fn sweep(&self) -> Found {
        let mut found = Found::default();
        // A pull or import cut short: its staging, and layers no image uses.
        let oci = self.host.oci.clone();
        match tokio::task::spawn_blocking(move || oci.sweep())
            .await
            .expect("no panic")
        {
            Ok(s) if s != drums_oci::Swept::default() => {
                info!(
                    staging = s.staging,
                    layers = s.layers,
                    "sweep: removed what an image pull or import left"
                )
            }
            Ok(_) => {}
            Err(e) => warn!("sweep: images: {}", crate::error_chain(&e)),
        }
        let sessions = match self.host.catalog.sessions() {
            Ok(s) => s,
            Err(e) => {
                warn!("sweep: list sessions: {e}");
                return found;
            }
        };
        for s in sessions {
            if self.host.live_init(&s).is_some() {
                info!(session = %s.id, name = %s.name, "adopting a live session left by a previous daemon");
                // Killed in the middle of a checkpoint, that daemon may have
                // left the session frozen.
                match drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &s.id)
                    .thaw_if_frozen()
                {
                    Ok(true) => {
                        info!(session = %s.id, "thawed: the previous daemon left it frozen")
                    }
                    Ok(false) => {}
                    Err(e) => warn!(session = %s.id, "sweep: thaw: {e}"),
                }
                found.adopted.push(s);
                continue;
            }
            let has_version = self
                .host
                .catalog
                .session_versions(&s.id)
                .is_ok_and(|v| v.iter().any(|v| v.state == VersionState::Done));
            if s.state == SessionState::Running && has_version {
                found.dead.push(s);
                continue;
            }
            info!(session = %s.id, name = %s.name, state = %s.state, "sweep: removing a session left by a previous daemon");
            if let Err(e) = self.remove_record(&s).await {
                warn!("sweep: {}", crate::error_chain(&e));
            }
        }
        let kept: Vec<String> = found
            .adopted
            .iter()
            .chain(&found.dead)
            .map(|s| s.id.clone())
            .collect();
        // Resources whose session row is gone (a crash inside create or rm).
        if let Ok(all) = self.host.catalog.all_resources() {
            let mut owners: Vec<String> = all
                .into_iter()
                .map(|r| r.owner)
                .filter(|o| o != DAEMON && !kept.contains(o))
                .collect();
            owners.sort();
            owners.dedup();
            for o in owners {
                info!(owner = %o, "sweep: removing resources of a vanished session");
                if let Err(e) = teardown::remove_owned(&self.host, &o).await {
                    warn!("sweep: {}", crate::error_chain(&e));
                }
            }
        }
        // Versions that never got published: their parts went with their
        // ledger rows just above. A removal that a crash interrupted is
        // finished.
        if let Ok(vs) = self.host.catalog.versions() {
            for v in vs {
                if v.state.in_flight() {
                    info!(version = %v.id, state = %v.state, "sweep: dropping an unpublished version");
                    let _ = self.host.catalog.delete_version(&v.id);
                } else if v.state == VersionState::Removing {
                    if let Err(e) = self.drop_version(&v).await {
                        warn!("sweep: {}", crate::error_chain(&e));
                    }
                }
            }
        }
        // Cgroups under our parent that no ledger row names (belt and braces:
        // the ledger records them first, so this finds nothing unless the
        // catalog itself was lost).
        for child in drums_cgroup::list_children(&self.host.cfg.cgroup_parent) {
            if kept.contains(&child) {
                continue;
            }
            warn!(cgroup = %child, "sweep: removing an unrecorded cgroup");
            let cg = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &child);
            if let Err(e) = tokio::task::spawn_blocking(move || cg.remove())
                .await
                .expect("no panic")
            {
                warn!("sweep: {}", crate::error_chain(&e));
            }
        }
        found
    }

    pub fn list(&self) -> Result<Vec<Session>, SessionError> {
        let mut ports = std::collections::HashMap::new();
        Ok(self
            .host
            .catalog
            .sessions()?
            .into_iter()
            .map(|r| {
                let p = ports
                    .entry(r.image.clone())
                    .or_insert_with(|| self.image_ports(&r.image))
                    .clone();
                Session {
                    ports: p,
                    ..to_api(r)
                }
            })
            .collect())
    }

    pub fn get(&self, id_or_name: &str) -> Result<Session, SessionError> {
        let r = self.host.record(id_or_name)?;
        let ports = self.image_ports(&r.image);
        Ok(Session { ports, ..to_api(r) })
    }

    /// What the session's cgroup accounts right now.
    pub fn stats(&self, id_or_name: &str) -> Result<drums_api::SessionStats, SessionError> {
        let rec = self.host.record(id_or_name)?;
        let cg = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id);
        Ok(drums_api::SessionStats {
            memory_bytes: cg.memory_usage(),
            pids: cg.pids().map(|p| p.len() as u64)?,
        })
    }

    /// Count a request passed through to session `id`'s guest as open until
    /// the guard (kept with its answer's body) is dropped.
    pub fn guest_stream(&self, id: &str) -> GuestStream {
        self.guest_streams.open(id)
    }

    /// A client of a running session's guest agent for requests passed
    /// through from the API (exec, files): the socket resolved inside the
    /// session's root, an error body read only up to [`GUEST_MAX_BODY`], and
    /// no time limit, since an exec or an upload may rightly take hours.
    pub fn guest_proxy(&self, s: &Session) -> Result<drums_api::Client, SessionError> {
        match s.init_pid {
            Some(pid) if s.state == SessionState::Running => {
                Ok(guest_client(pid).with_limits(None, Some(GUEST_MAX_BODY)))
            }
            _ => Err(SessionError::NotRunning {
                name: s.name.clone(),
                state: s.state,
            }),
        }
    }

    /// The end of a create or a restore: a built session runs; a failed one
    /// is torn down by its ledger rows, and its row goes too, unless the
    /// teardown itself failed: then the row stays for `drums rm` or the next
    /// sweep to finish the job.
    pub(crate) async fn settle(
        &self,
        rec: &SessionRecord,
        built: Result<i32, SessionError>,
    ) -> Result<Session, SessionError> {
        match built {
            Ok(pid) => {
                self.host
                    .catalog
                    .set_session_state(&rec.id, SessionState::Running, Some(pid))?;
                self.get(&rec.id)
            }
            Err(e) => {
                match teardown::remove_owned(&self.host, &rec.id).await {
                    Ok(()) => self.host.catalog.delete_session(&rec.id)?,
                    Err(t) => warn!(
                        "clean up failed session {}: {}",
                        rec.id,
                        crate::error_chain(&t)
                    ),
                }
                Err(e)
            }
        }
    }

    /// `drums rm`: kill the session and remove everything it owned.
    pub async fn remove(&self, id_or_name: &str) -> Result<(), SessionError> {
        let rec = self.host.record(id_or_name)?;
        self.remove_record(&rec).await?;
        self.remove_fork_checkpoint(&rec).await;
        Ok(())
    }

    /// A fork's checkpoint (made without `keep`) goes with the last session
    /// restored from it. Its removal failing leaves a checkpoint `drums
    /// checkpoint rm` removes; the session is gone either way.
    async fn remove_fork_checkpoint(&self, rec: &SessionRecord) {
        let Some(ck) = &rec.origin else {
            return;
        };
        let last = || -> Result<bool, SessionError> {
            Ok(self.host.catalog.with_siblings(ck)?
                && !self
                    .host
                    .catalog
                    .sessions()?
                    .iter()
                    .any(|s| s.origin.as_deref() == Some(ck.as_str())))
        };
        match last() {
            Ok(false) => {}
            Ok(true) => match self.remove_checkpoint(ck).await {
                Ok(()) => {
                    info!(checkpoint = %ck, "the fork's checkpoint went with its last sibling")
                }
                // Removed by hand meanwhile.
                Err(SessionError::CheckpointNotFound(_)) => {}
                Err(e) => {
                    warn!(checkpoint = %ck, "remove the fork's checkpoint with its last sibling: {}", crate::error_chain(&e))
                }
            },
            Err(e) => {
                warn!(checkpoint = %ck, "find the siblings of a fork's checkpoint: {}", crate::error_chain(&e))
            }
        }
    }

    /// Checkpoint `id` was made by a fork, and goes with its last sibling.
    pub fn checkpoint_goes_with_siblings(&self, id: &str) -> Result<(), SessionError> {
        Ok(self.host.catalog.set_with_siblings(id)?)
    }

    /// A version being taken finishes first and queued ones are dropped: a
    /// remove never kills what CRIU has seized. The state goes to removing
    /// before, so no new version starts (it would find the session not
    /// running, 409).
    async fn remove_record(&self, rec: &SessionRecord) -> Result<(), SessionError> {
        self.host
            .catalog
            .set_session_state(&rec.id, SessionState::Removing, None)?;
        self.versions.engine().cancel_session(&rec.id).await;
        self.remove_stopped(rec).await
    }

    /// Remove a session none of whose versions is being taken, or from
    /// inside the job that takes its last one (a checkpoint without
    /// `leave_running`, which waiting for its own job would deadlock).
    pub(crate) async fn remove_stopped(&self, rec: &SessionRecord) -> Result<(), SessionError> {
        self.host
            .catalog
            .set_session_state(&rec.id, SessionState::Removing, None)?;
        self.forget_turns(&rec.name);
        teardown::remove_owned(&self.host, &rec.id).await?;
        // Its history goes with it, but for what a person pinned.
        self.drop_history(&rec.id).await?;
        self.host.catalog.delete_session(&rec.id)?;
        Ok(())
    }

    /// Daemon shutdown: every session, then the daemon's own resources (the
    /// bridge and its firewall, the cgroup parent, the store's mount), then
    /// `ip_forward` as drumsd found it.
    pub async fn shutdown(&self) -> Result<(), SessionError> {
        let mut first_err = None;
        // Queued versions are dropped, running ones finish.
        self.versions.engine().shutdown().await;
        for s in self.host.catalog.sessions()? {
            if let Err(e) = self.remove_record(&s).await {
                warn!("shutdown: {}", crate::error_chain(&e));
                first_err.get_or_insert(e);
                continue;
            }
            self.remove_fork_checkpoint(&s).await;
        }
        // The Store handle's own close would unmount too; the ledger row does the
        // same, so drop the handle first and let one path do it.
        self.host.forget_store();
        if let Err(e) = teardown::remove_owned(&self.host, DAEMON).await {
            warn!("shutdown: {}", crate::error_chain(&e));
            first_err.get_or_insert(e);
        }
        // Last: no session of ours needs forwarding any more.
        if let Err(e) = self.host.ip_forward.restore() {
            warn!("shutdown: {}", crate::error_chain(&e));
            first_err.get_or_insert(drums_net::NetError::from(e).into());
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// How long drumsd waits for a guest agent's answer to one of its own calls
/// (health, hygiene, desktop start and readiness, audit): a hostile or hung
/// guest costs one task this long, never drumsd. A desktop's cold start is
/// slower and has its own budget ([`DESKTOP_START_TIMEOUT`]).
pub const GUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// A desktop's cold start, from Xvfb to agent-ready: a few seconds, but
/// several at once on a loaded 2-core machine can take tens of seconds.
/// drumsd sends it as the guest's budget.
pub const DESKTOP_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// How much longer than the budget it gave a guest drumsd waits for the
/// answer, so that the guest's own error, which names the late step, is
/// what the user reads rather than drumsd's "did not answer".
pub const GUEST_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
/// The largest guest answer drumsd reads whole: its own calls answer a few
/// KiB of JSON.
pub const GUEST_MAX_BODY: usize = 16 << 20;

/// The session's root as the host sees it.
pub fn session_root(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root"))
}

/// A client of the guest agent of the session whose init is `pid`, for
/// drumsd's own calls: the socket resolved inside the session's root, never
/// through a symlink of the session's, and every call bounded in time and
/// size ([`GUEST_TIMEOUT`], [`GUEST_MAX_BODY`]).
pub fn guest_client(pid: i32) -> drums_api::Client {
    drums_api::Client::in_root(session_root(pid), drums_init::GUEST_SOCKET)
        .with_limits(Some(GUEST_TIMEOUT), Some(GUEST_MAX_BODY))
}

/// [`guest_client`] for a desktop's cold start, which may take
/// [`DESKTOP_START_TIMEOUT`].
pub fn desktop_start_client(pid: i32) -> drums_api::Client {
    guest_client(pid).with_limits(
        Some(DESKTOP_START_TIMEOUT + GUEST_GRACE),
        Some(GUEST_MAX_BODY),
    )
}

pub(crate) fn to_api(r: SessionRecord) -> Session {
    Session {
        limits: serde_json::from_value::<Limits>(r.limits).unwrap_or_default(),
        id: r.id,
        name: r.name,
        profile: r.profile,
        image: r.image,
        state: r.state,
        hostname: r.hostname,
        network: r.network,
        egress: r.egress,
        ip: r.ip,
        mac: r.mac,
        init_pid: r.init_pid,
        created_at_ms: r.created_at_ms,
        generation: r.generation,
        origin: r.origin,
        privileged: r.privileged,
        ports: Vec::new(),
        pool: r.pool,
    }
}
