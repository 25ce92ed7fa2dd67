//! The host's resources: what drumsd opens once at start and every
//! subsystem shares read-only. The catalog and its ledger, the btrfs store
//! and its quota, the images, the host network, CRIU with its own /run, the
//! binaries sessions bind, and the limits every request is held to. Nothing
//! here changes after [`Host::open`]: state that does (versions, positions,
//! open guest streams) lives with the subsystem that owns it.

use drums_api::SessionState;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drums_api::Limits;
use drums_catalog::{Catalog, IpPool, ResourceKind, SessionRecord};
use drums_image::ImageStore;
use drums_net::Net;
use drums_store::Store;
use drums_sys::{LinuxSyscall, MsFlags, Syscall};
use tracing::info;

use crate::faults::Faults;
use crate::{io, SessionError};

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
    /// Checkpoint dumps at once, host-wide (drumsd's
    /// `--checkpoint-workers`); `None`: the engine's default.
    pub checkpoint_workers: Option<usize>,
    /// The most sessions held at once, pools' members included (drumsd's
    /// `--max-sessions`); `None`: no such limit.
    pub max_sessions: Option<u64>,
}

/// The host's resources, opened by [`Host::open`]. Its fields are handles
/// (each with its own synchronisation) that never change after opening, so
/// every subsystem reads them directly.
pub struct Host {
    pub(crate) cfg: ManagerConfig,
    /// The seam for mounts, namespaces and id maps: [`LinuxSyscall`] here,
    /// a recording in unit tests.
    pub(crate) sys: Arc<dyn Syscall + Send + Sync>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) store_root: PathBuf,
    /// Kept open for the daemon's life; its mount is in the ledger too.
    store: Mutex<Option<Store>>,
    pub(crate) images: ImageStore,
    /// OCI images, in the btrfs store (docs/oci.md).
    pub(crate) oci: drums_oci::OciStore,
    pub(crate) net: Net,
    /// `net.ipv4.ip_forward`, turned on with the first session that has
    /// egress `nat` and put back at shutdown.
    pub(crate) ip_forward: drums_net::IpForward,
    pub(crate) faults: Faults,
    /// Where CRIU dumps before the images go to the store.
    pub(crate) staging: crate::staging::Staging,
    pub(crate) bin_dir: PathBuf,
    pub(crate) criu: drums_criu::Criu,
    /// This host as a checkpoint records it, and as a restore checks it.
    pub(crate) fingerprint: drums_checkpoint::HostFingerprint,
    /// The defaults and bounds every request and manifest is held to.
    pub(crate) limits: crate::limits::LimitPolicy,
}

impl Host {
    /// Open the catalog, install the binaries, open (or make) the store with
    /// its quota, the image stores, the netlink handle and CRIU. Each mount
    /// is recorded in the ledger before it is made, so a crash between the
    /// two cannot leak it.
    pub(crate) async fn open(cfg: ManagerConfig) -> Result<Host, SessionError> {
        let sys: Arc<dyn Syscall + Send + Sync> = Arc::new(LinuxSyscall);
        let state = &cfg.state_dir;
        std::fs::create_dir_all(state.join("sessions"))
            .map_err(io("create", state.join("sessions")))?;
        let catalog = Arc::new(Catalog::open(&state.join("catalog.db"))?);
        let bin_dir = installed_bin_dir(state);
        install_binaries(&cfg.bin_src, &bin_dir)?;

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
        // left it mounted. Not noexec: swrk maps drums' prlimit shim from it.
        let criu_run = state.join("criu-run");
        own_tmpfs(&catalog, &*sys, &criu_run, CRIU_RUN)?;
        let criu = drums_criu::Criu::new()?.with_run_dir(&criu_run)?;
        let criu_version = criu.version()?;
        // CRIU dumps here, then the images go to the store sharing the
        // parent version's pages (drums_checkpoint::share): memory, so the
        // dump writes nothing to disk; at most a quarter of the host's, and
        // a dump that may not fit goes to the store directly
        // (crate::staging).
        let staging = state.join("dump-staging");
        own_tmpfs(&catalog, &*sys, &staging, DUMP_STAGING)?;
        // A dump a crashed daemon left half done is nobody's.
        for e in std::fs::read_dir(&staging).map_err(io("list", &staging))? {
            let p = e.map_err(io("list", &staging))?.path();
            std::fs::remove_dir_all(&p).map_err(io("remove", &p))?;
        }
        for dir in [
            state.join("checkpoints"),
            store_root.join("checkpoints"),
            store_root.join(CHECKPOINT_DIRS),
            store_root.join(RESTORE_VIEWS),
        ] {
            std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        }
        Ok(Host {
            sys,
            images: ImageStore::new(cfg.images_dir.clone()),
            oci,
            catalog,
            store_root,
            store: Mutex::new(Some(store)),
            net,
            ip_forward: drums_net::IpForward::new(),
            faults: Faults::default(),
            staging: crate::staging::Staging::new(staging),
            bin_dir,
            fingerprint: drums_checkpoint::HostFingerprint::of_this_host(&criu_version),
            criu,
            limits,
            cfg,
        })
    }

