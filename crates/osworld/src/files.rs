//! Moving files in and out of the session: /file, /setup/upload,
//! /list_directory and /desktop_path.
//!
//! These run in the agent (root), as the original runs in its server
//! process; files and directories they create are handed to the desktop
//! user, so the apps under test can change them.

use std::path::{Path, PathBuf};

use axum::body::{Body, Bytes};
use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::Multipart;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt as _;

use crate::exec::expand_path;
use crate::reply::{self, json_object, py_os_error};
use crate::{OsworldConfig, State};

/// `request.form` for url-encoded bodies (what OSWorld's clients send);
/// other bodies have no form fields, as far as the original is concerned.
pub(crate) fn form_field(headers: &HeaderMap, body: &Bytes, key: &str) -> Option<String> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    if !ct
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("application/x-www-form-urlencoded")
    {
        return None;
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).ok()?;
    pairs.into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// A request path, with `~` and `$VARS` expanded; relative paths are
/// taken from the user's home (the original's working directory).
fn resolve(cfg: &OsworldConfig, p: &str) -> PathBuf {
    let p = PathBuf::from(expand_path(cfg, p));
    if p.is_absolute() {
        p
    } else {
        cfg.user.home.join(p)
    }
}

/// POST /file, form field `file_path`: the file's bytes as an attachment.
pub(crate) async fn get_file(st: State, headers: HeaderMap, body: Bytes) -> Response {
    let Some(raw) = form_field(&headers, &body, "file_path") else {
        return reply::json(
            StatusCode::BAD_REQUEST,
            json!({"error": "file_path is required"}),
        );
    };
    let path = resolve(&st.cfg, &raw);
    let not_found = || reply::json(StatusCode::NOT_FOUND, json!({"error": "File not found"}));
    let failed = |msg: String| {
        reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": format!("Failed to serve file: {msg}")}),
        )
    };
    let shown = path.to_string_lossy().into_owned();
    let meta = match tokio::fs::metadata(&path).await {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return not_found(),
        Err(e) => return failed(py_os_error(&e, &shown)),
    };
    if meta.is_dir() {
        return failed(py_os_error(
            &std::io::Error::from_raw_os_error(libc::EISDIR),
            &shown,
        ));
    }
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return not_found(),
        Err(e) => return failed(py_os_error(&e, &shown)),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Streamed: evaluation files can be videos or whole profiles.
    let stream = tokio_util::io::ReaderStream::new(file);
    reply::attachment(&name, meta.len(), Body::from_stream(stream))
}

/// POST /setup/upload, multipart `file_path` (a plain field) and
/// `file_data` (a file part): writes the file, creating its directory.
pub(crate) async fn upload(st: State, mp: Result<Multipart, MultipartRejection>) -> Response {
    let missing = || {
        reply::json(
            StatusCode::BAD_REQUEST,
            json!({"error": "file_path and file_data are required"}),
        )
    };
    let bad_body = || {
        reply::http_error(
            StatusCode::BAD_REQUEST,
            "The browser (or proxy) sent a request that this server could not understand.",
        )
    };
    let Ok(mut mp) = mp else { return missing() };
    let mut file_path: Option<String> = None;
    let mut saved: Option<Result<u64, (PathBuf, std::io::Error)>> = None;
    // A file part that came before file_path: kept in memory until we know
    // where it goes (OSWorld's client sends file_path first).
    let mut early: Option<Bytes> = None;
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => return bad_body(),
        };
        let name = field.name().unwrap_or("").to_string();
        // Werkzeug files parts with a filename under request.files, the
        // rest under request.form; the original looks each up in one.
        let is_file = field.file_name().is_some();
        match (name.as_str(), is_file) {
            ("file_path", false) if file_path.is_none() => match field.text().await {
                Ok(t) => file_path = Some(t),
                Err(_) => return bad_body(),
            },
            ("file_data", true) if saved.is_none() && early.is_none() => match &file_path {
                Some(p) => saved = Some(save_stream(&st.cfg, &resolve(&st.cfg, p), field).await),
                None => match field.bytes().await {
                    Ok(b) => early = Some(b),
                    Err(_) => return bad_body(),
                },
            },
            // Skipping reads the part to its end.
            _ => drop(field),
        }
    }
    let Some(p) = file_path else { return missing() };
    let saved = match (saved, early) {
        (Some(s), _) => s,
        (None, Some(bytes)) => save_bytes(&st.cfg, &resolve(&st.cfg, &p), &bytes).await,
        (None, None) => return missing(),
    };
    match saved {
        Ok(size) => reply::text(StatusCode::OK, format!("File Uploaded: {size} bytes")),
        Err((path, e)) => reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": format!("Failed to upload file: {}", py_os_error(&e, &path.to_string_lossy()))}),
        ),
    }
}

/// Creates the missing directories above `path`, owned by the user.
fn prepare_parent(cfg: &OsworldConfig, path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let mut missing: Vec<&Path> = parent.ancestors().take_while(|a| !a.exists()).collect();
    missing.reverse();
    for dir in missing {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err((dir.to_path_buf(), e)),
        }
        std::os::unix::fs::chown(dir, Some(cfg.user.uid), Some(cfg.user.gid))
            .map_err(|e| (dir.to_path_buf(), e))?;
    }
    Ok(())
}

