//! The images a session starts from: drums' own (debootstrap, by name) and
//! OCI images (docs/oci.md), pulled from a registry or imported from an
//! archive into the btrfs store, by reference or id.
//!
//! A session's record names its image by a key that never changes meaning:
//! a drums image's name, or an OCI image's id (`sha256:` of its config). A
//! reference such as `repo/app:latest` can move to another image; the id
//! cannot, so a checkpoint restores onto the image it was taken on.

use std::path::PathBuf;
use std::sync::Arc;

use drums_api::PullEvent;
use drums_catalog::ImageRow;
use drums_oci::{ImageConfig, OciStore};

use crate::manager::Manager;
use crate::{io, SessionError};

/// An image resolved for a session.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// What the session's record keeps (see the module doc).
    pub key: String,
    /// The overlay's lower layer.
    pub rootfs: PathBuf,
    /// Built with drums' desktop layer.
    pub desktop: bool,
    /// An OCI image's config: what exec and `ps` apply.
    pub oci: Option<ImageConfig>,
}

impl Manager {
    pub fn oci(&self) -> &OciStore {
        &self.host.oci
    }

    /// The image `what` names: a drums image's name first (they cannot look
    /// like a reference with a registry or tag), then an OCI image's
    /// reference, normalised as `podman` does (`alpine` is
    /// `docker.io/library/alpine:latest`), then an id or a prefix of one.
    pub fn resolve_image(&self, what: &str) -> Result<ResolvedImage, SessionError> {
        if drums_image::validate_name(what).is_ok() {
            match self.host.images.get(what) {
                Ok(i) => {
                    return Ok(ResolvedImage {
                        key: i.name.clone(),
                        rootfs: i.rootfs.clone(),
                        desktop: i.desktop,
                        oci: None,
                    })
                }
                Err(drums_image::ImageError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let row = self.oci_image(what)?;
        let config = ImageConfig::parse(row.config.as_bytes()).map_err(|e| {
            SessionError::refused(
                format!("image {}: its stored config does not parse", row.id),
                e,
            )
        })?;
        Ok(ResolvedImage {
            rootfs: self.host.oci.rootfs(&row)?,
            key: row.id,
            desktop: false,
            oci: Some(config),
        })
    }

    /// The OCI image `what` names (a reference, normalised or as stored, or
    /// an id).
    pub fn oci_image(&self, what: &str) -> Result<ImageRow, SessionError> {
        match self.host.oci.resolve(what) {
            Err(drums_oci::StoreOpError::NotFound(_)) => {}
            r => return Ok(r?),
        }
        match drums_oci::normalize_reference(what) {
            Some(n) if n != what => Ok(self.host.oci.resolve(&n).map_err(|e| match e {
                drums_oci::StoreOpError::NotFound(_) => {
                    SessionError::ImageNotFound(what.to_string())
                }
                e => e.into(),
            })?),
            Some(_) => Err(SessionError::ImageNotFound(what.to_string())),
            // Neither a drums name, nor a reference, nor an id: the
            // caller's mistake (a path, say), not a missing image.
            None => Err(SessionError::Invalid(format!(
                "invalid image name {what:?}: neither a drums image's name, nor an OCI reference, nor an image id"
            ))),
        }
    }

    /// `name`, a reference a user gave, as drums stores names (as podman
    /// normalises them: `base:1` is `docker.io/library/base:1`).
    pub fn image_name(name: &str) -> Result<String, SessionError> {
        drums_oci::normalize_reference(name).ok_or_else(|| {
            SessionError::Invalid(format!(
                "invalid image name {name:?}: not an OCI reference (like base:1 or localhost/base:1)"
            ))
        })
    }

    /// `podman tag`: OCI image `what` (a name, an id or an id prefix) is also
    /// named `name` from now on; the name moves off any image that had it.
    /// drums' own images (`default`, `desktop`) are not OCI images and
    /// cannot be tagged.
    pub fn tag_image(&self, what: &str, name: &str) -> Result<ImageRow, SessionError> {
        let name = Self::image_name(name)?;
        let row = match self.oci_image(what) {
            Err(SessionError::ImageNotFound(_) | SessionError::Invalid(_))
                if drums_image::validate_name(what).is_ok() && self.host.images.get(what).is_ok() =>
            {
                return Err(SessionError::Invalid(format!(
                    "{what:?} is a drums image, not an OCI image: only OCI images (pulled, imported, built) can be tagged"
                )))
            }
            r => r?,
        };
        Ok(self.host.oci.tag(&row.id, &name)?)
    }

    /// Pull `reference` from its registry into the store. Layers already
    /// stored are not fetched. `events` gets the progress.
    pub async fn pull(
        &self,
        reference: &str,
        opts: drums_oci::PullOptions,
        events: tokio::sync::mpsc::UnboundedSender<PullEvent>,
    ) -> Result<ImageRow, SessionError> {
        let registry = drums_oci::registry_of(reference);
        if let Some(allowed) = &self.host.cfg.allowed_registries {
            if !allowed.contains(&registry) {
                return Err(SessionError::Invalid(format!(
                    "registry {registry} is not one drumsd may pull from (--allowed-registries {})",
                    allowed.join(",")
                )));
            }
        }
        let remote = drums_oci::Remote::resolve(reference, &opts).await?;
        let image = remote.image().clone();
        let name = remote.reference();
        let chains = drums_oci::chain_ids(&image.config.diff_ids);
        let _ = events.send(PullEvent::Resolved {
            reference: name.clone(),
            id: image.config_digest.clone(),
            layers: image.layers.len(),
        });
        // Every blob to fetch is charged before the first is: what a
        // manifest declares is what the download may write (fetch_layer
        // refuses a byte more).
        let room = crate::host::StoreRoom::new(&self.host.cfg, &self.host.store_root);
        let mut need = 0u64;
        for (i, l) in image.layers.iter().enumerate() {
            if !self.host.oci.has_layer(&chains[i])? {
                need = need.saturating_add(l.size);
            }
        }
        let left = room.now()?;
        if need > left {
            return Err(SessionError::NoRoom {
                what: "the image's layers to fetch",
                need,
                room: left,
            });
        }
        let staging = self.host.oci.staging_dir()?;
        self.host.faults.check("image.fetch")?;
        let mut blobs = Vec::with_capacity(image.layers.len());
        for (i, l) in image.layers.iter().enumerate() {
            if self.host.oci.has_layer(&chains[i])? {
                let _ = events.send(PullEvent::Layer {
                    index: i,
                    digest: l.digest.clone(),
                    done: 0,
                    total: 0,
                    stored: true,
                });
                blobs.push(None);
                continue;
            }
            let dest = staging.path().join(format!("layer-{i}"));
            let digest = l.digest.clone();
            let ev = events.clone();
            let mut last = 0u64;
            remote
                .fetch_layer(i, &dest, &mut |done, total| {
                    // Every MiB and the end: enough for a bar.
                    if done == total || done - last >= 1 << 20 {
                        last = done;
                        let _ = ev.send(PullEvent::Layer {
                            index: i,
                            digest: digest.clone(),
                            done,
                            total,
                            stored: false,
                        });
                    }
                })
                .await?;
            blobs.push(Some(dest));
        }
        let faults = self.image_faults();
        let row = ImageRow {
            id: image.config_digest.clone(),
            manifest_digest: image.digest.clone(),
            layers: chains,
            config: String::from_utf8_lossy(&image.config_raw).into_owned(),
            created_at_ms: drums_catalog::now_ms(),
            names: vec![name.clone()],
        };
        let (oci, row2) = (self.host.oci.clone(), row.clone());
        let diff_ids = image.config.diff_ids.clone();
        tokio::task::spawn_blocking(move || {
            let job = Storing {
                row: &row2,
                diff_ids: &diff_ids,
                blobs: &blobs,
                name: Some(&name),
                faults,
                room: &room,
                left: left - need,
            };
            store_image(&oci, &job, &|i| {
                let _ = events.send(PullEvent::Applying { index: i });
            })
        })
        .await
        .expect("no panic")?;
        drop(staging);
        Ok(row)
    }

    /// Import an image archive (a `docker save` archive or an oci-archive)
    /// streamed as `body`. It is spooled into the store first, within the
    /// room the store has, then unpacked, checked and stored; nothing of it
    /// stays on an error.
    /// `name`: the image's name instead of the one in the archive (`podman
    /// load`'s tag), checked before anything is read.
    pub async fn import_image<S, E>(
        &self,
        mut body: S,
        name: Option<&str>,
    ) -> Result<ImageRow, SessionError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: Into<crate::BoxError>,
    {
        let given = name.map(Self::image_name).transpose()?;
        let staging = self.host.oci.staging_dir()?;
        let spool = staging.path().join("archive.tar");
        let room = crate::host::StoreRoom::new(&self.host.cfg, &self.host.store_root);
        // The spool is charged as it arrives against the room now; what
        // unpacking writes, against what is left of it.
        let left = room.now()?;
        let spooled = self.spool(&mut body, &spool).await?;
        let left = left.saturating_sub(spooled);
        self.host.faults.check("image.fetch")?;
        let faults = self.image_faults();
        let oci = self.host.oci.clone();
        let row = tokio::task::spawn_blocking(move || -> Result<ImageRow, SessionError> {
            let file = std::fs::File::open(&spool).map_err(io("open", &spool))?;
            let unpacked = staging.path().join("archive");
            std::fs::create_dir(&unpacked).map_err(io("create", &unpacked))?;
            let a = drums_oci::archive::unpack(
                std::io::BufReader::new(file),
                &unpacked,
                &drums_oci::ArchiveLimits {
                    room: left,
                    ..Default::default()
                },
            )?;
            let blob_bytes: u64 = a.image.layers.iter().map(|l| l.size).sum();
            let chains = drums_oci::chain_ids(&a.image.config.diff_ids);
            // As a pull names it: `drums/two:v1` is `docker.io/drums/two:v1`.
            let name = given.or_else(|| {
                a.refs
                    .first()
                    .map(|r| drums_oci::normalize_reference(r).unwrap_or_else(|| r.clone()))
            });
            let row = ImageRow {
                id: a.image.config_digest.clone(),
                manifest_digest: a.image.digest.clone(),
                layers: chains,
                config: String::from_utf8_lossy(&a.image.config_raw).into_owned(),
                created_at_ms: drums_catalog::now_ms(),
                names: name.iter().cloned().collect(),
            };
            let blobs: Vec<Option<PathBuf>> = a.blobs.into_iter().map(Some).collect();
            let job = Storing {
                row: &row,
                diff_ids: &a.image.config.diff_ids,
                blobs: &blobs,
                name: name.as_deref(),
                faults,
                room: &room,
                left: left.saturating_sub(blob_bytes),
            };
            store_image(&oci, &job, &|_| {})?;
            drop(staging);
            Ok(row)
        })
        .await
        .expect("no panic")?;
        Ok(row)
    }

    /// The image points armed now, for the blocking thread that stores.
    fn image_faults(&self) -> ImageFaults {
        ImageFaults {
            fail_layer: self.host.faults.check("image.layer").is_err(),
            fail_commit: self.host.faults.check("image.commit").is_err(),
            hold_commit: self.host.faults.holds("image.commit"),
        }
    }

    /// `drums image rm`: refused while a session or checkpoint uses it.
    pub fn remove_image(&self, what: &str) -> Result<Option<String>, SessionError> {
        let row = self.oci_image(what)?;
        // The name as stored, so a normalised reference untags.
        let name = if row.names.iter().any(|n| n == what) {
            what.to_string()
        } else {
            drums_oci::normalize_reference(what)
                .filter(|n| row.names.contains(n))
                .unwrap_or_else(|| row.id.clone())
        };
        Ok(self.host.oci.remove(&name)?)
    }

    /// What an OCI image's config exposes; nothing for a drums image, or
    /// an image gone (a session's image cannot go while it exists).
    pub(crate) fn image_ports(&self, key: &str) -> Vec<String> {
        self.exec_defaults(key)
            .map(|c| c.exposed_ports)
            .unwrap_or_default()
    }

    /// The config of the OCI image a session's record names, which its
    /// commands run with (see [`apply_defaults`]); none for a drums image.
    pub fn exec_defaults(&self, key: &str) -> Option<ImageConfig> {
        if !key.starts_with("sha256:") {
            return None;
        }
        let row = self.host.catalog.image(key).ok()??;
        ImageConfig::parse(row.config.as_bytes()).ok()
    }
}

/// Fault injection in [`store_image`] (crate::faults::IMAGE_POINTS).
#[derive(Debug, Clone, Copy)]
struct ImageFaults {
    fail_layer: bool,
    fail_commit: bool,
    hold_commit: bool,
}

/// An image to store: its row, its layers' diff-ids and blobs (none for a
/// layer stored already), the name it gets.
struct Storing<'a> {
    row: &'a ImageRow,
    diff_ids: &'a [String],
    blobs: &'a [Option<PathBuf>],
    name: Option<&'a str>,
    faults: ImageFaults,
    /// The store's room, read again before each layer (sessions and other
    /// pulls write too), and what is left of it for this image's layers
    /// after what it already wrote (blobs, a spooled archive): each layer
    /// gets the smaller, and is charged what it writes.
    room: &'a crate::host::StoreRoom,
    left: u64,
}

/// Store every layer not stored yet, then make the image visible: under the
/// store's lock, so a removal cannot take a layer in between.
fn store_image(
    oci: &OciStore,
    job: &Storing<'_>,
    applying: &dyn Fn(usize),
) -> Result<(), SessionError> {
    let locked = oci.lock();
    let stored = store_locked(oci, &locked, job, applying);
    if stored.is_err() {
        // The layers this one added and no image uses: bad input leaves
        // nothing behind.
        if let Err(e) = oci.prune(&locked) {
            tracing::warn!(
                "prune after a failed image store: {}",
                crate::error_chain(&e)
            );
        }
    }
    stored
}

fn store_locked(
    oci: &OciStore,
    locked: &std::sync::MutexGuard<'_, ()>,
    job: &Storing<'_>,
    applying: &dyn Fn(usize),
) -> Result<(), SessionError> {
    let row = job.row;
    let mut left = job.left;
    for (i, chain) in row.layers.iter().enumerate() {
        if oci.has_layer(chain)? {
            continue;
        }
        let blob = job.blobs[i]
            .as_deref()
            .ok_or_else(|| drums_oci::StoreOpError::LayerMissing(chain.clone()))?;
        applying(i);
        let parent = i.checked_sub(1).map(|p| row.layers[p].as_str());
        let room = left.min(job.room.now()?);
        let (_, charged) = oci.add_layer(locked, parent, chain, &job.diff_ids[i], blob, room)?;
        left = left.saturating_sub(charged);
        if job.faults.fail_layer {
            return Err(SessionError::Injected("image.layer".into()));
        }
    }
    if job.faults.hold_commit {
        tracing::warn!("fault injection: holding image.commit until drumsd is killed");
        loop {
            std::thread::park();
        }
    }
    if job.faults.fail_commit {
        return Err(SessionError::Injected("image.commit".into()));
    }
    oci.commit(locked, row, job.name)?;
    Ok(())
}

/// Opens the OCI store at start (after the btrfs store is mounted).
pub(crate) fn open_oci(
    store_root: &std::path::Path,
    catalog: &Arc<drums_catalog::Catalog>,
) -> Result<OciStore, SessionError> {
    Ok(OciStore::open(store_root, catalog.clone())?)
}

/// An exec request with an OCI image's defaults, as `podman exec` applies
/// them: the image's `Env` under the request's own, its `WorkingDir` and
/// `User` unless the request names them. A `user:group` keeps the user
/// only (the guest takes the user's own groups).
pub fn apply_defaults(req: &mut drums_api::ExecRequest, config: &ImageConfig) {
    for kv in &config.env {
        if let Some((k, v)) = kv.split_once('=') {
            req.env
                .entry(k.to_string())
                .or_insert_with(|| v.to_string());
        }
    }
    if req.cwd.is_none() {
        req.cwd = config.working_dir.clone().filter(|d| !d.is_empty());
    }
    if req.user.is_none() {
        req.user = config
            .user
            .as_deref()
            .map(|u| u.split(':').next().unwrap_or(u).to_string())
            .filter(|u| !u.is_empty());
    }
}

/// An image's default process, as `podman run` makes it: `Entrypoint`
/// followed by `Cmd`. None if the image names neither.
pub fn default_process(config: &ImageConfig) -> Option<Vec<String>> {
    let argv: Vec<String> = config
        .entrypoint
        .iter()
        .chain(&config.cmd)
        .cloned()
        .collect();
    (!argv.is_empty()).then_some(argv)
}
