//! Checkpointing a session: CRIU dumps the process tree, and while the tree is
//! still frozen (CRIU's `post-dump` notification) a read-only btrfs snapshot of
//! the session's upper layer is taken, so files and processes are consistent.
//! Published only when every part is on disk.

use drums_api::VersionState;
use std::path::PathBuf;
use std::time::Instant;

use drums_api::{Checkpoint, CreateCheckpoint};
use drums_catalog::{ResourceKind, VersionRecord};
use drums_checkpoint::{ArtifactCost, Manifest, SourceSession, Took, VersionInfo, FORMAT_VERSION};
use tracing::{info, warn};

use crate::manager::Manager;
use crate::spec::validate_name_of;
use crate::{io, SessionError};

/// The bind mount of drums' binaries inside every session, declared external
/// to CRIU: it comes from the host and is re-bound on restore, never dumped.
pub const BIN_MOUNT: (&str, &str) = (drums_init::BIN_DIR, "drums-bin");

/// Every bind mount a session gets from the host, as CRIU's dump names them:
/// (mount point inside, key). The drums binaries and each device node of
/// /dev (binds of the host's nodes: see `drums_init::root::DEVICES`).
pub fn external_mounts_dump() -> Vec<(String, String)> {
    let mut v = vec![(BIN_MOUNT.0.to_owned(), BIN_MOUNT.1.to_owned())];
    for d in drums_init::root::DEVICES {
        v.push((format!("/dev/{d}"), format!("dev-{d}")));
    }
    v
}

/// The same mounts as a restore binds them: (key, host path). A checkpoint
/// taken before devices were binds has no such keys, and CRIU ignores them.
pub fn external_mounts_restore(bin_dir: &std::path::Path) -> Vec<(String, PathBuf)> {
    let mut v = vec![(BIN_MOUNT.1.to_owned(), bin_dir.to_owned())];
    for d in drums_init::root::DEVICES {
        v.push((format!("dev-{d}"), PathBuf::from("/dev").join(d)));
    }
    v
}

/// What one version takes, decided by crate::versions::pair.
#[derive(Clone)]
pub(crate) struct Plan {
    pub took: Took,
    /// A light version (crate::versions::light): `took` is files, and the
    /// session is checked while frozen to run only these processes.
    pub light: Option<crate::versions::DrumsOwn>,
    pub clean: bool,
    pub leave_running: bool,
    /// The version the session is at: what a selective artifact pairs with.
    pub head: Option<Manifest>,
    /// The history fields; the artifact fields are filled in as they are made.
    pub info: VersionInfo,
}

/// What [`Manager::take`] did.
enum Taken {
    Made(Box<Manifest>),
    /// The light version was refused, once the session was frozen or once
    /// its files were snapshotted: why.
    NotLight(String),
}

struct DumpReport {
    frozen_ms: f64,
    dump_ms: f64,
}

/// A dump CRIU refused, as what the session holds that cannot be taken (the
/// user reads this; CRIU's own lines go to drumsd's log, since the failed
/// checkpoint's directory, its log included, is removed).
fn explain(session: &str, e: drums_criu::CriuError) -> SessionError {
    match e.unsupported() {
        Some(u) => {
            warn!("{session}: {}", crate::error_chain(&e));
            SessionError::NotCheckpointable {
                session: session.to_owned(),
                process: u
                    .pid
                    .map_or_else(|| "a process".to_owned(), crate::process::describe),
                object: u.object,
                advice: u.advice,
            }
        }
        None => e.into(),
    }
}

/// Whether the session whose init is `init` has TCP connections, and every
/// one is to a loopback address (both ends in its network namespace).
/// Listeners and TIME_WAIT (held by the kernel, not a process) do not count.
fn connections_within(init: i32) -> bool {
    let mut any = false;
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{init}/net/{table}")) else {
            return false;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state)) = (f.get(2), f.get(3)) else {
                continue;
            };
            // 0A LISTEN, 06 TIME_WAIT, 07 CLOSE.
            if matches!(*state, "0A" | "06" | "07") {
                continue;
            }
            if !is_loopback(remote.split(':').next().unwrap_or("")) {
                return false;
            }
            any = true;
        }
    }
    any
}

