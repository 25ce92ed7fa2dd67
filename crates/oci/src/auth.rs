//! A registry's credentials, from the files `podman login` and `docker
//! login` write, read in podman's order: `$REGISTRY_AUTH_FILE`,
//! `$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$HOME/.config/containers/auth.json`, `$HOME/.docker/config.json`. The
//! first file with an entry for the registry wins.
//!
//! An entry is `auths[KEY].auth`, base64 of `user:password`, where KEY is the
//! registry's host (`127.0.0.1:5000`), also written as docker does
//! (`https://HOST/v1/`). Keys that name a namespace (`HOST/team`) are not
//! read: drums matches a registry, not a repository. Credential helpers
//! (`credHelpers`, `credsStore`) are not run; when one is all there is for
//! the registry, the error says so, since a silent anonymous pull would fail
//! later with a less helpful "not authorised".

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use base64::Engine;
use oci_client::Reference;
use serde::Deserialize;

use crate::error::SourceError;
use crate::registry::Credentials;

type Result<T> = std::result::Result<T, SourceError>;

/// The credentials for `registry` (a host, as [`registry_of`] gives it), or
/// None: pull anonymously.
pub fn credentials_for(registry: &str) -> Result<Option<Credentials>> {
    credentials_in(&auth_files(|k| std::env::var_os(k)), registry)
}

/// The registry host of an image reference, normalised as pulling it does:
/// `127.0.0.1:5000/drums/base` gives `127.0.0.1:5000`; a name with no host
/// (`debian:12`) gives `docker.io`.
pub fn registry_of(reference: &str) -> String {
    if let Ok(r) = reference.parse::<Reference>() {
        return r.registry().to_owned();
    }
    // Not a valid reference: the same rule by hand, for a message that names
    // the registry even so.
    match reference.split_once('/') {
        Some((host, _)) if host.contains(['.', ':']) || host == "localhost" => host.to_owned(),
        _ => "docker.io".to_owned(),
    }
}

/// The files to read, in order, with the environment `var` gives.
pub(crate) fn auth_files(var: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let var = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut out = Vec::new();
    if let Some(f) = var("REGISTRY_AUTH_FILE") {
        out.push(f);
    }
    if let Some(d) = var("XDG_RUNTIME_DIR") {
        out.push(d.join("containers/auth.json"));
    }
    if let Some(h) = var("HOME") {
        out.push(h.join(".config/containers/auth.json"));
        out.push(h.join(".docker/config.json"));
    }
    out
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
}

/// The credentials for `registry` in `files`, the first that has them.
pub(crate) fn credentials_in(files: &[PathBuf], registry: &str) -> Result<Option<Credentials>> {
    let names = names_of(registry);
    let mut helper = None;
    for path in files {
        let raw = match std::fs::read(path) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                continue
            }
            Err(source) => {
                return Err(SourceError::AuthFile {
                    path: path.clone(),
                    source,
                })
            }
        };
        let file: AuthFile =
            serde_json::from_slice(&raw).map_err(|source| SourceError::AuthJson {
                path: path.clone(),
                source,
            })?;
        let mut listed = false;
        for (key, entry) in &file.auths {
            let Some(host) = key_host(key) else { continue };
            if !names.iter().any(|n| n == host) {
                continue;
            }
            listed = true;
            if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
                return decode(auth)
                    .map(Some)
                    .ok_or_else(|| SourceError::AuthEntry {
                        path: path.clone(),
                        registry: registry.to_owned(),
                    });
            }
        }
        if helper.is_none() {
            let named = file
                .cred_helpers
                .iter()
                .find(|(k, _)| key_host(k).is_some_and(|h| names.iter().any(|n| n == h)))
                .map(|(_, v)| v.clone());
            // A credsStore serves every registry, and has nothing for most:
            // it counts as this registry's source only where `docker login`
            // left the registry's empty entry beside it.
            let store = file.creds_store.clone().filter(|_| listed);
            helper = named.or(store).map(|h| (h, path.clone()));
        }
    }
    match helper {
        Some((helper, path)) => Err(SourceError::CredHelper {
            registry: registry.to_owned(),
            helper,
            path,
        }),
        None => Ok(None),
    }
}

/// The names an entry for `registry` may be under: itself, and the host the
/// client resolves it to (the default registry's API host differs from its
/// name).
fn names_of(registry: &str) -> Vec<String> {
    let resolved = |r: &str| {
        Reference::with_tag(r.to_owned(), "x".to_owned(), "latest".to_owned())
            .resolve_registry()
            .to_owned()
    };
    let mut out = vec![registry.to_owned(), resolved(registry)];
    if registry == resolved("docker.io") {
        out.push("docker.io".to_owned());
    }
    out.dedup();
    out
}

/// The host an `auths` key names: `HOST`, `https://HOST`, `https://HOST/v1/`;
/// None for a key with a namespace.
fn key_host(key: &str) -> Option<&str> {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let k = ["/v1/", "/v1", "/v2/", "/v2", "/"]
        .iter()
        .find_map(|s| k.strip_suffix(s))
        .unwrap_or(k);
    (!k.is_empty() && !k.contains('/')).then_some(k)
}

