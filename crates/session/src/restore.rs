//! Restoring a checkpoint as N hygienic siblings, concurrently. Each sibling
//! gets its own writable snapshot of the checkpoint's file-system artifact, its
//! own cgroups, network namespace, veth, address and MAC, hostname and
//! machine-id; then the guest agent runs the in-session hygiene (RNG reseed of
//! registered processes, the restore generation). Every step is recorded
//! before it is made, like a create, and fails through the same teardown.

use std::net::Ipv4Addr;

use drums_api::{RestoreResult, Session};
use drums_catalog::{ResourceKind, SessionRecord};
use drums_checkpoint::Manifest;
use tracing::warn;

use crate::checkpoint::{external_mounts_restore, network_lock};
use crate::create::{parse_mac, random_hex, veth_name};
use crate::manager::{guest_client, Manager};
use crate::spec::{hostname_for, Egress};
use crate::{io, process, SessionError};

/// Most siblings one restore call may start.
pub const MAX_SIBLINGS: usize = 64;

/// A restore's (or a fork's) sibling count and name, checked before anything
/// is made: a fork checks them before it checkpoints.
pub fn check_siblings(count: usize, name: Option<&str>) -> Result<(), SessionError> {
    if count == 0 || count > MAX_SIBLINGS {
        return Err(SessionError::Invalid(format!(
            "count {count}: restore 1 to {MAX_SIBLINGS} siblings at a time"
        )));
    }
    if let Some(n) = name {
        if count != 1 {
            return Err(SessionError::Invalid(format!(
                "a name is only accepted for a single sibling, not for count {count}"
            )));
        }
        crate::spec::validate_name(n)?;
    }
    Ok(())
}

impl Manager {
    /// Restore `count` siblings of a checkpoint; all or nothing. A single
    /// sibling may be given a `name` (as `vmrun revertToSnapshot` needs, to
    /// keep a VM's name across reverts); otherwise each is named by its id.
    pub async fn restore(
        &self,
        checkpoint: &str,
        count: usize,
        name: Option<&str>,
    ) -> Result<RestoreResult, SessionError> {
        self.restore_as(checkpoint, count, name, None).await
    }

    /// [`Manager::restore`] of siblings that are members of warm pool
    /// `pool` from their first row on (see crate::pools): a crash while they
    /// are made leaves pool members, which the sweep removes, never sessions
    /// of nobody's.
    pub async fn restore_into_pool(
        &self,
        checkpoint: &str,
        count: usize,
        pool: &str,
    ) -> Result<RestoreResult, SessionError> {
        self.restore_as(checkpoint, count, None, Some(pool)).await
    }

