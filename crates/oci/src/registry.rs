//! Pulling from a registry, through `oci-client` (the distribution API, the
//! token dance, references): first the image, checked (`Remote::resolve`),
//! then each layer's blob to a file (`Remote::fetch_layer`), which the store
//! applies.
//!
//! drums checks what the client hands it rather than trusting it: every
//! manifest, config and blob is hashed here and compared with the digest
//! that named it, and a blob is cut off at the size its descriptor gives.
//! One gap: the client reads a manifest's whole body before drums sees it,
//! so the 4 MiB cap on a manifest is checked after the read (the config and
//! the layers are streamed, and capped as they come).

use std::io;
use std::path::Path;
use std::time::Duration;

use futures::{Stream, StreamExt};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{io_err, SourceError};
use crate::manifest::{
    self, digest_of, Descriptor, Document, ImageManifest, DOCKER_INDEX, DOCKER_MANIFEST,
    MAX_JSON_BYTES, OCI_INDEX, OCI_MANIFEST,
};

type Result<T> = std::result::Result<T, SourceError>;

/// What a pull may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOptions {
    /// Plain HTTP (a registry on the host or in a test), not HTTPS.
    pub insecure: bool,
    /// None: anonymous.
    pub auth: Option<Credentials>,
    /// No layer blob larger than this is fetched.
    pub max_blob_bytes: u64,
}

impl Default for PullOptions {
    /// HTTPS, anonymous, blobs up to `LayerLimits`' default unpacked size.
    fn default() -> Self {
        PullOptions {
            insecure: false,
            auth: None,
            max_blob_bytes: 32 << 30,
        }
    }
}

/// A user name and password (or token) for a registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// An image in a registry: its manifest and config fetched and checked, its
/// layers still there.
pub struct Remote {
    conn: Conn,
    image: ImageManifest,
    max_blob_bytes: u64,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("reference", &self.conn.reference.whole())
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

/// A client for one image's repository.
struct Conn {
    client: Client,
    reference: Reference,
    insecure: bool,
}

/// What drums asks a registry for a manifest: images and indexes, OCI and
/// docker.
const ACCEPT: [&str; 4] = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_INDEX];

/// An index may point at an index; this deep, no further.
const MAX_INDEX_DEPTH: usize = 4;

impl Remote {
    /// Fetch the image `reference` names (through an index, its linux/amd64
    /// image), and its config; check both.
    pub async fn resolve(reference: &str, opts: &PullOptions) -> Result<Remote> {
        // oci-client is built without a provider of its own (no aws-lc to
        // compile): ring. rustls 0.23.48 deprecates it for lacking
        // post-quantum key exchange, which only aws-lc has; a registry pull
        // gives up no more than a browser of last year did.
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
        let parsed: Reference = reference.parse().map_err(|source| SourceError::Reference {
            reference: reference.to_owned(),
            source,
        })?;
        let config = ClientConfig {
            protocol: if opts.insecure {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            // drums picks the platform itself, to name the ones an index has
            // when linux/amd64 is not among them.
            platform_resolver: None,
            // A registry that does not answer is reported, not waited on
            // for ever; a slow but moving download is fine (the timeout is
            // per read, not for the whole blob).
            connect_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(120)),
            ..ClientConfig::default()
        };
        // try_from, not new: new falls back to a default client (HTTPS) on
        // an error.
        let client = Client::try_from(config).map_err(|source| SourceError::Registry {
            op: "set up the registry client",
            reference: parsed.whole(),
            source: Box::new(source),
        })?;
        let conn = Conn {
            client,
            reference: parsed,
            insecure: opts.insecure,
        };
        let auth = match &opts.auth {
            None => RegistryAuth::Anonymous,
            Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
        };
        // Done first, and its error kept (later requests swallow a failed
        // token request and go on anonymously).
        conn.client
            .auth(&conn.reference, &auth, RegistryOperation::Pull)
            .await
            .map_err(|e| conn.classify(e, "authenticate", Wanted::Manifest))?;
        let image = conn.image(&auth).await?;
        Ok(Remote {
            conn,
            image,
            max_blob_bytes: opts.max_blob_bytes,
        })
    }

    pub fn image(&self) -> &ImageManifest {
        &self.image
    }

    /// The reference, normalised: `127.0.0.1:5000/drums/base:latest`, and a
    /// short name gets the default registry and `library/`, as other tools
    /// do.
    pub fn reference(&self) -> String {
        self.conn.reference.whole()
    }

