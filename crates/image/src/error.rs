use std::path::PathBuf;
use std::process::ExitStatus;

/// Everything that can go wrong with images.
///
/// Messages are lowercase and name the operation and the path involved; the
/// underlying error is kept as the [`std::error::Error::source`] rather than
/// repeated in the message, so print the whole chain to see it (drumsd and
/// the CLI do, with `drums_api::error_chain`).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Image names become directory names and appear in CLI output, so they
    /// are restricted to a small, unambiguous alphabet.
    #[error(
        "invalid image name {0:?}: use lowercase letters, digits, '.', '_' or '-' \
         (starting with a letter or digit, at most 63 characters)"
    )]
    InvalidName(String),

    /// A distinct variant so callers can map it to "not found" (HTTP 404,
    /// CLI exit code) without matching on messages.
    #[error("image {0:?} not found")]
    NotFound(String),

    /// Recipe values are passed to debootstrap as arguments; anything outside
    /// the expected syntax is refused before running it.
    #[error("invalid recipe {field} {value:?}: {reason}")]
    InvalidRecipe {
        field: &'static str,
        value: String,
        reason: &'static str,
    },

    /// The mirror is passed to debootstrap; only URI schemes it understands
    /// are accepted.
    #[error("invalid mirror {0:?}: expected an http://, https://, ftp:// or file:/ uri")]
    InvalidMirror(String),

    /// No usable `deb` source for the suite in the host's apt configuration.
    #[error(
        "no apt source for suite {suite:?} in /etc/apt/sources.list.d/*.sources, \
         /etc/apt/sources.list or /etc/apt/sources.list.d/*.list; cannot pick a debian mirror"
    )]
    NoMirror { suite: String },

    /// A filesystem operation failed.
    #[error("cannot {op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// debootstrap (or the shell wrapping it) could not be started at all.
    #[error("cannot start {program} (is the debootstrap package installed?)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },

    /// debootstrap ran and failed. The tail of its output is in the message
    /// because the cause (a missing package, a network error) is almost always
    /// in the last few lines; the full log stays on disk.
    #[error("debootstrap failed ({status}); full log: {}; last lines:\n{tail}", log.display())]
    Debootstrap {
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },

    /// A program run inside the tree being built (useradd, pip) failed.
    #[error("{step} failed: {detail}")]
    Step { step: String, detail: String },

    /// `image.json` exists but cannot be parsed.
    #[error("invalid image metadata {}", path.display())]
    Metadata {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// `image.json` was written by a newer drums with a format this one does
    /// not understand; guessing at its fields could mount the wrong tree.
    #[error(
        "image metadata {} has format_version {found}, newer than the supported {supported}; \
         upgrade drums to use this image",
        path.display()
    )]
    UnsupportedFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// Something is mounted inside the tree; deleting it would descend into
    /// (or fail on) the mounted filesystem.
    #[error("{} has filesystems mounted below it; unmount them first", path.display())]
    Busy { path: PathBuf },
}

impl ImageError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ImageError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Shorthand for attaching an operation and a path to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, ImageError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, ImageError> {
        self.map_err(|e| ImageError::io(op, path, e))
    }
}
