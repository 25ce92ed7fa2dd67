//! OCI images written by test code: layers as tar bytes (from a directory
//! tree or by hand, malicious entries included), an image layout on disk
//! (`oci-layout`, `index.json`, `blobs/sha256/HEX`), the ways a layout can
//! be wrong, and skopeo's conversions of a layout to the archive formats
//! `drums image import` reads.
//!
//! The images are made here rather than pulled, since the tests reach no
//! registry but their own on loopback; the base is drums' own debootstrap
//! rootfs, so a pulled or imported image boots like the default one.

#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use drums_testkit::oci::{append_tree, FIXED_MTIME, OCI_LAYOUT};
// Each test binary compiles this module and uses some of these.
#[allow(unused_imports)]
pub use drums_testkit::oci::{
    DEFAULT_PATH, MEDIA_CONFIG, MEDIA_INDEX, MEDIA_LAYER_GZIP, MEDIA_LAYER_TAR, MEDIA_LAYER_ZSTD,
    MEDIA_MANIFEST, REF_NAME,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// "sha256:HEX" of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    // Tests build sha2 without optimisation: 5 s for the 300 MiB base, where
    // coreutils takes 1 s. Large buffers go to sha256sum.
    if bytes.len() < 16 << 20 {
        return format!("sha256:{:x}", Sha256::digest(bytes));
    }
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = c.stdin.take().unwrap();
    // Written from a thread of its own, so that a sha256sum that dies early
    // fails the test rather than blocking it on a full pipe.
    let out = std::thread::scope(|s| {
        s.spawn(move || stdin.write_all(bytes).unwrap());
        c.wait_with_output().unwrap()
    });
    assert!(out.status.success(), "sha256sum: {}", out.status);
    let hex = String::from_utf8(out.stdout).unwrap();
    let hex = hex.split_whitespace().next().unwrap();
    assert_eq!(hex.len(), 64, "sha256sum said {hex:?}");
    format!("sha256:{hex}")
}

/// One layer: the tar, compressed or not, with its two digests. The bytes
/// are shared, so cloning the large base into several images costs nothing.
#[derive(Clone)]
pub struct Layer {
    bytes: Arc<Vec<u8>>,
    gzip: bool,
    diff_id: String,
    digest: String,
}

impl Layer {
    /// A tar of the whole tree at `root`, as [`append_tree`] writes it
    /// (name order, the root left out, devices and sockets skipped).
    pub fn from_dir(root: &Path, gzip: bool) -> Layer {
        let mut b = tar::Builder::new(Vec::new());
        append_tree(&mut b, root).expect("a layer of the tree");
        Layer::from_tar(b.into_inner().unwrap(), gzip)
    }

    pub fn builder() -> LayerBuilder {
        LayerBuilder {
            b: tar::Builder::new(Vec::new()),
        }
    }

    /// A layer of these tar bytes (a finished archive), gzipped if asked.
    pub fn from_tar(tar: Vec<u8>, gzip: bool) -> Layer {
        let diff_id = sha256_digest(&tar);
        let (bytes, digest) = if gzip {
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(&tar).unwrap();
            let z = z.finish().unwrap();
            let d = sha256_digest(&z);
            (z, d)
        } else {
            (tar, diff_id.clone())
        };
        Layer {
            bytes: Arc::new(bytes),
            gzip,
            diff_id,
            digest,
        }
    }

    /// A layer of exactly these blob bytes, whose config says `diff_id`:
    /// for blobs no builder makes (a gzip stream that is mostly repeats of
    /// one deflate block, say).
    pub fn from_blob(bytes: Vec<u8>, gzip: bool, diff_id: String) -> Layer {
        let digest = sha256_digest(&bytes);
        Layer {
            bytes: Arc::new(bytes),
            gzip,
            diff_id,
            digest,
        }
    }

    /// The digest of the uncompressed tar (what the config's
    /// `rootfs.diff_ids` lists).
    pub fn diff_id(&self) -> String {
        self.diff_id.clone()
    }