    /// Drop the store's handle at shutdown: its own close would unmount, but
    /// the ledger row does the same, so one path does it.
    pub(crate) fn forget_store(&self) {
        drop(self.store.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// The bridge's own address, the sessions' gateway.
    pub(crate) fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cfg.subnet) + 1)
    }

    pub(crate) fn pool(&self) -> IpPool {
        IpPool {
            base: self.cfg.subnet,
            prefix: self.cfg.prefix,
        }
    }

    /// A session's directory in the state directory.
    pub(crate) fn session_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("sessions").join(id)
    }

    /// A session's upper layer: its subvolume in the store.
    pub(crate) fn session_subvolume(&self, id: &str) -> PathBuf {
        self.store_root.join("sessions").join(id)
    }

    /// A version's directory: its manifest and CRIU images. In the store,
    /// so that a version's images share the pages its parent's hold
    /// (drums_checkpoint::share); one an older drums made is where it put
    /// it, in the state directory.
    pub(crate) fn checkpoint_dir(&self, id: &str) -> PathBuf {
        let old = self.cfg.state_dir.join("checkpoints").join(id);
        match old.exists() {
            true => old,
            false => self.store_root.join(CHECKPOINT_DIRS).join(id),
        }
    }

    /// A version's files: its snapshot in the store.
    pub(crate) fn checkpoint_snapshot(&self, id: &str) -> PathBuf {
        self.store_root.join("checkpoints").join(id)
    }

    /// The limits a restore of checkpoint `id` runs with: its manifest's,
    /// as this host's limit policy reads them today.
    pub(crate) fn manifest_limits(
        &self,
        id: &str,
        m: &drums_checkpoint::Manifest,
    ) -> Result<Limits, SessionError> {
        self.limits
            .from_manifest(&m.session.limits)
            .map_err(|source| SessionError::ManifestLimits {
                checkpoint: id.to_owned(),
                source,
            })
    }

    pub(crate) fn record(&self, id_or_name: &str) -> Result<SessionRecord, SessionError> {
        self.catalog
            .session(id_or_name)?
            .ok_or_else(|| SessionError::NotFound(id_or_name.to_owned()))
    }

    /// A session that must be running, with its init's pid.
    pub(crate) fn running(&self, id_or_name: &str) -> Result<(SessionRecord, i32), SessionError> {
        let rec = self.record(id_or_name)?;
        match (rec.state, rec.init_pid) {
            (SessionState::Running, Some(pid)) => Ok((rec, pid)),
            _ => Err(SessionError::NotRunning {
                name: rec.name,
                state: rec.state,
            }),
        }
    }

    /// The init of a session, if it is the live process the ledger recorded
    /// (a recycled pid has another start time).
    pub(crate) fn live_init(&self, s: &SessionRecord) -> Option<i32> {
        let pid = s.init_pid.filter(|_| s.state == SessionState::Running)?;
        let key = crate::process::ledger_key(pid)?;
        let recorded = self
            .catalog
            .owned_by(&s.id)
            .ok()?
            .iter()
            .any(|r| r.kind == ResourceKind::Process && r.key == key);
        (recorded && crate::process::alive(pid)).then_some(pid)
    }

    /// Unmount the host's copy of session `id`'s root (`root`) once the
    /// session's own mount namespace holds it, so no session mount stays
    /// visible on the host, and release its ledger row.
    pub(crate) fn release_host_root(&self, id: &str, root: &Path) -> Result<(), SessionError> {
        let _ = self.sys.umount2(root, drums_sys::MntFlags::MNT_DETACH);
        if let Some(r) = self
            .catalog
            .owned_by(id)?
            .into_iter()
            .find(|r| r.kind == ResourceKind::Mount)
        {
            self.catalog.release(r.seq)?;
        }
        Ok(())
    }
}

