//! What an image is: its manifest (or the index that points at one per
//! platform), its config, and the checks drums makes before it stores a
//! byte of it. Both sources, a registry and an archive, end here, so an image
//! is judged the same wherever it came from.
//!
//! The JSON documents are read through private serde structs rather than the
//! `oci-spec` types: drums reads a handful of fields, and wants its own error
//! for each way a document can be wrong (an unknown media type, a digest that
//! is not sha256, a platform drums does not run), not a generic parse error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::SourceError;

type Result<T> = std::result::Result<T, SourceError>;

/// A manifest, an index, a config: none is larger than this. Real ones are a
/// few KiB; the cap keeps a hostile one from filling memory.
pub const MAX_JSON_BYTES: u64 = 4 << 20;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_INDEX: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Not a type registries serve; drums gives it to a `docker save` archive's
/// layers, which are plain tar files.
pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";

const MANIFEST_TYPES: [&str; 2] = [OCI_MANIFEST, DOCKER_MANIFEST];
const INDEX_TYPES: [&str; 2] = [OCI_INDEX, DOCKER_INDEX];
const CONFIG_TYPES: [&str; 2] = [OCI_CONFIG, DOCKER_CONFIG];
/// zstd is not here: `layer::apply` cannot read it yet.
const LAYER_TYPES: [&str; 4] = [
    OCI_LAYER_TAR,
    OCI_LAYER_GZIP,
    DOCKER_LAYER_GZIP,
    DOCKER_LAYER_TAR,
];

/// The only platform drums runs.
const OS: &str = "linux";
const ARCH: &str = "amd64";

/// One image, checked and ready to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageManifest {
    /// `sha256:HEX` of the manifest's bytes: for a registry's image, or an
    /// OCI layout's, the manifest it holds (the platform's, not the index's).
    /// A `docker save` archive has no manifest; its digest is that of the one
    /// drums writes for it (see [`ImageManifest::synthesise`]).
    pub digest: String,
    /// `sha256:HEX` of the config: the image id.
    pub config_digest: String,
    /// The config's bytes, their digest verified.
    pub config_raw: Vec<u8>,
    pub config: ImageConfig,
    /// Base first.
    pub layers: Vec<LayerDesc>,
}

/// One layer's blob, as its manifest names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerDesc {
    /// `sha256:HEX` of the blob as stored (compressed or not).
    pub digest: String,
    /// One of the layer media types drums reads (gzip or plain tar).
    pub media_type: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// `sha256:HEX` of the uncompressed tar: what `layer::apply` computes.
    pub diff_id: String,
}

/// What drums takes from an image config (the docker/OCI `config` object,
/// and `rootfs.diff_ids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageConfig {
    pub architecture: String,
    pub os: String,
    /// None when the image does not say (or says ""): root.
    pub user: Option<String>,
    /// `NAME=VALUE`, as the image gives them.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `PORT/PROTO` (a bare port is tcp), sorted, no duplicates.
    pub exposed_ports: Vec<String>,
    /// The uncompressed layers' digests, base first.
    pub diff_ids: Vec<String>,
    /// RFC 3339, as the image gives it.
    pub created: Option<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    config: Option<RawRunConfig>,
    rootfs: Option<RawRootfs>,
    #[serde(default)]
    created: Option<String>,
}

/// Every field may be absent or null in images seen in the wild.
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawRunConfig {
    user: Option<String>,
    env: Option<Vec<String>>,
    working_dir: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Deserialize)]
struct RawRootfs {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    diff_ids: Vec<String>,
}