    /// The digest of the blob (compressed, if it is).
    pub fn digest(&self) -> String {
        self.digest.clone()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn is_gzip(&self) -> bool {
        self.gzip
    }

    pub fn media_type(&self) -> &'static str {
        if self.gzip {
            MEDIA_LAYER_GZIP
        } else {
            MEDIA_LAYER_TAR
        }
    }
}

/// A layer made entry by entry. Paths are relative ("etc/passwd"); entries
/// are written in the order given, owners numeric, mtimes fixed.
pub struct LayerBuilder {
    b: tar::Builder<Vec<u8>>,
}

impl LayerBuilder {
    fn header(kind: tar::EntryType, mode: u32, uid: u32, gid: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid as u64);
        h.set_gid(gid as u64);
        h.set_mtime(FIXED_MTIME);
        h.set_size(0);
        h
    }

    pub fn file(mut self, path: &str, data: &[u8], mode: u32, uid: u32, gid: u32) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, uid, gid);
        h.set_size(data.len() as u64);
        self.b.append_data(&mut h, path, data).unwrap();
        self
    }

    pub fn dir(mut self, path: &str, mode: u32, uid: u32, gid: u32) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, mode, uid, gid);
        self.b.append_data(&mut h, path, std::io::empty()).unwrap();
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0, 0);
        self.b.append_link(&mut h, path, target).unwrap();
        self
    }

    /// A hard link at `path` to `target`, a path in the image (relative,
    /// like every other path here).
    pub fn hardlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Link, 0o644, 0, 0);
        self.b.append_link(&mut h, path, target).unwrap();
        self
    }

    /// Delete `path` of the layers below: an empty `DIR/.wh.NAME`.
    pub fn whiteout(self, path: &str) -> Self {
        let p = Path::new(path);
        let name = p
            .file_name()
            .expect("a whiteout names a file")
            .to_str()
            .unwrap();
        let wh = p.with_file_name(format!(".wh.{name}"));
        self.file(wh.to_str().unwrap(), b"", 0o644, 0, 0)
    }

    /// Hide everything the layers below have in `dir`: `DIR/.wh..wh..opq`.
    pub fn opaque(self, dir: &str) -> Self {
        let p = Path::new(dir).join(".wh..wh..opq");
        self.file(p.to_str().unwrap(), b"", 0o644, 0, 0)
    }

    /// An entry written as given but for its checksum (set here), path
    /// checks bypassed: absolute paths, `..`, devices. Make the header with
    /// [`raw_header`], which writes any name.
    pub fn raw_entry(mut self, mut header: tar::Header, data: &[u8]) -> Self {
        header.set_cksum();
        self.b.append(&header, data).unwrap();
        self
    }

    pub fn build(self, gzip: bool) -> Layer {
        Layer::from_tar(self.b.into_inner().unwrap(), gzip)
    }
}

/// A ustar header named `path` byte for byte (at most 100 bytes), for
/// [`LayerBuilder::raw_entry`]: the tar crate's own `set_path` refuses `..`
/// and absolute paths, which are what a malicious layer holds. Size is
/// `size`; set a device's numbers or a link's name on the result.
pub fn raw_header(path: &[u8], kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(FIXED_MTIME);
    h.set_size(size);
    let name = &mut h.as_old_mut().name;
    assert!(path.len() <= name.len(), "raw_header: path over 100 bytes");
    name[..path.len()].copy_from_slice(path);
    h
}

/// Set a raw header's link name byte for byte (at most 100 bytes), with the
/// same reason as [`raw_header`].
pub fn set_raw_link(h: &mut tar::Header, target: &[u8]) {
    let l = &mut h.as_old_mut().linkname;
    assert!(
        target.len() <= l.len(),
        "set_raw_link: target over 100 bytes"
    );
    l.fill(0);
    l[..target.len()].copy_from_slice(target);
}

#[derive(Clone)]
pub struct ImageSpec {
    pub layers: Vec<Layer>,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// "8080/tcp"
    pub exposed_ports: Vec<String>,
    /// OCI's names: "amd64", "arm64".
    pub architecture: String,
    pub os: String,
}

