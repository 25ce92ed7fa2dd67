//! Exit codes, distinct per kind of failure so scripts can tell them apart.
//! `drums exec` exits with the command's own code instead (127 when the
//! command does not exist in the session, 124 on timeout, 128+N on signal N).

use drums_api::ClientError;

pub const OK: i32 = 0;
/// An internal error of drums or the daemon.
pub const INTERNAL: i32 = 1;
/// Bad usage or invalid input (clap uses 2 as well).
pub const USAGE: i32 = 2;
/// The session, image or file named does not exist.
pub const NOT_FOUND: i32 = 3;
/// The name is taken.
pub const CONFLICT: i32 = 4;
/// No daemon could be reached or started.
pub const UNAVAILABLE: i32 = 5;
/// Refused for lack of trust: an unsigned archive, or one whose signer this
/// host does not trust.
pub const UNTRUSTED: i32 = 6;
/// drumsd is busy for now (503): a pool with no member ready within the
/// take's timeout, or the checkpoint engine's queues full. Worth a retry.
pub const BUSY: i32 = 7;
pub const COMMAND_NOT_FOUND: i32 = 127;
pub const TIMED_OUT: i32 = 124;

/// An error with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }
    /// An internal error: its whole chain is the message.
    pub fn internal(e: &dyn std::error::Error) -> Failure {
        Failure::new(INTERNAL, drums_api::error_chain(e))
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let code = match &e {
            ClientError::Api { status: 400, .. } => USAGE,
            ClientError::Api { kind, .. } if kind == "command_not_found" => COMMAND_NOT_FOUND,
            ClientError::Api { status: 404, .. } => NOT_FOUND,
            ClientError::Api { status: 409, .. } => CONFLICT,
            ClientError::Api { status: 403, .. } => UNTRUSTED,
            ClientError::Api { status: 503, .. } => BUSY,
            ClientError::Connect { .. } => UNAVAILABLE,
            _ => INTERNAL,
        };
        Failure {
            code,
            message: drums_api::error_chain(&e),
        }
    }
}

/// How a client program's `main` ends: `work` run on a tokio runtime (every
/// core if `multi_thread`, else this thread alone), then the process exits
/// with its code, or prints its failure and exits with the failure's code.
/// One place for drums, drums-bench and drums-eval.
pub fn run_main<F>(multi_thread: bool, work: F) -> !
where
    F: std::future::Future<Output = Result<i32, Failure>>,
{
    let rt = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let code = match rt {
        Err(e) => {
            eprintln!("drums: start the async runtime: {e}");
            INTERNAL
        }
        Ok(rt) => match rt.block_on(work) {
            Ok(code) => code,
            Err(f) => {
                eprintln!("drums: {}", f.message);
                f.code
            }
        },
    };
    std::process::exit(code)
}