/// A /proc/net/tcp{,6} address: 127.0.0.0/8, ::1, or ::ffff:127.x. The
/// kernel prints each 32-bit word of the address as it lies in memory (in
/// network order) read as a native integer, so the word's native bytes are
/// the address's.
fn is_loopback(hex: &str) -> bool {
    let bytes: Vec<u8> = (0..hex.len() / 8)
        .filter_map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .flat_map(u32::to_ne_bytes)
        .collect();
    match bytes.len() {
        4 => bytes[0] == 127,
        16 => {
            bytes[..15].iter().all(|&b| b == 0) && bytes[15] == 1
                || bytes[..10].iter().all(|&b| b == 0)
                    && bytes[10..12] == [0xff, 0xff]
                    && bytes[12] == 127
        }
        _ => false,
    }
}

/// The (device, inode) pairs `marks` watch.
fn watched_inodes(marks: &[drums_criu::fsnotify::Mark]) -> std::collections::BTreeSet<(u32, u64)> {
    marks.iter().map(|m| (m.s_dev, m.ino)).collect()
}

/// Whether a process that was in the session before a dump is gone after it.
fn vanished(before: &[i32], cgroup: &drums_cgroup::Cgroup) -> bool {
    match cgroup.pids() {
        Ok(after) => before.iter().any(|p| !after.contains(p)),
        Err(_) => false,
    }
}

/// How often a dump is tried when a netlink socket had unread messages.
const DUMP_ATTEMPTS: u32 = 3;
/// CRIU's error for that case (criu/sk-netlink.c).
const NETLINK_BUSY: &str = "The socket has data to read";

/// The checkpoints' own state in drumsd's memory: which were verified, and
/// who reads or removes which right now (see `busy`).
#[derive(Default)]
pub(crate) struct Checkpoints {
    /// Checkpoints whose image checksums were verified, with the images'
    /// newest mtime then: a full check costs ~2.5 ms per MiB, so it runs at
    /// the first restore after a daemon start and again only if an image
    /// changed; every restore checks sizes.
    verified: std::sync::Mutex<std::collections::HashMap<String, i128>>,
    /// Per version: a removal (`drums checkpoint rm`, retention) waits for
    /// the restores, rollbacks and recoveries reading it.
    busy: crate::busy::Locks,
}

impl Checkpoints {
    /// Held while a restore, rollback, recovery or export reads version `id`.
    pub(crate) async fn reading(&self, id: &str) -> crate::busy::Held {
        self.busy.shared(id).await
    }

    /// Held while version `id` is removed, alone.
    pub(crate) async fn removing(&self, id: &str) -> crate::busy::Held {
        self.busy.alone(id).await
    }

    /// Check the images of version `id` in `images` against the manifest's
    /// `list`: their sizes always, their checksums when they are new to
    /// this daemon or changed since.
    pub(crate) async fn verify(
        &self,
        id: &str,
        images: &std::path::Path,
        list: &[drums_checkpoint::ImageFile],
    ) -> Result<(), SessionError> {
        let newest = drums_checkpoint::check_sizes(images, list)?;
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            == Some(&newest);
        if !known {
            let (images, list) = (images.to_owned(), list.to_vec());
            tokio::task::spawn_blocking(move || drums_checkpoint::verify(&images, &list))
                .await
                .expect("no panic")?;
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.to_owned(), newest);
        }
        Ok(())
    }
}

impl Manager {
    /// `drums checkpoint`: a full version of the session that a person
    /// pinned (and named), taken by the engine like every version, at high
    /// priority since the caller waits for it.
    pub async fn checkpoint(
        self: &std::sync::Arc<Self>,
        req: &CreateCheckpoint,
    ) -> Result<Checkpoint, SessionError> {
        let (rec, _) = self.host.running(&req.session)?;
        if let Some(n) = &req.name {
            validate_name_of("checkpoint", n)?;
        }
        let job = crate::versions::VersionJob {
            taker: self.taker(),
            session_id: rec.id.clone(),
            turn: None,
            class: crate::versions::JobClass::Manual,
            policy: drums_api::Policy::Full,
            wanted: Took::Full,
            changed: Default::default(),
            // Unnamed, it is still pinned: named after its id.
            name: Some(req.name.clone().unwrap_or_default()),
            clean: req.clean,
            leave_running: req.leave_running,
        };
        let submitted = self
            .versions
            .engine()
            .submit(job, drums_engine::Priority::High)
            .await?;
        let m = crate::versions::outcome(self.versions.engine().wait(submitted.id).await?)?;
        Ok(to_api(&m))
    }