    /// Download layer `i`'s blob to `dest`, a file this makes (it must not
    /// exist), checking its size and sha256 as it is written; `progress` is
    /// told (bytes so far, total). On any error the file is removed.
    pub async fn fetch_layer(
        &self,
        i: usize,
        dest: &Path,
        progress: &mut (dyn FnMut(u64, u64) + Send),
    ) -> Result<()> {
        let l = self
            .image
            .layers
            .get(i)
            .ok_or_else(|| SourceError::Invalid {
                what: "layer number",
                why: format!("{i} is past the image's {} layers", self.image.layers.len()),
            })?;
        if l.size > self.max_blob_bytes {
            return Err(SourceError::BlobTooBig {
                digest: l.digest.clone(),
                size: l.size,
                limit: self.max_blob_bytes,
            });
        }
        let mut file = create_new(dest).await?;
        let res = async {
            self.conn
                .fetch_blob(&l.digest, l.size, &mut file, progress)
                .await?;
            // No fsync: the store applies the blob and throws it away; a
            // crash before then means a fresh download.
            file.flush().await.map_err(io_err("write", dest))
        }
        .await;
        if res.is_err() {
            drop(file);
            if let Err(e) = tokio::fs::remove_file(dest).await {
                tracing::warn!(path = %dest.display(), error = %e, "remove a partial layer download");
            }
        }
        res
    }
}

impl Conn {
    /// The image the reference names: through indexes to the linux/amd64
    /// manifest, then its config.
    async fn image(&self, auth: &RegistryAuth) -> Result<ImageManifest> {
        let mut at = self.reference.clone();
        // What named the manifest being fetched: None for the reference's
        // own (a tag, or a digest that `at` carries).
        let mut named_by: Option<Descriptor> = None;
        for _ in 0..MAX_INDEX_DEPTH {
            let (raw, _) = self
                .client
                .pull_manifest_raw(&at, auth, &ACCEPT)
                .await
                .map_err(|e| self.classify(e, "fetch the manifest", Wanted::Manifest))?;
            let size = raw.len() as u64;
            if size > MAX_JSON_BYTES {
                return Err(SourceError::TooLarge {
                    what: "image manifest",
                    size,
                    limit: MAX_JSON_BYTES,
                });
            }
            let digest = digest_of(&raw);
            let expected = match &named_by {
                Some(d) => Some(d.digest.as_str()),
                None => at.digest(),
            };
            if let Some(expected) = expected {
                if expected != digest {
                    return Err(SourceError::DigestMismatch {
                        what: format!("manifest of {}", at.whole()),
                        expected: expected.to_owned(),
                        got: digest,
                    });
                }
            }
            if let Some(d) = &named_by {
                if d.size != size {
                    return Err(SourceError::BlobSize {
                        digest,
                        expected: d.size,
                        got: format!("the registry sent {size}"),
                    });
                }
            }
            let media_type = named_by.as_ref().map(|d| d.media_type.as_str());
            match manifest::parse_document(&raw, media_type)? {
                Document::Index(entries) => {
                    let e = manifest::pick_platform(&entries)?.clone();
                    at = self.reference.clone_with_digest(e.digest.clone());
                    named_by = Some(e);
                }
                Document::Manifest { config, layers } => {
                    let mut raw_config = Vec::with_capacity(config.size as usize);
                    self.fetch_blob(&config.digest, config.size, &mut raw_config, &mut |_, _| {})
                        .await?;
                    return ImageManifest::assemble(digest, &config, &layers, raw_config);
                }
            }
        }
        Err(SourceError::Invalid {
            what: "image index",
            why: format!("it nests indexes more than {MAX_INDEX_DEPTH} deep"),
        })
    }

    /// Stream the blob `digest` into `out`, checking it as it comes.
    async fn fetch_blob<W: AsyncWrite + Unpin>(
        &self,
        digest: &str,
        size: u64,
        out: &mut W,
        progress: &mut (dyn FnMut(u64, u64) + Send),
    ) -> Result<()> {
        let stream = self
            .client
            .pull_blob_stream(&self.reference, digest)
            .await
            .map_err(|e| self.classify(e, "fetch a blob", Wanted::Blob(digest)))?;
        copy_verified(stream, out, digest, size, progress)
            .await
            .map_err(|e| match e {
                Copy::Source(e) => e,
                Copy::Read(source) => SourceError::Download {
                    reference: self.reference.whole(),
                    digest: digest.to_owned(),
                    source,
                },
            })
    }

