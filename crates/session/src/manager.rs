//! The session manager: owns the catalog, the store, the images and the host
//! network, and is what drumsd's API calls into.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use drums_api::{Limits, Session};
use drums_catalog::{Catalog, IpPool, ResourceKind, SessionRecord};
use drums_image::ImageStore;
use drums_net::Net;
use drums_store::Store;
use drums_sys::{LinuxSyscall, MsFlags, Syscall};
use tracing::{info, warn};

use crate::faults::Faults;
use crate::{io, teardown, SessionError};

/// The owner name of the daemon's own resources in the ledger.
pub const DAEMON: &str = "daemon";

#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Everything drums keeps: catalog, store, session directories.
    pub state_dir: PathBuf,
    pub images_dir: PathBuf,
    /// Where drums-init and drums-guest were built; they are copied into the
    /// state directory so sessions never see the build tree.
    pub bin_src: PathBuf,
    pub bridge: String,
    /// The bridge's network: the bridge takes .1, sessions .2 upwards.
    pub subnet: Ipv4Addr,
    pub prefix: u8,
    /// The ports drums serves to sessions on the bridge address: the only new
    /// connections the firewall lets a session open to the host. Empty by
    /// default; the coordinator's proxy adds its own.
    pub bridge_services: Vec<drums_net::Service>,
    /// The TCP port of drumsd's session API on the bridge address (it must
    /// be in `bridge_services` too), passed to every new session's guest
    /// agent so its rollback tool can reach it; `None`: not served.
    pub session_api_port: Option<u16>,
    /// Name servers a session with egress `nat` gets in /etc/resolv.conf and
    /// may query on port 53, private range or not (see
    /// drums_net::firewall::set_resolvers).
    pub nameservers: Vec<Ipv4Addr>,
    /// Name of the cgroup under which every session's cgroup lives.
    pub cgroup_parent: String,
    /// Size of the sparse btrfs image when the state directory is not on btrfs.
    pub store_size: u64,
    /// Bytes of the store kept from sessions for drumsd's own subvolume
    /// creates, snapshots and deletes: all sessions and checkpoints together are
    /// limited (one qgroup) to the store's size minus this. `None`: 10% of the
    /// store, at least [`MIN_STORE_RESERVE`].
    pub store_reserve: Option<u64>,
    /// Limits a session gets where its request names none. `disk_bytes: None`
    /// means the smaller of 10 GiB and what the store holds for sessions.
    pub default_limits: Limits,
    /// What all sessions together may use (the parent cgroup's limits).
    pub sessions_caps: drums_cgroup::ParentCaps,
    pub fault_injection: bool,
    /// The registries pulls may reach; `None`: any.
    pub allowed_registries: Option<Vec<String>>,
    /// The most one OCI layer may unpack to, and its blob may be.
    pub image_layer_max: u64,
    pub ready_timeout: Duration,
    /// Versions a session's turn ends may take per minute (drumsd's
    /// `--turn-versions-per-minute`).
    pub turn_versions_per_minute: u32,
    /// The most sessions held at once, pools' members included (drumsd's
    /// `--max-sessions`); `None`: no such limit.
    pub max_sessions: Option<u64>,
}