/// Opens `path` for writing (truncating, like Python's "wb"); a file that
/// did not exist becomes the user's.
async fn open_target(
    cfg: &OsworldConfig,
    path: &Path,
) -> Result<tokio::fs::File, (PathBuf, std::io::Error)> {
    prepare_parent(cfg, path)?;
    let existed = path.exists();
    let f = tokio::fs::File::create(path)
        .await
        .map_err(|e| (path.to_path_buf(), e))?;
    if !existed {
        std::os::unix::fs::chown(path, Some(cfg.user.uid), Some(cfg.user.gid))
            .map_err(|e| (path.to_path_buf(), e))?;
    }
    Ok(f)
}

async fn finish(path: &Path, mut f: tokio::fs::File) -> Result<u64, (PathBuf, std::io::Error)> {
    let err = |e| (path.to_path_buf(), e);
    f.flush().await.map_err(err)?;
    Ok(f.metadata().await.map_err(err)?.len())
}

async fn save_stream(
    cfg: &OsworldConfig,
    path: &Path,
    mut field: Field<'_>,
) -> Result<u64, (PathBuf, std::io::Error)> {
    let result = async {
        let mut f = open_target(cfg, path).await?;
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => f
                    .write_all(&chunk)
                    .await
                    .map_err(|e| (path.to_path_buf(), e))?,
                Ok(None) => break,
                Err(e) => {
                    return Err((path.to_path_buf(), std::io::Error::other(e.body_text())));
                }
            }
        }
        finish(path, f).await
    }
    .await;
    if result.is_err() {
        // As the original: no half-written file stays behind.
        let _ = std::fs::remove_file(path);
    }
    result
}

async fn save_bytes(
    cfg: &OsworldConfig,
    path: &Path,
    bytes: &[u8],
) -> Result<u64, (PathBuf, std::io::Error)> {
    let result = async {
        let mut f = open_target(cfg, path).await?;
        f.write_all(bytes)
            .await
            .map_err(|e| (path.to_path_buf(), e))?;
        finish(path, f).await
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// POST /list_directory, JSON `{path}`: the tree below `path`.
pub(crate) async fn list_directory(headers: HeaderMap, body: Bytes) -> Response {
    let data = match json_object(&headers, &body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let Some(path) = data.get("path") else {
        return reply::json(
            StatusCode::BAD_REQUEST,
            json!({"error": "Missing 'path' parameter"}),
        );
    };
    let not_dir = || {
        reply::json(
            StatusCode::BAD_REQUEST,
            json!({"error": "The provided path is not a directory"}),
        )
    };
    // The original does not expand ~ here.
    let Some(path) = path.as_str().map(str::to_string) else {
        return not_dir();
    };
    if !Path::new(&path).is_dir() {
        return not_dir();
    }
    match tokio::task::spawn_blocking(move || tree(&path)).await {
        Ok(t) => reply::json(StatusCode::OK, json!({"directory_tree": t})),
        Err(_) => reply::internal_error(),
    }
}

/// Like the original: directories (following symlinks) recurse, everything
/// else is a file, and an unreadable directory becomes `{"error": ...}`.
/// Symlink loops end at the kernel's ELOOP/ENAMETOOLONG, as they do there.
fn tree(dir: &str) -> Value {
    let name = dir.rsplit('/').next().unwrap_or("");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return json!({"error": py_os_error(&e, dir)}),
    };
    let mut children = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => return json!({"error": py_os_error(&e, dir)}),
        };
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        let full = if dir.ends_with('/') {
            format!("{dir}{entry_name}")
        } else {
            format!("{dir}/{entry_name}")
        };
        if Path::new(&full).is_dir() {
            children.push(tree(&full));
        } else {
            children.push(json!({"type": "file", "name": entry_name}));
        }
    }
    json!({"type": "directory", "name": name, "children": children})
}

/// POST /desktop_path: `~/Desktop` of the user, if it exists.
pub(crate) async fn desktop_path(st: State) -> Response {
    let desktop = st.cfg.user.home.join("Desktop");
    if desktop.exists() {
        reply::json(
            StatusCode::OK,
            json!({"desktop_path": desktop.to_string_lossy()}),
        )
    } else {
        reply::json(
            StatusCode::NOT_FOUND,
            json!({"error": "Unsupported operating system or desktop path not found"}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn form_field_reads_urlencoded_only() {
        let mut h = HeaderMap::new();
        let body = Bytes::from_static(b"a=1&file_path=%2Ftmp%2Fx+y");
        assert_eq!(form_field(&h, &body, "file_path"), None);
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        assert_eq!(
            form_field(&h, &body, "file_path").as_deref(),
            Some("/tmp/x y")
        );
        assert_eq!(form_field(&h, &body, "nope"), None);
    }

    #[test]
    fn tree_shape() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), b"x").unwrap();
        let t = tree(d.path().to_str().unwrap());
        assert_eq!(t["type"], "directory");
        assert_eq!(
            t["children"],
            json!([{"type": "directory", "name": "sub", "children": [{"type": "file", "name": "f"}]}])
        );
    }
}