    async fn restore_as(
        &self,
        checkpoint: &str,
        count: usize,
        name: Option<&str>,
        pool: Option<&str>,
    ) -> Result<RestoreResult, SessionError> {
        check_siblings(count, name)?;
        // Shared with other restores, never with a remove of the checkpoint,
        // which would delete the images and snapshot this reads (see `busy`).
        // Read again under the lock: a remove that came first leaves nothing.
        let id = self.manifest(checkpoint)?.0.id;
        let _held = self.busy_checkpoints.shared(&id).await;
        let (ck, m) = self.manifest(&id)?;
        // Refused before CRIU runs: another host's checkpoint, or damaged images.
        m.host.check_restorable_on(&self.host)?;
        let process_of = process_artifact(&m)?;
        let images = self.checkpoint_dir(process_of).join("images");
        let newest = drums_checkpoint::check_sizes(&images, &m.images)?;
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(process_of)
            == Some(&newest);
        if !known {
            let list = m.images.clone();
            tokio::task::spawn_blocking(move || drums_checkpoint::verify(&images, &list))
                .await
                .expect("no panic")?;
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(process_of.to_owned(), newest);
        }
        // Before anything is made: the siblings' limits, the checkpoint's own
        // with today's defaults where it names none.
        let limits = self
            .limits
            .from_manifest(&m.session.limits)
            .map_err(|source| SessionError::ManifestLimits {
                checkpoint: ck.id.clone(),
                source,
            })?;
        // Looked up once for all siblings: their overlay's lower layer.
        let lower = self.resolve_image(&m.session.image)?.rootfs;

        let results = futures::future::join_all(
            (0..count).map(|_| self.restore_one(&m, &limits, &lower, name, pool)),
        )
        .await;
        let mut sessions = Vec::new();
        let mut first_err = None;
        for r in results {
            match r {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            for s in &sessions {
                if let Err(t) = self.remove(&s.id).await {
                    warn!(
                        "remove sibling {} after a failed restore: {}",
                        s.id,
                        crate::error_chain(&t)
                    );
                }
            }
            return Err(e);
        }
        Ok(RestoreResult {
            checkpoint_kept: true,
            checkpoint: ck.id,
            sessions,
        })
    }

    async fn restore_one(
        &self,
        m: &Manifest,
        limits: &drums_api::Limits,
        lower: &std::path::Path,
        name: Option<&str>,
        pool: Option<&str>,
    ) -> Result<Session, SessionError> {
        // An imported manifest is untrusted: only a known value passes.
        let egress = Egress::parse(&m.session.egress)?;
        if egress == Egress::Nat && m.session.network != "bridge" {
            return Err(SessionError::Invalid(
                "checkpoint has egress nat without network bridge".into(),
            ));
        }
        let id = random_hex(6);
        let name = name.map_or_else(|| id.clone(), str::to_owned);
        let rec = SessionRecord {
            hostname: hostname_for(&name, &id),
            name,
            id,
            profile: m.session.profile.clone(),
            image: m.session.image.clone(),
            state: "creating".into(),
            network: m.session.network.clone(),
            // A sibling keeps its checkpoint's egress.
            egress: egress.as_str().into(),
            ip: None,
            mac: None,
            limits: serde_json::to_value(limits).expect("limits serialize"),
            init_pid: None,
            created_at_ms: drums_catalog::now_ms(),
            generation: m.session.generation + 1,
            origin: Some(m.id.clone()),
            privileged: m.session.privileged,
            id_base: None,
            pool: pool.map(str::to_owned),
        };
        if m.session.privileged && m.session.user_namespace {
            return Err(SessionError::Invalid(
                "checkpoint is both privileged and in a user namespace".into(),
            ));
        }
        let pool = (rec.network == "bridge").then(|| self.pool());
        // Each sibling of a checkpoint taken in a user namespace gets a range
        // of its own (see crate::ids).
        let ids = m.session.user_namespace.then_some(crate::ids::POOL);
        let rec = self
            .catalog
            .insert_session(rec, pool, ids, self.cfg.max_sessions)?;
        let built = self
            .build_sibling(&rec, m, limits, lower, true, false)
            .await;
        self.settle(&rec, built).await
    }

    /// A rollback's or recovery's restore: the session's own record, its own
    /// identity in the images, so no hygiene; ready when its guest (and
    /// desktop) is. `kept_port`: its firewall port stayed listed (see
    /// [`crate::teardown::remove_owned_keeping_port`]).
    pub(crate) async fn rebuild(
        &self,
        rec: &SessionRecord,
        m: &Manifest,
        limits: &drums_api::Limits,
        lower: &std::path::Path,
        kept_port: bool,
    ) -> Result<i32, SessionError> {
        self.build_sibling(rec, m, limits, lower, false, kept_port)
            .await
    }

    async fn build_sibling(
        &self,
        rec: &SessionRecord,
        m: &Manifest,
        limits: &drums_api::Limits,
        lower: &std::path::Path,
        hygiene: bool,
        kept_port: bool,
    ) -> Result<i32, SessionError> {
        let id = &rec.id;
        let record = |kind, key: &str| self.catalog.record(id, kind, key);

        let dir = self.cfg.state_dir.join("sessions").join(id);
        record(ResourceKind::Dir, &dir.display().to_string())?;
        let root = dir.join("root");
        std::fs::create_dir_all(&root).map_err(io("create", &root))?;

        self.faults.check("restore.snapshot")?;
        let sv = self.store_root.join("sessions").join(id);
        record(ResourceKind::Subvolume, &sv.display().to_string())?;
        let (src, dst) = (self.checkpoint_snapshot(m.files_of()), sv.clone());
        // The sibling's own quota, set in the snapshot ioctl itself: the same
        // budget for new writes as its checkpoint's session had.
        let inherit = drums_store::QgroupInherit::session(limits.disk_bytes);
        tokio::task::spawn_blocking(move || {
            drums_store::snapshot_with(&src, &dst, false, &inherit)
        })
        .await
        .expect("no panic")?;

        self.faults.check("restore.cgroup")?;
        record(
            ResourceKind::Cgroup,
            &format!("{}/{}", self.cfg.cgroup_parent, id),
        )?;
        let limits = crate::limits::cgroup_limits(limits);
        let (parent, name) = (self.cfg.cgroup_parent.clone(), id.clone());
        let devices = crate::spec::devices(m.session.privileged);
        let cg = tokio::task::spawn_blocking(move || {
            drums_cgroup::Cgroup::create(&parent, &name, &limits, devices)
        })
        .await
        .expect("no panic")?;

        // CRIU needs the new root as a directory it can see: mount the overlay
        // on the host for the duration of the restore only.
        self.faults.check("restore.mount")?;
        record(ResourceKind::Mount, &root.display().to_string())?;
        let (r, l, s, base) = (root.clone(), lower.to_owned(), sv.clone(), rec.id_base);
        let sys = self.sys.clone();
        tokio::task::spawn_blocking(move || crate::ids::mount_root(&*sys, &r, &l, &s, base))
            .await
            .expect("no panic")?;

        let host_veth = veth_name(id);
        if rec.network == "bridge" {
            // CRIU creates the pair; recorded first like every link.
            record(ResourceKind::Link, &host_veth)?;
        }
        self.faults.check("restore.criu")?;
        // The network namespace comes back empty and is built here, in CRIU's
        // setup-namespaces notification (the tree exists, nothing runs, no
        // socket is restored yet), by the same code as a cold session's: no
        // forked `ip`, and the sibling's own address and MAC from the start.
        let net_fault = self
            .faults
            .check("restore.network")
            .err()
            .map(|e| e.to_string());
        let veth = (rec.network == "bridge").then(|| drums_net::VethSpec {
            host_name: host_veth.clone(),
            bridge: self.cfg.bridge.clone(),
            netns_pid: 0,
            mac: parse_mac(rec.mac.as_deref().unwrap_or_default()),
            ip: rec
                .ip
                .as_deref()
                .and_then(|s| s.parse::<Ipv4Addr>().ok())
                .expect("bridge siblings have an address"),
            prefix: self.cfg.prefix,
            gateway: self.gateway(),
            egress: rec.egress == Egress::Nat.as_str(),
            listed: kept_port,
        });
        if rec.egress == Egress::Nat.as_str() {
            self.ip_forward
                .enable()
                .map_err(drums_net::NetError::from)?;
        }
        let images_dir = sibling_images(
            &self.checkpoint_dir(process_artifact(m)?).join("images"),
            &dir,
            rec.id_base,
        )?;
        let opts = drums_criu::RestoreOpts {
            images_dir: images_dir.clone(),
            work_dir: dir.clone(),
            root: root.clone(),
            external_mounts: external_mounts_restore(&self.bin_dir),
            veth_pairs: vec![],
            join_cgroups: cg.procs_files(),
            network_lock: network_lock(&rec.network),
            // As the dump decided: its images have a stream per connection
            // it kept (crate::checkpoint, connections_within).
            tcp_established: drums_criu::kept_connections(&images_dir),
            empty_net: true,
        };
        let (criu, net, rt) = (
            self.criu.clone(),
            self.net.clone(),
            tokio::runtime::Handle::current(),
        );
        // The root's pid, as soon as it exists: recorded in the ledger even if
        // the restore then fails, so the teardown kills and reaps it (it is
        // drumsd's child, and nobody else would reap it).
        let root_pid = std::sync::Arc::new(std::sync::Mutex::new(None));
        let noted = root_pid.clone();
        let restored = tokio::task::spawn_blocking(move || {
            criu.restore(&opts, &mut |script, pid| {
                if script != drums_criu::script::SETUP_NAMESPACES {
                    return Ok(());
                }
                *noted.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((pid, process::ledger_key(pid)));
                if let Some(f) = &net_fault {
                    return Err(f.clone());
                }
                let r = match &veth {
                    Some(v) => rt.block_on(net.create_session_veth(&drums_net::VethSpec {
                        netns_pid: pid,
                        ..v.clone()
                    })),
                    None => rt.block_on(drums_net::loopback_up(pid)),
                };
                r.map_err(|e| crate::error_chain(&e))
            })
        })
        .await
        .expect("restore task does not panic");
        let noted = root_pid.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((_, Some(key))) = &noted {
            record(ResourceKind::Process, key)?;
        }
        let pid = restored?.pid;
        if noted.map(|(p, _)| p) != Some(pid) {
            if let Some(key) = process::ledger_key(pid) {
                record(ResourceKind::Process, &key)?;
            }
        }
        self.catalog.set_session_state(id, "creating", Some(pid))?;
        // The restored mount namespace holds its own reference to the root.
        self.release_host_root(id, &root)?;

        self.faults.check("restore.hygiene")?;
        if hygiene {
            self.hygiene(rec, pid, m.clean).await?;
        } else {
            self.wait_ready(id, pid).await?;
            if rec.profile == "desktop" {
                self.desktop_ready(pid).await?;
            }
        }
        Ok(pid)
    }

    /// The in-session half of hygiene, by the guest agent: hostname,
    /// machine-id, generation, and the reseed of registered processes. Its
    /// answer is also the sibling's readiness.
    async fn hygiene(
        &self,
        rec: &SessionRecord,
        pid: i32,
        clean: bool,
    ) -> Result<(), SessionError> {
        // The kernel's half of the new identity, from outside (the session
        // holds no CAP_SYS_ADMIN); the guest rewrites the files and reseeds.
        let (p, h) = (pid, rec.hostname.clone());
        tokio::task::spawn_blocking(move || drums_sys::set_hostname_in(p, &h))
            .await
            .expect("no panic")
            .map_err(|e| SessionError::Hygiene(e.into()))?;
        let ip = rec
            .ip
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e: std::net::AddrParseError| SessionError::Hygiene(e.into()))?;
        let body = drums_api::guest::HygieneRequest {
            hostname: rec.hostname.clone(),
            machine_id: random_hex(16),
            generation: rec.generation,
            ip,
            ack_timeout_ms: None,
        };
        let client = guest_client(pid);
        let _: serde_json::Value = client
            .json(hyper::Method::POST, "/v1/hygiene", Some(&body))
            .await
            .map_err(|e| SessionError::Hygiene(e.into()))?;
        if rec.profile == "desktop" {
            self.faults.check("restore.desktop")?;
            // The hostname has changed: now the browser's profile lock, and for
            // a clean checkpoint its cookies, storage and renderers. Then the
            // sibling is ready when its desktop is agent-ready.
            let browser = drums_api::guest::BrowserHygiene {
                hostname: rec.hostname.clone(),
                clean,
            };
            let _: serde_json::Value = client
                .json(hyper::Method::POST, "/v1/desktop/hygiene", Some(&browser))
                .await
                .map_err(|e| SessionError::Desktop(e.into()))?;
            self.desktop_ready(pid).await?;
        }
        Ok(())
    }

