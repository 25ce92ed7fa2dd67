//! Where images come from: configs checked, archives unpacked (both kinds,
//! and every way a hostile one is refused), credentials found, and a
//! registry's failures told apart. No network but loopback; no root.
//!
//! The registry's happy path needs a real registry and is tested with the
//! daemon; here an in-test HTTP server only fails (401, 404), or is not
//! there at all.

use std::io::Write;
use std::path::Path;

use drums_oci::{
    unpack, ArchiveLimits, Credentials, ImageConfig, PullOptions, Remote, SourceError,
};
use sha2::{Digest, Sha256};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(b)))
}

fn bare(d: &str) -> &str {
    d.strip_prefix("sha256:").unwrap()
}

/// A tar stream written header by header, so that it can hold what the
/// `tar` crate's builder refuses to write (absolute paths, `..`).
#[derive(Default, Clone)]
struct Tar {
    b: Vec<u8>,
}

impl Tar {
    fn raw(&mut self, name: &[u8], kind: tar::EntryType, data: &[u8], link: &[u8]) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        let g = h.as_gnu_mut().unwrap();
        g.name[..name.len()].copy_from_slice(name);
        g.linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.b.extend_from_slice(h.as_bytes());
        self.b.extend_from_slice(data);
        self.b
            .extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
        self
    }
    fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.raw(name.as_bytes(), tar::EntryType::Regular, data, b"")
    }
    fn dir(&mut self, name: &str) -> &mut Self {
        self.raw(name.as_bytes(), tar::EntryType::Directory, b"", b"")
    }
    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            name.as_bytes(),
            tar::EntryType::Symlink,
            b"",
            target.as_bytes(),
        )
    }
    /// The stream, with its end-of-archive blocks.
    fn done(&self) -> Vec<u8> {
        let mut b = self.b.clone();
        b.extend(std::iter::repeat_n(0u8, 1024));
        b
    }
}

/// A one-layer image: the layer as a plain tar and gzip'd, and its config.
struct Tiny {
    tar: Vec<u8>,
    gz: Vec<u8>,
    config: Vec<u8>,
    diff_id: String,
}

fn tiny(arch: &str) -> Tiny {
    let mut layer = Tar::default();
    layer.dir("etc/").file("etc/hello", b"hello from a layer\n");
    let tar = layer.done();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let diff_id = sha(&tar);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": "linux", "created": "2024-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"], "WorkingDir": "/work", "User": "1000",
                   "ExposedPorts": {"8080/tcp": {}}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }))
    .unwrap();
    Tiny {
        tar,
        gz,
        config,
        diff_id,
    }
}

fn manifest_for(t: &Tiny, layer_type: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha(&t.config), "size": t.config.len()},
        "layers": [{"mediaType": layer_type, "digest": sha(&t.gz), "size": t.gz.len()}],
    }))
    .unwrap()
}

fn index_of(entries: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": entries})).unwrap()
}

/// An OCI layout in a tar, its index.json as given, with the blobs given.
fn oci_archive(index: &[u8], blobs: &[&[u8]]) -> Tar {
    let mut t = Tar::default();
    t.file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)
        .file("index.json", index)
        .dir("blobs/")
        .dir("blobs/sha256/");
    for b in blobs {
        t.file(&format!("blobs/sha256/{}", bare(&sha(b))), b);
    }
    t
}

/// The tiny image as `skopeo copy oci:… oci-archive:…` writes it.
fn tiny_oci(t: &Tiny) -> (Tar, String) {
    let m = manifest_for(t, OCI_LAYER_GZIP);
    let index = index_of(serde_json::json!([{
        "mediaType": OCI_MANIFEST, "digest": sha(&m), "size": m.len(),
        "annotations": {"org.opencontainers.image.ref.name": "tiny"},
    }]));
    (oci_archive(&index, &[&t.config, &m, &t.gz]), sha(&m))
}

