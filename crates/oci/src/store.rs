//! OCI images in drums' btrfs store (docs/oci.md, "Storage").
//!
//! A layer is a read-only subvolume `STORE/oci/layers/HEX`, keyed by its
//! chain id (the image spec's hash over the diff-ids from the base up): a
//! snapshot of its parent's subvolume with the layer applied. So a layer's
//! tree is the whole image up to it, N images on one base store the base
//! once, and a session's root is an overlay on the top layer's subvolume,
//! as on drums' own images.
//!
//! Nothing half-made is ever visible: a layer is applied in a staging
//! subvolume under `STORE/oci/tmp`, its diff-id checked, then snapshotted
//! read-only to its final name and recorded; the image becomes visible
//! last, with its names, in one catalog transaction. A crash leaves staging
//! parts and layers no image uses; [`OciStore::sweep`] removes them at
//! start.
//!
//! One lock ([`OciStore::lock`]) orders layer writes, commits, removals and
//! the sweep, so a removal never takes a layer a pull is about to commit.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use drums_catalog::{Catalog, CatalogError, ImageRow, LayerRow};
use drums_store::StoreError;
use sha2::{Digest, Sha256};

use crate::layer::{LayerError, LayerLimits};

/// Under the btrfs store's root.
const DIR: &str = "oci";

#[derive(Debug, thiserror::Error)]
pub enum StoreOpError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("apply layer {diff_id}")]
    Layer {
        diff_id: String,
        #[source]
        source: LayerError,
    },
    #[error(
        "layer's content does not match the image config: diff-id expected {expected}, got {got}"
    )]
    DiffId { expected: String, got: String },
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no image {0:?} (see `drums images`)")]
    NotFound(String),
    #[error("{0:?} names more than one image ({1}); give more of the id")]
    Ambiguous(String, String),
    #[error("image {name} is in use by {users}; remove them first")]
    InUse { name: String, users: String },
    #[error("image {0} has no layers")]
    NoLayers(String),
    #[error("layer {0} is missing from the store (removed meanwhile?); pull or import again")]
    LayerMissing(String),
}

type Result<T> = std::result::Result<T, StoreOpError>;

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreOpError + 'a {
    move |source| StoreOpError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// The chain ids of a stack of diff-ids, base first: the base's is its
/// diff-id, and each next one is `sha256(parent + " " + diff_id)`.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let id = match out.last() {
            None => d.clone(),
            Some(parent) => format!(
                "sha256:{}",
                hex(&Sha256::digest(format!("{parent} {d}").as_bytes()))
            ),
        };
        out.push(id);
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `sha256:HEX` → `HEX`: a layer's subvolume name. The catalog only holds
/// digests this crate checked, but a name is a path, so check again.
fn digest_hex(d: &str) -> Option<&str> {
    let h = d.strip_prefix("sha256:")?;
    (h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(h)
}

/// An image as `drums images` shows it.
#[derive(Debug, Clone)]
pub struct ImageSummary {
    pub image: ImageRow,
    /// Content bytes of all its layers.
    pub size: u64,
    /// Of those, bytes in layers that another image uses too.
    pub shared: u64,
}

/// What the sweep removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    pub staging: usize,
    pub layers: usize,
}

#[derive(Clone)]
pub struct OciStore {
    root: PathBuf,
    catalog: Arc<Catalog>,
    lock: Arc<Mutex<()>>,
    pub limits: LayerLimits,
}

impl OciStore {
    /// The OCI part of the btrfs store mounted at `store_root`.
    pub fn open(store_root: &Path, catalog: Arc<Catalog>) -> Result<OciStore> {
        let root = store_root.join(DIR);
        for d in [root.clone(), root.join("layers"), root.join("tmp")] {
            std::fs::create_dir_all(&d).map_err(io("create", &d))?;
        }
        // Layers keep their setuid files (as podman's do); only root may
        // reach them from the host.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .map_err(io("chmod 0700", &root))?;
        Ok(OciStore {
            root,
            catalog,
            lock: Arc::new(Mutex::new(())),
            limits: LayerLimits::default(),
        })
    }

    /// Orders writes to the layers and images (see the module doc).
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh staging directory for blobs: removed by the caller, or by the
    /// sweep after a crash.
    pub fn staging_dir(&self) -> Result<tempfile::TempDir> {
        let tmp = self.root.join("tmp");
        tempfile::Builder::new()
            .prefix("blobs-")
            .tempdir_in(&tmp)
            .map_err(io("create a staging directory in", &tmp))
    }

    /// The subvolume of the layer `chain_id`.
    pub fn layer_path(&self, chain_id: &str) -> Option<PathBuf> {
        digest_hex(chain_id).map(|h| self.root.join("layers").join(h))
    }

    /// Whether layer `chain_id` is stored and recorded.
    pub fn has_layer(&self, chain_id: &str) -> Result<bool> {
        Ok(self.catalog.layer(chain_id)?.is_some()
            && self
                .layer_path(chain_id)
                .is_some_and(|p| drums_store::is_subvolume(&p)))
    }

