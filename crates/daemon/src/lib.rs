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
pub mod request_id;
pub mod server;
pub mod session_api;

pub use config::{Cli, Command, DaemonArgs};

use std::sync::Arc;

use anyhow::Context;
use drums_session::Manager;
use tokio::net::UnixListener;
use tracing::{info, warn};

/// How long drumsd's stop waits for the session API's open connections.
const SESSION_API_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Run the daemon until SIGTERM or SIGINT, then remove every session and the
/// daemon's own resources.
pub async fn run(args: DaemonArgs) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM that arrives while the manager starts (the
    // sweep can take seconds) is kept, and ends the daemon cleanly once it
    // serves, instead of killing it with the store still mounted.
    let shutdown = shutdown_signal()?;
    let cfg = args.manager_config()?;
    std::fs::create_dir_all(&cfg.state_dir)
        .with_context(|| format!("create state directory {}", cfg.state_dir.display()))?;
    // Root's alone: it holds images with setuid programs, the catalog, CRIU
    // images (code that runs as root) and the sessions' files.
    std::fs::set_permissions(
        &cfg.state_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .with_context(|| format!("chmod 0700 {}", cfg.state_dir.display()))?;
    let _lock = lock::acquire(&cfg.state_dir)?;
    // Restored process trees (and each session's PID 1, once drums-init's stage 0
    // exits) become our children, so we can reap them.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl PR_SET_CHILD_SUBREAPER");
    }
    let socket = args.socket_path();
    check_socket(&socket)?;
    let manager = Arc::new(
        Manager::start(cfg.clone())
            .await
            .map_err(|e| anyhow::anyhow!(drums_api::error_chain(&e)))
            .context("start session manager")?,
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
            let l = bounded::bind_to_device(&cfg.bridge, manager.bridge_address(), port)?;
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
        .context("the coordinator's journal")?;
    let coordinator = drums_coordinator::Coordinator::new(
        manager.clone(),
        upstreams,
        Arc::new(journal),
        args.turn_policy,
        args.coordinator_limits()?,
    )
    .context("the LLM proxy's upstream client")?;
    let watch = coordinator.spawn_watch();
    let (stop_proxy, proxy_stopped) = tokio::sync::watch::channel(false);
    let mut proxies = Vec::new();
    let mut listeners = Vec::new();
    if let Some(port) = args.llm_proxy() {
        let l = bounded::bind_to_device(&cfg.bridge, manager.bridge_address(), port)?;
        listeners.push((l, drums_coordinator::Listener::Bridge, PROXY_BRIDGE_BOUNDS));
    }
    if let Some(at) = args.llm_proxy_local()? {
        // Another drumsd (another state directory) may hold the address: this
        // one still serves everything else, and says so.
        match bind_local(at) {
            Ok(l) => listeners.push((l, drums_coordinator::Listener::Local, PROXY_LOCAL_BOUNDS)),
            Err(e) => warn!("llm proxy: not listening on {at}: {e:#}"),
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
        .map_err(|e| anyhow::anyhow!(drums_api::error_chain(&e)))
        .context("start warm pools")?;
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
    let served = serve.await.context("serve api");
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
        warn!("shutdown: {}", drums_api::error_chain(&e));
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

fn bind_local(at: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let socket = if at.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .context("llm proxy socket")?;
    socket.set_reuseaddr(true).context("SO_REUSEADDR")?;
    socket
        .bind(at)
        .with_context(|| format!("bind the llm proxy to {at}"))?;
    socket
        .listen(1024)
        .with_context(|| format!("listen on {at}"))
}

fn check_socket(socket: &std::path::Path) -> anyhow::Result<()> {
    if socket.exists() {
        // A live daemon answers; a socket file nobody listens on is stale.
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            anyhow::bail!("another drumsd already listens on {}", socket.display());
        }
        std::fs::remove_file(socket)
            .with_context(|| format!("remove stale socket {}", socket.display()))?;
    }
    Ok(())
}

fn bind(socket: &std::path::Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let l = UnixListener::bind(socket).with_context(|| format!("bind {}", socket.display()))?;
    // Root only: the API can run anything as root inside a session.
    std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("chmod {}", socket.display()))?;
    Ok(l)
}

fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    })
}
