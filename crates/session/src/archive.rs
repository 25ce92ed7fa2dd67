//! `drums checkpoint export` / `import`: one signed tar archive holding a
//! checkpoint's manifest, its CRIU images and its file-system snapshot,
//! restorable on another host of the same kernel and CPU family.
//!
//! The format, what the signature covers and what an import accepts are in
//! [`drums_checkpoint::archive`]; this module runs them against the store.
//!
//! Export: GNU tar writes the members (it keeps the overlay upper layer's
//! `trusted.overlay.*` xattrs, which mark opaque directories, and its 0:0
//! whiteouts); the stream passes through drumsd, which hashes it, drops tar's
//! end-of-archive blocks and, only once tar has exited 0, appends the signed
//! `signature.json`. Any failure ends the HTTP body with an error rather than
//! a clean end, so the client never takes a truncated archive for a whole one.
//!
//! Import: the body is spooled to a root-only file in a staging directory on
//! the store, the whole file is validated, and only then is anything
//! extracted, by the same parser that validated it. The checkpoint gets a
//! fresh local id; the archive's id is kept in the manifest as `origin`.

use drums_api::VersionState;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bytes::Bytes;
use drums_api::Checkpoint;
use drums_catalog::{CatalogError, ResourceKind, VersionRecord};
use drums_checkpoint::archive::{self, ArchiveError, Trust};
use drums_checkpoint::keys::{self, HostKey};
use drums_checkpoint::Manifest;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tracing::warn;

use crate::checkpoint::to_api;
use crate::create::random_hex;
use crate::manager::Manager;
use crate::spec::validate_name;
use crate::{io, teardown, SessionError};

/// What tar stores of a snapshot: the overlay xattrs and nothing else (an
/// import refuses any other xattr, ACLs included), numeric owners (names mean
/// nothing on another host), in the pax format the importer parses, without
/// the atime/ctime records that would only make it larger. No `--sparse`: the
/// importer accepts plain members only.
const TAR_FS_FLAGS: &[&str] = &[
    "--format=posix",
    "--pax-option=delete=atime,delete=ctime",
    "--xattrs",
    // drums_checkpoint::archive::OVERLAY_XATTRS
    "--xattrs-include=trusted.overlay.opaque",
    "--xattrs-include=trusted.overlay.redirect",
    "--numeric-owner",
];

/// How many bytes an export sends at a time.
const CHUNK: usize = 256 << 10;

/// The archive as it streams out: data, and on failure one error last.
pub type ExportStream = mpsc::Receiver<Result<Bytes, std::io::Error>>;

impl Manager {
    /// This host's signing key, made at first use in `STATE/keys`.
    pub fn host_key(&self) -> Result<HostKey, SessionError> {
        Ok(HostKey::load_or_create(
            &self.host.cfg.state_dir.join("keys"),
        )?)
    }

    /// `STATE/trusted-keys`: whose archives an import accepts.
    pub fn trusted_keys_file(&self) -> PathBuf {
        self.host.cfg.state_dir.join("trusted-keys")
    }