    /// Store the layer `chain_id` (under the lock): a snapshot of
    /// `parent`'s subvolume (none for a base layer) with `blob` applied,
    /// whose diff-id must be `diff_id`, within `room` bytes of the store
    /// ([`LayerLimits::room`]). Nothing of it stays on an error. Returns
    /// its row and what it was charged.
    pub fn add_layer(
        &self,
        _locked: &MutexGuard<'_, ()>,
        parent: Option<&str>,
        chain_id: &str,
        diff_id: &str,
        blob: &Path,
        room: u64,
    ) -> Result<(LayerRow, u64)> {
        let dst = self
            .layer_path(chain_id)
            .ok_or_else(|| StoreOpError::LayerMissing(chain_id.into()))?;
        let staging = self.root.join("tmp").join(format!(
            "layer-{}-{}",
            digest_hex(chain_id).unwrap_or("x"),
            std::process::id()
        ));
        // Left by an earlier try of this process.
        drums_store::delete_subvolume(&staging)?;
        match parent {
            Some(p) => {
                let src = self
                    .layer_path(p)
                    .filter(|s| drums_store::is_subvolume(s))
                    .ok_or_else(|| StoreOpError::LayerMissing(p.into()))?;
                drums_store::snapshot(&src, &staging, false)?;
            }
            None => drums_store::create_subvolume(&staging)?,
        }
        let applied = (|| {
            let f = File::open(blob).map_err(io("open", blob))?;
            let limits = LayerLimits {
                room,
                ..self.limits
            };
            let applied = crate::layer::apply(&staging, f, &limits).map_err(|source| {
                StoreOpError::Layer {
                    diff_id: diff_id.into(),
                    source,
                }
            })?;
            if applied.diff_id != diff_id {
                return Err(StoreOpError::DiffId {
                    expected: diff_id.into(),
                    got: applied.diff_id,
                });
            }
            // The read-only snapshot is what sessions see: a layer never
            // changes once its digest is checked.
            drums_store::snapshot(&staging, &dst, true)?;
            Ok(applied)
        })();
        let cleaned = drums_store::delete_subvolume(&staging);
        let applied = applied?;
        cleaned?;
        let row = LayerRow {
            chain_id: chain_id.into(),
            diff_id: diff_id.into(),
            parent: parent.map(Into::into),
            size: applied.bytes,
        };
        if let Err(e) = self.catalog.insert_layer(&row) {
            let _ = drums_store::delete_subvolume(&dst);
            return Err(e.into());
        }
        for s in &applied.skipped {
            // Said once per layer stored: a layer already in the store is
            // not applied again.
            tracing::warn!(
                chain_id,
                "layer {diff_id}: entry {} not written: {}",
                s.path,
                s.what
            );
        }
        Ok((row, applied.charged))
    }

    /// Make the image visible (under the lock, with all its layers stored),
    /// named `name` if given; a name already on another image moves here.
    pub fn commit(
        &self,
        _locked: &MutexGuard<'_, ()>,
        image: &ImageRow,
        name: Option<&str>,
    ) -> Result<()> {
        if image.layers.is_empty() {
            return Err(StoreOpError::NoLayers(image.id.clone()));
        }
        for l in &image.layers {
            if !self.has_layer(l)? {
                return Err(StoreOpError::LayerMissing(l.clone()));
            }
        }
        self.catalog.commit_image(image, name)?;
        Ok(())
    }

    /// Give image `what` (as [`OciStore::resolve`] finds it) the name
    /// `name`, a reference as stored; the image as it is now.
    pub fn tag(&self, what: &str, name: &str) -> Result<ImageRow> {
        let _locked = self.lock();
        let image = self.resolve(what)?;
        self.catalog.tag_image(name, &image.id)?;
        self.catalog
            .image(&image.id)?
            .ok_or_else(|| StoreOpError::NotFound(what.into()))
    }