pub struct Manager {
    pub(crate) cfg: ManagerConfig,
    /// The seam for mounts, namespaces and id maps: [`LinuxSyscall`] here,
    /// a recording in unit tests.
    pub(crate) sys: std::sync::Arc<dyn Syscall + Send + Sync>,
    pub(crate) catalog: std::sync::Arc<Catalog>,
    pub(crate) store_root: PathBuf,
    /// Kept open for the daemon's life; its mount is in the ledger too.
    _store: Mutex<Option<Store>>,
    pub(crate) images: ImageStore,
    /// OCI images, in the btrfs store (docs/oci.md).
    pub(crate) oci: drums_oci::OciStore,
    pub(crate) net: Net,
    /// `net.ipv4.ip_forward`, turned on with the first session that has
    /// egress `nat` and put back at shutdown.
    pub(crate) ip_forward: drums_net::IpForward,
    pub faults: Faults,
    pub(crate) bin_dir: PathBuf,
    pub(crate) criu: drums_criu::Criu,
    /// This host as a checkpoint records it, and as a restore checks it.
    pub(crate) host: drums_checkpoint::HostFingerprint,
    /// Checkpoints whose image checksums were verified, with the images'
    /// newest mtime then: a full check costs ~2.5 ms per MiB, so it runs at
    /// the first restore after a daemon start and again only if an image
    /// changed; every restore checks sizes.
    pub(crate) verified: Mutex<std::collections::HashMap<String, i128>>,
    /// Loads its eBPF programs with the first inspected session.
    pub(crate) inspector: drums_inspect::Inspector,
    pub(crate) turns: tokio::sync::broadcast::Sender<crate::inspect::TurnNews>,
    /// The defaults and bounds every request and manifest is held to.
    pub(crate) limits: crate::limits::LimitPolicy,
    /// The host's checkpoint scheduler: every version of every session.
    pub(crate) engine: drums_engine::Scheduler<crate::versions::VersionJob>,
    pub(crate) positions: crate::versions::Positions,
    /// Sessions whose old versions are being dropped right now.
    pub(crate) retaining: Mutex<std::collections::HashSet<String>>,
    /// Requests passed through to each session's guest that are still open
    /// (`drums exec`, file transfers): CRIU cannot dump the guest's end of
    /// such a connection, whose peer is drumsd.
    pub(crate) guest_streams: std::sync::Arc<Mutex<std::collections::HashMap<String, usize>>>,
    /// Per version: a removal (`drums checkpoint rm`, retention) waits for
    /// the restores, rollbacks and recoveries reading it (see `busy`).
    pub(crate) busy_checkpoints: crate::busy::Locks,
    /// Per session: the versions its turn ends took lately.
    pub(crate) turn_versions: crate::budget::Budget,
}

/// How long a checkpoint waits for a guest stream that is ending.
const GUEST_STREAM_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// An open request to a session's guest; see [`Manager::guest_stream`].
pub struct GuestStream {
    streams: std::sync::Arc<Mutex<std::collections::HashMap<String, usize>>>,
    id: String,
}

impl Drop for GuestStream {
    fn drop(&mut self) {
        let mut all = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = all.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                all.remove(&self.id);
            }
        }
    }
}

/// The sessions a previous daemon left that the sweep keeps.
#[derive(Default)]
pub(crate) struct Found {
    /// Their init still runs: adopted as they are.
    adopted: Vec<SessionRecord>,
    /// Running, but their processes died: recovered from their newest version.
    dead: Vec<SessionRecord>,
}

/// Mount CRIU's /run, a tmpfs, at `at`, or remount the one an older daemon
/// left there (`is_tmpfs`) with today's flags.
fn mount_criu_run(sys: &dyn Syscall, at: &Path, is_tmpfs: bool) -> Result<(), SessionError> {
    // Not noexec: swrk maps drums' prlimit shim from it (see
    // drums_criu::Criu::with_run_dir). Root-only (0700), as it holds
    // code root runs. A tmpfs left by an older daemon is remounted with
    // these flags.
    let remount = if is_tmpfs {
        MsFlags::MS_REMOUNT
    } else {
        MsFlags::empty()
    };
    sys.mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        remount | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=16m,mode=0700"),
    )
    .map_err(|e| SessionError::Io {
        op: "mount tmpfs",
        path: at.to_owned(),
        source: e.source.into(),
    })
}

/// The disk quota a session gets when neither its request nor drumsd's config
/// names one: room for a desktop's browser profile and caches, an apt or pip
/// install or two, and a build tree.
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;

/// The least of the store kept for drumsd by default: a subvolume delete or a
/// snapshot needs metadata space in the worst case of a few hundred MiB on a
/// store that sessions have filled.
pub const MIN_STORE_RESERVE: u64 = 256 << 20;

