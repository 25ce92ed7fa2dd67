//! An OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/HEX`)
//! written from directory trees, for `drums bench image`: one gzip layer
//! per tree, any number of images sharing layers, each tagged in
//! `index.json`. skopeo pushes it with `--preserve-digests`, so every arm of
//! the bench pulls these exact bytes.
//!
//! Layers are streamed to their blob file (the base is ~300 MiB of tar), and
//! hashed twice on the way: the tar (the config's diff_id) and the gzip (the
//! blob's digest).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use drums_testkit::oci::{
    append_tree, DEFAULT_PATH, FIXED_MTIME, MEDIA_CONFIG, MEDIA_INDEX, MEDIA_LAYER_GZIP,
    MEDIA_MANIFEST, OCI_LAYOUT, REF_NAME,
};
use flate2::write::GzEncoder;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Writing the layout.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("create layout {}", dir.display())]
    Create {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A step of streaming a layer into its blob ("write the layer's tar",
    /// "finish the layer's gzip", ...).
    #[error("{step}")]
    Blob {
        step: String,
        #[source]
        source: io::Error,
    },
    #[error("layer of {}", root.display())]
    LayerOf {
        root: PathBuf,
        #[source]
        source: Box<LayoutError>,
    },
    #[error("encode {what}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

type Result<T, E = LayoutError> = std::result::Result<T, E>;

/// `step` of writing a blob failed.
fn blob_step(step: impl Into<String>) -> impl FnOnce(io::Error) -> LayoutError {
    let step = step.into();
    move |source| LayoutError::Blob { step, source }
}

/// Writing `path` failed.
fn writing(path: &Path) -> impl FnOnce(io::Error) -> LayoutError {
    let path = path.to_owned();
    move |source| LayoutError::Write { path, source }
}

/// A layer's blob in the layout.
#[derive(Clone, Debug)]
pub struct Layer {
    /// `sha256:` of the gzip blob.
    pub digest: String,
    /// `sha256:` of the tar inside it.
    pub diff_id: String,
    /// Bytes of the blob.
    pub size: u64,
    /// Bytes of the tar.
    pub tar_size: u64,
    /// Tar entries.
    pub entries: u64,
}

pub struct Layout {
    dir: PathBuf,
    /// index.json's entries, one per tag.
    manifests: Vec<Value>,
}

impl Layout {
    pub fn create(dir: &Path) -> Result<Layout> {
        std::fs::create_dir_all(dir.join("blobs/sha256")).map_err(|source| {
            LayoutError::Create {
                dir: dir.to_owned(),
                source,
            }
        })?;
        let marker = dir.join("oci-layout");
        std::fs::write(&marker, OCI_LAYOUT).map_err(writing(&marker))?;
        Ok(Layout {
            dir: dir.to_owned(),
            manifests: Vec::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A layer of the whole tree at `root`, the root itself left out.
    pub fn layer_from_dir(&self, root: &Path) -> Result<Layer> {
        // The tree's error (its path named) rides as the io error's text.
        self.layer(|b| append_tree(b, root).map_err(io::Error::other))
            .map_err(|e| LayoutError::LayerOf {
                root: root.to_owned(),
                source: Box::new(e),
            })
    }

    /// A layer of regular files (path in the image, content), root's, 0644,
    /// in directories that the layers below have.
    pub fn layer_from_files(&self, files: &[(String, Vec<u8>)]) -> Result<Layer> {
        self.layer(|b| {
            for (path, data) in files {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_uid(0);
                h.set_gid(0);
                // Fixed, so that the same files make the same layer.
                h.set_mtime(FIXED_MTIME);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data.as_slice())?;
            }
            Ok(files.len() as u64)
        })
    }

    /// Stream a tar, filled by `fill` (which returns its entry count),
    /// through gzip into a new blob.
    fn layer(&self, fill: impl FnOnce(&mut LayerTar) -> io::Result<u64>) -> Result<Layer> {
        let blobs = self.dir.join("blobs/sha256");
        let tmp = tempfile::NamedTempFile::new_in(&blobs)
            .map_err(blob_step(format!("create a blob in {}", blobs.display())))?;
        let file = tmp.reopen().map_err(blob_step("reopen the new blob"))?;
        // Level fast: the blob is made once per run, and gzip's level
        // changes what every arm has to inflate far less than the time to
        // make it.
        let gz = GzEncoder::new(
            Hashing::new(BufWriter::with_capacity(1 << 20, file)),
            flate2::Compression::fast(),
        );
        let mut b = tar::Builder::new(Hashing::new(gz));
        b.follow_symlinks(false);
        let entries = fill(&mut b).map_err(blob_step("write the layer's tar"))?;
        let tar = b
            .into_inner()
            .map_err(blob_step("finish the layer's tar"))?;
        let (diff_id, tar_size) = (tar.digest(), tar.bytes);
        let blob = tar
            .inner
            .finish()
            .map_err(blob_step("finish the layer's gzip"))?;
        let (digest, size) = (blob.digest(), blob.bytes);
        blob.inner
            .into_inner()
            .map_err(|e| e.into_error())
            .map_err(blob_step("flush the layer's blob"))?;
        let hex = digest.trim_start_matches("sha256:");
        tmp.persist(blobs.join(hex))
            .map_err(|e| e.error)
            .map_err(blob_step(format!("name blob {digest}")))?;
        Ok(Layer {
            digest,
            diff_id,
            size,
            tar_size,
            entries,
        })
    }

    /// An image of `layers` (base first), tagged `tag`: its config and
    /// manifest written, and `index.json` written again with it.
    pub fn add_image(&mut self, tag: &str, layers: &[&Layer]) -> Result<()> {
        let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
        let config = json!({
            "created": "2024-01-01T00:00:00Z",
            "architecture": "amd64",
            "os": "linux",
            "config": { "Env": [DEFAULT_PATH] },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
            "history": layers.iter().map(|_| json!({
                "created": "2024-01-01T00:00:00Z",
                "created_by": "drums bench image",
            })).collect::<Vec<_>>(),
        });
        let (config_digest, config_size) = self.blob(&config)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": { "mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size },
            "layers": layers.iter().map(|l| json!({
                "mediaType": MEDIA_LAYER_GZIP,
                "digest": l.digest,
                "size": l.size,
            })).collect::<Vec<_>>(),
        });
        let (digest, size) = self.blob(&manifest)?;
        self.manifests
            .retain(|m| m["annotations"][REF_NAME].as_str() != Some(tag));
        self.manifests.push(json!({
            "mediaType": MEDIA_MANIFEST,
            "digest": digest,
            "size": size,
            "annotations": { REF_NAME: tag },
        }));
        let index = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": self.manifests,
        });
        let path = self.dir.join("index.json");
        let index = serde_json::to_vec(&index).map_err(|source| LayoutError::Encode {
            what: "index.json",
            source,
        })?;
        std::fs::write(&path, index).map_err(writing(&path))
    }

    /// A JSON blob: its digest and size.
    fn blob(&self, v: &Value) -> Result<(String, u64)> {
        let bytes = serde_json::to_vec(v).map_err(|source| LayoutError::Encode {
            what: "a json blob",
            source,
        })?;
        let hex = format!("{:x}", Sha256::digest(&bytes));
        let path = self.dir.join("blobs/sha256").join(&hex);
        std::fs::write(&path, &bytes).map_err(writing(&path))?;
        Ok((format!("sha256:{hex}"), bytes.len() as u64))
    }
}