/// The tiny image as `skopeo copy … docker-archive:…` writes it: layers and
/// config at the top, a legacy directory whose layer.tar is a symlink.
fn tiny_docker(t: &Tiny) -> Tar {
    let legacy = "f".repeat(64);
    let mut a = Tar::default();
    a.file(&format!("{}.tar", bare(&t.diff_id)), &t.tar)
        .file(&format!("{}.json", bare(&sha(&t.config))), &t.config)
        .symlink(
            &format!("{legacy}/layer.tar"),
            &format!("../{}.tar", bare(&t.diff_id)),
        )
        .file(&format!("{legacy}/VERSION"), b"1.0")
        .file(&format!("{legacy}/json"), b"{}")
        .file(
            "manifest.json",
            &serde_json::to_vec(&serde_json::json!([{
                "Config": format!("{}.json", bare(&sha(&t.config))),
                "RepoTags": ["drums/tiny:latest"],
                "Layers": [format!("{}.tar", bare(&t.diff_id))],
            }]))
            .unwrap(),
        )
        .file("repositories", br#"{"drums/tiny":{"latest":"ffff"}}"#);
    a
}

/// A parent directory with an empty `staging` in it: what unpack may touch,
/// and what it must not.
struct Place {
    parent: tempfile::TempDir,
}

impl Place {
    fn new() -> Place {
        let parent = tempfile::tempdir().unwrap();
        std::fs::create_dir(parent.path().join("staging")).unwrap();
        Place { parent }
    }
    fn staging(&self) -> std::path::PathBuf {
        self.parent.path().join("staging")
    }
    fn unpack(&self, bytes: &[u8]) -> Result<drums_oci::Archive, SourceError> {
        unpack(bytes, &self.staging(), &ArchiveLimits::default())
    }
    /// Nothing beside staging, and nothing in it but plain files and
    /// directories.
    fn check_contained(&self) {
        let names: Vec<_> = std::fs::read_dir(self.parent.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["staging"], "unpack wrote beside staging");
        fn walk(p: &Path) {
            for e in std::fs::read_dir(p).unwrap() {
                let e = e.unwrap();
                let t = std::fs::symlink_metadata(e.path()).unwrap().file_type();
                assert!(
                    t.is_file() || t.is_dir(),
                    "{:?} is neither file nor dir",
                    e.path()
                );
                if t.is_dir() {
                    walk(&e.path());
                }
            }
        }
        walk(&self.staging());
    }
    fn refused(&self, bytes: &[u8]) -> SourceError {
        let e = self.unpack(bytes).expect_err("the archive must be refused");
        self.check_contained();
        e
    }
}

#[test]
fn docker_and_oci_archives_of_one_image_agree() {
    let t = tiny("amd64");
    let (oci, manifest_digest) = tiny_oci(&t);
    let p = Place::new();
    let a = p.unpack(&oci.done()).unwrap();
    assert_eq!(a.image.digest, manifest_digest);
    assert_eq!(a.refs, ["tiny"]);
    assert_eq!(a.image.layers[0].media_type, OCI_LAYER_GZIP);
    assert_eq!(a.image.layers[0].digest, sha(&t.gz));
    assert_eq!(std::fs::read(&a.blobs[0]).unwrap(), t.gz);
    let c = &a.image.config;
    assert_eq!(c.cmd, ["/bin/sh"]);
    assert_eq!(c.user.as_deref(), Some("1000"));
    assert_eq!(c.working_dir.as_deref(), Some("/work"));
    assert_eq!(c.exposed_ports, ["8080/tcp"]);

    let q = Place::new();
    let b = q.unpack(&tiny_docker(&t).done()).unwrap();
    assert_eq!(b.refs, ["drums/tiny:latest"]);
    assert_eq!(b.image.config_digest, a.image.config_digest);
    assert_eq!(b.image.config.diff_ids, a.image.config.diff_ids);
    assert_eq!(b.image.config_raw, t.config);
    assert_eq!(
        b.image.layers[0].media_type,
        "application/vnd.docker.image.rootfs.diff.tar"
    );
    assert_eq!(b.image.layers[0].digest, t.diff_id);
    assert_eq!(b.image.layers[0].size, t.tar.len() as u64);
    assert_eq!(std::fs::read(&b.blobs[0]).unwrap(), t.tar);
    // The synthesised manifest digest is stable.
    let r = Place::new();
    assert_eq!(
        r.unpack(&tiny_docker(&t).done()).unwrap().image.digest,
        b.image.digest
    );
    p.check_contained();
    q.check_contained();
}

#[test]
fn old_docker_save_and_gzip_and_dot_slash() {
    let t = tiny("amd64");
    let id = "e".repeat(64);
    let mut a = Tar::default();
    a.dir("./")
        .dir(&format!("./{id}/"))
        .file(&format!("./{id}/layer.tar"), &t.tar)
        .file(&format!("./{}.json", bare(&sha(&t.config))), &t.config)
        .file(
            "./manifest.json",
            &serde_json::to_vec(&serde_json::json!([{
                "Config": format!("{}.json", bare(&sha(&t.config))),
                "RepoTags": null,
                "Layers": [format!("{id}/layer.tar")],
            }]))
            .unwrap(),
        );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&a.done()).unwrap();
    let p = Place::new();
    let got = p.unpack(&gz.finish().unwrap()).unwrap();
    assert!(got.refs.is_empty());
    assert_eq!(got.image.config.diff_ids, std::slice::from_ref(&t.diff_id));
    assert_eq!(got.blobs[0], p.staging().join(format!("{id}/layer.tar")));
}

