//! `GET`/`PUT /v1/files` and `GET /v1/dir`: whole-file transfer and directory
//! listing inside the session.
//!
//! Downloads and uploads are streamed, never buffered whole: the agent is meant
//! to stay small while the files agents move around (datasets, build outputs)
//! need not be.

use std::fs::Permissions;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::ApiError;
use crate::paths::{self, PathError};

/// Response header carrying a downloaded file's permission bits, as 4 octal
/// digits (`0644`).
pub const MODE_HEADER: &str = "x-drums-mode";

/// Mode of a newly created file when the request gives none.
const DEFAULT_MODE: u32 = 0o644;

const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
pub struct FileQuery {
    pub path: String,
    #[serde(default)]
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct DirQuery {
    pub path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("invalid mode {0:?}: expected octal permission bits such as 0644")]
    InvalidMode(String),
    #[error("not found: {}", .path.display())]
    NotFound {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parent directory not found: {}", .0.display())]
    ParentNotFound(PathBuf),
    #[error("not a regular file: {} is a {what}", .path.display())]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("not a directory: {}", .0.display())]
    NotADirectory(PathBuf),
    #[error("is a directory: {}", .0.display())]
    IsADirectory(PathBuf),
    #[error("permission denied: failed to {op} {}", .path.display())]
    PermissionDenied {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to {op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read the request body")]
    Body(#[source] axum::Error),
    #[error("failed to list {}", .path.display())]
    Task {
        path: PathBuf,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl From<FilesError> for ApiError {
    fn from(err: FilesError) -> Self {
        use StatusCode as S;
        let (status, kind) = match &err {
            FilesError::Path(e) => e.status_kind(),
            FilesError::InvalidMode(_) | FilesError::Body(_) => (S::BAD_REQUEST, "bad_request"),
            FilesError::NotFound { .. } | FilesError::ParentNotFound(_) => {
                (S::NOT_FOUND, "not_found")
            }
            FilesError::NotAFile { .. } => (S::BAD_REQUEST, "not_a_file"),
            FilesError::NotADirectory(_) => (S::BAD_REQUEST, "not_a_directory"),
            FilesError::IsADirectory(_) => (S::BAD_REQUEST, "is_a_directory"),
            FilesError::PermissionDenied { .. } => (S::FORBIDDEN, "permission_denied"),
            FilesError::Io { source, .. }
                if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) =>
            {
                (S::INSUFFICIENT_STORAGE, "no_space")
            }
            FilesError::Io { .. } | FilesError::Task { .. } => {
                (S::INTERNAL_SERVER_ERROR, "io_error")
            }
        };
        ApiError::from_error(status, kind, &err)
    }
}

/// Classifies an I/O failure of `op` on `path` by errno.
fn io_error(op: &'static str, path: &Path, source: io::Error) -> FilesError {
    let path = path.to_owned();
    match source.raw_os_error() {
        // ENOTDIR: a component of the path is a file, which for the client is
        // just as much "there is no such file".
        Some(libc::ENOENT | libc::ENOTDIR) => FilesError::NotFound { path, source },
        Some(libc::EACCES | libc::EPERM) => FilesError::PermissionDenied { op, path, source },
        _ => FilesError::Io { op, path, source },
    }
}

fn describe(file_type: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "device"
    } else {
        "special file"
    }
}

fn format_mode(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// Parses `0644`, `644` or `0o644`; anything beyond the 12 permission bits
/// (file type bits) is refused rather than masked.
pub fn parse_mode(s: &str) -> Result<u32, FilesError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let invalid = || FilesError::InvalidMode(s.to_owned());
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(invalid());
    }
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o7777 => Ok(mode),
        _ => Err(invalid()),
    }
}

/// `GET /v1/files?path=P`: the raw bytes of a regular file.
pub async fn get_file(
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(crate::server::query_rejection)?;
    let path = paths::resolve(&query.path)?;
    Ok(read_file(path).await?)
}

async fn read_file(path: PathBuf) -> Result<Response, FilesError> {
    // stat before open: opening a FIFO blocks until a writer appears, and
    // opening some devices has side effects.
    let meta = tokio::fs::metadata(&path)
        .await
        .map_err(|e| io_error("stat", &path, e))?;
    if !meta.is_file() {
        let what = describe(meta.file_type());
        return Err(FilesError::NotAFile { path, what });
    }
    // O_NONBLOCK in case it was swapped for a FIFO since the stat; it has no
    // effect on a regular file. The fstat after open is authoritative.
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&path)
        .await
        .map_err(|e| io_error("open", &path, e))?;
    let meta = file
        .metadata()
        .await
        .map_err(|e| io_error("stat", &path, e))?;
    if !meta.is_file() {
        let what = describe(meta.file_type());
        return Err(FilesError::NotAFile { path, what });
    }
    let len = meta.len();

    // Read at most the advertised length, so a file that grows while being
    // sent cannot overrun Content-Length.
    let reader = file.take(len);
    let stream = futures::stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        let mut buf = vec![0u8; READ_CHUNK];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(reader)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(
        MODE_HEADER,
        HeaderValue::from_str(&format_mode(meta.mode())).expect("octal digits are a valid header"),
    );
    Ok(response)
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PutResponse {
    pub path: String,
    pub size: u64,
}

/// `PUT /v1/files?path=P[&mode=0644]`: atomically replace P with the body.
pub async fn put_file(
    query: Result<Query<FileQuery>, QueryRejection>,
    body: Body,
) -> Result<(StatusCode, Json<PutResponse>), ApiError> {
    let mut data = body.into_data_stream();
    let put = async {
        let Query(query) = query.map_err(crate::server::query_rejection)?;
        let path = paths::resolve(&query.path)?;
        let mode = query.mode.as_deref().map(parse_mode).transpose()?;
        let size = write_file(&path, mode, &mut data).await?;
        tracing::info!(path = %path.display(), size, "file written");
        Ok((
            StatusCode::CREATED,
            Json(PutResponse {
                path: path.to_string_lossy().into_owned(),
                size,
            }),
        ))
    }
    .await;
    if put.is_err() {
        drain(&mut data).await;
    }
    put
}

/// How much of a refused upload's body is read and dropped before the
/// answer, and for how long.
const DRAIN_MAX: u64 = 64 << 20;
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// Read what is left of a refused upload's body. Answering without reading
/// it makes the server close the connection with the body unread, and a
/// client still sending it (drumsd, streaming the user's upload) gets EPIPE
/// instead of the answer: the user read "guest unavailable" (502) where the
/// guest had said 400 or 404. Bounded, as HTTP servers bound a lingering
/// close: past the bound the connection closes as before.
async fn drain(data: &mut BodyDataStream) {
    let mut read = 0u64;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(Ok(chunk)) = data.next().await {
            read += chunk.len() as u64;
            if read > DRAIN_MAX {
                break;
            }
        }
    })
    .await;
}