    /// Start writing the signed archive of a published checkpoint. The
    /// version is held (shared, as a restore holds it) until the archive is
    /// written: a removal of it (`checkpoint rm`, retention) waits, instead
    /// of deleting the files tar reads and breaking the archive off. A
    /// client that stops reading holds it until it goes (the API is
    /// root's own socket; sessions have no export).
    pub async fn export(&self, id_or_name: &str) -> Result<ExportStream, SessionError> {
        // Read again under the lock: a remove that came first leaves nothing.
        let id = self.manifest(id_or_name)?.0.id;
        let held = self.checkpoints.reading(&id).await;
        let (ck, m) = self.manifest(&id)?;
        let key = self.host_key()?;
        let dir = self.host.checkpoint_dir(&ck.id);
        // A selective version's artifacts may be an earlier version's: the
        // archive holds them all, and an import makes it a full checkpoint.
        let process_of = crate::restore::process_artifact(&m)?;
        let images_dir = self.host.checkpoint_dir(process_of);
        let snap = self.host.checkpoint_snapshot(m.files_of());
        let fault = self
            .host
            .faults
            .check("export.tar")
            .err()
            .map(|e| e.to_string());
        let mut child = std::process::Command::new("tar")
            .arg("--create")
            .arg("--file=-")
            .args(TAR_FS_FLAGS)
            // A restore of the same version hard-links its images while tar
            // reads them (see stream_export): not an error.
            .arg("--warning=no-file-changed")
            // Only the snapshot's members are "." or start with "./": they
            // become fs and fs/…. `S`: never rewrite a symlink's target
            // ("./x" stays "./x"); hard-link targets are rewritten alike.
            .arg("--transform=s,^\\.$,fs,S")
            .arg("--transform=s,^\\./,fs/,S")
            .arg("-C")
            .arg(&dir)
            .arg("manifest.json")
            .arg("-C")
            .arg(&images_dir)
            .arg("images")
            .arg("-C")
            .arg(&snap)
            .arg(".")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("spawn", PathBuf::from("tar")))?;
        let (tx, rx) = mpsc::channel(4);
        std::thread::spawn(move || {
            let _held = held;
            let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
            let result = stream_export(&mut child, &key, fault, &tx, &mut buf);
            if let Err(e) = result {
                let _ = child.kill();
                let _ = child.wait();
                warn!("export: {}", crate::error_chain(&e));
                // What was read is sent, then the error: the body ends with
                // an error, never a clean end.
                if !buf.is_empty() {
                    let _ = tx.blocking_send(Ok(Bytes::from(std::mem::take(&mut buf))));
                }
                let _ = tx.blocking_send(Err(std::io::Error::other(e)));
            }
        });
        Ok(rx)
    }

    /// Import an archive streamed in `body` (see the module's doc). Refused,
    /// keeping nothing, when any member is not allowed, the signature does not
    /// verify or its signer is not trusted (unless `trust_unsigned`), a name in
    /// the manifest is not a plain name, the manifest is of a newer format, it
    /// was taken on an incompatible host, or an image is damaged. With
    /// `name`, it is published under that name instead of the archive's (a
    /// cluster names what it received by content, `drums.ray`).
    pub async fn import<S, E>(
        &self,
        mut body: S,
        trust_unsigned: bool,
        name: Option<&str>,
    ) -> Result<Checkpoint, SessionError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: Into<crate::BoxError>,
    {
        // A bad name is refused before a byte is spooled.
        if let Some(n) = name {
            crate::spec::validate_name_of("checkpoint", n)?;
        }
        // The staging directory is on the store, so fs/ can go straight into
        // a subvolume; it is root-only, so nothing changes the spooled archive
        // between its validation and its extraction.
        let token = random_hex(6);
        let owner = format!("import:{token}");
        let parent = self.host.store_root.join("checkpoints");
        let staging = parent.join(format!(".import-{token}"));
        self.host
            .catalog
            .record(&owner, ResourceKind::Dir, &staging.display().to_string())?;
        let result = async {
            std::fs::create_dir_all(&parent).map_err(io("create", &parent))?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&staging)
                .map_err(io("create", &staging))?;
            let spool = staging.join("archive.tar");
            self.spool(&mut body, &spool).await?;

            let mut keys = vec![self.host_key()?.public()];
            let trusted_keys_file = self.trusted_keys_file();
            keys.extend(
                keys::read_trusted(&trusted_keys_file)?
                    .into_iter()
                    .map(|(k, _)| k),
            );
            let trust = Trust {
                keys,
                trusted_keys_file,
                trust_unsigned,
            };
            let path = spool.clone();
            let verified = tokio::task::spawn_blocking(move || archive::verify(&path, &trust))
                .await
                .expect("no panic")?;
            let mut m = verified.manifest;
            // Everything that could refuse it is checked before anything is
            // extracted.
            check_manifest(&m)?;
            if let Some(n) = name {
                m.name = n.to_owned();
            }
            self.check_usable_here(&m)?;
            if self.host.catalog.version(&m.name)?.is_some() {
                return Err(CatalogError::CheckpointNameTaken(m.name.clone()).into());
            }

            let fs = staging.join("fs");
            self.host
                .catalog
                .record(&owner, ResourceKind::Subvolume, &fs.display().to_string())?;
            // In the sessions' qgroup: an archive's fs/ counts against what
            // sessions may hold, so an import cannot eat drumsd's reserve.
            drums_store::create_subvolume_with(&fs, &drums_store::QgroupInherit::session(None))?;
            let (path, dst) = (spool.clone(), staging.clone());
            tokio::task::spawn_blocking(move || archive::extract(&path, &dst))
                .await
                .expect("no panic")?;
            std::fs::remove_file(&spool).map_err(io("remove", &spool))?;
            if let Some(k) = &verified.signer {
                tracing::info!("import of checkpoint {} signed by {k}", m.id);
            }
            self.publish_import(&staging, m).await
        }
        .await;
        if let Err(t) = teardown::remove_owned(&self.host, &owner).await {
            warn!("clean up import staging: {}", crate::error_chain(&t));
        }
        result
    }

    async fn publish_import(
        &self,
        staging: &Path,
        theirs: Manifest,
    ) -> Result<Checkpoint, SessionError> {
        let id = random_hex(6);
        let m = Manifest {
            id: id.clone(),
            origin: Some(theirs.id.clone()),
            format_version: drums_checkpoint::FORMAT_VERSION,
            // Here it is a full checkpoint, outside any session's history:
            // the ids its history named are the exporting host's.
            version: None,
            ..theirs
        };
        let images = staging.join("images");
        let ck = VersionRecord {
            id: id.clone(),
            name: m.name.clone(),
            session_id: m.session.id.clone(),
            state: VersionState::Pending,
            created_at_ms: m.created_at_ms,
            manifest: serde_json::Value::Null,
            number: None,
            parent: None,
            pinned: true,
            files_of: None,
            process_of: None,
        };
        self.host.catalog.insert_version(&ck)?;
        let owner = format!("ckpt:{id}");
        let result = async {
            let dir = self.host.checkpoint_dir(&id);
            self.host
                .catalog
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
            let snap = self.host.checkpoint_snapshot(&id);
            self.host.catalog.record(
                &owner,
                ResourceKind::Subvolume,
                &snap.display().to_string(),
            )?;
            drums_store::snapshot_with(
                &staging.join("fs"),
                &snap,
                true,
                &drums_store::QgroupInherit::session(None),
            )?;
            m.write(&dir)?;
            drums_checkpoint::fsync_dir(dir.parent().expect("has parent"))?;
            self.host.catalog.publish_version(
                &id,
                &serde_json::to_value(&m).expect("manifest serializes"),
                &id,
                Some(&id),
                &owner,
            )?;
            Ok(to_api(&m))
        }
        .await;
        if result.is_err() {
            if let Err(t) = teardown::remove_owned(&self.host, &owner).await {
                warn!("clean up failed import {id}: {}", crate::error_chain(&t));
            } else {
                self.host.catalog.delete_version(&id)?;
            }
        }
        result
    }

    /// An imported manifest passes the checks a restore of it would make,
    /// so a checkpoint that could never be restored here is refused before
    /// anything is written, as a bad archive (400), not kept to fail later.
    fn check_usable_here(&self, m: &Manifest) -> Result<(), SessionError> {
        m.host
            .check_restorable_on(&self.host.fingerprint)
            .map_err(|e| SessionError::refused("the archive cannot be restored on this host", e))?;
        self.host
            .limits
            .from_manifest(&m.session.limits)
            .map_err(|e| {
                SessionError::refused("the archive's manifest has limits this host refuses", e)
            })?;
        match self.resolve_image(&m.session.image) {
            Ok(_) => Ok(()),
            Err(SessionError::ImageNotFound(n)) => Err(SessionError::Invalid(format!(
                "the archive's checkpoint needs the image {n:?}, which this host does not have"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Write an archive streamed as `body` to the new file `spool` (0600):
    /// an archive may not take the store's reserve, so it is counted as it
    /// arrives and refused at the first byte over.
    pub(crate) async fn spool<S, E>(
        &self,
        body: &mut S,
        spool: &std::path::Path,
    ) -> Result<u64, SessionError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: Into<crate::BoxError>,
    {
        use futures::StreamExt;
        let mut f = tokio::fs::File::from_std(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(spool)
                .map_err(io("create", spool))?,
        );
        let room = crate::host::import_room(&self.host.cfg, &self.host.store_root)?;
        let mut spooled = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| SessionError::refused("read the archive", e))?;
            spooled += chunk.len() as u64;
            if spooled > room {
                return Err(SessionError::ArchiveTooLarge { room });
            }
            f.write_all(&chunk).await.map_err(io("write", spool))?;
        }
        f.flush().await.map_err(io("write", spool))?;
        Ok(spooled)
    }
}

/// Why an export's stream ended early; the client's body ends with it.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("pass tar's members")]
    Members(#[source] ArchiveError),
    #[error("wait for tar")]
    Wait(#[source] std::io::Error),
    #[error("tar failed ({status}): {stderr}")]
    Tar {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("send the signature")]
    Signature(#[source] std::io::Error),
    #[error("the client went away")]
    ClientGone,
}

/// Pass tar's members on, then (tar having exited 0) the signature.
fn stream_export(
    child: &mut std::process::Child,
    key: &HostKey,
    fault: Option<String>,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: &mut Vec<u8>,
) -> Result<(), ExportError> {
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Read concurrently: a tar with much to say must not block on its stderr.
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut send = |b: &[u8]| -> std::io::Result<()> {
        buf.extend_from_slice(b);
        if buf.len() >= CHUNK {
            tx.blocking_send(Ok(Bytes::from(std::mem::take(buf))))
                .map_err(|_| std::io::Error::other(ExportError::ClientGone))?;
        }
        Ok(())
    };
    let digest = archive::pass_members(stdout, &mut send, |i| match &fault {
        Some(f) if i == 1 => Err(ArchiveError::Injected(f.clone())),
        _ => Ok(()),
    })
    .map_err(ExportError::Members);
    if digest.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(ExportError::Wait)?;
    let errs = errs.join().unwrap_or_default();
    let digest = digest?;
    // Exit 1 with nothing said is tar's "file changed as we read it", its
    // warning turned off below: a restore hard-links the images it reads
    // (boot/criu.rs), which changes their ctime, never their bytes (the
    // import checks every image's sha256). Anything else tar says fails.
    let changed_only = status.code() == Some(1) && errs.trim().is_empty();
    if !status.success() && !changed_only {
        return Err(ExportError::Tar {
            status,
            stderr: errs.trim().to_owned(),
        });
    }
    send(&archive::signature_member(key, &digest)).map_err(ExportError::Signature)?;
    if !buf.is_empty() {
        tx.blocking_send(Ok(Bytes::from(std::mem::take(buf))))
            .map_err(|_| ExportError::ClientGone)?;
    }
    Ok(())
}

/// Every name in an archive's manifest that could become part of a path (or
/// of a cgroup or host name) is one plain component by the local rules.
fn check_manifest(m: &Manifest) -> Result<(), SessionError> {
    let name = |what: &str, v: &str| {
        validate_name(v).map_err(|_| {
            SessionError::Invalid(format!(
                "the archive's manifest has an invalid {what} {v:?}: use 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"
            ))
        })
    };
    name("checkpoint id", &m.id)?;
    name("checkpoint name", &m.name)?;
    name("session id", &m.session.id)?;
    name("session name", &m.session.name)?;
    name("hostname", &m.session.hostname)?;
    name("image", &m.session.image)?;
    if m.session.profile.parse::<drums_api::Profile>().is_err() {
        return Err(SessionError::Invalid(format!(
            "the archive's manifest has an unknown profile {:?}",
            m.session.profile
        )));
    }
    if !["none", "bridge"].contains(&m.session.network.as_str()) {
        return Err(SessionError::Invalid(format!(
            "the archive's manifest has an unknown network {:?}",
            m.session.network
        )));
    }
    serde_json::from_value::<drums_api::Limits>(m.session.limits.clone())
        .map_err(|e| SessionError::refused("the archive's manifest has invalid limits", e))?;
    for i in &m.images {
        archive::check_image_name(&i.name)
            .map_err(|why| SessionError::Invalid(format!("the archive's manifest: {why}")))?;
    }
    Ok(())
}