impl ImageConfig {
    /// Parse an image config and check that drums can run it: linux/amd64,
    /// rootfs of type `layers`, every diff_id a sha256 digest.
    pub fn parse(raw: &[u8]) -> Result<ImageConfig> {
        check_size("image config", raw.len() as u64)?;
        let c: RawConfig = serde_json::from_slice(raw).map_err(|source| SourceError::Json {
            what: "image config",
            source,
        })?;
        if c.os != OS || c.architecture != ARCH {
            return Err(SourceError::Platform {
                found: platform_name(&c.os, &c.architecture, c.variant.as_deref()),
            });
        }
        let rootfs = c.rootfs.ok_or_else(|| SourceError::Invalid {
            what: "image config",
            why: "it has no rootfs".to_owned(),
        })?;
        if rootfs.kind != "layers" {
            return Err(SourceError::Invalid {
                what: "image config",
                why: format!("its rootfs type is {:?}, not \"layers\"", rootfs.kind),
            });
        }
        for d in &rootfs.diff_ids {
            check_digest(d)?;
        }
        let r = c.config.unwrap_or_default();
        let mut ports: Vec<String> = r
            .exposed_ports
            .unwrap_or_default()
            .into_keys()
            .map(|p| if p.contains('/') { p } else { p + "/tcp" })
            .collect();
        ports.sort();
        ports.dedup();
        Ok(ImageConfig {
            architecture: c.architecture,
            os: c.os,
            user: r.user.filter(|u| !u.is_empty()),
            env: r.env.unwrap_or_default(),
            working_dir: r.working_dir.filter(|w| !w.is_empty()),
            entrypoint: r.entrypoint.unwrap_or_default(),
            cmd: r.cmd.unwrap_or_default(),
            exposed_ports: ports,
            diff_ids: rootfs.diff_ids,
            created: c.created,
        })
    }
}

/// `os/arch[/variant]`.
fn platform_name(os: &str, arch: &str, variant: Option<&str>) -> String {
    let os = if os.is_empty() { "(no os)" } else { os };
    let arch = if arch.is_empty() {
        "(no architecture)"
    } else {
        arch
    };
    match variant {
        Some(v) if !v.is_empty() => format!("{os}/{arch}/{v}"),
        _ => format!("{os}/{arch}"),
    }
}

/// `sha256:` and 64 lowercase hex digits; any other algorithm is refused by
/// name (the store addresses blobs by sha256 alone).
pub fn check_digest(d: &str) -> Result<()> {
    let Some((algorithm, hex)) = d.split_once(':') else {
        return Err(SourceError::BadDigest {
            digest: d.to_owned(),
        });
    };
    if algorithm != "sha256" {
        let known = !algorithm.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
        return Err(if known {
            SourceError::DigestAlgorithm {
                digest: d.to_owned(),
                algorithm: algorithm.to_owned(),
            }
        } else {
            SourceError::BadDigest {
                digest: d.to_owned(),
            }
        });
    }
    if !is_sha256_hex(hex) {
        return Err(SourceError::BadDigest {
            digest: d.to_owned(),
        });
    }
    Ok(())
}

/// 64 lowercase hex digits.
pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `sha256:HEX` of `bytes`.
pub(crate) fn digest_of(bytes: &[u8]) -> String {
    finish(Sha256::new_with_prefix(bytes))
}

/// `sha256:HEX` of what `h` has hashed.
pub(crate) fn finish(h: Sha256) -> String {
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in h.finalize() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn check_size(what: &'static str, size: u64) -> Result<()> {
    if size > MAX_JSON_BYTES {
        return Err(SourceError::TooLarge {
            what,
            size,
            limit: MAX_JSON_BYTES,
        });
    }
    Ok(())
}

/// A platform, as an index entry gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// A descriptor: what a manifest or an index says of a blob it points at.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDocument {
    schema_version: Option<i64>,
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Descriptor>>,
}

/// A manifest document: one image's, or an index of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Document {
    Manifest {
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
    Index(Vec<Descriptor>),
}