    async fn desktop_ready(&self, pid: i32) -> Result<(), SessionError> {
        // The guest's budget ends before drumsd's client gives up, so a
        // late desktop answers with what was late.
        let ready = format!(
            "/v1/desktop/ready?timeout_ms={}",
            (crate::manager::GUEST_TIMEOUT - crate::manager::GUEST_GRACE).as_millis()
        );
        let _: serde_json::Value = guest_client(pid)
            .json(hyper::Method::GET, &ready, None::<&()>)
            .await
            .map_err(|e| SessionError::Desktop(e.into()))?;
        Ok(())
    }
}

/// The version whose CRIU images a restore uses; a version without process
/// state (the `files` policy) has none to restore.
pub(crate) fn process_artifact(m: &Manifest) -> Result<&str, SessionError> {
    m.process_of().ok_or_else(|| {
        SessionError::Conflict(format!(
            "version {} holds files only (the files policy): it has no processes to restore",
            m.id
        ))
    })
}

/// The images a sibling restores from. Without a range, the checkpoint's own
/// (shared, read-only, by every concurrent restore). With one, a directory of
/// the sibling's (under its state dir `dir`) that hard-links every image but the
/// user namespace's, which is rewritten with the sibling's range: CRIU would
/// otherwise give every sibling the range of the session it was dumped from.
fn sibling_images(
    images: &std::path::Path,
    dir: &std::path::Path,
    base: Option<u32>,
) -> Result<std::path::PathBuf, SessionError> {
    use drums_criu::userns_image;
    let Some(base) = base else {
        return Ok(images.to_owned());
    };
    let Some(userns) = userns_image::find(images)? else {
        return Err(SessionError::Invalid(format!(
            "checkpoint images in {} have no user namespace, though its manifest says the session had one",
            images.display()
        )));
    };
    let view = dir.join("images");
    std::fs::create_dir(&view).map_err(io("create", &view))?;
    let list = std::fs::read_dir(images).map_err(io("list", images))?;
    for e in list {
        let name = e.map_err(io("list", images))?.file_name();
        if name.to_string_lossy() == userns {
            continue;
        }
        // A hard link, not a symlink: CRIU opens images from the restored
        // tasks too, as the sibling's range, which may not walk a symlink's
        // path through drumsd's state directory (0700). Both are in it.
        let link = view.join(&name);
        std::fs::hard_link(images.join(&name), &link).map_err(io("link", &link))?;
    }
    let maps = userns_image::read(&images.join(&userns))?;
    let from = maps.uid.first().map(|e| e.lower_first).unwrap_or(0);
    let moved = userns_image::rebase(&maps, from, base, crate::ids::RANGE).ok_or_else(|| {
        SessionError::Invalid(format!(
            "checkpoint's user namespace maps {maps:?} are not one drums range"
        ))
    })?;
    userns_image::write(&view.join(&userns), &moved)?;
    Ok(view)
}