/// A layer's tar, hashed, gzipped, hashed again, written.
type LayerTar = tar::Builder<Hashing<GzEncoder<Hashing<BufWriter<File>>>>>;

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            bytes: 0,
        }
    }

    fn digest(&self) -> String {
        format!("sha256:{:x}", self.hash.clone().finalize())
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn sha256_file(p: &Path) -> String {
        format!("sha256:{:x}", Sha256::digest(std::fs::read(p).unwrap()))
    }

    /// Every blob is named by its sha256, a layer's diff_id is its tar's,
    /// and index.json names each tag's manifest, which names its layers.
    #[test]
    fn layout_is_consistent() {
        let tree = tempfile::tempdir().unwrap();
        std::fs::create_dir(tree.path().join("etc")).unwrap();
        std::fs::write(tree.path().join("etc/a"), b"a").unwrap();
        std::fs::hard_link(tree.path().join("etc/a"), tree.path().join("b")).unwrap();
        std::os::unix::fs::symlink("etc/a", tree.path().join("c")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut l = Layout::create(dir.path()).unwrap();
        let base = l.layer_from_dir(tree.path()).unwrap();
        assert_eq!(base.entries, 4);
        let top = l
            .layer_from_files(&[("etc/x".into(), vec![7; 100])])
            .unwrap();
        l.add_image("one", &[&base, &top]).unwrap();
        l.add_image("two", &[&base]).unwrap();

        let blobs = dir.path().join("blobs/sha256");
        for e in std::fs::read_dir(&blobs).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            assert_eq!(sha256_file(&p), format!("sha256:{name}"));
        }
        for layer in [&base, &top] {
            let blob = blobs.join(layer.digest.trim_start_matches("sha256:"));
            assert_eq!(std::fs::metadata(&blob).unwrap().len(), layer.size);
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(File::open(&blob).unwrap())
                .read_to_end(&mut tar)
                .unwrap();
            assert_eq!(tar.len() as u64, layer.tar_size);
            assert_eq!(format!("sha256:{:x}", Sha256::digest(&tar)), layer.diff_id);
        }
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
        let tags: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["annotations"][REF_NAME].as_str().unwrap())
            .collect();
        assert_eq!(tags, ["one", "two"]);
        let m = &index["manifests"][0]["digest"];
        let m: Value = serde_json::from_slice(
            &std::fs::read(blobs.join(m.as_str().unwrap().trim_start_matches("sha256:"))).unwrap(),
        )
        .unwrap();
        assert_eq!(m["layers"][0]["digest"], json!(base.digest));
        assert_eq!(m["layers"][1]["digest"], json!(top.digest));
    }
}
