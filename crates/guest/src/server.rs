//! The HTTP server: routes, listeners, and running until a shutdown signal.

use std::future::{Future, IntoFuture};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, UnixListener};

use crate::error::ApiError;
use crate::hygiene::{self, HygieneConfig, HygieneError};
use crate::rollback::SessionApi;
use crate::{exec, files};

/// Where the daemon expects the agent inside the session.
pub const DEFAULT_SOCKET: &str = "/run/drums/guest.sock";

/// An address to listen on, as given to `--listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// `unix:/path/to.sock`
    Unix(PathBuf),
    /// `tcp:127.0.0.1:5000`
    Tcp(SocketAddr),
}

impl FromStr for Listener {
    type Err = ServeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |why: &str| ServeError::InvalidListener(format!("{s:?}: {why}"));
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(invalid("unix socket path must be absolute"));
            }
            Ok(Listener::Unix(path.into()))
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            addr.parse()
                .map(Listener::Tcp)
                .map_err(|_| invalid("expected tcp:IP:PORT"))
        } else {
            Err(invalid("expected unix:/PATH or tcp:IP:PORT"))
        }
    }
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Unix(path) => write!(f, "unix:{}", path.display()),
            Listener::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("start the async runtime")]
    Runtime(#[source] io::Error),
    #[error("invalid listen address {0}")]
    InvalidListener(String),
    #[error("failed to create socket directory {}", .path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("socket {} is in use by a running server", .0.display())]
    SocketInUse(PathBuf),
    #[error("refusing to replace {}: it exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    #[error("failed to remove stale socket {}", .path.display())]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to bind {addr}")]
    Bind {
        addr: Listener,
        #[source]
        source: io::Error,
    },
    #[error("failed to restrict permissions of {}", .path.display())]
    Chmod {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to install signal handler")]
    Signal(#[source] io::Error),
    #[error("server failed")]
    Serve(#[source] io::Error),
    #[error("failed to prepare the reseed directory")]
    Hygiene(#[source] HygieneError),
}

/// The whole API v1 as a router, for serving or for in-process tests, with
/// the production hygiene paths.
pub fn router() -> Router {
    router_with(HygieneConfig::default())
}

/// The whole API v1, with the hygiene files under `hygiene`'s directories,
/// and no session API to forward the rollback tool to.
pub fn router_with(hygiene: HygieneConfig) -> Router {
    router_full(hygiene, SessionApi::default())
}

/// The whole API v1, the rollback tool forwarding to `session_api`.
pub fn router_full(hygiene: HygieneConfig, session_api: SessionApi) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/exec", post(exec::handler))
        .route("/v1/files", get(files::get_file).put(files::put_file))
        .route("/v1/dir", get(files::list_dir))
        .merge(hygiene::router(hygiene))
        .merge(crate::desktop::router())
        .merge(crate::rollback::router(session_api))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(log_request))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub hostname: String,
    pub pid: u32,
    /// The last pid the session's pid namespace handed out
    /// (`/proc/sys/kernel/ns_last_pid`, which a process reads for its own
    /// namespace only). Equal to `pid` while nothing but the session's init
    /// and this agent ever ran: drumsd's light versions rest on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pid: Option<u32>,
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        pid: std::process::id(),
        // Read here, on the runtime's one thread: a blocking-pool thread
        // would take a pid and move what it reads.
        last_pid: std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
    })
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("no such endpoint: {}", request.uri().path()))
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "method {} not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    let response = next.run(request).await;
    // For streaming endpoints this logs when the stream *starts*; exec logs
    // its own end.
    tracing::debug!(%method, %uri, status = response.status().as_u16(), "request");
    response
}

/// Turns axum's JSON body rejection into our error format. axum answers a
/// well-formed body of the wrong shape with 422; for clients that is just
/// another bad request, so it becomes 400 like the rest (415 for a missing
/// content type and 413 for an oversized body keep their own status).
pub(crate) fn json_rejection(rejection: JsonRejection) -> ApiError {
    let status = match rejection.status() {
        StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
        status => status,
    };
    // body_text already carries the whole cause; its source chain would
    // repeat it.
    ApiError::new(
        status,
        "bad_request",
        crate::error::lower_first(&rejection.body_text()),
    )
}

/// Turns axum's query string rejection into our error format.
pub(crate) fn query_rejection(rejection: QueryRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "bad_request",
        crate::error::lower_first(&rejection.body_text()),
    )
}

enum Bound {
    Unix {
        path: PathBuf,
        listener: UnixListener,
    },
    Tcp(TcpListener),
}

/// Bound listeners, ready to serve. Binding is separate from serving so that
/// callers (main, tests) know the sockets exist before anything connects.
pub struct Server {
    bound: Vec<Bound>,
    hygiene: HygieneConfig,
    session_api: SessionApi,
}

impl Server {
    pub async fn bind(listeners: Vec<Listener>) -> Result<Self, ServeError> {
        let mut bound = Vec::with_capacity(listeners.len());
        for listener in listeners {
            bound.push(match &listener {
                Listener::Unix(path) => Bound::Unix {
                    listener: bind_unix(path)?,
                    path: path.clone(),
                },
                Listener::Tcp(addr) => {
                    Bound::Tcp(TcpListener::bind(addr).await.map_err(|source| {
                        ServeError::Bind {
                            addr: listener.clone(),
                            source,
                        }
                    })?)
                }
            });
        }
        Ok(Self {
            bound,
            hygiene: HygieneConfig::default(),
            session_api: SessionApi::default(),
        })
    }