impl Manager {
    /// Open everything, sweep what a previous daemon left, and make the bridge.
    pub async fn start(cfg: ManagerConfig) -> Result<Manager, SessionError> {
        let sys: std::sync::Arc<dyn Syscall + Send + Sync> = std::sync::Arc::new(LinuxSyscall);
        let state = &cfg.state_dir;
        std::fs::create_dir_all(state.join("sessions"))
            .map_err(io("create", state.join("sessions")))?;
        let catalog = std::sync::Arc::new(Catalog::open(&state.join("catalog.db"))?);
        let bin_dir = installed_bin_dir(state);
        install_binaries(&cfg.bin_src, &bin_dir)?;

        // The store: record its mount before making it, so a crash between
        // mount and record cannot leak it.
        let store_mount = state.join("store");
        catalog.record(
            DAEMON,
            ResourceKind::Mount,
            &store_mount.display().to_string(),
        )?;
        let (state2, size, sys2) = (state.clone(), cfg.store_size, sys.clone());
        let store = tokio::task::spawn_blocking(move || Store::open_with(&*sys2, &state2, size))
            .await
            .expect("store open does not panic")?;
        let store_root = store.root().to_path_buf();
        if !matches!(store.backing(), drums_store::Backing::Loop { .. }) {
            // Native btrfs: nothing is mounted, so there is nothing to unmount.
            let rows = catalog.owned_by(DAEMON)?;
            if let Some(r) = rows.iter().find(|r| r.kind == ResourceKind::Mount) {
                catalog.release(r.seq)?;
            }
        }
        std::fs::create_dir_all(store_root.join("sessions"))
            .map_err(io("create", store_root.join("sessions")))?;
        let limits = quota_store(&store_root, &cfg)?;
        let mut oci = crate::images::open_oci(&store_root, &catalog)?;
        oci.limits.max_bytes = cfg.image_layer_max;

        let net = Net::new().await?;
        // A tmpfs of our own as CRIU's /run, so it can cache its kernel probes
        // (see drums_criu::Criu::with_run_dir); reused if a previous daemon
        // left it mounted.
        let criu_run = state.join("criu-run");
        catalog.record(DAEMON, ResourceKind::Mount, &criu_run.display().to_string())?;
        std::fs::create_dir_all(&criu_run).map_err(io("create", &criu_run))?;
        let is_tmpfs = nix::sys::statfs::statfs(&criu_run)
            .map(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
            .unwrap_or(false);
        mount_criu_run(&*sys, &criu_run, is_tmpfs)?;
        let criu = drums_criu::Criu::new()?.with_run_dir(&criu_run)?;
        let criu_version = criu.version()?;
        std::fs::create_dir_all(state.join("checkpoints"))
            .map_err(io("create", state.join("checkpoints")))?;
        std::fs::create_dir_all(store_root.join("checkpoints"))
            .map_err(io("create", store_root.join("checkpoints")))?;
        let cfg_parent = cfg.cgroup_parent.clone();
        let turn_versions = crate::budget::Budget::per_minute(cfg.turn_versions_per_minute);
        let m = Manager {
            sys,
            images: ImageStore::new(cfg.images_dir.clone()),
            oci,
            cfg,
            catalog,
            store_root,
            _store: Mutex::new(Some(store)),
            net,
            ip_forward: drums_net::IpForward::new(),
            faults: Faults::default(),
            bin_dir,
            host: drums_checkpoint::HostFingerprint::of_this_host(&criu_version),
            verified: Mutex::new(Default::default()),
            busy_checkpoints: Default::default(),
            turn_versions,
            guest_streams: Default::default(),
            criu,
            inspector: drums_inspect::Inspector::new(crate::inspect::session_level(&cfg_parent)),
            turns: tokio::sync::broadcast::channel(256).0,
            limits,
            engine: drums_engine::Scheduler::new(drums_engine::Config::default())?,
            positions: Default::default(),
            retaining: Default::default(),
        };
        let found = m.sweep().await;

        m.catalog
            .record(DAEMON, ResourceKind::Link, &m.cfg.bridge)?;
        // The bridge's firewall (made by ensure_bridge) is the daemon's too,
        // and goes before the bridge at shutdown (newest row first).
        m.catalog
            .record(DAEMON, ResourceKind::NftTable, &m.cfg.bridge)?;
        m.net
            .ensure_bridge(
                &m.cfg.bridge,
                m.gateway(),
                m.cfg.prefix,
                &m.cfg.bridge_services,
            )
            .await?;
        drums_net::firewall::set_resolvers(&m.cfg.bridge, &m.cfg.nameservers)
            .map_err(drums_net::NetError::from)?;
        // The cgroup parent, with the caps on all sessions together; after the
        // sweep, so a previous daemon's sessions no longer count against them.
        m.catalog
            .record(DAEMON, ResourceKind::Cgroup, &m.cfg.cgroup_parent)?;
        let (parent, caps) = (m.cfg.cgroup_parent.clone(), m.cfg.sessions_caps);
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
            if s.network != "bridge" {
                continue;
            }
            let port = drums_net::firewall::Port {
                ifname: crate::create::veth_name(&s.id),
                mac: crate::create::parse_mac(s.mac.as_deref().unwrap_or_default()),
                ip: match s.ip.as_deref().and_then(|ip| ip.parse().ok()) {
                    Some(ip) => ip,
                    None => continue,
                },
                egress: s.egress == crate::spec::Egress::Nat.as_str(),
            };
            if port.egress {
                if let Err(e) = self.ip_forward.enable() {
                    warn!("adopt {}: ip_forward: {e}", s.name);
                }
            }
            if let Err(e) = drums_net::firewall::add_port(&self.cfg.bridge, &port) {
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

    /// The init of a session, if it is the live process the ledger recorded
    /// (a recycled pid has another start time).
    pub(crate) fn live_init(&self, s: &SessionRecord) -> Option<i32> {
        let pid = s.init_pid.filter(|_| s.state == "running")?;
        let key = crate::process::ledger_key(pid)?;
        let recorded = self
            .catalog
            .owned_by(&s.id)
            .ok()?
            .iter()
            .any(|r| r.kind == ResourceKind::Process && r.key == key);
        (recorded && crate::process::alive(pid)).then_some(pid)
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.cfg
    }

    /// The limits every session is held to, with the defaults resolved.
    pub fn limit_policy(&self) -> &crate::limits::LimitPolicy {
        &self.limits
    }

    /// The bridge's own address: the sessions' gateway, where drumsd serves
    /// its session API.
    pub fn bridge_address(&self) -> Ipv4Addr {
        self.gateway()
    }

    /// The running session whose network address is `ip`, if any. What a
    /// connection's source address says about who is calling is only as
    /// good as the network's anti-spoofing: see drumsd's session API.
    pub fn session_at(&self, ip: Ipv4Addr) -> Result<Option<Session>, SessionError> {
        let ip = ip.to_string();
        Ok(self
            .catalog
            .sessions()?
            .into_iter()
            .find(|r| r.network == "bridge" && r.ip.as_deref() == Some(ip.as_str()))
            .map(to_api))
    }

    pub(crate) fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cfg.subnet) + 1)
    }