    /// The image `what` names: a name as stored (normalised by the caller),
    /// an id (`sha256:HEX`), or a prefix of one's hex of at least 4.
    pub fn resolve(&self, what: &str) -> Result<ImageRow> {
        let not_found = || StoreOpError::NotFound(what.into());
        let id = if let Some(id) = self.catalog.image_named(what)? {
            id
        } else {
            let hexpart = what.strip_prefix("sha256:").unwrap_or(what);
            if hexpart.len() < 4
                || !hexpart
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(not_found());
            }
            let ids = self
                .catalog
                .images_with_prefix(&format!("sha256:{hexpart}"))?;
            match ids.len() {
                0 => return Err(not_found()),
                1 => ids.into_iter().next().expect("one"),
                _ => return Err(StoreOpError::Ambiguous(what.into(), ids.join(", "))),
            }
        };
        self.catalog.image(&id)?.ok_or_else(not_found)
    }

    /// The root file system of image `id`: its top layer's subvolume.
    pub fn rootfs(&self, image: &ImageRow) -> Result<PathBuf> {
        let top = image
            .layers
            .last()
            .ok_or_else(|| StoreOpError::NoLayers(image.id.clone()))?;
        self.layer_path(top)
            .filter(|p| drums_store::is_subvolume(p))
            .ok_or_else(|| StoreOpError::LayerMissing(top.clone()))
    }

    /// Every image with its size and the bytes it shares with others.
    pub fn list(&self) -> Result<Vec<ImageSummary>> {
        let images = self.catalog.images()?;
        let sizes: HashMap<String, u64> = self
            .catalog
            .layers()?
            .into_iter()
            .map(|l| (l.chain_id, l.size))
            .collect();
        let mut users: HashMap<&str, usize> = HashMap::new();
        for i in &images {
            for l in i.layers.iter().collect::<HashSet<_>>() {
                *users.entry(l.as_str()).or_default() += 1;
            }
        }
        Ok(images
            .iter()
            .map(|i| {
                let size_of = |l: &String| sizes.get(l).copied().unwrap_or(0);
                ImageSummary {
                    size: i.layers.iter().map(size_of).sum(),
                    shared: i
                        .layers
                        .iter()
                        .filter(|l| users.get(l.as_str()).copied().unwrap_or(0) > 1)
                        .map(size_of)
                        .sum(),
                    image: i.clone(),
                }
            })
            .collect())
    }

    /// Remove what `what` names. A name on an image that keeps other names
    /// only loses that name (as `podman rmi` untags); otherwise the image
    /// goes, refused while a session or checkpoint uses it, with the layers
    /// no other image uses. Returns the removed image's id, if one was.
    pub fn remove(&self, what: &str) -> Result<Option<String>> {
        let locked = self.lock();
        let image = self.resolve(what)?;
        let by_name = image.names.iter().any(|n| n == what);
        if by_name && image.names.len() > 1 {
            self.catalog.untag_image(what)?;
            return Ok(None);
        }
        let users = self.catalog.image_users(&image.id)?;
        if !users.is_empty() {
            return Err(StoreOpError::InUse {
                name: what.into(),
                users: users.join(", "),
            });
        }
        self.catalog.delete_image(&image.id)?;
        self.prune(&locked)?;
        Ok(Some(image.id))
    }

    /// Removes layers no image uses (and their subvolumes), and layer
    /// subvolumes without a row: after a removal's catalog change, so a crash
    /// here leaves only what the next sweep removes; and after a pull or
    /// import that failed, which is why every layer is added and committed
    /// under one hold of the lock (outside it, every layer is some image's).
    pub fn prune(&self, _locked: &MutexGuard<'_, ()>) -> Result<usize> {
        let used: HashSet<String> = self
            .catalog
            .images()?
            .into_iter()
            .flat_map(|i| i.layers)
            .collect();
        let mut removed = 0;
        let rows = self.catalog.layers()?;
        for l in &rows {
            if used.contains(&l.chain_id) {
                continue;
            }
            if let Some(p) = self.layer_path(&l.chain_id) {
                drums_store::delete_subvolume(&p)?;
            }
            self.catalog.delete_layer(&l.chain_id)?;
            removed += 1;
        }
        let known: HashSet<String> = rows
            .into_iter()
            .filter(|l| used.contains(&l.chain_id))
            .filter_map(|l| digest_hex(&l.chain_id).map(str::to_owned))
            .collect();
        let dir = self.root.join("layers");
        for e in std::fs::read_dir(&dir).map_err(io("read", &dir))? {
            let e = e.map_err(io("read", &dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                remove_any(&e.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// At start, before anything else uses the store: staging left by a
    /// pull or import cut short, and layers no image uses.
    pub fn sweep(&self) -> Result<Swept> {
        let locked = self.lock();
        let tmp = self.root.join("tmp");
        let mut staging = 0;
        for e in std::fs::read_dir(&tmp).map_err(io("read", &tmp))? {
            let e = e.map_err(io("read", &tmp))?;
            remove_any(&e.path())?;
            staging += 1;
        }
        // A recorded layer whose subvolume is gone is useless.
        for l in self.catalog.layers()? {
            if !self.has_layer(&l.chain_id)? {
                self.catalog.delete_layer(&l.chain_id)?;
            }
        }
        let layers = self.prune(&locked)?;
        Ok(Swept { staging, layers })
    }
}

/// A subvolume, or a plain tree.
fn remove_any(p: &Path) -> Result<()> {
    if drums_store::is_subvolume(p) {
        drums_store::delete_subvolume(p)?;
    } else if p.is_dir() {
        std::fs::remove_dir_all(p).map_err(io("remove", p))?;
    } else {
        std::fs::remove_file(p).map_err(io("remove", p))?;
    }
    Ok(())
}

/// A reference as `podman` names it: `alpine` is
/// `docker.io/library/alpine:latest`. None if it does not parse.
pub fn normalize_reference(reference: &str) -> Option<String> {
    oci_client::Reference::try_from(reference)
        .ok()
        .map(|r| r.whole())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_spec() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let ids = chain_ids(&[d('a'), d('b')]);
        assert_eq!(ids[0], d('a'));
        let want = hex(&Sha256::digest(format!("{} {}", d('a'), d('b')).as_bytes()));
        assert_eq!(ids[1], format!("sha256:{want}"));
        assert_eq!(digest_hex("sha256:../x"), None);
        assert_eq!(digest_hex(&ids[1]), Some(want.as_str()));
    }
}