    /// Serves the hygiene endpoints with these paths instead of the
    /// production ones.
    pub fn with_hygiene(mut self, hygiene: HygieneConfig) -> Self {
        self.hygiene = hygiene;
        self
    }

    /// Forwards the rollback tool to drumsd's session API on this port of
    /// the session's gateway.
    pub fn with_session_api(mut self, session_api: SessionApi) -> Self {
        self.session_api = session_api;
        self
    }

    /// The bound addresses, with the real port for `tcp:…:0`.
    pub fn local_addrs(&self) -> Vec<Listener> {
        self.bound
            .iter()
            .map(|b| match b {
                Bound::Unix { path, .. } => Listener::Unix(path.clone()),
                Bound::Tcp(l) => {
                    Listener::Tcp(l.local_addr().expect("bound socket has an address"))
                }
            })
            .collect()
    }

    /// Serves [`router`] on every listener until one fails (which in
    /// practice does not happen: accept errors are retried by axum).
    pub async fn run(self) -> Result<(), ServeError> {
        type ServeFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;
        let router = router_full(self.hygiene, self.session_api);
        let mut futures: Vec<ServeFuture> = Vec::new();
        for bound in self.bound {
            let addr = match &bound {
                Bound::Unix { path, .. } => Listener::Unix(path.clone()),
                Bound::Tcp(l) => Listener::Tcp(l.local_addr().map_err(ServeError::Serve)?),
            };
            tracing::info!(%addr, version = env!("CARGO_PKG_VERSION"), "listening");
            futures.push(match bound {
                Bound::Unix { listener, .. } => {
                    Box::pin(axum::serve(listener, router.clone()).into_future())
                }
                Bound::Tcp(listener) => {
                    Box::pin(axum::serve(listener, router.clone()).into_future())
                }
            });
        }
        if futures.is_empty() {
            return Ok(());
        }
        futures::future::try_join_all(futures)
            .await
            .map(drop)
            .map_err(ServeError::Serve)
    }

    /// Like [`Server::run`], but returns when `shutdown` completes, removing
    /// the unix socket files. Running commands are killed when the runtime
    /// drops their supervising tasks.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let sockets: Vec<PathBuf> = self
            .bound
            .iter()
            .filter_map(|b| match b {
                Bound::Unix { path, .. } => Some(path.clone()),
                Bound::Tcp(_) => None,
            })
            .collect();
        let result = tokio::select! {
            r = self.run() => r,
            () = shutdown => Ok(()),
        };
        for path in sockets {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "failed to remove socket: {e}");
            }
        }
        result
    }
}

/// Binds a unix socket at `path`, creating its directory and replacing a
/// stale socket left by a previous agent that did not exit cleanly.
fn bind_unix(path: &std::path::Path) -> Result<UnixListener, ServeError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| ServeError::CreateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // Only a socket nobody answers on is stale; a live one means a
            // second agent, and stealing its address would strand the first.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::SocketInUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(|source| ServeError::RemoveStale {
                path: path.to_owned(),
                source,
            })?;
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_owned())),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| ServeError::Bind {
        addr: Listener::Unix(path.to_owned()),
        source,
    })?;
    // The agent runs commands as any user, root included, so only root (the
    // daemon) may talk to it; an unprivileged process in the session must
    // not be able to escalate through the socket.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServeError::Chmod {
            path: path.to_owned(),
            source,
        }
    })?;
    Ok(listener)
}

/// Installs SIGINT and SIGTERM handlers (init stops the agent with SIGTERM)
/// and returns a future that resolves when either arrives. Installing eagerly,
/// not on first poll, means no signal between now and then is lost to the
/// default action.
pub fn shutdown_signal() -> Result<impl Future<Output = ()>, ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("received SIGTERM, shutting down"),
            _ = int.recv() => tracing::info!("received SIGINT, shutting down"),
        }
    })
}

/// Creates the reseed directory, binds `listeners` and serves until
/// SIGINT/SIGTERM, then removes the unix sockets.
/// [`serve`] on the agent's runtime: one thread, since the agent mostly
/// waits on pipes and sockets and every session runs one, so memory matters
/// more than parallelism; the blocking pool (file I/O) is capped and its idle
/// threads exit quickly. Here rather than in main.rs so that the agent's
/// code is compiled once, in this crate, not again in the binary's.
pub fn serve_blocking(
    listeners: Vec<Listener>,
    hygiene: HygieneConfig,
    session_api: SessionApi,
) -> Result<(), ServeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .build()
        .map_err(ServeError::Runtime)?
        .block_on(serve(listeners, hygiene, session_api))
}

pub async fn serve(
    listeners: Vec<Listener>,
    hygiene: HygieneConfig,
    session_api: SessionApi,
) -> Result<(), ServeError> {
    let shutdown = shutdown_signal()?;
    // Before binding: once drumsd can reach the socket, processes may
    // already be expected to have registered.
    hygiene::init(&hygiene).map_err(ServeError::Hygiene)?;
    Server::bind(listeners)
        .await?
        .with_hygiene(hygiene)
        .with_session_api(session_api)
        .run_until(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_addresses() {
        assert_eq!(
            "unix:/run/drums/guest.sock".parse::<Listener>().unwrap(),
            Listener::Unix("/run/drums/guest.sock".into())
        );
        assert_eq!(
            "tcp:127.0.0.1:5000".parse::<Listener>().unwrap(),
            Listener::Tcp("127.0.0.1:5000".parse().unwrap())
        );
        for bad in ["unix:relative.sock", "tcp:localhost", "http://x", ""] {
            assert!(bad.parse::<Listener>().is_err(), "{bad}");
        }
    }
}