    /// The error for what the client said, told apart by what a user can do
    /// about it.
    fn classify(&self, e: OciDistributionError, op: &'static str, what: Wanted<'_>) -> SourceError {
        use OciDistributionError as E;
        let reference = self.reference.whole();
        let registry = self.reference.registry().to_owned();
        enum Kind {
            Auth,
            Missing,
            Down,
            Other,
        }
        let kind = match &e {
            E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => Kind::Auth,
            E::ImageManifestNotFoundError(_) => Kind::Missing,
            E::RegistryError { envelope, .. } => {
                let has = |f: fn(&OciErrorCode) -> bool| envelope.errors.iter().any(|x| f(&x.code));
                if has(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                    Kind::Auth
                } else if has(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::NotFound
                            | OciErrorCode::BlobUnknown
                    )
                }) {
                    Kind::Missing
                } else {
                    Kind::Other
                }
            }
            E::ServerError {
                code: 401 | 403, ..
            } => Kind::Auth,
            E::ServerError { code: 404, .. } => Kind::Missing,
            E::RequestError(r) if r.is_connect() || r.is_timeout() => Kind::Down,
            _ => Kind::Other,
        };
        if let E::DigestError(DigestError::VerificationError { expected, actual }) = &e {
            return SourceError::DigestMismatch {
                what: format!("{op} of {reference}"),
                expected: expected.clone(),
                got: actual.clone(),
            };
        }
        let source = Box::new(e);
        match (kind, what) {
            (Kind::Auth, _) => SourceError::Unauthorized {
                reference,
                registry,
                source,
            },
            (Kind::Missing, Wanted::Manifest) => SourceError::NotFound { reference, source },
            (Kind::Missing, Wanted::Blob(d)) => SourceError::BlobUnknown {
                reference,
                digest: d.to_owned(),
                source,
            },
            (Kind::Down, _) => {
                let (cause, plain) = down_cause(&source);
                SourceError::Unreachable {
                    registry,
                    state: if plain == Plain::Down {
                        "is down"
                    } else {
                        "is unreachable"
                    },
                    cause,
                    hint: if !self.insecure && plain == Plain::No {
                        " (if it serves plain HTTP, pull from it as insecure)"
                    } else {
                        ""
                    },
                    source,
                }
            }
            (Kind::Other, _) => SourceError::Registry {
                op,
                reference,
                source,
            },
        }
    }
}

#[derive(Clone, Copy)]
enum Wanted<'a> {
    Manifest,
    Blob(&'a str),
}

/// How plainly a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plain {
    /// Refused or timed out: nothing answers there.
    Down,
    /// No such host, or the network is not there.
    NoRoute,
    /// Something answered, and the talk failed (TLS, most likely).
    No,
}

/// Why a connection failed, in a few words ("connection refused"), and how
/// plainly.
fn down_cause(e: &OciDistributionError) -> (String, Plain) {
    let mut deepest: &dyn std::error::Error = e;
    let mut plain = Plain::No;
    let mut cause = None;
    let mut dns = false;
    let mut at: Option<&dyn std::error::Error> = Some(e);
    while let Some(x) = at {
        // hyper-util's resolver names its failure so; there is no type to
        // match on through reqwest.
        dns |= x.to_string().starts_with("dns error");
        if let Some(io) = x.downcast_ref::<io::Error>() {
            let (words, how) = match io.kind() {
                io::ErrorKind::ConnectionRefused => ("connection refused", Plain::Down),
                io::ErrorKind::TimedOut => ("timed out", Plain::Down),
                io::ErrorKind::HostUnreachable => ("host unreachable", Plain::NoRoute),
                io::ErrorKind::NetworkUnreachable => ("network unreachable", Plain::NoRoute),
                _ => ("", Plain::No),
            };
            if how != Plain::No && cause.is_none() {
                cause = Some(words.to_owned());
                plain = how;
            }
        }
        deepest = x;
        at = x.source();
    }
    if let OciDistributionError::RequestError(r) = e {
        if r.is_timeout() && cause.is_none() {
            cause = Some("timed out".to_owned());
            plain = Plain::Down;
        }
    }
    let text = deepest.to_string();
    if plain == Plain::No && dns {
        plain = Plain::NoRoute;
    }
    (cause.unwrap_or(text), plain)
}