    /// Unmount the host's copy of session `id`'s root (`root`) once the
    /// session's own mount namespace holds it, so no session mount stays
    /// visible on the host, and release its ledger row.
    pub(crate) fn release_host_root(
        &self,
        id: &str,
        root: &std::path::Path,
    ) -> Result<(), SessionError> {
        let _ = self.sys.umount2(root, drums_sys::MntFlags::MNT_DETACH);
        if let Some(r) = self
            .catalog
            .owned_by(id)?
            .into_iter()
            .find(|r| r.kind == drums_catalog::ResourceKind::Mount)
        {
            self.catalog.release(r.seq)?;
        }
        Ok(())
    }

    pub(crate) fn pool(&self) -> IpPool {
        IpPool {
            base: self.cfg.subnet,
            prefix: self.cfg.prefix,
        }
    }

    pub fn images(&self) -> &ImageStore {
        &self.images
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
        let oci = self.oci.clone();
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
        let sessions = match self.catalog.sessions() {
            Ok(s) => s,
            Err(e) => {
                warn!("sweep: list sessions: {e}");
                return found;
            }
        };
        for s in sessions {
            if self.live_init(&s).is_some() {
                info!(session = %s.id, name = %s.name, "adopting a live session left by a previous daemon");
                // Killed in the middle of a checkpoint, that daemon may have
                // left the session frozen.
                match drums_cgroup::Cgroup::open(&self.cfg.cgroup_parent, &s.id).thaw_if_frozen() {
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
                .catalog
                .session_versions(&s.id)
                .is_ok_and(|v| v.iter().any(|v| v.state == "done"));
            if s.state == "running" && has_version {
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
        if let Ok(all) = self.catalog.all_resources() {
            let mut owners: Vec<String> = all
                .into_iter()
                .map(|r| r.owner)
                .filter(|o| o != DAEMON && !kept.contains(o))
                .collect();
            owners.sort();
            owners.dedup();
            for o in owners {
                info!(owner = %o, "sweep: removing resources of a vanished session");
                if let Err(e) = teardown::remove_owned(self, &o).await {
                    warn!("sweep: {}", crate::error_chain(&e));
                }
            }
        }
        // Versions that never got published: their parts went with their
        // ledger rows just above. A removal that a crash interrupted is
        // finished.
        if let Ok(vs) = self.catalog.versions() {
            for v in vs {
                if drums_catalog::IN_FLIGHT.contains(&v.state.as_str()) {
                    info!(version = %v.id, state = %v.state, "sweep: dropping an unpublished version");
                    let _ = self.catalog.delete_version(&v.id);
                } else if v.state == "removing" {
                    if let Err(e) = self.drop_version(&v).await {
                        warn!("sweep: {}", crate::error_chain(&e));
                    }
                }
            }
        }
        // Cgroups under our parent that no ledger row names (belt and braces:
        // the ledger records them first, so this finds nothing unless the
        // catalog itself was lost).
        for child in drums_cgroup::list_children(&self.cfg.cgroup_parent) {
            if kept.contains(&child) {
                continue;
            }
            warn!(cgroup = %child, "sweep: removing an unrecorded cgroup");
            let cg = drums_cgroup::Cgroup::open(&self.cfg.cgroup_parent, &child);
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
        let r = self.record(id_or_name)?;
        let ports = self.image_ports(&r.image);
        Ok(Session { ports, ..to_api(r) })
    }

    /// A session that must be running, with its init's pid.
    pub(crate) fn running(&self, id_or_name: &str) -> Result<(SessionRecord, i32), SessionError> {
        let rec = self.record(id_or_name)?;
        match (rec.state.as_str(), rec.init_pid) {
            ("running", Some(pid)) => Ok((rec, pid)),
            _ => Err(SessionError::NotRunning {
                name: rec.name,
                state: rec.state,
            }),
        }
    }

    pub(crate) fn record(&self, id_or_name: &str) -> Result<SessionRecord, SessionError> {
        self.catalog
            .session(id_or_name)?
            .ok_or_else(|| SessionError::NotFound(id_or_name.to_owned()))
    }

    /// What the session's cgroup accounts right now.
    pub fn stats(&self, id_or_name: &str) -> Result<drums_api::SessionStats, SessionError> {
        let rec = self.record(id_or_name)?;
        let cg = drums_cgroup::Cgroup::open(&self.cfg.cgroup_parent, &rec.id);
        Ok(drums_api::SessionStats {
            memory_bytes: cg.memory_usage(),
            pids: cg.pids().map(|p| p.len() as u64)?,
        })
    }

    /// A client of a running session's guest agent for requests passed
    /// through from the API (exec, files): the socket resolved inside the
    /// session's root, an error body read only up to [`GUEST_MAX_BODY`], and
    /// no time limit, since an exec or an upload may rightly take hours.
    /// Count a request passed through to session `id`'s guest as open until
    /// the guard (kept with its answer's body) is dropped.
    pub fn guest_stream(&self, id: &str) -> GuestStream {
        *self
            .guest_streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_owned())
            .or_default() += 1;
        GuestStream {
            streams: self.guest_streams.clone(),
            id: id.to_owned(),
        }
    }

    /// Requests passed through to session `id`'s guest still open.
    pub(crate) fn open_guest_streams(&self, id: &str) -> usize {
        self.guest_streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    /// [`Manager::open_guest_streams`], given a moment to reach zero: a
    /// stream's guard goes when drumsd's side of the response ends, which
    /// can be just after its caller has read the last byte and asked for a
    /// checkpoint (seen under load in `drums bench corpus`). A stream still
    /// open after [`GUEST_STREAM_GRACE`] is a real one.
    pub(crate) async fn settled_guest_streams(&self, id: &str) -> usize {
        let deadline = std::time::Instant::now() + GUEST_STREAM_GRACE;
        loop {
            let open = self.open_guest_streams(id);
            if open == 0 || std::time::Instant::now() >= deadline {
                return open;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    pub fn guest_proxy(&self, s: &Session) -> Result<drums_api::Client, SessionError> {
        match s.init_pid {
            Some(pid) if s.state == "running" => {
                Ok(guest_client(pid).with_limits(None, Some(GUEST_MAX_BODY)))
            }
            _ => Err(SessionError::NotRunning {
                name: s.name.clone(),
                state: s.state.clone(),
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
                self.catalog
                    .set_session_state(&rec.id, "running", Some(pid))?;
                self.get(&rec.id)
            }
            Err(e) => {
                match teardown::remove_owned(self, &rec.id).await {
                    Ok(()) => self.catalog.delete_session(&rec.id)?,
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
        let rec = self.record(id_or_name)?;
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
            Ok(self.catalog.with_siblings(ck)?
                && !self
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
        Ok(self.catalog.set_with_siblings(id)?)
    }

    /// A version being taken finishes first and queued ones are dropped: a
    /// remove never kills what CRIU has seized. The state goes to removing
    /// before, so no new version starts (it would find the session not
    /// running, 409).
    async fn remove_record(&self, rec: &SessionRecord) -> Result<(), SessionError> {
        self.catalog.set_session_state(&rec.id, "removing", None)?;
        self.engine.cancel_session(&rec.id).await;
        self.remove_stopped(rec).await
    }

    /// Remove a session none of whose versions is being taken, or from
    /// inside the job that takes its last one (a checkpoint without
    /// `leave_running`, which waiting for its own job would deadlock).
    pub(crate) async fn remove_stopped(&self, rec: &SessionRecord) -> Result<(), SessionError> {
        self.catalog.set_session_state(&rec.id, "removing", None)?;
        self.forget_turns(&rec.name);
        teardown::remove_owned(self, &rec.id).await?;
        // Its history goes with it, but for what a person pinned.
        self.drop_history(&rec.id).await?;
        self.catalog.delete_session(&rec.id)?;
        Ok(())
    }

    /// Daemon shutdown: every session, then the daemon's own resources (the
    /// bridge and its firewall, the cgroup parent, the store's mount), then
    /// `ip_forward` as drumsd found it.
    pub async fn shutdown(&self) -> Result<(), SessionError> {
        let mut first_err = None;
        // Queued versions are dropped, running ones finish.
        self.engine.shutdown().await;
        for s in self.catalog.sessions()? {
            if let Err(e) = self.remove_record(&s).await {
                warn!("shutdown: {}", crate::error_chain(&e));
                first_err.get_or_insert(e);
                continue;
            }
            self.remove_fork_checkpoint(&s).await;
        }
        // The Store handle's own close would unmount too; the ledger row does the
        // same, so drop the handle first and let one path do it.
        drop(self._store.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Err(e) = teardown::remove_owned(self, DAEMON).await {
            warn!("shutdown: {}", crate::error_chain(&e));
            first_err.get_or_insert(e);
        }
        // Last: no session of ours needs forwarding any more.
        if let Err(e) = self.ip_forward.restore() {
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

/// Turn quotas on for the store, cap all of drums' subvolumes together at the
/// store's size minus the reserve, and resolve the disk default against that.
/// The bytes of a store of `size` bytes kept from sessions (and from
/// imports being spooled) for drumsd's own writes.
pub(crate) fn store_reserve(cfg: &ManagerConfig, size: u64) -> u64 {
    reserve_of(cfg.store_reserve, size)
}

fn reserve_of(configured: Option<u64>, size: u64) -> u64 {
    configured.unwrap_or_else(|| (size / 10).max(MIN_STORE_RESERVE))
}

/// What an import may spool onto the store now: its free space less the
/// reserve, so a huge archive is refused before it can fill the store.
pub(crate) fn import_room(cfg: &ManagerConfig, store_root: &Path) -> Result<u64, SessionError> {
    StoreRoom::new(cfg, store_root).now()
}

/// The store's room for what drumsd writes of a stranger's (archives,
/// blobs, layers): its free space less the reserve, read again (a statvfs)
/// before each step that writes, since sessions write meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct StoreRoom {
    root: PathBuf,
    reserve: Option<u64>,
}

impl StoreRoom {
    pub(crate) fn new(cfg: &ManagerConfig, store_root: &Path) -> StoreRoom {
        StoreRoom {
            root: store_root.to_owned(),
            reserve: cfg.store_reserve,
        }
    }

    pub(crate) fn now(&self) -> Result<u64, SessionError> {
        let fs = nix::sys::statvfs::statvfs(&self.root).map_err(|e| SessionError::Io {
            op: "statvfs",
            path: self.root.clone(),
            source: e.into(),
        })?;
        let size = fs.blocks() * fs.fragment_size();
        let free = fs.blocks_available() * fs.fragment_size();
        Ok(free.saturating_sub(reserve_of(self.reserve, size)))
    }
}

fn quota_store(
    store_root: &Path,
    cfg: &ManagerConfig,
) -> Result<crate::limits::LimitPolicy, SessionError> {
    let fs = nix::sys::statfs::statfs(store_root).map_err(|e| SessionError::Io {
        op: "statfs",
        path: store_root.into(),
        source: e.into(),
    })?;
    let size = fs.blocks() * fs.block_size() as u64;
    let reserve = store_reserve(cfg, size);
    let room = size
        .checked_sub(reserve)
        .filter(|r| *r > 0)
        .ok_or_else(|| {
            SessionError::Invalid(format!(
            "store reserve of {reserve} bytes leaves nothing of the {size}-byte store for sessions"
        ))
        })?;
    drums_store::enable_quota(store_root)?;
    drums_store::ensure_qgroup(store_root, drums_store::SESSIONS_QGROUP)?;
    // Referenced, for the group: every byte its members reach, counted once.
    drums_store::limit_qgroup(
        store_root,
        drums_store::SESSIONS_QGROUP,
        drums_store::QgroupLimitKind::Referenced,
        Some(room),
    )?;
    let mut defaults = cfg.default_limits.clone();
    if defaults.disk_bytes.is_none() {
        defaults.disk_bytes = Some(DEFAULT_DISK_BYTES.min(room));
    }
    let policy = crate::limits::LimitPolicy {
        defaults,
        max_disk_bytes: room,
    };
    // A default that no session could get is a configuration error, found now
    // rather than at the first create.
    policy.validate(&policy.defaults)?;
    info!(store_bytes = size, sessions_bytes = room, defaults = ?policy.defaults, "limits");
    Ok(policy)
}

/// Where drumsd installs the binaries every session binds: beside the state
/// directory (`/var/lib/drums-bin` for `/var/lib/drums`), not in it. A
/// session's root is an unprivileged host range, and CRIU's restore binds
/// the directory from inside the sibling's user namespace: neither may walk
/// through the state directory, which is root's alone (0700).
pub fn installed_bin_dir(state: &Path) -> PathBuf {
    let name = state
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "drums".into());
    state.with_file_name(format!("{name}-bin"))
}

/// Copy drums-init beside the state, atomically (rename), and only when it
/// changed: running sessions keep the inode they started with. It is what
/// drumsd starts on the host (stage 0). What sessions exec, drums-init's
/// stage 2 and drums-guest, is installed by `drums_init::loader`: copies that
/// run on the host's loader and libraries, installed with them, whatever
/// libc a session's image has.
fn install_binaries(src: &Path, dst: &Path) -> Result<(), SessionError> {
    std::fs::create_dir_all(dst).map_err(io("create", dst))?;
    // Readable by every session range; writable by root only.
    std::fs::set_permissions(dst, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(io("chmod", dst))?;
    for name in ["drums-init"] {
        let from = src.join(name);
        let to = dst.join(name);
        let new = std::fs::read(&from).map_err(io("read", &from))?;
        if std::fs::read(&to).map(|old| old == new).unwrap_or(false) {
            continue;
        }
        let tmp = dst.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, &new).map_err(io("write", &tmp))?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io("chmod", &tmp))?;
        std::fs::rename(&tmp, &to).map_err(io("rename", &to))?;
    }
    drums_init::loader::install(src, dst)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drums_sys::{Call, RecordingSyscall};

    #[test]
    fn criu_run_is_a_private_tmpfs_and_an_old_one_is_remounted() {
        for (is_tmpfs, extra) in [(false, MsFlags::empty()), (true, MsFlags::MS_REMOUNT)] {
            let sys = RecordingSyscall::new();
            mount_criu_run(&sys, Path::new("/s/criu-run"), is_tmpfs).unwrap();
            assert_eq!(
                sys.calls(),
                [Call::Mount {
                    source: Some("tmpfs".into()),
                    target: "/s/criu-run".into(),
                    fstype: Some("tmpfs".into()),
                    flags: extra | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    data: Some("size=16m,mode=0700".into()),
                }]
            );
        }
    }

    #[test]
    fn a_failed_criu_run_mount_names_it_and_keeps_the_errno() {
        let sys = RecordingSyscall::new();
        sys.fail("mount", nix::Error::EPERM);
        let e = mount_criu_run(&sys, Path::new("/s/criu-run"), false).unwrap_err();
        assert_eq!(e.to_string(), "mount tmpfs /s/criu-run");
        let source = std::error::Error::source(&e).unwrap();
        assert!(
            source.to_string().contains("Operation not permitted"),
            "{source}"
        );
    }
}