/// base64 of `user:password`.
fn decode(auth: &str) -> Option<Credentials> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    (!u.is_empty()).then(|| Credentials {
        username: u.to_owned(),
        password: p.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn write(p: &std::path::Path, v: serde_json::Value) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
    }

    fn env(home: &std::path::Path) -> Vec<PathBuf> {
        let home = home.as_os_str().to_owned();
        auth_files(move |k| (k == "HOME").then(|| home.clone()))
    }

    #[test]
    fn order_and_key_shapes() {
        let t = tempfile::tempdir().unwrap();
        let files = env(t.path());
        assert_eq!(credentials_in(&files, "127.0.0.1:5000").unwrap(), None);
        write(
            &t.path().join(".docker/config.json"),
            serde_json::json!({"auths": {
                "https://127.0.0.1:5000/v1/": {"auth": b64("docker:pw")},
                "127.0.0.2:5000/team": {"auth": b64("ns:pw")},
            }}),
        );
        let c = credentials_in(&files, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("docker", "pw"));
        assert_eq!(credentials_in(&files, "127.0.0.2:5000").unwrap(), None);
        // podman's own file comes first.
        write(
            &t.path().join(".config/containers/auth.json"),
            serde_json::json!({"auths": {"127.0.0.1:5000": {"auth": b64("podman:a:b")}}}),
        );
        let c = credentials_in(&files, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("podman", "a:b")
        );
    }

    #[test]
    fn default_registry_under_docker_key() {
        let t = tempfile::tempdir().unwrap();
        let files = env(t.path());
        let api_host = names_of("docker.io")[1].clone();
        write(
            &t.path().join(".docker/config.json"),
            serde_json::json!({"auths": {format!("https://{api_host}/v1/"): {"auth": b64("u:p")}}}),
        );
        assert!(credentials_in(&files, &registry_of("debian:12"))
            .unwrap()
            .is_some());
    }

    #[test]
    fn helpers_named_only_when_alone() {
        let t = tempfile::tempdir().unwrap();
        let files = env(t.path());
        write(
            &t.path().join(".docker/config.json"),
            serde_json::json!({"credHelpers": {"127.0.0.1:5000": "secretservice"}, "credsStore": "desktop",
                "auths": {"127.0.0.3:5000": {}}}),
        );
        let e = credentials_in(&files, "127.0.0.1:5000").unwrap_err();
        assert!(
            matches!(&e, SourceError::CredHelper { helper, .. } if helper == "secretservice"),
            "{e}"
        );
        let e = credentials_in(&files, "127.0.0.3:5000").unwrap_err();
        assert!(
            matches!(&e, SourceError::CredHelper { helper, .. } if helper == "desktop"),
            "{e}"
        );
        // A registry the store was never asked about: anonymous.
        assert_eq!(credentials_in(&files, "127.0.0.4:5000").unwrap(), None);
        write(
            &t.path().join(".config/containers/auth.json"),
            serde_json::json!({"auths": {"127.0.0.1:5000": {"auth": b64("u:p")}}}),
        );
        assert!(credentials_in(&files, "127.0.0.1:5000").unwrap().is_some());
    }

    #[test]
    fn bad_entries_named() {
        let t = tempfile::tempdir().unwrap();
        let files = env(t.path());
        write(
            &t.path().join(".docker/config.json"),
            serde_json::json!({"auths": {"127.0.0.1:5000": {"auth": "!!!"}}}),
        );
        assert!(matches!(
            credentials_in(&files, "127.0.0.1:5000"),
            Err(SourceError::AuthEntry { .. })
        ));
        std::fs::write(t.path().join(".docker/config.json"), b"{").unwrap();
        assert!(matches!(
            credentials_in(&files, "127.0.0.1:5000"),
            Err(SourceError::AuthJson { .. })
        ));
    }

    #[test]
    fn registries_of_references() {
        assert_eq!(
            registry_of("127.0.0.1:5000/drums/base:latest"),
            "127.0.0.1:5000"
        );
        assert_eq!(registry_of("localhost/x"), "localhost");
        assert_eq!(registry_of("debian:12"), "docker.io");
        assert_eq!(registry_of("library/debian"), "docker.io");
        assert_eq!(registry_of("Bad Name/x"), "docker.io");
    }

    #[test]
    fn files_in_podman_order() {
        let f = auth_files(|k| match k {
            "REGISTRY_AUTH_FILE" => Some("/a.json".into()),
            "XDG_RUNTIME_DIR" => Some("/run/user/0".into()),
            "HOME" => Some("/root".into()),
            _ => None,
        });
        assert_eq!(
            f,
            [
                PathBuf::from("/a.json"),
                "/run/user/0/containers/auth.json".into(),
                "/root/.config/containers/auth.json".into(),
                "/root/.docker/config.json".into(),
            ]
        );
    }
}