impl ImageSpec {
    /// linux/amd64 with the usual PATH and nothing else set.
    pub fn new(layers: Vec<Layer>) -> ImageSpec {
        ImageSpec {
            layers,
            user: None,
            working_dir: None,
            env: vec![DEFAULT_PATH.to_owned()],
            entrypoint: vec![],
            cmd: vec![],
            exposed_ports: vec![],
            architecture: "amd64".into(),
            os: "linux".into(),
        }
    }

    /// The image config JSON (`application/vnd.oci.image.config.v1+json`).
    fn config(&self, architecture: &str, diff_ids: &[String]) -> Value {
        let mut c = serde_json::Map::new();
        if let Some(u) = &self.user {
            c.insert("User".into(), json!(u));
        }
        if let Some(w) = &self.working_dir {
            c.insert("WorkingDir".into(), json!(w));
        }
        if !self.env.is_empty() {
            c.insert("Env".into(), json!(self.env));
        }
        if !self.entrypoint.is_empty() {
            c.insert("Entrypoint".into(), json!(self.entrypoint));
        }
        if !self.cmd.is_empty() {
            c.insert("Cmd".into(), json!(self.cmd));
        }
        if !self.exposed_ports.is_empty() {
            let ports: serde_json::Map<String, Value> = self
                .exposed_ports
                .iter()
                .map(|p| (p.clone(), json!({})))
                .collect();
            c.insert("ExposedPorts".into(), Value::Object(ports));
        }
        json!({
            "created": "2024-01-01T00:00:00Z",
            "architecture": architecture,
            "os": self.os,
            "config": c,
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
            "history": (0..diff_ids.len())
                .map(|i| json!({ "created": "2024-01-01T00:00:00Z", "created_by": format!("drums test layer {i}") }))
                .collect::<Vec<_>>(),
        })
    }
}

/// How [`write_layout_with`] makes a layout wrong. Layer tampering hits the
/// image's last layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tamper {
    None,
    /// The last layer's blob file holds bytes that do not hash to its name
    /// and descriptor digest (one byte in the middle flipped; the size is
    /// right, so only a digest check catches it).
    LayerDigest,
    /// The config's last `rootfs.diff_ids` entry is not the digest of the
    /// last layer's uncompressed tar.
    DiffId,
    /// The last layer's descriptor says this media type (its bytes are
    /// unchanged): `MEDIA_LAYER_ZSTD`, or garbage.
    LayerMediaType(String),
    /// The config and index.json's platform say this architecture.
    Platform(&'static str),
    /// index.json points at an image index (not a manifest) whose only
    /// manifest is for this architecture; the config says it too.
    IndexOnlyArch(&'static str),
}

/// Write an OCI layout at `dir` holding `image`, tagged `tag` (annotation
/// `org.opencontainers.image.ref.name`). Returns (manifest digest, config
/// digest).
pub fn write_layout(dir: &Path, image: &ImageSpec, tag: &str) -> (String, String) {
    write_layout_with(dir, image, tag, Tamper::None)
}

/// [`write_layout`], made wrong as `tamper` says. A layout that already
/// exists at `dir` keeps its other images (an entry of the same tag is
/// replaced). Returns (digest `tag` points at, config digest): for
/// `IndexOnlyArch` the first is the image index's digest.
pub fn write_layout_with(
    dir: &Path,
    image: &ImageSpec,
    tag: &str,
    tamper: Tamper,
) -> (String, String) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), OCI_LAYOUT).unwrap();
    let n = image.layers.len();
    let hits_layer = matches!(
        tamper,
        Tamper::LayerDigest | Tamper::DiffId | Tamper::LayerMediaType(_)
    );
    assert!(
        n > 0 || !hits_layer,
        "{tamper:?} needs a layer to tamper with"
    );

    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for (i, l) in image.layers.iter().enumerate() {
        let last = i + 1 == n;
        if last && tamper == Tamper::LayerDigest {
            let mut bad = l.bytes().to_vec();
            let mid = bad.len() / 2;
            bad[mid] ^= 0xff;
            write_blob_as(dir, &l.digest, &bad);
        } else {
            write_blob_as(dir, &l.digest, l.bytes());
        }
        let media = match (&tamper, last) {
            (Tamper::LayerMediaType(m), true) => m.clone(),
            _ => l.media_type().to_owned(),
        };
        layers.push(json!({ "mediaType": media, "digest": l.digest, "size": l.bytes.len() }));
        diff_ids.push(if last && tamper == Tamper::DiffId {
            sha256_digest(b"not this layer's tar")
        } else {
            l.diff_id.clone()
        });
    }
    let arch = match tamper {
        Tamper::Platform(a) | Tamper::IndexOnlyArch(a) => a.to_owned(),
        _ => image.architecture.clone(),
    };
    let config = serde_json::to_vec(&image.config(&arch, &diff_ids)).unwrap();
    let config_digest = write_blob(dir, &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": { "mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config.len() },
        "layers": layers,
    }))
    .unwrap();
    let manifest_digest = write_blob(dir, &manifest);
    let platform = json!({ "architecture": arch, "os": image.os });
    let mut top = json!({
        "mediaType": MEDIA_MANIFEST,
        "digest": manifest_digest,
        "size": manifest.len(),
        "platform": platform,
    });
    if let Tamper::IndexOnlyArch(_) = tamper {
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [top],
        }))
        .unwrap();
        top = json!({
            "mediaType": MEDIA_INDEX,
            "digest": write_blob(dir, &index),
            "size": index.len(),
        });
    }
    top["annotations"] = json!({ REF_NAME: tag });
    let top_digest = top["digest"].as_str().unwrap().to_owned();

    let index_path = dir.join("index.json");
    let mut manifests: Vec<Value> = std::fs::read(&index_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v["manifests"].as_array().cloned())
        .unwrap_or_default();
    manifests.retain(|m| m["annotations"][REF_NAME].as_str() != Some(tag));
    manifests.push(top);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": manifests,
    }))
    .unwrap();
    std::fs::write(index_path, index).unwrap();
    (top_digest, config_digest)
}