/// Versions' directories (manifest and CRIU images), in the store.
pub(crate) const CHECKPOINT_DIRS: &str = "checkpoint-images";

/// Siblings' views of a version's images while CRIU restores them
/// (crate::boot::criu), in the store beside the images they link.
pub(crate) const RESTORE_VIEWS: &str = "restore-views";

/// A tmpfs of drumsd's own: extra mount flags, and its options.
type TmpfsSpec = (MsFlags, &'static str);

/// CRIU's /run. Root-only (0700), as it holds code root runs.
const CRIU_RUN: TmpfsSpec = (MsFlags::empty(), "size=16m,mode=0700");

/// Where CRIU dumps before the images go to the store.
const DUMP_STAGING: TmpfsSpec = (MsFlags::MS_NOEXEC, "size=25%,mode=0700");

/// Record, make and mount drumsd's tmpfs `at` (recorded first, like every
/// mount, so a crash cannot leak it).
fn own_tmpfs(
    catalog: &Catalog,
    sys: &dyn Syscall,
    at: &Path,
    spec: TmpfsSpec,
) -> Result<(), SessionError> {
    catalog.record(DAEMON, ResourceKind::Mount, &at.display().to_string())?;
    std::fs::create_dir_all(at).map_err(io("create", at))?;
    let is_tmpfs = nix::sys::statfs::statfs(at)
        .map(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        .unwrap_or(false);
    mount_tmpfs(sys, at, is_tmpfs, spec)
}

/// Mount a tmpfs at `at`, or remount the one an older daemon left there
/// (`is_tmpfs`) with today's flags.
fn mount_tmpfs(
    sys: &dyn Syscall,
    at: &Path,
    is_tmpfs: bool,
    (flags, data): TmpfsSpec,
) -> Result<(), SessionError> {
    let remount = if is_tmpfs {
        MsFlags::MS_REMOUNT
    } else {
        MsFlags::empty()
    };
    sys.mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        remount | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | flags,
        Some(data),
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
            mount_tmpfs(&sys, Path::new("/s/criu-run"), is_tmpfs, CRIU_RUN).unwrap();
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
        // The staging tmpfs runs nothing.
        let sys = RecordingSyscall::new();
        mount_tmpfs(&sys, Path::new("/s/dump-staging"), false, DUMP_STAGING).unwrap();
        assert!(
            matches!(&sys.calls()[..], [Call::Mount { flags, data: Some(d), .. }]
            if flags.contains(MsFlags::MS_NOEXEC) && d == "size=25%,mode=0700")
        );
    }

    #[test]
    fn a_failed_criu_run_mount_names_it_and_keeps_the_errno() {
        let sys = RecordingSyscall::new();
        sys.fail("mount", nix::Error::EPERM);
        let e = mount_tmpfs(&sys, Path::new("/s/criu-run"), false, CRIU_RUN).unwrap_err();
        assert_eq!(e.to_string(), "mount tmpfs /s/criu-run");
        let source = std::error::Error::source(&e).unwrap();
        assert!(
            source.to_string().contains("Operation not permitted"),
            "{source}"
        );
    }
}
