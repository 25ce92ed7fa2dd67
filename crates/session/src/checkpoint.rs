//! Checkpointing a session: CRIU dumps the process tree, and while the tree is
//! still frozen (CRIU's `post-dump` notification) a read-only btrfs snapshot of
//! the session's upper layer is taken, so files and processes are consistent.
//! Published only when every part is on disk.

use std::path::PathBuf;
use std::time::Instant;

use drums_api::{Checkpoint, CreateCheckpoint};
use drums_catalog::{CheckpointRecord, ResourceKind};
use drums_checkpoint::{Manifest, SourceSession, FORMAT_VERSION};
use tracing::warn;

use crate::create::random_hex;
use crate::manager::Manager;
use crate::spec::validate_name_of;
use crate::{io, teardown, SessionError};

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

impl Manager {
    pub(crate) fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("checkpoints").join(id)
    }

    pub(crate) fn checkpoint_snapshot(&self, id: &str) -> PathBuf {
        self.store_root.join("checkpoints").join(id)
    }

    pub async fn checkpoint(&self, req: &CreateCheckpoint) -> Result<Checkpoint, SessionError> {
        let held_id = self.record(&req.session)?.id;
        if let Some(n) = &req.name {
            validate_name_of("checkpoint", n)?;
        }
        // Held to the end, the session's stop included: a remove of this
        // session waits for the dump rather than kill what CRIU has seized.
        // The state is read under the lock: a remove that came first leaves
        // the session removing (409) or gone (404).
        let _held = self.busy_sessions.alone(&held_id).await;
        let (rec, pid) = self.running(&held_id)?;
        let id = random_hex(6);
        let ck = CheckpointRecord {
            id: id.clone(),
            name: req.name.clone().unwrap_or_else(|| id.clone()),
            session_id: rec.id.clone(),
            state: "pending".into(),
            created_at_ms: drums_catalog::now_ms(),
            manifest: serde_json::Value::Null,
        };
        self.catalog.insert_checkpoint(&ck)?;
        let owner = format!("ckpt:{id}");
        let aside = self.inspect_set_aside(&rec.name);
        let result = self.dump_and_publish(&rec, &ck, &owner, pid, req).await;
        match &result {
            Err(_) if aside => self.inspect_checkpoint_failed(&rec.name),
            Ok(_) if aside && req.leave_running => self.inspect_resumed(&rec.name),
            _ => {}
        }
        result
    }

    async fn dump_and_publish(
        &self,
        rec: &drums_catalog::SessionRecord,
        ck: &CheckpointRecord,
        owner: &str,
        pid: i32,
        req: &CreateCheckpoint,
    ) -> Result<Checkpoint, SessionError> {
        let id = &ck.id;
        match self.dump(rec, pid, ck, owner, req).await {
            Ok(m) => {
                // Published, and in the same transaction the checkpoint row
                // takes over its directory and snapshot from the ledger.
                self.catalog.publish_checkpoint(
                    id,
                    &serde_json::to_value(&m).expect("manifest serializes"),
                    owner,
                )?;
                if !req.leave_running {
                    // CRIU killed the tree after dumping it; remove the rest
                    // (the caller holds the session's lock).
                    self.remove_record(rec).await?;
                }
                Ok(to_api(&m))
            }
            Err(e) => {
                if let Err(t) = teardown::remove_owned(self, owner).await {
                    warn!(
                        "clean up failed checkpoint {id}: {}",
                        crate::error_chain(&t)
                    );
                } else {
                    self.catalog.delete_checkpoint(id)?;
                }
                Err(e)
            }
        }
    }

    async fn dump(
        &self,
        rec: &drums_catalog::SessionRecord,
        pid: i32,
        ck: &CheckpointRecord,
        owner: &str,
        req: &CreateCheckpoint,
    ) -> Result<Manifest, SessionError> {
        self.faults.check("checkpoint.dir")?;
        let dir = self.checkpoint_dir(&ck.id);
        self.catalog
            .record(owner, ResourceKind::Dir, &dir.display().to_string())?;
        let images = dir.join("images");
        std::fs::create_dir_all(&images).map_err(io("create", &images))?;
        let snap = self.checkpoint_snapshot(&ck.id);
        std::fs::create_dir_all(snap.parent().expect("has parent")).map_err(io("create", &snap))?;
        // Recorded before CRIU runs: the snapshot is made inside its callback.
        self.catalog
            .record(owner, ResourceKind::Subvolume, &snap.display().to_string())?;
        let upper = self.store_root.join("sessions").join(&rec.id);

        self.faults.check("checkpoint.criu")?;
        let snapshot_fault = self
            .faults
            .check("checkpoint.snapshot")
            .err()
            .map(|e| e.to_string());
        let opts = drums_criu::DumpOpts {
            pid,
            images_dir: images.clone(),
            leave_running: req.leave_running,
            // Not the v1 freezer: CRIU polls its state every 100 ms, so the
            // freeze alone cost 100 ms of frozen time. Seizing a session's few
            // processes with ptrace takes a few ms.
            freeze_cgroup: None,
            external_mounts: external_mounts_dump(),
            network_lock: network_lock(&rec.network),
            tcp_established: false,
        };
        let started = Instant::now();
        let mut attempt = 1;
        let mut retried_exit = false;
        let cgroup = drums_cgroup::Cgroup::open(&self.cfg.cgroup_parent, &rec.id);
        let report = loop {
            let before = cgroup.pids().unwrap_or_default();
            let (criu, opts) = (self.criu.clone(), opts.clone());
            let (upper, target, snapshot_fault) =
                (upper.clone(), snap.clone(), snapshot_fault.clone());
            let (inspector, name) = (self.inspector(), rec.name.clone());
            let result = tokio::task::spawn_blocking(move || {
                criu.dump(&opts, &mut |script, _pid| {
                    // The tree stays frozen until this returns: the one moment
                    // files and processes agree.
                    if script == drums_criu::script::POST_DUMP {
                        if let Some(f) = &snapshot_fault {
                            return Err(f.clone());
                        }
                        // In the sessions' qgroup, so siblings snapshotted
                        // from it join a group their source is already in and
                        // the kernel never has to rescan.
                        let inherit = drums_store::QgroupInherit::session(None);
                        drums_store::snapshot_with(&upper, &target, true, &inherit)
                            .map_err(|e| crate::error_chain(&e))?;
                        // Files and processes are now in the checkpoint: the
                        // inspector starts over from here.
                        if let Err(e) = inspector.checkpointed(&name) {
                            warn!("inspector: {name}: {e}");
                        }
                    }
                    Ok(())
                })
            })
            .await
            .expect("dump task does not panic");
            // Nothing to try again once the snapshot is made: the files are
            // already in the checkpoint.
            let again = match &result {
                Err(_) if snap.exists() => None,
                // CRIU cannot dump a netlink socket with unread messages. A
                // browser's route-monitoring socket gets one whenever the
                // session's network changes (an IPv6 address finishing its
                // duplicate check, a second or two after a start or restore);
                // the failed dump thawed the tree, the browser reads it, and
                // the next attempt finds the queue empty.
                Err(e)
                    if attempt < DUMP_ATTEMPTS && crate::error_chain(&e).contains(NETLINK_BUSY) =>
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
                Err(_) if !retried_exit && vanished(&before, &cgroup) => {
                    retried_exit = true;
                    Some("a process of the session exited during the dump")
                }
                _ => None,
            };
            match (result, again) {
                (Err(_), Some(why)) => {
                    warn!("checkpoint {}: {why}; dumping again", ck.id);
                    attempt += 1;
                    std::fs::remove_dir_all(&images).map_err(io("clear", &images))?;
                    std::fs::create_dir_all(&images).map_err(io("create", &images))?;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                (result, _) => break result?,
            }
        };
        let frozen_ms = report
            .frozen_at_most
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0);
        let dump_ms = started.elapsed().as_secs_f64() * 1e3;

        let images_dir = images.clone();
        let files = tokio::task::spawn_blocking(move || drums_checkpoint::seal_images(&images_dir))
            .await
            .expect("seal task does not panic")?;
        let m = Manifest {
            format_version: FORMAT_VERSION,
            id: ck.id.clone(),
            name: ck.name.clone(),
            created_at_ms: ck.created_at_ms,
            session: SourceSession {
                id: rec.id.clone(),
                name: rec.name.clone(),
                hostname: rec.hostname.clone(),
                profile: rec.profile.clone(),
                image: rec.image.clone(),
                network: rec.network.clone(),
                egress: rec.egress.clone(),
                limits: rec.limits.clone(),
                generation: rec.generation,
                privileged: rec.privileged,
                user_namespace: rec.id_base.is_some(),
            },
            host: self.host.clone(),
            clean: req.clean,
            leave_running: req.leave_running,
            images: files,
            origin: None,
            frozen_ms,
            dump_ms,
        };
        m.write(&dir)?;
        drums_checkpoint::fsync_dir(dir.parent().expect("has parent"))?;
        Ok(m)
    }

    /// Published checkpoints, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, SessionError> {
        let mut out = Vec::new();
        for c in self.catalog.checkpoints()? {
            if c.state == "done" {
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

    /// A published checkpoint's record and manifest (read from disk, so what a
    /// restore uses is what is there).
    pub(crate) fn manifest(
        &self,
        id_or_name: &str,
    ) -> Result<(CheckpointRecord, Manifest), SessionError> {
        let ck = self
            .catalog
            .checkpoint(id_or_name)?
            .filter(|c| c.state == "done")
            .ok_or_else(|| SessionError::CheckpointNotFound(id_or_name.to_owned()))?;
        let m = Manifest::read(&self.checkpoint_dir(&ck.id))?;
        Ok((ck, m))
    }

    /// `drums checkpoint rm`: the images, the snapshot, then the record.
    pub async fn remove_checkpoint(&self, id_or_name: &str) -> Result<(), SessionError> {
        let found = |id: &str| {
            self.catalog
                .checkpoint(id)?
                .ok_or_else(|| SessionError::CheckpointNotFound(id_or_name.to_owned()))
        };
        let id = found(id_or_name)?.id;
        // Restores in flight read its images and snapshot: they finish first
        // (see `busy`). Read again: another remove may have come first.
        let _held = self.busy_checkpoints.alone(&id).await;
        let ck = found(&id)?;
        let owner = format!("ckpt:{}", ck.id);
        self.catalog.record(
            &owner,
            ResourceKind::Dir,
            &self.checkpoint_dir(&ck.id).display().to_string(),
        )?;
        self.catalog.record(
            &owner,
            ResourceKind::Subvolume,
            &self.checkpoint_snapshot(&ck.id).display().to_string(),
        )?;
        self.catalog.set_checkpoint_state(&ck.id, "removing")?;
        teardown::remove_owned(self, &owner).await?;
        self.catalog.delete_checkpoint(&ck.id)?;
        Ok(())
    }
}

/// CRIU's network lock keeps TCP peers from seeing a half-dumped connection.
/// drums never dumps established connections (siblings get new addresses, so
/// they would point nowhere; CRIU refuses the dump instead), and listening
/// sockets need no lock: the lock would only add ~12 ms of frozen time and an
/// nft table per dump and per restore.
pub(crate) fn network_lock(_network: &str) -> drums_criu::NetworkLock {
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
