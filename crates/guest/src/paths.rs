//! Lexical resolution of the paths clients send.
//!
//! The agent already runs inside the session (its `/` is the session root after
//! `pivot_root`), so this is not a security boundary: it exists to turn
//! obviously wrong input such as `../../etc/passwd` into a clear error instead of
//! silently clamping it to `/etc/passwd`, and to give every endpoint one
//! canonical spelling of a path for its responses and logs.

use std::path::PathBuf;

use axum::http::StatusCode;

use crate::error::ApiError;

/// Why a client-supplied path was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path contains a nul byte: {0:?}")]
    Nul(String),
    #[error("path escapes the session root: {0}")]
    EscapesRoot(String),
}

impl PathError {
    /// The HTTP status and error kind this rejection is reported with.
    pub fn status_kind(&self) -> (StatusCode, &'static str) {
        match self {
            PathError::Empty | PathError::Nul(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            PathError::EscapesRoot(_) => (StatusCode::BAD_REQUEST, "path_escapes_root"),
        }
    }
}

impl From<PathError> for ApiError {
    fn from(err: PathError) -> Self {
        let (status, kind) = err.status_kind();
        ApiError::from_error(status, kind, &err)
    }
}

/// Normalises `path` lexically into an absolute path.
///
/// Relative paths are taken relative to `/`; empty and `.` components are
/// dropped and `..` removes the previous component. A `..` with nothing left to
/// remove is an error rather than being clamped at `/`, because the caller
/// almost certainly meant something else. Symlinks are not looked at: the path
/// is resolved as text, which is what the client wrote.
pub fn resolve(path: &str) -> Result<PathBuf, PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.contains('\0') {
        return Err(PathError::Nul(path.to_owned()));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(PathError::EscapesRoot(path.to_owned()));
                }
            }
            name => parts.push(name),
        }
    }
    let mut out = String::with_capacity(path.len() + 1);
    for part in &parts {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(PathBuf::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(input: &str) -> String {
        resolve(input).unwrap().to_str().unwrap().to_owned()
    }

    #[test]
    fn absolute_paths_are_normalised() {
        assert_eq!(ok("/"), "/");
        assert_eq!(ok("/etc/passwd"), "/etc/passwd");
        assert_eq!(ok("//etc///passwd/"), "/etc/passwd");
        assert_eq!(ok("/etc/./passwd"), "/etc/passwd");
        assert_eq!(ok("/a/b/../c"), "/a/c");
        assert_eq!(ok("/a/.."), "/");
        assert_eq!(ok("/a/b/../../c/./d/.."), "/c");
    }

    #[test]
    fn relative_paths_are_relative_to_root() {
        assert_eq!(ok("etc/passwd"), "/etc/passwd");
        assert_eq!(ok("."), "/");
        assert_eq!(ok("./tmp"), "/tmp");
        assert_eq!(ok("a/../b"), "/b");
    }

    #[test]
    fn climbing_above_root_is_rejected() {
        for bad in [
            "..",
            "/..",
            "../../..",
            "/a/../..",
            "a/b/../../../etc",
            "/../etc/passwd",
        ] {
            assert_eq!(
                resolve(bad),
                Err(PathError::EscapesRoot(bad.to_owned())),
                "{bad}"
            );
        }
        assert_eq!(
            PathError::EscapesRoot("../x".into()).to_string(),
            "path escapes the session root: ../x"
        );
    }

    #[test]
    fn dots_inside_names_are_names() {
        assert_eq!(ok("/a/..."), "/a/...");
        assert_eq!(ok("/a/..b/.c"), "/a/..b/.c");
    }

    #[test]
    fn empty_and_nul_are_rejected() {
        assert_eq!(resolve(""), Err(PathError::Empty));
        assert_eq!(resolve("/a\0b"), Err(PathError::Nul("/a\0b".into())));
    }
}