fn write_blob(dir: &Path, bytes: &[u8]) -> String {
    let d = sha256_digest(bytes);
    write_blob_as(dir, &d, bytes);
    d
}

fn write_blob_as(dir: &Path, digest: &str, bytes: &[u8]) {
    let hex = digest.strip_prefix("sha256:").unwrap();
    std::fs::write(dir.join("blobs/sha256").join(hex), bytes).unwrap();
}

/// `skopeo copy oci:LAYOUT:TAG docker-archive:FILE:TAG`: the format of
/// `docker save` (layers stored uncompressed, named by digest). `tag` is
/// also the Docker reference written to the archive's `RepoTags`, in
/// skopeo's normalized form: Docker Hub's default host is prefixed, and a
/// bare name gains `library/` (a bare "latest" becomes the repository
/// "library/latest"), so a name like "drums/two:v1" reads best. skopeo
/// refuses what a docker archive cannot hold: a zstd or unknown layer media
/// type, an image index, a layer whose bytes do not match its digest.
pub fn to_docker_archive(layout: &Path, tag: &str, file: &Path) {
    skopeo_copy(
        &[],
        layout,
        tag,
        &format!("docker-archive:{}:{tag}", file.display()),
        file,
    );
}

/// `skopeo copy --all oci:LAYOUT:TAG oci-archive:FILE:TAG`: a tar of an OCI
/// layout holding that one image (an image index copied whole). skopeo
/// checks blob digests, so a `Tamper::LayerDigest` layout needs
/// [`tar_layout`].
pub fn to_oci_archive(layout: &Path, tag: &str, file: &Path) {
    skopeo_copy(
        &["--all"],
        layout,
        tag,
        &format!("oci-archive:{}:{tag}", file.display()),
        file,
    );
}

/// An oci-archive made by tarring the layout directory as it is, every tag
/// and every flaw kept: what no tool that checks would write.
pub fn tar_layout(layout: &Path, file: &Path) {
    let mut b = tar::Builder::new(std::fs::File::create(file).unwrap());
    append_tree(&mut b, layout).expect("a tar of the layout");
    b.into_inner().unwrap().sync_all().unwrap();
}