/// Parse a manifest or an index. `media_type` is what the descriptor that
/// pointed here says (an index entry, an OCI layout's `index.json`), None for
/// a registry's answer to a tag; the document's own `mediaType`, then its
/// shape, decide when it is None.
pub(crate) fn parse_document(raw: &[u8], media_type: Option<&str>) -> Result<Document> {
    check_size("image manifest", raw.len() as u64)?;
    let d: RawDocument = serde_json::from_slice(raw).map_err(|source| SourceError::Json {
        what: "image manifest",
        source,
    })?;
    let version = d.schema_version.unwrap_or(0);
    if version != 2 {
        return Err(SourceError::SchemaVersion {
            what: "image manifest",
            found: version,
        });
    }
    let media_type = match (
        media_type.filter(|m| !m.is_empty()),
        d.media_type.as_deref(),
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(SourceError::MediaTypeMismatch {
                what: "image manifest",
                descriptor: a.to_owned(),
                document: b.to_owned(),
            })
        }
        (Some(a), _) => a.to_owned(),
        (None, Some(b)) => b.to_owned(),
        // OCI lets a document leave out its media type: its shape tells.
        (None, None) if d.manifests.is_some() => OCI_INDEX.to_owned(),
        (None, None) => OCI_MANIFEST.to_owned(),
    };
    if INDEX_TYPES.contains(&media_type.as_str()) {
        let entries = d.manifests.ok_or_else(|| SourceError::Invalid {
            what: "image index",
            why: "it has no manifests".to_owned(),
        })?;
        return Ok(Document::Index(entries));
    }
    if !MANIFEST_TYPES.contains(&media_type.as_str()) {
        return Err(SourceError::MediaType {
            what: "an image manifest",
            media_type,
        });
    }
    let config = d.config.ok_or_else(|| SourceError::Invalid {
        what: "image manifest",
        why: "it has no config".to_owned(),
    })?;
    let layers = d.layers.ok_or_else(|| SourceError::Invalid {
        what: "image manifest",
        why: "it has no layers".to_owned(),
    })?;
    if !CONFIG_TYPES.contains(&config.media_type.as_str()) {
        return Err(SourceError::MediaType {
            what: "an image config",
            media_type: config.media_type,
        });
    }
    check_digest(&config.digest)?;
    check_size("image config", config.size)?;
    for l in &layers {
        if !LAYER_TYPES.contains(&l.media_type.as_str()) {
            return Err(SourceError::MediaType {
                what: "a layer",
                media_type: l.media_type.clone(),
            });
        }
        check_digest(&l.digest)?;
    }
    Ok(Document::Manifest { config, layers })
}

/// The linux/amd64 entry of an index (the first, if there are several; a
/// variant is not looked at), or an error listing the platforms it has.
pub(crate) fn pick_platform(entries: &[Descriptor]) -> Result<&Descriptor> {
    let found = entries.iter().find(|e| {
        e.platform
            .as_ref()
            .is_some_and(|p| p.os == OS && p.architecture == ARCH)
    });
    match found {
        Some(e) => {
            check_digest(&e.digest)?;
            Ok(e)
        }
        None => Err(SourceError::NoPlatform {
            platforms: entries
                .iter()
                .map(|e| match &e.platform {
                    Some(p) => platform_name(&p.os, &p.architecture, p.variant.as_deref()),
                    None => "(no platform)".to_owned(),
                })
                .collect(),
        }),
    }
}

impl ImageManifest {
    /// An image from its manifest's digest and parts, and its config's bytes:
    /// the config's digest is verified, the config parsed and checked, and
    /// its diff_ids matched one to one with the layers.
    pub(crate) fn assemble(
        digest: String,
        config: &Descriptor,
        layers: &[Descriptor],
        config_raw: Vec<u8>,
    ) -> Result<ImageManifest> {
        let got = digest_of(&config_raw);
        if got != config.digest {
            return Err(SourceError::DigestMismatch {
                what: "image config".to_owned(),
                expected: config.digest.clone(),
                got,
            });
        }
        if config_raw.len() as u64 != config.size {
            return Err(SourceError::BlobSize {
                digest: config.digest.clone(),
                expected: config.size,
                got: format!("it has {}", config_raw.len()),
            });
        }
        let parsed = ImageConfig::parse(&config_raw)?;
        if parsed.diff_ids.len() != layers.len() {
            return Err(SourceError::LayerCount {
                layers: layers.len(),
                diff_ids: parsed.diff_ids.len(),
            });
        }
        let layers = layers
            .iter()
            .zip(&parsed.diff_ids)
            .map(|(l, d)| LayerDesc {
                digest: l.digest.clone(),
                media_type: l.media_type.clone(),
                size: l.size,
                diff_id: d.clone(),
            })
            .collect();
        Ok(ImageManifest {
            digest,
            config_digest: got,
            config_raw,
            config: parsed,
            layers,
        })
    }