#[test]
fn nested_index_resolves_to_amd64() {
    let t = tiny("amd64");
    let arm = tiny("arm64");
    let m = manifest_for(&t, OCI_LAYER_GZIP);
    let m_arm = manifest_for(&arm, OCI_LAYER_GZIP);
    let inner = index_of(serde_json::json!([
        {"mediaType": OCI_MANIFEST, "digest": sha(&m_arm), "size": m_arm.len(), "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        {"mediaType": OCI_MANIFEST, "digest": sha(&m), "size": m.len(), "platform": {"os": "linux", "architecture": "amd64"}},
    ]));
    let top = index_of(serde_json::json!([{
        "mediaType": OCI_INDEX, "digest": sha(&inner), "size": inner.len(),
        "annotations": {"org.opencontainers.image.ref.name": "a", "io.containerd.image.name": "127.0.0.1:5000/drums/tiny:a"},
    }]));
    let a = oci_archive(&top, &[&inner, &m, &t.config, &t.gz, &m_arm, &arm.config]);
    let p = Place::new();
    let got = p.unpack(&a.done()).unwrap();
    assert_eq!(got.image.digest, sha(&m));
    assert_eq!(got.refs, ["127.0.0.1:5000/drums/tiny:a"]);

    // Without an amd64 entry, the platforms it has are named.
    let inner = index_of(serde_json::json!([
        {"mediaType": OCI_MANIFEST, "digest": sha(&m_arm), "size": m_arm.len(), "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
    ]));
    let top = index_of(
        serde_json::json!([{"mediaType": OCI_INDEX, "digest": sha(&inner), "size": inner.len()}]),
    );
    let a = oci_archive(&top, &[&inner, &m_arm, &arm.config]);
    let e = Place::new().refused(&a.done());
    assert_eq!(
        e.to_string(),
        "the image index has no linux/amd64 image; it has linux/arm64/v8"
    );
}

#[test]
fn wrong_platform_refused() {
    let arm = tiny("arm64");
    let (a, _) = tiny_oci(&arm);
    let e = Place::new().refused(&a.done());
    assert_eq!(
        e.to_string(),
        "image is for linux/arm64; drums runs linux/amd64"
    );
}

#[test]
fn hostile_names_refused_and_nothing_escapes() {
    let t = tiny("amd64");
    let (good, _) = tiny_oci(&t);
    let p = Place::new();
    let outside = p.parent.path().join("evil");
    let cases: Vec<(&str, Tar)> = vec![
        ("absolute", {
            let mut a = good.clone();
            a.file(outside.to_str().unwrap(), b"x");
            a
        }),
        ("dotdot", {
            let mut a = good.clone();
            a.file("../evil", b"x");
            a
        }),
        ("dotdot inside", {
            let mut a = good.clone();
            a.file("blobs/../../evil", b"x");
            a
        }),
        ("symlink", {
            let mut a = Tar::default();
            a.dir("blobs/")
                .dir("blobs/sha256/")
                .symlink(&format!("blobs/sha256/{}", "a".repeat(64)), "/etc/passwd");
            a
        }),
        ("hard link", {
            let mut a = good.clone();
            a.raw(b"repositories", tar::EntryType::Link, b"", b"index.json");
            a
        }),
        ("device", {
            let mut a = Tar::default();
            a.raw(b"blobs", tar::EntryType::Char, b"", b"");
            a
        }),
        ("fifo", {
            let mut a = Tar::default();
            a.raw(b"index.json", tar::EntryType::Fifo, b"", b"");
            a
        }),
        ("unknown file", {
            let mut a = good.clone();
            a.file("run-me.sh", b"#!/bin/sh\n");
            a
        }),
        ("unknown dir", {
            let mut a = Tar::default();
            a.dir("etc/");
            a
        }),
        ("file in a blob's place", {
            let mut a = Tar::default();
            a.file("blobs/sha256/short", b"x");
            a
        }),
    ];
    for (what, a) in cases {
        let p = Place::new();
        let e = p.refused(&a.done());
        assert!(matches!(e, SourceError::ArchiveEntry { .. }), "{what}: {e}");
        assert!(!outside.exists(), "{what}");
    }
}

#[test]
fn duplicate_entry_refused() {
    let t = tiny("amd64");
    let (mut a, _) = tiny_oci(&t);
    a.file("index.json", b"{}");
    let e = Place::new().refused(&a.done());
    assert!(e.to_string().contains("appears twice"), "{e}");
}

#[test]
fn blob_not_matching_its_name_refused() {
    let t = tiny("amd64");
    let mut a = oci_archive(&index_of(serde_json::json!([])), &[]);
    a.file(
        &format!("blobs/sha256/{}", bare(&sha(&t.config))),
        b"not the config",
    );
    let e = Place::new().refused(&a.done());
    let SourceError::DigestMismatch { expected, got, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!((expected, got), (&sha(&t.config), &sha(b"not the config")));
}

#[test]
fn docker_layer_not_matching_diff_id_refused() {
    let t = tiny("amd64");
    let id = "e".repeat(64);
    let mut a = Tar::default();
    a.file(&format!("{id}/layer.tar"), b"some other layer")
        .file(&format!("{}.json", bare(&sha(&t.config))), &t.config)
        .file(
            "manifest.json",
            &serde_json::to_vec(&serde_json::json!([{
                "Config": format!("{}.json", bare(&sha(&t.config))),
                "Layers": [format!("{id}/layer.tar")],
            }]))
            .unwrap(),
        );
    let e = Place::new().refused(&a.done());
    assert!(
        matches!(&e, SourceError::DigestMismatch { expected, .. } if *expected == t.diff_id),
        "{e}"
    );
}

#[test]
fn truncated_archives_refused() {
    let t = tiny("amd64");
    let (a, _) = tiny_oci(&t);
    let whole = a.done();
    // In the middle of the layer blob (the last file).
    let at = a.b.len() - 512 - t.gz.len().div_ceil(512) * 512 + t.gz.len() / 2;
    // Inside a header; between entries, before the end blocks.
    for (what, cut) in [
        ("inside a blob", at),
        ("inside a header", 700),
        ("at an entry's end", a.b.len()),
    ] {
        let e = Place::new().refused(&whole[..cut]);
        assert!(matches!(e, SourceError::Truncated { .. }), "{what}: {e}");
        assert!(e.to_string().starts_with("archive is truncated"), "{e}");
    }
    // gzip'd, cut.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&whole).unwrap();
    let gz = gz.finish().unwrap();
    let e = Place::new().refused(&gz[..gz.len() / 2]);
    assert!(matches!(e, SourceError::Truncated { .. }), "{e}");
}

#[test]
fn limits_enforced() {
    let t = tiny("amd64");
    let (a, _) = tiny_oci(&t);
    let p = Place::new();
    let limits = ArchiveLimits {
        max_bytes: 1 << 30,
        max_entries: 3,
        ..ArchiveLimits::default()
    };
    let e = unpack(&a.done()[..], &p.staging(), &limits).unwrap_err();
    assert!(
        matches!(e, SourceError::ArchiveTooManyEntries { limit: 3 }),
        "{e}"
    );
    p.check_contained();
    let p = Place::new();
    let limits = ArchiveLimits {
        max_bytes: 100,
        max_entries: 100,
        ..ArchiveLimits::default()
    };
    let e = unpack(&a.done()[..], &p.staging(), &limits).unwrap_err();
    assert!(
        matches!(e, SourceError::ArchiveTooBig { limit: 100 }),
        "{e}"
    );
    p.check_contained();
    // The store's room is charged the same content.
    let p = Place::new();
    let limits = ArchiveLimits {
        room: 100,
        ..ArchiveLimits::default()
    };
    let e = unpack(&a.done()[..], &p.staging(), &limits).unwrap_err();
    assert!(matches!(e, SourceError::NoRoom { room: 100 }), "{e}");
    p.check_contained();
}

#[test]
fn one_image_per_archive() {
    let t = tiny("amd64");
    let entry = serde_json::json!({
        "Config": format!("{}.json", bare(&sha(&t.config))),
        "Layers": [format!("{}.tar", bare(&t.diff_id))],
    });
    let mut a = Tar::default();
    a.file(&format!("{}.tar", bare(&t.diff_id)), &t.tar)
        .file(&format!("{}.json", bare(&sha(&t.config))), &t.config)
        .file(
            "manifest.json",
            &serde_json::to_vec(&[&entry, &entry]).unwrap(),
        );
    let e = Place::new().refused(&a.done());
    assert_eq!(
        e.to_string(),
        "the archive holds 2 images; drums imports exactly one per archive"
    );

    let m = manifest_for(&t, OCI_LAYER_GZIP);
    let other = tiny("amd64");
    let mut c2: serde_json::Value = serde_json::from_slice(&other.config).unwrap();
    c2["config"]["Cmd"] = serde_json::json!(["/bin/true"]);
    let c2 = serde_json::to_vec(&c2).unwrap();
    let m2 = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha(&c2), "size": c2.len()},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": sha(&t.gz), "size": t.gz.len()}],
    }))
    .unwrap();
    let index = index_of(serde_json::json!([
        {"mediaType": OCI_MANIFEST, "digest": sha(&m), "size": m.len(), "annotations": {"org.opencontainers.image.ref.name": "a"}},
        {"mediaType": OCI_MANIFEST, "digest": sha(&m2), "size": m2.len(), "annotations": {"org.opencontainers.image.ref.name": "b"}},
    ]));
    let a = oci_archive(&index, &[&m, &m2, &t.config, &c2, &t.gz]);
    let e = Place::new().refused(&a.done());
    assert!(matches!(e, SourceError::ImageCount { count: 2 }), "{e}");

    // Two names for one image are fine.
    let index = index_of(serde_json::json!([
        {"mediaType": OCI_MANIFEST, "digest": sha(&m), "size": m.len(), "annotations": {"org.opencontainers.image.ref.name": "a"}},
        {"mediaType": OCI_MANIFEST, "digest": sha(&m), "size": m.len(), "annotations": {"org.opencontainers.image.ref.name": "b"}},
    ]));
    let a = oci_archive(&index, &[&m, &t.config, &t.gz]);
    assert_eq!(Place::new().unpack(&a.done()).unwrap().refs, ["a", "b"]);
}