/// How a copy failed: a check, or the stream itself.
pub(crate) enum Copy {
    Source(SourceError),
    Read(io::Error),
}

/// Copy `stream` into `out`, refusing more bytes than `size`, and check at
/// the end that it was `size` bytes whose sha256 is `digest`. The client's
/// own check (an error at the end of the stream) is not relied on: when it
/// reports a mismatch, this one names it.
pub(crate) async fn copy_verified<S, B, W>(
    mut stream: S,
    out: &mut W,
    digest: &str,
    size: u64,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> std::result::Result<(), Copy>
where
    S: Stream<Item = io::Result<B>> + Unpin,
    B: AsRef<[u8]>,
    W: AsyncWrite + Unpin,
{
    let mut hash = Sha256::new();
    let mut so_far: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) if e.get_ref().is_some_and(|i| i.is::<DigestError>()) => break,
            Err(e) => return Err(Copy::Read(e)),
        };
        let chunk = chunk.as_ref();
        so_far += chunk.len() as u64;
        if so_far > size {
            return Err(Copy::Source(SourceError::BlobSize {
                digest: digest.to_owned(),
                expected: size,
                got: format!("the registry sent at least {so_far}"),
            }));
        }
        hash.update(chunk);
        out.write_all(chunk).await.map_err(Copy::Read)?;
        progress(so_far, size);
    }
    if so_far != size {
        return Err(Copy::Source(SourceError::BlobSize {
            digest: digest.to_owned(),
            expected: size,
            got: format!("the registry sent {so_far}"),
        }));
    }
    let got = manifest::finish(hash);
    if got != digest {
        return Err(Copy::Source(SourceError::DigestMismatch {
            what: format!("blob {digest}"),
            expected: digest.to_owned(),
            got,
        }));
    }
    Ok(())
}

/// A new file, never one that is there (nor through a symlink).
async fn create_new(dest: &Path) -> Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(dest)
        .await
        .map_err(io_err("create", dest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn chunks(parts: &[&[u8]]) -> impl Stream<Item = io::Result<Vec<u8>>> + Unpin {
        futures::stream::iter(parts.iter().map(|p| Ok(p.to_vec())).collect::<Vec<_>>())
    }

    #[test]
    fn copy_checks_digest_size_and_reports_progress() {
        let data = b"hello, layer";
        let d = digest_of(data);
        let mut out = Vec::new();
        let mut seen = Vec::new();
        run(copy_verified(
            chunks(&[b"hello, ", b"layer"]),
            &mut out,
            &d,
            12,
            &mut |a, b| seen.push((a, b)),
        ))
        .ok()
        .unwrap();
        assert_eq!(out, data);
        assert_eq!(seen, [(7, 12), (12, 12)]);

        let bad = digest_of(b"other");
        let e = run(copy_verified(
            chunks(&[data]),
            &mut Vec::new(),
            &bad,
            12,
            &mut |_, _| {},
        ));
        let Err(Copy::Source(SourceError::DigestMismatch { expected, got, .. })) = e else {
            panic!("a digest mismatch");
        };
        assert_eq!((expected, got), (bad, d.clone()));

        let e = run(copy_verified(
            chunks(&[data, b"!"]),
            &mut Vec::new(),
            &d,
            12,
            &mut |_, _| {},
        ));
        assert!(matches!(e, Err(Copy::Source(SourceError::BlobSize { .. }))));
        let e = run(copy_verified(
            chunks(&[b"hello"]),
            &mut Vec::new(),
            &d,
            12,
            &mut |_, _| {},
        ));
        assert!(matches!(e, Err(Copy::Source(SourceError::BlobSize { .. }))));
    }

    #[test]
    fn copy_names_the_mismatch_the_client_found_first() {
        let data = b"hello";
        let want = digest_of(b"other");
        let client_says = io::Error::other(DigestError::VerificationError {
            expected: want.clone(),
            actual: digest_of(data),
        });
        let s = futures::stream::iter(vec![Ok(data.to_vec()), Err(client_says)]);
        let e = run(copy_verified(s, &mut Vec::new(), &want, 5, &mut |_, _| {}));
        assert!(matches!(
            e,
            Err(Copy::Source(SourceError::DigestMismatch { .. }))
        ));
    }
}