    /// An image from a `docker save` archive, which has a config and plain
    /// tar layers but no manifest. Its layers' digests are their diff_ids
    /// (the blob is the uncompressed tar), their media type
    /// [`DOCKER_LAYER_TAR`]. Its digest is the sha256 of a docker v2
    /// manifest drums writes for it: compact JSON, keys in this order, no
    /// whitespace:
    /// `{"schemaVersion":2,"mediaType":DOCKER_MANIFEST,"config":{"mediaType":DOCKER_CONFIG,"size":N,"digest":D},"layers":[{"mediaType":DOCKER_LAYER_TAR,"size":N,"digest":D},…]}`.
    /// The same archive always gives the same digest.
    pub(crate) fn synthesise(config_raw: Vec<u8>, layer_sizes: &[u64]) -> Result<ImageManifest> {
        let parsed = ImageConfig::parse(&config_raw)?;
        if parsed.diff_ids.len() != layer_sizes.len() {
            return Err(SourceError::LayerCount {
                layers: layer_sizes.len(),
                diff_ids: parsed.diff_ids.len(),
            });
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Desc<'a> {
            media_type: &'a str,
            size: u64,
            digest: &'a str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Synthetic<'a> {
            schema_version: u32,
            media_type: &'a str,
            config: Desc<'a>,
            layers: Vec<Desc<'a>>,
        }
        let config_digest = digest_of(&config_raw);
        let doc = Synthetic {
            schema_version: 2,
            media_type: DOCKER_MANIFEST,
            config: Desc {
                media_type: DOCKER_CONFIG,
                size: config_raw.len() as u64,
                digest: &config_digest,
            },
            layers: parsed
                .diff_ids
                .iter()
                .zip(layer_sizes)
                .map(|(d, &size)| Desc {
                    media_type: DOCKER_LAYER_TAR,
                    size,
                    digest: d,
                })
                .collect(),
        };
        let bytes = serde_json::to_vec(&doc).expect("a struct of strings and numbers serialises");
        let layers = parsed
            .diff_ids
            .iter()
            .zip(layer_sizes)
            .map(|(d, &size)| LayerDesc {
                digest: d.clone(),
                media_type: DOCKER_LAYER_TAR.to_owned(),
                size,
                diff_id: d.clone(),
            })
            .collect();
        Ok(ImageManifest {
            digest: digest_of(&bytes),
            config_digest,
            config_raw,
            config: parsed,
            layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn config(os: &str, arch: &str, diff_ids: &[String]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "architecture": arch, "os": os,
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"], "ExposedPorts": {"8080/tcp": {}, "53/udp": {}, "22": {}}},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap()
    }

    #[test]
    fn digests() {
        check_digest(&d('a')).unwrap();
        assert!(matches!(
            check_digest(&format!("sha512:{}", "a".repeat(128))),
            Err(SourceError::DigestAlgorithm { algorithm, .. }) if algorithm == "sha512"
        ));
        for bad in [
            "sha256:".to_owned() + &"A".repeat(64),
            "sha256:".to_owned() + &"a".repeat(63),
            "a".repeat(64),
            "sha256:../../etc".to_owned(),
        ] {
            assert!(
                matches!(check_digest(&bad), Err(SourceError::BadDigest { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn config_ports_sorted_and_tcp_by_default() {
        let c = ImageConfig::parse(&config("linux", "amd64", &[d('1')])).unwrap();
        assert_eq!(c.exposed_ports, ["22/tcp", "53/udp", "8080/tcp"]);
        assert_eq!(c.cmd, ["/bin/sh"]);
        assert_eq!(c.user, None);
    }

    #[test]
    fn platform_named() {
        let e = ImageConfig::parse(&config("linux", "arm64", &[])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "image is for linux/arm64; drums runs linux/amd64"
        );
    }

    #[test]
    fn document_kinds() {
        let m = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": OCI_CONFIG, "digest": d('c'), "size": 3},
            "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": d('1'), "size": 9}],
        });
        let raw = serde_json::to_vec(&m).unwrap();
        assert!(matches!(
            parse_document(&raw, None).unwrap(),
            Document::Manifest { .. }
        ));
        assert!(matches!(
            parse_document(&raw, Some(DOCKER_INDEX)),
            Err(SourceError::Invalid { .. })
        ));
        let i = serde_json::json!({"schemaVersion": 2, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": d('a'), "size": 1, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"mediaType": OCI_MANIFEST, "digest": d('b'), "size": 1, "platform": {"os": "linux", "architecture": "amd64", "variant": "v3"}},
        ]});
        let Document::Index(entries) =
            parse_document(&serde_json::to_vec(&i).unwrap(), None).unwrap()
        else {
            panic!("an index");
        };
        assert_eq!(pick_platform(&entries).unwrap().digest, d('b'));
        let e = pick_platform(&entries[..1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the image index has no linux/amd64 image; it has linux/arm64/v8"
        );
    }

    #[test]
    fn documents_refused() {
        let doc = |v: serde_json::Value| serde_json::to_vec(&v).unwrap();
        let manifest = |config_type: &str, layer_type: &str| {
            doc(serde_json::json!({
                "schemaVersion": 2,
                "config": {"mediaType": config_type, "digest": d('c'), "size": 3},
                "layers": [{"mediaType": layer_type, "digest": d('1'), "size": 9}],
            }))
        };
        let e = parse_document(&manifest("application/octet-stream", OCI_LAYER_TAR), None);
        assert_eq!(
            e.unwrap_err().to_string(),
            "unknown media type \"application/octet-stream\" for an image config"
        );
        let zstd = "application/vnd.oci.image.layer.v1.tar+zstd";
        let e = parse_document(&manifest(OCI_CONFIG, zstd), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("unknown media type {zstd:?} for a layer")
        );
        let artifact = "application/vnd.oci.artifact.manifest.v1+json";
        let e = parse_document(&manifest(OCI_CONFIG, OCI_LAYER_TAR), Some(artifact)).unwrap_err();
        assert!(matches!(e, SourceError::MediaType { .. }), "{e}");
        let e = parse_document(
            &doc(serde_json::json!({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST})),
            Some(OCI_MANIFEST),
        )
        .unwrap_err();
        assert!(matches!(e, SourceError::MediaTypeMismatch { .. }), "{e}");
        let e = parse_document(
            &doc(serde_json::json!({"schemaVersion": 1, "fsLayers": []})),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(e, SourceError::SchemaVersion { found: 1, .. }),
            "{e}"
        );
        let mut big = manifest(OCI_CONFIG, OCI_LAYER_TAR);
        big.truncate(big.len() - 1);
        big.extend_from_slice(b",\"pad\":\"");
        big.extend(std::iter::repeat_n(b'x', MAX_JSON_BYTES as usize));
        big.extend_from_slice(b"\"}");
        let e = parse_document(&big, None).unwrap_err();
        assert!(matches!(e, SourceError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn assemble_checks_config_and_counts() {
        let raw = config("linux", "amd64", &[d('1')]);
        let desc = |digest: String, size: usize| Descriptor {
            media_type: OCI_CONFIG.to_owned(),
            digest,
            size: size as u64,
            platform: None,
            annotations: None,
        };
        let layer = Descriptor {
            media_type: OCI_LAYER_GZIP.to_owned(),
            ..desc(d('9'), 5)
        };
        let config = desc(digest_of(&raw), raw.len());
        let m = ImageManifest::assemble(d('m'), &config, std::slice::from_ref(&layer), raw.clone())
            .unwrap();
        assert_eq!(m.layers[0].diff_id, d('1'));
        assert_eq!(m.config_digest, digest_of(&raw));
        let e = ImageManifest::assemble(
            d('m'),
            &config,
            &[layer.clone(), layer.clone()],
            raw.clone(),
        )
        .unwrap_err();
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
        let e =
            ImageManifest::assemble(d('m'), &desc(d('0'), raw.len()), &[layer], raw).unwrap_err();
        assert!(matches!(e, SourceError::DigestMismatch { .. }), "{e}");
    }

    #[test]
    fn synthetic_digest_is_stable() {
        let raw = config("linux", "amd64", &[d('1'), d('2')]);
        let a = ImageManifest::synthesise(raw.clone(), &[10, 20]).unwrap();
        let b = ImageManifest::synthesise(raw, &[10, 20]).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.layers[1].digest, d('2'));
        assert_eq!(a.layers[1].media_type, DOCKER_LAYER_TAR);
    }
}