    /// Take what `plan` says into `ver`'s directory and snapshot, and write
    /// its manifest durably. Publishing is the caller's.
    pub(crate) async fn make_version(
        &self,
        rec: &drums_catalog::SessionRecord,
        pid: i32,
        ver: &VersionRecord,
        owner: &str,
        mut plan: Plan,
        mut worker: Option<drums_engine::Worker>,
    ) -> Result<Manifest, SessionError> {
        if plan.light.is_some() {
            match self.take(rec, pid, ver, owner, &plan, &mut worker).await? {
                Taken::Made(m) => return Ok(*m),
                Taken::NotLight(why) => {
                    info!(session = %rec.name, "version {}: not light, taken whole: {why}", ver.id);
                    plan.light = None;
                    plan.took = Took::Full;
                    plan.info.reason = Some(format!("not light: {why}"));
                }
            }
        }
        let dumps = plan.took != Took::Files;
        let aside = dumps && self.inspect_set_aside(&rec.name);
        let result = match self.take(rec, pid, ver, owner, &plan, &mut worker).await {
            Ok(Taken::Made(m)) => Ok(*m),
            Ok(Taken::NotLight(_)) => unreachable!("only a light plan is refused as one"),
            Err(e) => Err(e),
        };
        match &result {
            Err(_) if aside => self.inspect_checkpoint_failed(&rec.name),
            Ok(m) if aside && m.leave_running => self.inspect_resumed(&rec.name),
            _ => {}
        }
        result
    }