#[test]
fn manifest_checks_in_archives() {
    let t = tiny("amd64");
    let with = |m: &[u8]| {
        let index = index_of(
            serde_json::json!([{"mediaType": OCI_MANIFEST, "digest": sha(m), "size": m.len()}]),
        );
        oci_archive(&index, &[m, &t.config, &t.gz]).done()
    };
    // zstd, and a type drums has never heard of.
    for ty in [
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    ] {
        let e = Place::new().refused(&with(&manifest_for(&t, ty)));
        assert_eq!(
            e.to_string(),
            format!("unknown media type {ty:?} for a layer"),
        );
    }
    // Two layers, one diff_id.
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha(&t.config), "size": t.config.len()},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": sha(&t.gz), "size": t.gz.len()},
                   {"mediaType": OCI_LAYER_GZIP, "digest": sha(&t.gz), "size": t.gz.len()}],
    }))
    .unwrap();
    let e = Place::new().refused(&with(&m));
    assert!(
        matches!(
            e,
            SourceError::LayerCount {
                layers: 2,
                diff_ids: 1
            }
        ),
        "{e}"
    );
    // A layer digest that is not sha256.
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha(&t.config), "size": t.config.len()},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": format!("sha512:{}", "a".repeat(128)), "size": 1}],
    }))
    .unwrap();
    let e = Place::new().refused(&with(&m));
    assert!(matches!(e, SourceError::DigestAlgorithm { .. }), "{e}");
    // A descriptor size that lies.
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha(&t.config), "size": t.config.len()},
        "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": sha(&t.gz), "size": 1}],
    }))
    .unwrap();
    let e = Place::new().refused(&with(&m));
    assert!(matches!(e, SourceError::BlobSize { .. }), "{e}");
    // An archive that is no image.
    let mut a = Tar::default();
    a.file("repositories", b"{}");
    assert!(matches!(
        Place::new().refused(&a.done()),
        SourceError::NotAnImage
    ));
}

