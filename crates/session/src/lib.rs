//! Sessions: creating, tracking and removing them, with every host resource
//! recorded in the ownership ledger before it exists.
//!
//! - [`spec`] turns an API request into a validated plan, or a clear error;
//! - [`create`] builds a session step by step (directory, subvolume, cgroups,
//!   init, network, readiness), each step a fault-injection point;
//! - [`teardown`] removes whatever the ledger names, for `rm`, for a failed
//!   create, at shutdown, and in the sweep at daemon start;
//! - [`process`] holds the few process helpers (start times, reaping);
//! - [`inspect`] is where turn boundaries meet the eBPF inspector;
//! - `busy` keeps a dump and a remove of one session apart, and a restore
//!   and a remove of one checkpoint.

pub mod archive;
pub mod audit;
mod boot;
pub mod budget;
mod busy;
pub mod checkpoint;
pub mod create;
pub mod faults;
pub mod files_back;
mod host;
pub mod ids;
pub mod images;
pub mod inspect;
pub mod limits;
pub mod manager;
pub mod pools;
pub mod process;
pub mod restore;
pub mod spec;
mod staging;
mod streams;
pub mod teardown;
pub mod versions;
mod watches;

pub use boot::InitFailure;
pub use manager::{Manager, ManagerConfig};

use std::path::PathBuf;

/// What kind of failure an error is, for the API's status codes and the CLI's
/// exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    BadRequest,
    NotFound,
    Conflict,
    /// Refused for lack of trust (an unsigned archive, an unknown signer).
    Forbidden,
    /// The host is busy (the checkpoint engine's queues are full): retry.
    Unavailable,
    Internal,
}