    async fn take(
        &self,
        rec: &drums_catalog::SessionRecord,
        pid: i32,
        ver: &VersionRecord,
        owner: &str,
        plan: &Plan,
        worker: &mut Option<drums_engine::Worker>,
    ) -> Result<Taken, SessionError> {
        let started = Instant::now();
        self.host.faults.check("checkpoint.dir")?;
        let dir = self.host.checkpoint_dir(&ver.id);
        self.host
            .catalog
            .record(owner, ResourceKind::Dir, &dir.display().to_string())?;
        let images = dir.join("images");
        std::fs::create_dir_all(&images).map_err(io("create", &images))?;
        let snap = self.host.checkpoint_snapshot(&ver.id);
        std::fs::create_dir_all(snap.parent().expect("has parent")).map_err(io("create", &snap))?;
        let mut info = plan.info.clone();
        info.took = plan.took;
        let mut committed = None;
        let (report, files_cost) = match plan.took {
            Took::Files => {
                // Recorded before it is made, like every subvolume.
                self.host.catalog.record(
                    owner,
                    ResourceKind::Subvolume,
                    &snap.display().to_string(),
                )?;
                self.host.faults.check("checkpoint.snapshot")?;
                // A light version's processes, checked while frozen; an
                // armed `version.light` fault refuses it as they would.
                let check = plan.light.clone().map(|own| {
                    let refused = self.host.faults.check("version.light").is_err();
                    move |pids: &[i32]| match refused {
                        true => Some("the fault version.light was injected".to_owned()),
                        false => own.why_not(pids),
                    }
                });
                let mut cost = match self.files_artifact(rec, &snap, check).await? {
                    Ok(cost) => cost,
                    Err(why) => return Ok(Taken::NotLight(why)),
                };
                // And after: a process that started and ended between the
                // job's look at the last pid and the freeze left no trace in
                // the cgroup, but moved the last pid on, so the one the job
                // read is not the files' own. Then these files go, and the
                // version is taken whole.
                if let Some(own) = &plan.light {
                    let after = match self.host.faults.check("version.light.after") {
                        Err(_) => Err("the fault version.light.after was injected".to_owned()),
                        Ok(()) => match crate::versions::last_pid(pid).await {
                            Ok(now) if now == own.last_pid => Ok(()),
                            Ok(now) => Err(format!(
                                "a process ran meanwhile (the session's last pid moved from {} to {now})",
                                own.last_pid
                            )),
                            Err(why) => Err(why),
                        },
                    };
                    if let Err(why) = after {
                        drums_store::delete_subvolume(&snap)?;
                        return Ok(Taken::NotLight(format!("once snapshotted: {why}")));
                    }
                }
                cost.bytes = self.files_bytes(&snap, plan.head.as_ref());
                (None, Some(cost))
            }
            Took::Full | Took::Process => {
                let full = plan.took == Took::Full;
                if full {
                    self.host.catalog.record(
                        owner,
                        ResourceKind::Subvolume,
                        &snap.display().to_string(),
                    )?;
                }
                // CRIU dumps into the staging tmpfs, then the images go to
                // the store sharing the pages the parent version's hold; or,
                // when the dump may not fit there, straight into the store
                // with every page written.
                let staging = self.host.staging.reserve(
                    &self.host.faults,
                    &ver.id,
                    drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id)
                        .memory_usage(),
                )?;
                let (report, held) = self
                    .dump(
                        rec,
                        pid,
                        &ver.id,
                        staging.as_ref().map_or(&images, |s| s.dir()),
                        full.then_some(&snap),
                        plan.leave_running,
                    )
                    .await?;
                if let Some(staged) = staging {
                    // The session is captured (and thawed). What is left,
                    // copying its images with their checksums and fsyncs
                    // and syncing the store, is not CRIU's: the
                    // scheduler's worker goes to the next session's dump
                    // meanwhile (drums_engine, "A bounded pool of
                    // workers"). This session's next job still waits.
                    drop(worker.take());
                    committed = Some(self.commit(staged, &images, plan.head.as_ref()).await?);
                }
                info.held = held;
                (Some(report), None)
            }
        };
        self.host
            .catalog
            .set_version_state(&ver.id, VersionState::Versioning)?;
        self.host.faults.hold("version.manifest").await;
        self.engine_faults()?;
        let head = plan.head.as_ref();
        let (images_list, frozen_ms, dump_ms) = match (&report, &committed) {
            // Copied from the staging tmpfs: already checksummed and fsynced.
            (Some(r), Some(c)) => (c.images.clone(), r.frozen_ms, r.dump_ms),
            (Some(r), None) => {
                let images_dir = images.clone();
                let files =
                    tokio::task::spawn_blocking(move || drums_checkpoint::seal_images(&images_dir))
                        .await
                        .expect("seal task does not panic")?;
                (files, r.frozen_ms, r.dump_ms)
            }
            // A files artifact restores with the head's process images.
            (None, _) => (
                head.map(|h| h.images.clone()).unwrap_or_default(),
                files_cost.map_or(0.0, |c| c.frozen_ms),
                0.0,
            ),
        };
        let own = ver.id.clone();
        match plan.took {
            Took::Full => {
                info.files_of = own.clone();
                info.process_of = Some(own.clone());
            }
            Took::Process => {
                info.files_of = head.map_or(own.clone(), |h| h.files_of().to_owned());
                info.process_of = Some(own.clone());
            }
            Took::Files => {
                info.files_of = own.clone();
                // A light version stands for processes a cold start makes,
                // and the last pid it puts back.
                info.last_pid = plan.light.as_ref().map(|own| own.last_pid);
                info.process_of =
                    if info.policy == drums_api::Policy::Files.as_str() || plan.light.is_some() {
                        None
                    } else {
                        head.and_then(|h| h.process_of().map(str::to_owned))
                    };
                info.held = head
                    .filter(|_| plan.light.is_none())
                    .and_then(|h| h.version.as_ref())
                    .map(|v| v.held.clone())
                    .unwrap_or_default();
            }
        }
        let total_ms = started.elapsed().as_secs_f64() * 1e3;
        let images_bytes: u64 = images_list.iter().map(|i| i.size).sum();
        if let Some(r) = &report {
            let (written, shared) = committed
                .as_ref()
                .map_or((images_bytes, 0), |c| (c.written, c.shared));
            info.process = Some(ArtifactCost {
                bytes: written,
                shared_bytes: shared,
                frozen_ms: r.frozen_ms,
                total_ms,
            });
            if plan.took == Took::Full {
                info.files = Some(ArtifactCost {
                    bytes: self.files_bytes(&snap, head),
                    shared_bytes: 0,
                    frozen_ms: r.frozen_ms,
                    total_ms,
                });
            }
        }
        if let Some(mut c) = files_cost {
            c.total_ms = total_ms;
            info.files = Some(c);
        }
        let m = Manifest {
            format_version: FORMAT_VERSION,
            id: ver.id.clone(),
            name: ver.name.clone(),
            created_at_ms: ver.created_at_ms,
            session: SourceSession {
                id: rec.id.clone(),
                name: rec.name.clone(),
                hostname: rec.hostname.clone(),
                profile: rec.profile.as_str().into(),
                image: rec.image.clone(),
                network: rec.network.as_str().into(),
                egress: rec.egress.as_str().into(),
                limits: rec.limits.clone(),
                generation: rec.generation,
                privileged: rec.privileged,
                user_namespace: rec.id_base.is_some(),
            },
            host: self.host.fingerprint.clone(),
            clean: plan.clean,
            leave_running: plan.leave_running,
            images: images_list,
            origin: None,
            frozen_ms,
            dump_ms,
            version: Some(info),
        };
        m.write(&dir)?;
        drums_checkpoint::fsync_dir(dir.parent().expect("has parent"))?;
        Ok(Taken::Made(Box::new(m)))
    }

    /// The file data a files artifact wrote: what its snapshot holds in
    /// extents newer than the previous files artifact (all of it without
    /// one). Metadata is not counted; a failure to count counts nothing.
    fn files_bytes(&self, snap: &std::path::Path, head: Option<&Manifest>) -> u64 {
        let since = head
            .and_then(|h| {
                drums_store::subvolume_info(&self.host.checkpoint_snapshot(h.files_of())).ok()
            })
            .map_or(0, |i| i.created);
        drums_store::written_since(snap, since).map_or(0, |w| w.bytes)
    }

    /// The fault point between the artifacts and the manifest.
    fn engine_faults(&self) -> Result<(), SessionError> {
        self.host.faults.check("version.manifest")
    }

    /// A read-only snapshot of the session's subvolume, taken while its
    /// cgroup is frozen (the unified hierarchy's `cgroup.freeze`, measured
    /// fastest: docs/engine.md), so no write is torn. With `check`, the
    /// session's processes are read once frozen, and the snapshot is not
    /// taken if it says why not (the inner error).
    async fn files_artifact(
        &self,
        rec: &drums_catalog::SessionRecord,
        snap: &std::path::Path,
        check: Option<impl Fn(&[i32]) -> Option<String> + Send + 'static>,
    ) -> Result<Result<ArtifactCost, String>, SessionError> {
        let upper = self.host.store_root.join("sessions").join(&rec.id);
        let cg = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id);
        let target = snap.to_owned();
        let (inspector, name) = (self.inspector(), rec.name.clone());
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            // The freeze is no work of the session's processes: the
            // inspector takes its cost back out once they are thawed.
            let pause = inspector.freezing(&name).unwrap_or_else(|e| {
                tracing::warn!("inspector: {name} is about to be frozen: {e}");
                None
            });
            let f0 = Instant::now();
            let snapped = cg.freeze(drums_cgroup::FreezeMethod::V2).map(|frozen| {
                let refused = check.and_then(|c| match cg.pids() {
                    Ok(pids) => c(&pids),
                    Err(e) => Some(format!("the session's processes could not be read: {e}")),
                });
                let made = match &refused {
                    Some(_) => Ok(()),
                    None => {
                        let inherit = drums_store::QgroupInherit::session(None);
                        drums_store::snapshot_with(&upper, &target, true, &inherit)
                    }
                };
                // Thawed whatever the snapshot did.
                (made, frozen.thaw(), refused)
            });
            let frozen_ms = f0.elapsed().as_secs_f64() * 1e3;
            if let Some(p) = pause {
                if let Err(e) = inspector.thawed(&name, p) {
                    tracing::warn!("inspector: {name} was thawed: {e}");
                }
            }
            let (made, thawed, refused) = snapped?;
            made?;
            thawed?;
            if let Some(why) = refused {
                return Ok(Err(why));
            }
            Ok::<_, SessionError>(Ok(ArtifactCost {
                bytes: 0,
                shared_bytes: 0,
                frozen_ms,
                total_ms: t0.elapsed().as_secs_f64() * 1e3,
            }))
        })
        .await
        .expect("snapshot task does not panic")
    }

    /// Copy a dump's images from the staging tmpfs to `images` in the store,
    /// sharing the pages the head's process images hold
    /// (drums_checkpoint::share), then drop the staged dump. The fault
    /// `checkpoint.share` leaves the head out (every page written);
    /// `checkpoint.commit` stops the copy after its first image.
    async fn commit(
        &self,
        staged: crate::staging::Staged,
        images: &std::path::Path,
        head: Option<&Manifest>,
    ) -> Result<drums_checkpoint::share::Committed, SessionError> {
        let parent = match self.host.faults.check("checkpoint.share") {
            Err(_) => None,
            Ok(()) => head
                .and_then(|h| h.process_of())
                .map(|id| self.host.checkpoint_dir(id).join("images")),
        };
        let stop = self.host.faults.check("checkpoint.commit").err();
        let dest = images.to_owned();
        let c = tokio::task::spawn_blocking(move || {
            let c = drums_checkpoint::share::commit_images(
                staged.dir(),
                &dest,
                parent.as_deref(),
                |name| match &stop {
                    Some(e) => Err(drums_checkpoint::share::interrupted(format!(
                        "after {name}: {e}"
                    ))),
                    None => Ok(()),
                },
            )?;
            // Commit the store's transaction now, with the session thawed:
            // the images' fsyncs only went to btrfs' log, and the next
            // snapshot (taken frozen) would otherwise commit all of it,
            // clones and all, while the session waits.
            if let Ok(dir) = std::fs::File::open(&dest) {
                if let Err(e) = nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) {
                    warn!("syncfs {}: {e}", dest.display());
                }
            }
            Ok::<_, drums_checkpoint::CheckpointError>(c)
        })
        .await
        .expect("commit task does not panic")?;
        if let Some(why) = &c.unshared {
            warn!(
                "version images in {}: nothing shared: {why}",
                images.display()
            );
        }
        Ok(c)
    }

    /// A CRIU dump of the session into `images`; with `snap`, the files
    /// artifact too, in CRIU's post-dump notification while the tree is
    /// still frozen. Returns the report and the files the tree held.
    async fn dump(
        &self,
        rec: &drums_catalog::SessionRecord,
        pid: i32,
        id: &str,
        images: &std::path::Path,
        snap: Option<&std::path::Path>,
        leave_running: bool,
    ) -> Result<(DumpReport, Vec<String>), SessionError> {
        let upper = self.host.store_root.join("sessions").join(&rec.id);
        self.host.faults.hold("checkpoint.criu").await;
        self.host.faults.check("checkpoint.criu")?;
        let snapshot_fault = self.host.faults.check("checkpoint.snapshot").is_err();
        let opts = drums_criu::DumpOpts {
            pid,
            images_dir: images.to_owned(),
            leave_running,
            // Not the v1 freezer: CRIU polls its state every 100 ms, so the
            // freeze alone cost 100 ms of frozen time. Seizing a session's few
            // processes with ptrace takes a few ms.
            freeze_cgroup: None,
            external_mounts: external_mounts_dump(),
            network_lock: network_lock(rec.network),
            // Decided per attempt, below.
            tcp_established: false,
        };
        let cg = drums_cgroup::Cgroup::open(&self.host.cfg.cgroup_parent, &rec.id);
        // The root's layers, where watched inodes are looked up.
        let layers = vec![upper.join("upper"), self.resolve_image(&rec.image)?.rootfs];
        let started = Instant::now();
        let mut attempt = 1;
        let mut retried_exit = false;
        let (report, held) = loop {
            let before = cg.pids().unwrap_or_default();
            // Every watch's path, for CRIU (crate::watches). Read before the
            // freeze, so a watch added meanwhile is not in it: see below.
            let marks = drums_criu::fsnotify::marks(&before);
            let watched = watched_inodes(&marks);
            let (session, layers_, images_) = (rec.name.clone(), layers.clone(), images.to_owned());
            tokio::task::spawn_blocking(move || {
                let entries = crate::watches::irmap_entries(&session, pid, &marks, &layers_)?;
                drums_criu::fsnotify::write_irmap_cache(&images_, &entries)?;
                Ok::<_, SessionError>(())
            })
            .await
            .expect("no panic")?;
            let (criu, mut opts) = (self.host.criu.clone(), opts.clone());
            // A connection with both ends in the session (loopback) comes
            // back whole, in any sibling: its addresses are the session's
            // own. One with a peer outside cannot (a sibling has another
            // address, and the peer's side is not in the version), and CRIU
            // takes all of a tree's connections or none of their state: so
            // only when every connection is within the session is it kept;
            // otherwise every one is restored closed (`tcp_close`).
            opts.tcp_established = connections_within(pid);
            let (upper, target) = (upper.clone(), snap.map(|s| s.to_owned()));
            let (inspector, name, tree) = (self.inspector(), rec.name.clone(), cg.clone());
            let result = tokio::task::spawn_blocking(move || {
                let mut held = Vec::new();
                let r = criu.dump(&opts, &mut |script, _pid| {
                    // The tree stays frozen until this returns: the one moment
                    // files and processes agree.
                    if script == drums_criu::script::POST_DUMP {
                        held = crate::versions::held_paths(&tree.pids().unwrap_or_default());
                        if let Some(target) = &target {
                            if snapshot_fault {
                                return Err(
                                    SessionError::Injected("checkpoint.snapshot".into()).into()
                                );
                            }
                            // In the sessions' qgroup, so siblings snapshotted
                            // from it join a group their source is already in and
                            // the kernel never has to rescan.
                            let inherit = drums_store::QgroupInherit::session(None);
                            drums_store::snapshot_with(&upper, target, true, &inherit)?;
                        }
                        // What the tree did is now in the version: the
                        // inspector starts over from here.
                        if let Err(e) = inspector.checkpointed(&name) {
                            warn!("inspector: {name}: {e}");
                        }
                    }
                    Ok(())
                });
                r.map(|report| (report, held))
            })
            .await
            .expect("dump task does not panic");
            // Nothing to try again once the snapshot is made: the files are
            // already in the version.
            let again = match &result {
                Err(_) if snap.is_some_and(|s| s.exists()) => None,
                // The session's init is exiting: nothing is left to dump.
                Err(drums_criu::CriuError::Abandoned { .. }) => None,
                // CRIU cannot dump a netlink socket with unread messages. A
                // browser's route-monitoring socket gets one whenever the
                // session's network changes (an IPv6 address finishing its
                // duplicate check, a second or two after a start or restore);
                // the failed dump thawed the tree, the browser reads it, and
                // the next attempt finds the queue empty.
                Err(e)
                    if attempt < DUMP_ATTEMPTS && crate::error_chain(e).contains(NETLINK_BUSY) =>
                {
                    Some(NETLINK_BUSY)
                }
                // A task that dies while CRIU has it seized (SIGKILLed by the
                // OOM killer, or by a process CRIU had not frozen yet) fails
                // the dump: CRIU cannot cure or detach from it. The session
                // lives on without it, so one more dump, of the tree as it now
                // is, usually succeeds. Told from CRIU's own failures by the
                // session's pids, not by CRIU's wording; only once, so a real
                // failure in a session whose processes come and go is
                // reported after one retry.
                Err(_) if !retried_exit && vanished(&before, &cg) => {
                    retried_exit = true;
                    Some("a process of the session exited during the dump")
                }
                // A watch added after the paths were read has none in the
                // cache, and CRIU cannot find one: read them again.
                Err(_)
                    if attempt < DUMP_ATTEMPTS
                        && watched_inodes(&drums_criu::fsnotify::marks(
                            &cg.pids().unwrap_or_default(),
                        ))
                        .difference(&watched)
                        .next()
                        .is_some() =>
                {
                    Some("a process of the session added a file watch during the dump")
                }
                _ => None,
            };
            match (result, again) {
                (Err(_), Some(why)) => {
                    warn!("version {id}: {why}; dumping again");
                    attempt += 1;
                    std::fs::remove_dir_all(images).map_err(io("clear", images))?;
                    std::fs::create_dir_all(images).map_err(io("create", images))?;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                (result, _) => break result.map_err(|e| explain(&rec.name, e))?,
            }
        };
        let frozen_ms = report
            .frozen_at_most
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0);
        Ok((
            DumpReport {
                frozen_ms,
                dump_ms: started.elapsed().as_secs_f64() * 1e3,
            },
            held,
        ))
    }

    /// Published checkpoints (pinned versions), oldest first.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, SessionError> {
        let mut out = Vec::new();
        for c in self.host.catalog.versions()? {
            if c.state == VersionState::Done && c.pinned {
                if let Ok(m) = serde_json::from_value::<Manifest>(c.manifest) {
                    out.push(to_api(&m));
                }
            }
        }
        Ok(out)
    }

    pub fn get_checkpoint(&self, id_or_name: &str) -> Result<Checkpoint, SessionError> {
        Ok(to_api(&self.manifest(id_or_name)?.1))
    }

    /// A done version's record and manifest (read from disk, so what a
    /// restore uses is what is there).
    pub(crate) fn manifest(
        &self,
        id_or_name: &str,
    ) -> Result<(VersionRecord, Manifest), SessionError> {
        let ck = self
            .host
            .catalog
            .version(id_or_name)?
            .filter(|c| c.state == VersionState::Done)
            .ok_or_else(|| SessionError::CheckpointNotFound(id_or_name.to_owned()))?;
        let m = Manifest::read(&self.host.checkpoint_dir(&ck.id))?;
        Ok((ck, m))
    }

    /// `drums checkpoint rm`: the record, then its artifacts unless a later
    /// version of its session still uses them.
    pub async fn remove_checkpoint(&self, id_or_name: &str) -> Result<(), SessionError> {
        let ck = self
            .host
            .catalog
            .version(id_or_name)?
            .ok_or_else(|| SessionError::CheckpointNotFound(id_or_name.to_owned()))?;
        if ck.state.in_flight() {
            return Err(SessionError::Conflict(format!(
                "checkpoint {} is still being made ({})",
                ck.name, ck.state
            )));
        }
        let pools = self.host.catalog.pools_of_checkpoint(&ck.id)?;
        if !pools.is_empty() {
            return Err(SessionError::Conflict(format!(
                "checkpoint {} is what warm pool(s) {} restore; remove them first (drums pool rm)",
                ck.name,
                pools.join(", ")
            )));
        }
        self.host
            .catalog
            .set_version_state(&ck.id, VersionState::Removing)?;
        self.drop_version(&ck).await
    }
}