#[test]
fn configs_parsed_and_checked() {
    // A docker config, with the nulls and extra objects docker writes.
    let docker = br##"{"architecture":"amd64","os":"linux","created":"2023-06-01T00:00:00.1Z",
        "config":{"Hostname":"","User":"","Env":["PATH=/bin"],"Cmd":null,"Entrypoint":["/init"],
                  "WorkingDir":"","ExposedPorts":{"80/tcp":{},"443":{}},"Labels":null},
        "container_config":{"Cmd":["/bin/sh","-c","#(nop) CMD []"]},
        "history":[{"created_by":"x"}],
        "rootfs":{"type":"layers","diff_ids":["sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]}}"##;
    let c = ImageConfig::parse(docker).unwrap();
    assert_eq!(c.user, None);
    assert_eq!(c.working_dir, None);
    assert!(c.cmd.is_empty());
    assert_eq!(c.entrypoint, ["/init"]);
    assert_eq!(c.exposed_ports, ["443/tcp", "80/tcp"]);
    assert_eq!(c.created.as_deref(), Some("2023-06-01T00:00:00.1Z"));

    // An OCI config with no `config` at all.
    let oci = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let c = ImageConfig::parse(oci).unwrap();
    assert!(c.env.is_empty() && c.diff_ids.is_empty());

    let e = ImageConfig::parse(
        br#"{"architecture":"arm","variant":"v7","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "image is for linux/arm/v7; drums runs linux/amd64"
    );
    let e = ImageConfig::parse(
        br#"{"architecture":"amd64","os":"windows","rootfs":{"type":"layers","diff_ids":[]}}"#,
    )
    .unwrap_err();
    assert!(matches!(e, SourceError::Platform { .. }), "{e}");

    let e = ImageConfig::parse(
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:ABC"]}}"#,
    )
    .unwrap_err();
    assert!(matches!(e, SourceError::BadDigest { .. }), "{e}");
    let e = ImageConfig::parse(br#"{"architecture":"amd64","os":"linux"}"#).unwrap_err();
    assert!(matches!(e, SourceError::Invalid { .. }), "{e}");
    let e = ImageConfig::parse(b"[1,2").unwrap_err();
    assert!(matches!(e, SourceError::Json { .. }), "{e}");

    let mut big =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"pad":""#
            .to_vec();
    big.extend(std::iter::repeat_n(b'x', 4 << 20));
    big.extend_from_slice(br#""}"#);
    let e = ImageConfig::parse(&big).unwrap_err();
    assert!(
        matches!(e, SourceError::TooLarge { limit, .. } if limit == 4 << 20),
        "{e}"
    );
}

/// The tiny image through real skopeo, when it is installed: the two
/// archive kinds it writes for one OCI layout agree.
#[test]
fn skopeo_archives_agree() {
    if std::process::Command::new("skopeo")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED skopeo_archives_agree: skopeo is not installed");
        return;
    }
    let t = tiny("amd64");
    let (oci, _) = tiny_oci(&t);
    let d = tempfile::tempdir().unwrap();
    let layout = d.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    tar::Archive::new(&oci.done()[..]).unpack(&layout).unwrap();
    let run = |dest: String| {
        let out = std::process::Command::new("skopeo")
            .args(["--insecure-policy", "copy", "-q"])
            .arg(format!("oci:{}:tiny", layout.display()))
            .arg(dest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let da = d.path().join("d.tar");
    let oa = d.path().join("o.tar");
    run(format!("docker-archive:{}:drums/tiny:latest", da.display()));
    run(format!("oci-archive:{}:tiny", oa.display()));
    let (p, q) = (Place::new(), Place::new());
    let from_docker = p.unpack(&std::fs::read(&da).unwrap()).unwrap();
    let from_oci = q.unpack(&std::fs::read(&oa).unwrap()).unwrap();
    assert_eq!(
        from_docker.image.config_digest,
        from_oci.image.config_digest
    );
    assert_eq!(
        from_docker.image.config.diff_ids,
        from_oci.image.config.diff_ids
    );
    assert_eq!(from_docker.image.config.diff_ids, [t.diff_id]);
    assert_eq!(from_oci.refs, ["tiny"]);
    assert_eq!(from_docker.refs.len(), 1);
    p.check_contained();
    q.check_contained();
}

/// What the test server answers for a request's path.
type Answer = std::sync::Arc<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

/// A minimal HTTP/1.1 server on loopback that answers every request with
/// what `answer` gives for its path; it serves until the test's runtime
/// ends.
async fn serve(answer: Answer) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Bounded: a test makes a handful of requests.
        for _ in 0..64 {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // A TLS hello is no HTTP: answered at once, as an HTTP server does.
            while !req.windows(4).any(|w| w == b"\r\n\r\n")
                && req.first().is_none_or(|b| *b != 0x16)
            {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let line = String::from_utf8_lossy(&req)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
            let _ = s.write_all(&answer(&path)).await;
            let _ = s.shutdown().await;
        }
    });
    port
}

fn response(status: &str, headers: &str, body: impl AsRef<[u8]>) -> Vec<u8> {
    let body = body.as_ref();
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn insecure() -> PullOptions {
    PullOptions {
        insecure: true,
        ..PullOptions::default()
    }
}

#[tokio::test]
async fn registry_down() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = Remote::resolve(&format!("127.0.0.1:{port}/drums/base:latest"), &insecure())
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Unreachable { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("registry 127.0.0.1:{port} is down: connection refused")
    );
}

#[tokio::test]
async fn registry_refuses_everyone() {
    let port = serve(std::sync::Arc::new(|_: &str| {
        response(
            "401 Unauthorized",
            "WWW-Authenticate: Basic realm=\"drums-test\"\r\nContent-Type: application/json\r\n",
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
        )
    }))
    .await;
    let reference = format!("127.0.0.1:{port}/drums/base:latest");
    for auth in [
        None,
        Some(Credentials {
            username: "u".into(),
            password: "wrong".into(),
        }),
    ] {
        let opts = PullOptions { auth, ..insecure() };
        let e = Remote::resolve(&reference, &opts).await.unwrap_err();
        assert!(matches!(e, SourceError::Unauthorized { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("not authorised to pull {reference} from 127.0.0.1:{port} (drums reads credentials from auth.json / ~/.docker/config.json)")
        );
    }
}

#[tokio::test]
async fn registry_without_the_image() {
    let port = serve(std::sync::Arc::new(|path: &str| {
        if path == "/v2/" {
            response("200 OK", "Content-Type: application/json\r\n", "{}")
        } else if path.contains("/plain/") {
            response("404 Not Found", "", "404 page not found")
        } else {
            response(
                "404 Not Found",
                "Content-Type: application/json\r\n",
                r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
            )
        }
    }))
    .await;
    for repo in ["drums/base", "drums/plain/base"] {
        let reference = format!("127.0.0.1:{port}/{repo}:latest");
        let e = Remote::resolve(&reference, &insecure()).await.unwrap_err();
        assert!(matches!(e, SourceError::NotFound { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("no image {reference} in the registry")
        );
    }
}

#[tokio::test]
async fn plain_http_registry_without_insecure_gets_a_hint() {
    let port = serve(std::sync::Arc::new(|_: &str| response("200 OK", "", "{}"))).await;
    let e = Remote::resolve(
        &format!("127.0.0.1:{port}/drums/base:latest"),
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, SourceError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains("pull from it as insecure"), "{e}");
}

/// A registry that serves the tiny image's manifest and config, and a
/// layer blob of the right size whose bytes are not the layer's.
#[tokio::test]
async fn corrupt_layer_refused_and_removed() {
    let t = tiny("amd64");
    let m = manifest_for(&t, OCI_LAYER_GZIP);
    let (config, gz) = (t.config.clone(), t.gz.clone());
    let port = serve(std::sync::Arc::new(move |path: &str| {
        let json = "Content-Type: application/json\r\n";
        if path == "/v2/" {
            response("200 OK", json, "{}")
        } else if path.ends_with("/manifests/latest") {
            response("200 OK", &format!("Content-Type: {OCI_MANIFEST}\r\n"), &m)
        } else if path.ends_with(&sha(&config)) {
            response("200 OK", "", &config)
        } else if path.ends_with(&sha(&gz)) {
            let mut bad = gz.clone();
            bad[gz.len() / 2] ^= 0xff;
            response("200 OK", "", bad)
        } else {
            response(
                "404 Not Found",
                json,
                r#"{"errors":[{"code":"BLOB_UNKNOWN"}]}"#,
            )
        }
    }))
    .await;
    let reference = format!("127.0.0.1:{port}/drums/base:latest");
    let remote = Remote::resolve(&reference, &insecure()).await.unwrap();
    assert_eq!(remote.reference(), reference);
    assert_eq!(remote.image().config_digest, sha(&t.config));
    let d = tempfile::tempdir().unwrap();
    let dest = d.path().join("layer");
    let mut calls = 0;
    let e = remote
        .fetch_layer(0, &dest, &mut |_, total| {
            assert_eq!(total, t.gz.len() as u64);
            calls += 1;
        })
        .await
        .unwrap_err();
    let SourceError::DigestMismatch { expected, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(*expected, sha(&t.gz));
    assert!(calls > 0);
    assert!(!dest.exists(), "the partial download is removed");

    // A file already there is neither written nor removed.
    std::fs::write(&dest, b"mine").unwrap();
    let e = remote
        .fetch_layer(0, &dest, &mut |_, _| {})
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Io { op: "create", .. }), "{e:?}");
    assert_eq!(std::fs::read(&dest).unwrap(), b"mine");

    // Over the limit: refused before a byte is asked for.
    let opts = PullOptions {
        max_blob_bytes: 8,
        ..insecure()
    };
    let remote = Remote::resolve(&reference, &opts).await.unwrap();
    let other = d.path().join("other");
    let e = remote
        .fetch_layer(0, &other, &mut |_, _| {})
        .await
        .unwrap_err();
    assert!(
        matches!(e, SourceError::BlobTooBig { limit: 8, .. }),
        "{e:?}"
    );
    assert!(!other.exists());
}

#[test]
fn bad_reference_named() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(Remote::resolve("Not A Reference", &insecure()))
        .unwrap_err();
    assert!(matches!(e, SourceError::Reference { .. }), "{e:?}");
}

/// `credentials_for` reads the real environment; it runs in a child process
/// with its own (the parent's is shared by every test thread).
#[test]
fn credentials_from_a_temp_home() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".docker")).unwrap();
    std::fs::write(
        home.path().join(".docker/config.json"),
        br#"{"auths":{"https://127.0.0.1:5000/v1/":{"auth":"ZG9ja2VyOnB3"}}}"#,
    )
    .unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "credentials_child", "--nocapture"])
        .env("HOME", home.path())
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run by credentials_from_a_temp_home, in a child with its own HOME"]
fn credentials_child() {
    let c = drums_oci::credentials_for(&drums_oci::registry_of("127.0.0.1:5000/drums/base"))
        .unwrap()
        .unwrap();
    assert_eq!((c.username.as_str(), c.password.as_str()), ("docker", "pw"));
    assert_eq!(drums_oci::credentials_for("127.0.0.9:1").unwrap(), None);
}
