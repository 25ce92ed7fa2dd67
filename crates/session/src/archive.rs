//! `drums checkpoint export` / `import`: one tar archive holding a checkpoint's
//! manifest, its CRIU images and its file-system snapshot, restorable on
//! another host of the same kernel and CPU family.
//!
//! GNU tar does the work (not a hot path): it keeps the overlay upper layer's
//! extended attributes (`trusted.overlay.*`, which mark opaque directories)
//! and its whiteouts (0:0 character devices), which a tar library would drop.
//! Layout: `manifest.json` first, then `images/…`, then `fs/…`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use drums_api::Checkpoint;
use drums_catalog::{CheckpointRecord, ResourceKind};
use drums_checkpoint::Manifest;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tracing::warn;

use crate::checkpoint::to_api;
use crate::create::random_hex;
use crate::manager::Manager;
use crate::{io, teardown, SessionError};

/// The options that make tar keep what an overlay upper layer needs.
const TAR_FS_FLAGS: &[&str] = &[
    "--xattrs",
    "--xattrs-include=*",
    "--acls",
    "--numeric-owner",
    "--sparse",
];

impl Manager {
    /// Start `tar` writing the archive of a published checkpoint to its stdout.
    pub fn export(&self, id_or_name: &str) -> Result<Child, SessionError> {
        let (ck, _) = self.manifest(id_or_name)?;
        let dir = self.checkpoint_dir(&ck.id);
        let snap = self.checkpoint_snapshot(&ck.id);
        let mut cmd = Command::new("tar");
        cmd.arg("--create")
            .arg("--file=-")
            .args(TAR_FS_FLAGS)
            // Only the snapshot's members start with "./": they become fs/….
            .arg("--transform=s,^\\./,fs/,")
            .arg("-C")
            .arg(&dir)
            .arg("manifest.json")
            .arg("images")
            .arg("-C")
            .arg(&snap)
            .arg(".")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd.spawn().map_err(io("spawn", PathBuf::from("tar")))
    }

    /// Import an archive streamed in `body`: refused (and nothing kept) when
    /// the manifest is of a newer format, was taken on an incompatible host,
    /// or an image is damaged; otherwise published like a local checkpoint.
    pub async fn import<S, E>(&self, mut body: S) -> Result<Checkpoint, SessionError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures::StreamExt;
        // Everything lands in a staging directory on the store first, so the
        // fs/ part can go straight into a subvolume (created before tar runs).
        let token = random_hex(6);
        let owner = format!("import:{token}");
        let staging = self
            .store_root
            .join("checkpoints")
            .join(format!(".import-{token}"));
        self.catalog
            .record(&owner, ResourceKind::Dir, &staging.display().to_string())?;
        std::fs::create_dir_all(&staging).map_err(io("create", &staging))?;
        let fs = staging.join("fs");
        self.catalog
            .record(&owner, ResourceKind::Subvolume, &fs.display().to_string())?;
        let result = async {
            // In the sessions' qgroup: an archive's fs/ counts against what
            // sessions may hold, so an import cannot eat drumsd's reserve.
            drums_store::create_subvolume_with(&fs, &drums_store::QgroupInherit::session(None))?;
            let mut tar = Command::new("tar")
                .arg("--extract")
                .arg("--file=-")
                .args(TAR_FS_FLAGS)
                .arg("-C")
                .arg(&staging)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(io("spawn", PathBuf::from("tar")))?;
            let mut stdin = tar.stdin.take().expect("piped");
            while let Some(chunk) = body.next().await {
                let chunk =
                    chunk.map_err(|e| SessionError::Invalid(format!("read the archive: {e}")))?;
                if stdin.write_all(&chunk).await.is_err() {
                    break; // tar stopped reading: its exit status says why
                }
            }
            drop(stdin);
            let out = tar
                .wait_with_output()
                .await
                .map_err(io("wait for", PathBuf::from("tar")))?;
            if !out.status.success() {
                return Err(SessionError::Invalid(format!(
                    "not a drums checkpoint archive: tar: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            self.publish_import(&staging).await
        }
        .await;
        if let Err(t) = teardown::remove_owned(self, &owner).await {
            warn!("clean up import staging: {}", crate::error_chain(&t));
        }
        result
    }

    async fn publish_import(&self, staging: &Path) -> Result<Checkpoint, SessionError> {
        let m = Manifest::read(staging)?;
        // Refused here, before anything is published or CRIU ever runs.
        m.host.check_restorable_on(&self.host)?;
        let images = staging.join("images");
        let (imgs, list) = (images.clone(), m.images.clone());
        tokio::task::spawn_blocking(move || drums_checkpoint::verify(&imgs, &list))
            .await
            .expect("no panic")?;
        if self.catalog.checkpoint(&m.id)?.is_some() {
            return Err(SessionError::Invalid(format!(
                "checkpoint {} is already here",
                m.id
            )));
        }
        let ck = CheckpointRecord {
            id: m.id.clone(),
            name: m.name.clone(),
            session_id: m.session.id.clone(),
            state: "pending".into(),
            created_at_ms: m.created_at_ms,
            manifest: serde_json::Value::Null,
        };
        self.catalog.insert_checkpoint(&ck)?;
        let owner = format!("ckpt:{}", m.id);
        let result = async {
            let dir = self.checkpoint_dir(&m.id);
            self.catalog
                .record(&owner, ResourceKind::Dir, &dir.display().to_string())?;
            let dst = dir.join("images");
            std::fs::create_dir_all(&dst).map_err(io("create", &dst))?;
            for i in &m.images {
                std::fs::copy(images.join(&i.name), dst.join(&i.name))
                    .map_err(io("copy", dst.join(&i.name)))?;
            }
            let (dst2, list) = (dst.clone(), m.images.clone());
            tokio::task::spawn_blocking(move || {
                drums_checkpoint::verify(&dst2, &list)
                    .and_then(|_| drums_checkpoint::seal_images(&dst2))
            })
            .await
            .expect("no panic")?;
            let snap = self.checkpoint_snapshot(&m.id);
            self.catalog
                .record(&owner, ResourceKind::Subvolume, &snap.display().to_string())?;
            drums_store::snapshot_with(
                &staging.join("fs"),
                &snap,
                true,
                &drums_store::QgroupInherit::session(None),
            )?;
            m.write(&dir)?;
            drums_checkpoint::fsync_dir(dir.parent().expect("has parent"))?;
            self.catalog.publish_checkpoint(
                &m.id,
                &serde_json::to_value(&m).expect("manifest serializes"),
            )?;
            for r in self.catalog.owned_by(&owner)? {
                self.catalog.release(r.seq)?;
            }
            Ok(to_api(&m))
        }
        .await;
        if result.is_err() {
            if let Err(t) = teardown::remove_owned(self, &owner).await {
                warn!(
                    "clean up failed import {}: {}",
                    m.id,
                    crate::error_chain(&t)
                );
            } else {
                self.catalog.delete_checkpoint(&m.id)?;
            }
        }
        result
    }
}