/// An error from outside the manager's own types (a guest's answer, a
/// host call), kept whole as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A request refused (400) with a message written where it was decided.
    #[error("{0}")]
    Invalid(String),
    /// A request refused (400) for a reason that is an error of its own,
    /// kept as the source: `what` says what was refused.
    #[error("{what}")]
    Refused {
        what: String,
        #[source]
        source: BoxError,
    },
    #[error("no session named {0:?}")]
    NotFound(String),
    #[error("no checkpoint named {0:?}")]
    CheckpointNotFound(String),
    #[error("no pool named {0:?}")]
    PoolNotFound(String),
    /// A take found no ready member within its timeout.
    #[error("pool {pool} has no ready member after {waited_ms} ms: {why}")]
    PoolEmpty {
        pool: String,
        waited_ms: u64,
        why: String,
    },
    #[error("no image named {0:?} (see `drums images`; `make demo` builds \"default\", `make test` or `scripts/setup.sh image NAME` the built-in \"desktop\" and \"agent\")")]
    ImageNotFound(String),
    #[error("a session named {0:?} already exists")]
    NameTaken(String),
    /// The session exists but is being created or removed: the request was
    /// fine, the session's state refuses it (409), as with a name taken.
    #[error("session {name} is {state}, not running")]
    NotRunning {
        name: String,
        state: drums_api::SessionState,
    },
    #[error(transparent)]
    Catalog(drums_catalog::CatalogError),
    #[error("store")]
    Store(#[from] drums_store::StoreError),
    #[error("cgroup")]
    Cgroup(#[from] drums_cgroup::CgroupError),
    #[error("network")]
    Net(#[from] drums_net::NetError),
    #[error("image")]
    Image(#[source] drums_image::ImageError),
    #[error("image store")]
    Oci(#[source] drums_oci::StoreOpError),
    #[error("image source")]
    OciSource(#[from] drums_oci::SourceError),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("criu")]
    Criu(#[from] drums_criu::CriuError),
    #[error("checkpoint")]
    Checkpoint(#[from] drums_checkpoint::CheckpointError),
    #[error("checkpoint archive")]
    Archive(#[from] drums_checkpoint::archive::ArchiveError),
    #[error("host key")]
    Key(#[from] drums_checkpoint::keys::KeyError),
    #[error("user namespace")]
    Ids(#[from] drums_sys::SysError),
    #[error("install the host's loader for drums' programs in sessions")]
    Loader(#[from] drums_init::loader::LoaderError),
    /// A sibling's new identity could not be applied: the host's half (its
    /// hostname, from outside) or the guest's answer.
    #[error("hygiene")]
    Hygiene(#[source] BoxError),
    /// The desktop's start, hygiene or readiness, as the guest answered.
    #[error("desktop")]
    Desktop(#[source] BoxError),
    /// drums-init failed, said so, or said something else.
    #[error("session init")]
    Init(#[source] boot::InitFailure),
    /// The pipe to drums-init failed.
    #[error("session init: {op} drums-init")]
    InitPipe {
        /// "write to", "read from".
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("session init: unreadable report {line:?}")]
    InitReport {
        line: String,
        #[source]
        source: serde_json::Error,
    },
    /// An import's archive would take the store's reserve.
    #[error("archive larger than the {room} bytes the store has room for (its free space less drumsd's reserve)")]
    ArchiveTooLarge { room: u64 },
    /// A pull's blobs would take the store's reserve.
    #[error("{what} take {need} bytes, more than the {room} the store has room for (its free space less drumsd's reserve)")]
    NoRoom {
        what: &'static str,
        need: u64,
        room: u64,
    },
    #[error("injected fault at {0}")]
    Injected(String),
    #[error("session {id} did not become ready within {waited_ms} ms{detail}")]
    NotReady {
        id: String,
        waited_ms: u64,
        detail: String,
    },
    #[error("inspector")]
    Inspect(#[from] drums_inspect::InspectError),
    #[error(transparent)]
    Limits(#[from] limits::LimitsError),
    #[error("checkpoint {checkpoint}: the limits in its manifest")]
    ManifestLimits {
        checkpoint: String,
        #[source]
        source: limits::ManifestLimitsError,
    },
    #[error("remove session {id}: {failures}")]
    Teardown {
        id: String,
        failures: teardown::Failures,
    },
    /// The request conflicts with the state of what it names.
    #[error("{0}")]
    Conflict(String),
    #[error("session {session} has no version {version:?}")]
    VersionNotFound { session: String, version: String },
    /// A recovery or rollback asked for the newest done version, and the
    /// session has none (yet): its own variant, so that a caller can tell it
    /// from a conflict with a rollback or recovery under way.
    #[error("session {session} has no done version {purpose}")]
    NoDoneVersion {
        session: String,
        /// "to recover from", "yet".
        purpose: &'static str,
    },
    /// A version's job failed; every waiter of it gets the same error.
    #[error(transparent)]
    Version(std::sync::Arc<SessionError>),
    /// A version's job never finished: it panicked, or was cancelled before
    /// it started (its session went, or drumsd is shutting down).
    #[error("version job")]
    VersionJob(#[source] drums_engine::Failure<std::sync::Arc<SessionError>>),
    #[error("checkpoint engine")]
    Engine(#[from] drums_engine::EngineError),
    /// Something a session holds that a checkpoint cannot take, found
    /// before CRIU is asked (so the user reads this, not CRIU's log).
    #[error("session {session} cannot be checkpointed: {process} holds {object}; {advice}")]
    NotCheckpointable {
        session: String,
        /// "process 7 (python3, host pid 2214)", or "a process".
        process: String,
        object: String,
        advice: String,
    },
}

impl SessionError {
    /// [`SessionError::Refused`]: `what` was refused because of `source`.
    pub fn refused(what: impl Into<String>, source: impl Into<BoxError>) -> SessionError {
        SessionError::Refused {
            what: what.into(),
            source: source.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            SessionError::Invalid(_)
            | SessionError::Refused { .. }
            | SessionError::Limits(_)
            | SessionError::Image(drums_image::ImageError::InvalidName(_)) => ErrorKind::BadRequest,
            // The checkpoint exists but cannot be restored as it is, like one
            // from an incompatible host.
            SessionError::ManifestLimits { .. } => ErrorKind::Conflict,
            // The store (or what it holds for sessions) is full: the request
            // was fine, the state of the host refuses it for now.
            e if out_of_room(e) => ErrorKind::Conflict,
            SessionError::ArchiveTooLarge { .. } | SessionError::NoRoom { .. } => {
                ErrorKind::Conflict
            }
            SessionError::PoolEmpty { .. } => ErrorKind::Unavailable,
            SessionError::NotFound(_)
            | SessionError::PoolNotFound(_)
            | SessionError::VersionNotFound { .. }
            | SessionError::ImageNotFound(_)
            | SessionError::CheckpointNotFound(_) => ErrorKind::NotFound,
            SessionError::NameTaken(_)
            | SessionError::NotRunning { .. }
            | SessionError::NotCheckpointable { .. } => ErrorKind::Conflict,
            SessionError::Inspect(e) => match e {
                drums_inspect::InspectError::NoTurn(_)
                | drums_inspect::InspectError::TurnOpen { .. }
                | drums_inspect::InspectError::Died { .. }
                | drums_inspect::InspectError::NotWatched(_) => ErrorKind::Conflict,
                drums_inspect::InspectError::NoProcess { .. } => ErrorKind::NotFound,
                _ => ErrorKind::Internal,
            },
            SessionError::Catalog(
                drums_catalog::CatalogError::CheckpointNameTaken(_)
                | drums_catalog::CatalogError::NameIsAnId { .. },
            ) => ErrorKind::Conflict,
            // Every address of the subnet (or every id range) is taken: as with
            // a full store, the request was fine and the host's state refuses
            // it until a session goes.
            SessionError::Catalog(
                drums_catalog::CatalogError::PoolExhausted(_)
                | drums_catalog::CatalogError::TooManySessions { .. },
            ) => ErrorKind::Conflict,
            SessionError::Catalog(drums_catalog::CatalogError::PoolNameTaken(_)) => {
                ErrorKind::Conflict
            }
            SessionError::Checkpoint(drums_checkpoint::CheckpointError::Incompatible {
                ..
            }) => ErrorKind::Conflict,
            SessionError::Archive(e) if e.is_untrusted() => ErrorKind::Forbidden,
            SessionError::Archive(drums_checkpoint::archive::ArchiveError::Io { .. }) => {
                ErrorKind::Internal
            }
            SessionError::Archive(_) => ErrorKind::BadRequest,
            SessionError::Conflict(_) | SessionError::NoDoneVersion { .. } => ErrorKind::Conflict,
            SessionError::Oci(e) => match e {
                drums_oci::StoreOpError::InUse { .. } => ErrorKind::Conflict,
                drums_oci::StoreOpError::Ambiguous(..)
                | drums_oci::StoreOpError::Layer { .. }
                | drums_oci::StoreOpError::DiffId { .. }
                | drums_oci::StoreOpError::NoLayers(_) => ErrorKind::BadRequest,
                _ => ErrorKind::Internal,
            },
            // What a registry or an archive handed over, or the registry's state:
            // the request's to fix, not drumsd's.
            SessionError::OciSource(e) if !matches!(e, drums_oci::SourceError::Io { .. }) => {
                ErrorKind::BadRequest
            }
            SessionError::Version(e) => e.kind(),
            SessionError::VersionJob(drums_engine::Failure::Job { error, .. }) => error.kind(),
            // Its session was removed while the job waited: the state
            // refuses it, as for any request on a session being removed.
            SessionError::VersionJob(drums_engine::Failure::Cancelled {
                reason: drums_engine::CancelReason::Session,
            }) => ErrorKind::Conflict,
            SessionError::VersionJob(drums_engine::Failure::Cancelled {
                reason: drums_engine::CancelReason::Shutdown,
            }) => ErrorKind::Unavailable,
            SessionError::Engine(e) => match e {
                drums_engine::EngineError::Busy { .. } | drums_engine::EngineError::ShutDown => {
                    ErrorKind::Unavailable
                }
                // A job id is opaque to clients: one that is not even a
                // number names no job, like an unknown one.
                drums_engine::EngineError::UnknownJob(_)
                | drums_engine::EngineError::BadJobId { .. } => ErrorKind::NotFound,
                _ => ErrorKind::Internal,
            },
            _ => ErrorKind::Internal,
        }
    }
}

/// Whether an I/O error anywhere in `e`'s chain is EDQUOT (a full qgroup) or
/// ENOSPC (a full file system).
fn out_of_room(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EDQUOT | libc::ENOSPC)) {
                return true;
            }
        }
        // An image that would take the store's reserve.
        if matches!(
            err.downcast_ref::<drums_oci::LayerError>(),
            Some(drums_oci::LayerError::NoRoom { .. })
        ) || matches!(
            err.downcast_ref::<drums_oci::SourceError>(),
            Some(drums_oci::SourceError::NoRoom { .. })
        ) {
            return true;
        }
        cur = err.source();
    }
    false
}

impl From<drums_catalog::CatalogError> for SessionError {
    fn from(e: drums_catalog::CatalogError) -> Self {
        match e {
            drums_catalog::CatalogError::NameTaken(n) => SessionError::NameTaken(n),
            e => SessionError::Catalog(e),
        }
    }
}

impl From<drums_oci::StoreOpError> for SessionError {
    fn from(e: drums_oci::StoreOpError) -> Self {
        match e {
            drums_oci::StoreOpError::NotFound(n) => SessionError::ImageNotFound(n),
            e => SessionError::Oci(e),
        }
    }
}

impl From<drums_image::ImageError> for SessionError {
    fn from(e: drums_image::ImageError) -> Self {
        match e {
            drums_image::ImageError::NotFound(n) => SessionError::ImageNotFound(n),
            e => SessionError::Image(e),
        }
    }
}

pub(crate) fn io(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> SessionError {
    let path = path.into();
    move |source| SessionError::Io { op, path, source }
}

/// The one chain formatter (drums_api's), for the logs and messages here.
pub use drums_api::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_store_is_a_conflict_not_an_internal_error() {
        let io = |errno| SessionError::Io {
            op: "create",
            path: "/s/upper".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        assert_eq!(io(libc::EDQUOT).kind(), ErrorKind::Conflict);
        assert_eq!(io(libc::ENOSPC).kind(), ErrorKind::Conflict);
        assert_eq!(io(libc::EIO).kind(), ErrorKind::Internal);
        let store = SessionError::Store(drums_store::StoreError::Snapshot {
            src: "/a".into(),
            dst: "/b".into(),
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        });
        assert_eq!(store.kind(), ErrorKind::Conflict);
    }

    /// Found by the API fuzz test: both were 500s.
    #[test]
    fn no_free_address_is_a_conflict_and_a_bad_image_name_a_bad_request() {
        let pool = SessionError::Catalog(drums_catalog::CatalogError::PoolExhausted(
            "10.0.0.0/24".into(),
        ));
        assert_eq!(pool.kind(), ErrorKind::Conflict);
        let image = SessionError::Image(drums_image::ImageError::InvalidName("../x".into()));
        assert_eq!(image.kind(), ErrorKind::BadRequest);
    }
}
