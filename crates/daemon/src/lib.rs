//! drumsd: the one long-running daemon. It owns every session through the
//! session manager and serves the REST API of `api/openapi.yaml` on a unix
//! socket, and the session API (`session_api`) to the sessions on the bridge
//! address.

pub mod bounded;
pub mod config;
pub mod error;
mod images;
pub mod json;
pub mod ksm;
pub mod lock;
mod pools;
mod reissue;
mod replication;
pub mod request_id;
pub mod server;
pub mod session_api;
mod upload;

pub use config::{Cli, Command, DaemonArgs};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use drums_api::error_chain;
use drums_session::{Manager, SessionError};
use tokio::net::UnixListener;
use tracing::{info, warn};

/// What ends drumsd before it serves, or its serving.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Bind(#[from] bounded::BindError),
    #[error("install {signal} handler")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// On the state directory and the API's socket: `op` is what was done
    /// to `path` ("create state directory", "bind", "chmod", ...).
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("prctl PR_SET_CHILD_SUBREAPER")]
    Subreaper(#[source] std::io::Error),
    #[error("another drumsd already listens on {}", .0.display())]
    SocketInUse(PathBuf),
    #[error("start session manager")]
    StartManager(#[source] SessionError),
    #[error(transparent)]
    Upstreams(#[from] drums_coordinator::upstream::UpstreamError),
    #[error("the coordinator's journal")]
    Journal(#[source] drums_catalog::CatalogError),
    #[error("the LLM proxy's upstream client")]
    UpstreamClient(#[source] std::io::Error),
    #[error("start warm pools")]
    StartPools(#[source] SessionError),
    #[error("serve api")]
    Serve(#[source] std::io::Error),
}

/// `op` on `path` failed.
fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError {
    let path = path.to_owned();
    move |source| DaemonError::Io { op, path, source }
}

/// How long drumsd's stop waits for the session API's open connections.
const SESSION_API_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Run the daemon until SIGTERM or SIGINT, then remove every session and the
/// daemon's own resources.
pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    // Handlers first: a SIGTERM that arrives while the manager starts (the
    // sweep can take seconds) is kept, and ends the daemon cleanly once it
    // serves, instead of killing it with the store still mounted.
    let shutdown = shutdown_signal()?;
    let cfg = args.manager_config()?;
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(io("create state directory", &cfg.state_dir))?;
    // Root's alone: it holds images with setuid programs, the catalog, CRIU
    // images (code that runs as root) and the sessions' files.
    std::fs::set_permissions(
        &cfg.state_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .map_err(io("chmod 0700", &cfg.state_dir))?;
    let _lock = lock::acquire(&cfg.state_dir)?;
    // Restored process trees (and each session's PID 1, once drums-init's stage 0
    // exits) become our children, so we can reap them.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(DaemonError::Subreaper(std::io::Error::last_os_error()));
    }
    let socket = args.socket_path();
    check_socket(&socket)?;
    let manager = Arc::new(
        Manager::start(cfg.clone())
            .await
            .map_err(DaemonError::StartManager)?,
    );
    // Bound only once the sweep is done: a client that can connect finds a
    // daemon that is ready, with nothing of a previous one left.
    let listener = bind(&socket)?;
    let ksm = args.ksm.then(ksm::Ksm::enable);
    info!(socket = %socket.display(), state = %cfg.state_dir.display(), "drumsd ready");

    // The session API, once the bridge has its address (the manager made it).
    let (stop_sessions_api, stopped) = tokio::sync::oneshot::channel::<()>();
    let session_api = match args.session_api() {
        Some(port) => {
            let l = bounded::bind_to_device(
                "session api",
                &cfg.bridge,
                manager.bridge_address(),
                port,
            )?;
            let api = session_api::SessionApi::new(
                manager.clone(),
                session_api::Budget::per_minute(args.self_rollbacks_per_minute),
            );
            let task = tokio::spawn(session_api::serve(l, api.clone(), async {
                let _ = stopped.await;
            }));
            info!(address = %manager.bridge_address(), port, "session api ready");
            Some((api, task))
        }
        None => None,
    };

    // The coordinator's LLM proxy: on the bridge address for agents inside
    // sessions, on the host for agents outside (docs/coordinator.md).
    let upstreams = drums_coordinator::Upstreams::parse(&args.llm_upstreams)?;
    let journal = drums_catalog::Catalog::open_for_journal(&cfg.state_dir.join("catalog.db"))
        .map_err(DaemonError::Journal)?;
    let coordinator = drums_coordinator::Coordinator::new(
        manager.clone(),
        upstreams,
        Arc::new(journal),
        args.turn_policy,
        args.coordinator_limits()?,
    )
    .map_err(DaemonError::UpstreamClient)?;
    let watch = coordinator.spawn_watch();
    let (stop_proxy, proxy_stopped) = tokio::sync::watch::channel(false);
    let mut proxies = Vec::new();
    let mut listeners = Vec::new();
    if let Some(port) = args.llm_proxy() {
        let l = bounded::bind_to_device("llm proxy", &cfg.bridge, manager.bridge_address(), port)?;
        listeners.push((l, drums_coordinator::Listener::Bridge, PROXY_BRIDGE_BOUNDS));
    }
    if let Some(at) = args.llm_proxy_local()? {
        // Another drumsd (another state directory) may hold the address: this
        // one still serves everything else, and says so.
        match bounded::bind_local("llm proxy", at) {
            Ok(l) => {
                if let Ok(a) = l.local_addr() {
                    coordinator.listening_locally(a);
                }
                listeners.push((l, drums_coordinator::Listener::Local, PROXY_LOCAL_BOUNDS))
            }
            Err(e) => warn!("llm proxy: not listening on {at}: {}", error_chain(&e)),
        }
    }
    for (l, which, bounds) in listeners {
        let at = l.local_addr().ok();
        let c = coordinator.clone();
        let make = move |peer: std::net::SocketAddr| {
            let c = c.clone();
            hyper::service::service_fn(move |req| {
                let c = c.clone();
                async move { Ok::<_, std::convert::Infallible>(c.handle(req, peer, which).await) }
            })
        };
        let mut stopped = proxy_stopped.clone();
        proxies.push(tokio::spawn(bounded::serve(
            l,
            "llm proxy",
            bounds,
            make,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        )));
        info!(address = ?at, "llm proxy ready");
    }

    // Warm pools refill once the manager has swept and adopted what a
    // previous daemon left (docs/pools.md).
    let pools = drums_session::pools::Pools::start(manager.clone())
        .await
        .map_err(DaemonError::StartPools)?;
    let app = server::router(manager.clone(), coordinator.clone(), pools.clone());
    // Followers of `drums inspect` would hold a graceful shutdown open forever.
    // Nor would takes waiting on an empty pool, for their timeout.
    let (m, p) = (manager.clone(), pools.clone());
    let shutdown = async move {
        shutdown.await;
        m.end_turn_streams();
        p.end_takes();
    };
    let serve = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let served = serve.await.map_err(DaemonError::Serve);
    if let Some((api, mut task)) = session_api {
        let _ = stop_sessions_api.send(());
        // A session may hold a connection open (a slow request, on purpose):
        // it does not get to keep drumsd from stopping.
        match tokio::time::timeout(SESSION_API_DRAIN, &mut task).await {
            Ok(Ok(Err(e))) => warn!("session api: {e}"),
            Ok(Err(e)) => warn!("session api task: {e}"),
            Ok(Ok(Ok(()))) => {}
            Err(_) => {
                warn!("session api: connections still open after {SESSION_API_DRAIN:?}, closed");
                task.abort();
            }
        }
        // Rollbacks already answered finish before the sessions go.
        api.drain().await;
    }
    // Before the sessions go: their processes dying is no failure to recover.
    watch.abort();
    let _ = stop_proxy.send(true);
    for p in proxies {
        if let Ok(Err(e)) = p.await {
            warn!("llm proxy: {e}");
        }
    }
    // Before the sessions go: a refill would restore members into a daemon
    // that is removing them. The pools stay recorded and refill at the next
    // start.
    pools.shutdown().await;
    info!("shutting down: removing every session");
    let _ = std::fs::remove_file(&socket);
    if let Err(e) = manager.shutdown().await {
        warn!("shutdown: {}", error_chain(&e));
    }
    if let Some(k) = ksm {
        k.restore();
    }
    served
}

/// The LLM proxy's bounds for sessions: an agent may run many model calls
/// at once, and a model's answer takes as long as it takes.
const PROXY_BRIDGE_BOUNDS: bounded::Bounds = bounded::Bounds {
    per_address: 64,
    header_timeout: std::time::Duration::from_secs(10),
    lifetime: None,
};

/// For agents on the host, which are trusted as much as their user.
const PROXY_LOCAL_BOUNDS: bounded::Bounds = bounded::Bounds {
    per_address: 4096,
    header_timeout: std::time::Duration::from_secs(10),
    lifetime: None,
};

fn check_socket(socket: &Path) -> Result<(), DaemonError> {
    if socket.exists() {
        // A live daemon answers; a socket file nobody listens on is stale.
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(DaemonError::SocketInUse(socket.to_owned()));
        }
        std::fs::remove_file(socket).map_err(io("remove stale socket", socket))?;
    }
    Ok(())
}

fn bind(socket: &Path) -> Result<UnixListener, DaemonError> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    }
    let l = UnixListener::bind(socket).map_err(io("bind", socket))?;
    // Root only: the API can run anything as root inside a session.
    std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io("chmod", socket))?;
    Ok(l)
}

fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, DaemonError> {
    use tokio::signal::unix::{signal, SignalKind};
    let installed = |signal| move |source| DaemonError::Signal { signal, source };
    let mut term = signal(SignalKind::terminate()).map_err(installed("SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(installed("SIGINT"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    })
}

/// drumsd's program: parse the command line, start tracing, run. Here, not
/// in main.rs, so that the daemon's code is compiled once, in this crate.
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let failed = match cli.command {
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(DaemonError::Runtime)
            .and_then(|rt| rt.block_on(run(cli.daemon)))
            .err()
            .map(|e| drums_api::error_chain(&e)),
        Some(Command::Image(config::ImageCommand::Build { name, mirror })) => {
            server::build_image(&cli.daemon, &name, mirror)
                .err()
                .map(|e| drums_api::error_chain(&e))
        }
    };
    match failed {
        Some(why) => {
            eprintln!("drumsd: {why}");
            std::process::ExitCode::FAILURE
        }
        None => std::process::ExitCode::SUCCESS,
    }
}