/// CRIU's network lock keeps TCP peers from seeing a half-dumped connection.
/// drums never dumps established connections (siblings get new addresses, so
/// they would point nowhere; CRIU refuses the dump instead), and listening
/// sockets need no lock: the lock would only add ~12 ms of frozen time and an
/// nft table per dump and per restore.
pub(crate) fn network_lock(_network: drums_api::Network) -> drums_criu::NetworkLock {
    drums_criu::NetworkLock::Skip
}

pub fn to_api(m: &Manifest) -> Checkpoint {
    Checkpoint {
        id: m.id.clone(),
        name: m.name.clone(),
        session_id: m.session.id.clone(),
        created_at_ms: m.created_at_ms,
        clean: m.clean,
        profile: m.session.profile.clone(),
        image: m.session.image.clone(),
        format_version: m.format_version,
        images_bytes: m.images_bytes(),
        dump_ms: m.dump_ms,
        frozen_ms: m.frozen_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_as_proc_net_tcp_prints_them() {
        assert!(is_loopback("0100007F"));
        assert!(is_loopback("0500007F"));
        assert!(!is_loopback("0500D60A")); // 10.214.0.5
        assert!(is_loopback("00000000000000000000000001000000"));
        assert!(is_loopback("0000000000000000FFFF00000100007F"));
        assert!(!is_loopback("0000000000000000FFFF00000500D60A"));
        assert!(!is_loopback(""));
    }
}
