//! The host's signing key and the keys it trusts.
//!
//! A checkpoint holds CRIU images, which a restore turns into processes
//! running as root on this host: an archive is code. Every export is signed
//! with this host's ed25519 key, and an import is refused unless the signer is
//! trusted (see docs/security.md, "Untrusted archives").
//!
//! Files (both versioned, see docs/formats.md):
//! - `STATE/keys/host.key` (dir 0700, file 0600), made at first use:
//!   ```text
//!   drums-host-key 1
//!   ed25519 <base64 of the 32-byte secret seed>
//!   ```
//! - `STATE/trusted-keys`, written by the administrator:
//!   ```text
//!   drums-trusted-keys 1
//!   # comments and blank lines are ignored
//!   ed25519 <base64 of the 32-byte public key> any comment, e.g. drums@buildhost
//!   ```
//!   The host's own key is always trusted; a missing file trusts no other.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

/// First line of `host.key`.
pub const HOST_KEY_HEADER: &str = "drums-host-key 1";
/// First line of `trusted-keys`.
pub const TRUSTED_KEYS_HEADER: &str = "drums-trusted-keys 1";
/// The only algorithm drums signs with.
pub const ALGORITHM: &str = "ed25519";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {why}")]
    Format {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("{path} line {line}")]
    Key {
        path: PathBuf,
        line: usize,
        #[source]
        source: PublicKeyError,
    },
}

/// The `<base64>` part of a public key that is not an ed25519 key.
#[derive(Debug, thiserror::Error)]
pub enum PublicKeyError {
    #[error("not base64")]
    Base64(#[source] base64::DecodeError),
    #[error("an ed25519 key has 32 bytes, not {0}")]
    Length(usize),
    #[error("not an ed25519 key")]
    Ed25519(#[source] ed25519_dalek::SignatureError),
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> KeyError + 'a {
    move |source| KeyError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// A public key as it is written in `trusted-keys` and printed by
/// `drums key show`: `ed25519 <base64>`.
pub fn public_key_text(k: &VerifyingKey) -> String {
    format!("{ALGORITHM} {}", b64().encode(k.as_bytes()))
}

/// Parse the `<base64>` part of a public key.
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, PublicKeyError> {
    let bytes = b64().decode(text.trim()).map_err(PublicKeyError::Base64)?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| PublicKeyError::Length(b.len()))?;
    VerifyingKey::from_bytes(&bytes).map_err(PublicKeyError::Ed25519)
}

pub struct HostKey {
    key: SigningKey,
}

impl HostKey {
    /// Load `DIR/host.key`, making the key first if there is none. Two
    /// first uses at once agree on one key: the file is linked into place
    /// only if absent, and the loser reads the winner's.
    pub fn load_or_create(dir: &Path) -> Result<HostKey, KeyError> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        // Tightened even when the directory was already there.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("chmod", dir))?;
        let path = dir.join("host.key");
        match std::fs::read_to_string(&path) {
            Ok(text) => return Self::parse(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("read", &path)(e)),
        }
        let mut seed = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
            .map_err(io("read", Path::new("/dev/urandom")))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".host.key.")
            .permissions(std::fs::Permissions::from_mode(0o600))
            .tempfile_in(dir)
            .map_err(io("create a temporary file in", dir))?;
        writeln!(tmp, "{HOST_KEY_HEADER}\n{ALGORITHM} {}", b64().encode(seed))
            .and_then(|_| tmp.as_file().sync_all())
            .map_err(io("write", tmp.path()))?;
        match tmp.persist_noclobber(&path) {
            Ok(_) => {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io("fsync", dir))?;
                Ok(HostKey {
                    key: SigningKey::from_bytes(&seed),
                })
            }
            Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(&path).map_err(io("read", &path))?;
                Self::parse(&path, &text)
            }
            Err(e) => Err(io("create", &path)(e.error)),
        }
    }

    fn parse(path: &Path, text: &str) -> Result<HostKey, KeyError> {
        let bad = |line, why: &str| KeyError::Format {
            path: path.to_owned(),
            line,
            why: why.to_owned(),
        };
        let mut lines = text.lines();
        if lines.next() != Some(HOST_KEY_HEADER) {
            return Err(bad(1, &format!("expected {HOST_KEY_HEADER:?}")));
        }
        let seed = lines
            .next()
            .and_then(|l| l.strip_prefix("ed25519 "))
            .ok_or_else(|| bad(2, "expected \"ed25519 <base64 seed>\""))?;
        let seed: [u8; 32] = b64()
            .decode(seed.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad(2, "the seed is not 32 bytes of base64"))?;
        Ok(HostKey {
            key: SigningKey::from_bytes(&seed),
        })
    }

    pub fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    pub fn sign(&self, msg: &[u8]) -> Signature {
        self.key.sign(msg)
    }
}