fn skopeo_copy(flags: &[&str], layout: &Path, tag: &str, dest: &str, file: &Path) {
    // skopeo adds to an existing docker-archive rather than replacing it.
    let _ = std::fs::remove_file(file);
    let out = Command::new("/usr/bin/skopeo")
        .args(["--insecure-policy", "copy", "--quiet"])
        .args(flags)
        .arg(format!("oci:{}:{tag}", layout.display()))
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo copy oci:{}:{tag} {dest} failed ({}):\n{}",
        layout.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// drums' own default rootfs (debootstrap), which set-up builds.
pub fn base_rootfs() -> PathBuf {
    super::images_dir().join("default/rootfs")
}

/// The whole default rootfs as one uncompressed layer, made once per test
/// process: it is large, and every image below starts from it.
pub fn base_layer() -> &'static Layer {
    static BASE: OnceLock<Layer> = OnceLock::new();
    BASE.get_or_init(|| {
        super::require_root();
        let t = Instant::now();
        let l = Layer::from_dir(&base_rootfs(), false);
        eprintln!(
            "oci::base_layer: {} MiB of tar in {:.2} s",
            l.bytes().len() >> 20,
            t.elapsed().as_secs_f64()
        );
        l
    })
}

/// The base, then a gzipped layer that whites out /etc/debian_version and
/// adds /etc/drums-layer2 ("layer 2\n"): both layer media types, and a
/// deletion across layers.
pub fn two_layer_image() -> ImageSpec {
    let top = Layer::builder()
        .dir("etc", 0o755, 0, 0)
        .whiteout("etc/debian_version")
        .file("etc/drums-layer2", b"layer 2\n", 0o644, 0, 0)
        .build(true);
    ImageSpec::new(vec![base_layer().clone(), top])
}

/// The base, then a layer adding user `worker` (uid and gid 1000) to copies
/// of the base's /etc/passwd and /etc/group, and /home/worker owned by it;
/// the config runs `sleep infinity` as worker in /home/worker with
/// FOO=bar, and exposes 8080/tcp.
pub fn user_workdir_image() -> ImageSpec {
    let root = base_rootfs();
    let appended = |rel: &str, line: &str| {
        let p = root.join(rel);
        let meta = std::fs::metadata(&p).unwrap();
        let mut data = std::fs::read(&p).unwrap();
        if !data.is_empty() && !data.ends_with(b"\n") {
            data.push(b'\n');
        }
        data.extend_from_slice(line.as_bytes());
        (data, meta.mode() & 0o7777, meta.uid(), meta.gid())
    };
    let (passwd, pm, pu, pg) = appended(
        "etc/passwd",
        "worker:x:1000:1000:drums test user:/home/worker:/bin/sh\n",
    );
    let (group, gm, gu, gg) = appended("etc/group", "worker:x:1000:\n");
    let top = Layer::builder()
        .dir("etc", 0o755, 0, 0)
        .file("etc/passwd", &passwd, pm, pu, pg)
        .file("etc/group", &group, gm, gu, gg)
        .dir("home", 0o755, 0, 0)
        .dir("home/worker", 0o755, 1000, 1000)
        .build(true);
    let mut image = ImageSpec::new(vec![base_layer().clone(), top]);
    image.user = Some("worker".into());
    image.working_dir = Some("/home/worker".into());
    image.env.push("FOO=bar".into());
    image.exposed_ports = vec!["8080/tcp".into()];
    image.cmd = vec!["sleep".into(), "infinity".into()];
    image
}

/// A layer of `mib` MiB that does not compress.
pub fn noise_layer(name: &str, mib: usize, seed: u64) -> Layer {
    // xorshift: enough to defeat gzip, no dependency.
    let mut x = seed | 1;
    let data: Vec<u8> = (0..mib << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    Layer::builder().file(name, &data, 0o644, 0, 0).build(true)
}
