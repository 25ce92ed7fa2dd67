//! Serving TCP to callers that are not trusted (sessions, on the bridge
//! address), within bounds per caller. axum's own `serve` has none: a
//! session could open connections until drumsd runs out of file
//! descriptors, or keep each one open forever sending nothing.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;
use tracing::warn;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Making the listener of one of drumsd's TCP services (`what`: "session
/// api", "llm proxy"); `at` is the address (and device) it was to listen on.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{what} socket")]
    Socket {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("SO_REUSEADDR for {at}")]
    ReuseAddr {
        at: String,
        #[source]
        source: std::io::Error,
    },
    #[error("SO_BINDTODEVICE for {at}")]
    BindDevice {
        at: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bind the {what} to {at}")]
    Bind {
        what: &'static str,
        at: String,
        #[source]
        source: std::io::Error,
    },
    #[error("listen on {at}")]
    Listen {
        at: String,
        #[source]
        source: std::io::Error,
    },
}

/// What one connection, and one caller, may hold.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Connections at once from one address; the next is closed as soon as
    /// it is accepted, unanswered.
    pub per_address: usize,
    /// How long a connection may take to send a request's headers.
    pub header_timeout: Duration,
    /// The longest a connection lives, whatever it does; none for answers
    /// that take as long as they take (a model's).
    pub lifetime: Option<Duration>,
}

/// Serve `listener` until `shutdown`, each connection with the service
/// `make(peer)` makes for it. At shutdown, connections still open are
/// closed.
pub async fn serve<M, S, B>(
    listener: TcpListener,
    what: &'static str,
    bounds: Bounds,
    make: M,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    M: Fn(SocketAddr) -> S,
    S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let open = Arc::new(Mutex::new(HashMap::new()));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of file descriptors, or a connection reset before it
                // was accepted: the listener itself is fine.
                Err(e) => {
                    warn!("{what}: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = Slot::take(&open, peer.ip(), bounds.per_address) else {
            continue; // dropped: closed at once
        };
        let _ = stream.set_nodelay(true);
        let service = make(peer);
        connections.spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(bounds.header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            match bounds.lifetime {
                Some(l) => {
                    let _ = tokio::time::timeout(l, connection).await;
                }
                None => {
                    let _ = connection.await;
                }
            }
        });
    }
    connections.shutdown().await;
    Ok(())
}

/// One of an address's connections, given back when dropped.
struct Slot {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Slot {
    fn take(open: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, max: usize) -> Option<Slot> {
        let mut map = open.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot {
            open: open.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// The listener of `what` on `addr:port`, bound to the device `bridge`, so
/// that nothing but what arrives through the bridge is accepted.
pub fn bind_to_device(
    what: &'static str,
    bridge: &str,
    addr: Ipv4Addr,
    port: u16,
) -> Result<TcpListener, BindError> {
    let addr = SocketAddr::from((addr, port));
    let at = format!("{addr} on {bridge}");
    let socket = TcpSocket::new_v4().map_err(|source| BindError::Socket { what, source })?;
    socket
        .bind_device(Some(bridge.as_bytes()))
        .map_err(|source| BindError::BindDevice {
            at: at.clone(),
            source,
        })?;
    listen(what, socket, addr, at, 128)
}

/// The listener of `what` on `addr`, on this host (the LLM proxy's, for agents
/// outside sessions).
pub fn bind_local(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|source| BindError::Socket { what, source })?;
    listen(what, socket, addr, addr.to_string(), 1024)
}

/// The steps both listeners share: reuse the address, bind, listen. `at`
/// names the address in errors.
fn listen(
    what: &'static str,
    socket: TcpSocket,
    addr: SocketAddr,
    at: String,
    backlog: u32,
) -> Result<TcpListener, BindError> {
    // A restarted drumsd binds again at once, over connections of the
    // previous one in TIME_WAIT.
    socket
        .set_reuseaddr(true)
        .map_err(|source| BindError::ReuseAddr {
            at: at.clone(),
            source,
        })?;
    socket.bind(addr).map_err(|source| BindError::Bind {
        what,
        at: at.clone(),
        source,
    })?;
    socket
        .listen(backlog)
        .map_err(|source| BindError::Listen { at, source })
}