/// The keys in a `trusted-keys` file, with their comments. A missing file
/// holds none; a malformed one is an error (never "trust nothing" silently,
/// nor "trust what parsed").
pub fn read_trusted(path: &Path) -> Result<Vec<(VerifyingKey, String)>, KeyError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read", path)(e)),
    };
    parse_trusted(path, &text)
}

fn parse_trusted(path: &Path, text: &str) -> Result<Vec<(VerifyingKey, String)>, KeyError> {
    let bad = |line, why: String| KeyError::Format {
        path: path.to_owned(),
        line,
        why,
    };
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, l)) if l.trim() == TRUSTED_KEYS_HEADER => {}
        Some((_, l)) if l.starts_with("drums-trusted-keys ") => {
            return Err(bad(
                1,
                format!("format {l:?} is newer than this drums supports ({TRUSTED_KEYS_HEADER:?})"),
            ))
        }
        _ => {
            return Err(bad(
                1,
                format!("the first line must be {TRUSTED_KEYS_HEADER:?}"),
            ))
        }
    }
    for (i, l) in lines {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let mut f = l.splitn(3, char::is_whitespace);
        let (alg, key, comment) = (f.next(), f.next(), f.next().unwrap_or("").trim());
        if alg != Some(ALGORITHM) {
            return Err(bad(
                i + 1,
                format!("expected \"{ALGORITHM} <base64 key> [comment]\""),
            ));
        }
        let key = parse_public_key(key.unwrap_or("")).map_err(|source| KeyError::Key {
            path: path.to_owned(),
            line: i + 1,
            source,
        })?;
        out.push((key, comment.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_key_is_made_once_private_and_stable() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("keys");
        let a = HostKey::load_or_create(&dir).unwrap();
        let b = HostKey::load_or_create(&dir).unwrap();
        assert_eq!(a.public(), b.public());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            std::fs::metadata(dir.join("host.key")).unwrap().mode() & 0o777,
            0o600
        );
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "a temporary key file was left: {left:?}");
        let sig = a.sign(b"m");
        b.public().verify_strict(b"m", &sig).unwrap();
    }

    #[test]
    fn trusted_keys_parse_and_refuse_what_they_do_not_know() {
        let k = HostKey::load_or_create(&tempfile::tempdir().unwrap().path().join("k")).unwrap();
        let p = Path::new("/t");
        let text = format!(
            "{TRUSTED_KEYS_HEADER}\n# build host\n\n{} drums@build 1\n",
            public_key_text(&k.public())
        );
        let got = parse_trusted(p, &text).unwrap();
        assert_eq!(got, vec![(k.public(), "drums@build 1".to_owned())]);
        let e = parse_trusted(p, "ed25519 AAAA\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "/t line 1: the first line must be \"drums-trusted-keys 1\""
        );
        let e = parse_trusted(p, "drums-trusted-keys 9\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("newer than this drums supports"), "{e}");
        let e = parse_trusted(p, &format!("{TRUSTED_KEYS_HEADER}\nrsa AAAA x\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/t line 2: expected"), "{e}");
        let e = parse_trusted(p, &format!("{TRUSTED_KEYS_HEADER}\ned25519 AAAA x\n")).unwrap_err();
        let e = drums_api::error_chain(&e);
        assert_eq!(e, "/t line 2: an ed25519 key has 32 bytes, not 3");
        assert!(read_trusted(Path::new("/nonexistent/trusted-keys"))
            .unwrap()
            .is_empty());
    }
}