/// Removes the temporary upload file unless the upload was committed, so a
/// failed or abandoned (client gone mid-body) upload leaves nothing behind.
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn commit(&mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "failed to remove temporary upload: {e}");
            }
        }
    }
}

/// Writes the body next to `path`, fsyncs it and renames it over `path`, so
/// readers see the old content or the new, never a torn mix.
///
/// Without an explicit mode, replacing an existing file keeps its mode; a new
/// file gets 0644. Replacing a file also keeps its owner, since files under a
/// user's home must stay theirs even though the agent writes as root. A
/// symlink at `path` is replaced by the new file, not followed (as `mv` would).
async fn write_file(
    path: &Path,
    mode: Option<u32>,
    data: &mut BodyDataStream,
) -> Result<u64, FilesError> {
    let Some(parent) = path.parent() else {
        return Err(FilesError::IsADirectory(path.to_owned()));
    };
    match tokio::fs::metadata(parent).await {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(FilesError::ParentNotFound(parent.to_owned())),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
            return Err(FilesError::ParentNotFound(parent.to_owned()))
        }
        Err(e) => return Err(io_error("stat", parent, e)),
    }
    let existing = match tokio::fs::symlink_metadata(path).await {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("stat", path, e)),
    };
    if let Some(m) = &existing {
        let is_dir = m.is_dir()
            || (m.is_symlink() && tokio::fs::metadata(path).await.is_ok_and(|t| t.is_dir()));
        if is_dir {
            return Err(FilesError::IsADirectory(path.to_owned()));
        }
    }
    let replaced = existing.filter(|m| m.is_file());
    let mode = mode.unwrap_or_else(|| {
        replaced
            .as_ref()
            .map_or(DEFAULT_MODE, |m| m.mode() & 0o7777)
    });

    // Same directory, so the rename is atomic (same filesystem); a name that
    // does not grow with the target's, so a 255-byte target name still fits.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tmp = parent.join(format!(
        ".drums-upload.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .await
        .map_err(|e| io_error("create", &tmp, e))?;
    let mut guard = TempFile(Some(tmp.clone()));

    let mut size = 0u64;
    while let Some(chunk) = data.next().await {
        let chunk = chunk.map_err(FilesError::Body)?;
        file.write_all(&chunk)
            .await
            .map_err(|e| io_error("write", &tmp, e))?;
        size += chunk.len() as u64;
    }
    file.flush().await.map_err(|e| io_error("write", &tmp, e))?;
    if let Some(m) = &replaced {
        // chown before chmod: chown clears setuid/setgid bits.
        std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))
            .map_err(|e| io_error("chown", &tmp, e))?;
    }
    file.set_permissions(Permissions::from_mode(mode))
        .await
        .map_err(|e| io_error("chmod", &tmp, e))?;
    file.sync_all()
        .await
        .map_err(|e| io_error("fsync", &tmp, e))?;
    drop(file);
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| io_error("rename", &tmp, e))?;
    guard.commit();

    // Make the rename itself durable. The file is already in place, so a
    // failure here is logged rather than turned into a failed upload.
    let dir = parent.to_owned();
    let synced = tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all()).await;
    if let Ok(Err(e)) | Err(e) = synced.map_err(io::Error::other) {
        tracing::warn!(dir = %parent.display(), "failed to fsync directory after upload: {e}");
    }
    Ok(size)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`; symlinks are not followed.
    pub kind: String,
    pub size: u64,
    /// Permission bits as 4 octal digits, like [`MODE_HEADER`].
    pub mode: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntry>,
}

/// `GET /v1/dir?path=P`.
pub async fn list_dir(
    query: Result<Query<DirQuery>, QueryRejection>,
) -> Result<Json<DirListing>, ApiError> {
    let Query(query) = query.map_err(crate::server::query_rejection)?;
    let path = paths::resolve(&query.path)?;
    // One hop to the blocking pool for the whole listing, instead of one per
    // entry with tokio::fs.
    let dir = path.clone();
    let entries = tokio::task::spawn_blocking(move || read_dir(&dir))
        .await
        .map_err(|source| FilesError::Task {
            path: path.clone(),
            source,
        })??;
    Ok(Json(DirListing {
        path: path.to_string_lossy().into_owned(),
        entries,
    }))
}

/// Lists `dir` sorted by name. Names that are not UTF-8 are converted lossily.
pub fn read_dir(dir: &Path) -> Result<Vec<DirEntry>, FilesError> {
    let iter = std::fs::read_dir(dir).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => FilesError::NotADirectory(dir.to_owned()),
        _ => io_error("list", dir, e),
    })?;
    let mut entries = Vec::new();
    for entry in iter {
        let entry = entry.map_err(|e| io_error("list", dir, e))?;
        // DirEntry::metadata is an lstat: a symlink is reported as one.
        let meta = match entry.metadata() {
            Ok(m) => m,
            // Deleted between readdir and lstat: it is simply not there.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("stat", &entry.path(), e)),
        };
        let ft = meta.file_type();
        let kind = if ft.is_file() {
            "file"
        } else if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "other"
        };
        entries.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            kind: kind.to_owned(),
            size: meta.len(),
            mode: format_mode(meta.mode()),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        assert_eq!(parse_mode("755").unwrap(), 0o755);
        assert_eq!(parse_mode("0o600").unwrap(), 0o600);
        assert_eq!(parse_mode("4755").unwrap(), 0o4755);
        for bad in [
            "",
            "0o",
            "8",
            "0x1ff",
            "rw-r--r--",
            "17777",
            "-644",
            "99999999999999",
        ] {
            assert!(
                matches!(parse_mode(bad), Err(FilesError::InvalidMode(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn modes_format_as_four_octal_digits() {
        assert_eq!(format_mode(0o100644), "0644");
        assert_eq!(format_mode(0o4755), "4755");
        assert_eq!(format_mode(0o7), "0007");
    }
}
