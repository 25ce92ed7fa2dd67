use std::path::PathBuf;

/// Building an `OsworldConfig`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("look up user {name} in {path}")]
    NoSuchUser { name: String, path: PathBuf },
}

/// Running one command for a request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("spawn {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("wait for {program}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("create pipe for {program}")]
    Pipe {
        program: String,
        #[source]
        source: nix::Error,
    },
    /// The command outlived its timeout; it and its process group were
    /// killed and reaped.
    #[error("{program} timed out after {seconds} seconds")]
    Timeout { program: String, seconds: f64 },
}

impl RunError {
    /// The text the original puts in `message`: Python's `str(exception)`.
    pub(crate) fn python_message(&self) -> String {
        match self {
            RunError::Spawn { program, source } => crate::reply::py_os_error(source, program),
            other => drums_api::error_chain(other),
        }
    }
}
