//! What can go wrong while getting an image from where it comes from (a
//! registry, an archive) and checking what it says it is. One enum for the
//! four source modules (manifest, registry, archive, auth): the CLI shows the
//! message, and a caller that reacts (a retry, a prompt for a login) matches
//! the variant, never the text.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    // What an image is (manifest.rs).
    #[error("image is for {found}; drums runs linux/amd64")]
    Platform { found: String },
    #[error("the image index has no linux/amd64 image; it has {}", list_or_none(.platforms))]
    NoPlatform { platforms: Vec<String> },
    #[error("the manifest lists {layers} layers but the image config has {diff_ids} diff_ids")]
    LayerCount { layers: usize, diff_ids: usize },
    #[error("digest {digest:?} uses {algorithm}; drums accepts only sha256 digests")]
    DigestAlgorithm { digest: String, algorithm: String },
    #[error("{digest:?} is not a digest (sha256: and 64 lowercase hex digits)")]
    BadDigest { digest: String },
    #[error("unknown media type {media_type:?} for {what}")]
    MediaType {
        what: &'static str,
        media_type: String,
    },
    #[error("the {what} says its media type is {document:?} but the descriptor that names it says {descriptor:?}")]
    MediaTypeMismatch {
        what: &'static str,
        descriptor: String,
        document: String,
    },
    #[error("the {what} is schema version {found}; drums reads version 2")]
    SchemaVersion { what: &'static str, found: i64 },
    #[error("the {what} is {size} bytes, over its limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("parse the {what}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the {what} is not what drums reads: {why}")]
    Invalid { what: &'static str, why: String },
    #[error("{what}: digest mismatch: expected {expected}, got {got}")]
    DigestMismatch {
        what: String,
        expected: String,
        got: String,
    },
    #[error("blob {digest} is {expected} bytes by its descriptor, but {got}")]
    BlobSize {
        digest: String,
        expected: u64,
        got: String,
    },
    #[error("blob {digest} is {size} bytes, over the limit of {limit}")]
    BlobTooBig {
        digest: String,
        size: u64,
        limit: u64,
    },

    // A registry (registry.rs).
    #[error("parse the image reference {reference:?}")]
    Reference {
        reference: String,
        #[source]
        source: oci_client::ParseError,
    },
    #[error("registry {registry} {state}: {cause}{hint}")]
    Unreachable {
        registry: String,
        /// "is down" (refused, timed out), or "is unreachable" (no such
        /// host, a TLS failure).
        state: &'static str,
        cause: String,
        /// Empty, or why it may not be down after all (plain HTTP spoken
        /// to a client that wants TLS).
        hint: &'static str,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("not authorised to pull {reference} from {registry} (drums reads credentials from auth.json / ~/.docker/config.json)")]
    Unauthorized {
        reference: String,
        registry: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("no image {reference} in the registry")]
    NotFound {
        reference: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("the registry has no blob {digest} for {reference}")]
    BlobUnknown {
        reference: String,
        digest: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("{op} for {reference}")]
    Registry {
        op: &'static str,
        reference: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("download blob {digest} of {reference}")]
    Download {
        reference: String,
        digest: String,
        #[source]
        source: std::io::Error,
    },

    // An archive (archive.rs).
    #[error("archive entry {path:?} refused: {why}")]
    ArchiveEntry { path: String, why: String },
    #[error("archive is truncated: {why}")]
    Truncated {
        why: String,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("read the archive")]
    ArchiveRead(#[source] std::io::Error),
    #[error("the archive holds more than its limit of {limit} bytes")]
    ArchiveTooBig { limit: u64 },
    #[error("the archive unpacks to more than the {room} bytes the store has room for (its free space less drumsd's reserve)")]
    NoRoom { room: u64 },
    #[error("the archive has more than its limit of {limit} entries")]
    ArchiveTooManyEntries { limit: u64 },
    #[error("the archive is neither a docker save archive (manifest.json) nor an OCI layout (oci-layout and index.json)")]
    NotAnImage,
    #[error("the archive holds {count} images; drums imports exactly one per archive")]
    ImageCount { count: usize },
    #[error("the archive lacks {path:?}, which its {named_by} names")]
    MissingFile {
        path: String,
        named_by: &'static str,
    },

    // Credentials (auth.rs).
    #[error("read the credentials file {path:?}")]
    AuthFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse the credentials file {path:?}")]
    AuthJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the credentials for {registry} in {path:?} are not base64 of user:password")]
    AuthEntry { path: PathBuf, registry: String },
    #[error("the credentials for {registry} are in the credential helper {helper:?} ({path:?}), which drums does not support; log in so that they are written to auth.json instead")]
    CredHelper {
        registry: String,
        helper: String,
        path: PathBuf,
    },

    #[error("{op} {path:?}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "no platform entries".to_owned()
    } else {
        v.join(", ")
    }
}

/// An `Io` error for `op` on `path`, to hand to `map_err`.
pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> SourceError + 'a {
    move |source| SourceError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}
