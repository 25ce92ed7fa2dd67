//! A small HTTP/1.1 client over a unix socket: one connection per request, which
//! costs tens of microseconds on a local socket and keeps no state to go stale.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;

use crate::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens on the socket (no daemon, or the session's guest is down).
    #[error("connect to {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("http exchange with {path}")]
    Http {
        path: PathBuf,
        #[source]
        source: hyper::Error,
    },
    #[error("read response from {path}")]
    Body {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("decode response from {path}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The peer did not answer within the client's time limit.
    #[error("{path} did not answer within {after:?}")]
    Timeout { path: PathBuf, after: Duration },
    /// The peer's answer was larger than the client accepts.
    #[error("response from {path} exceeds {max} bytes")]
    TooLarge { path: PathBuf, max: usize },
    /// The server answered with an error body.
    #[error("{message}")]
    Api {
        status: u16,
        kind: String,
        message: String,
    },
}

impl ClientError {
    pub fn kind(&self) -> Option<&str> {
        match self {
            ClientError::Api { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    /// The socket's path as shown in errors.
    socket: PathBuf,
    /// For a socket inside a session: the session's root as the host sees
    /// it, and the socket's path there, resolved inside that root at every
    /// connect (see [`Client::in_root`]).
    in_root: Option<(PathBuf, PathBuf)>,
    /// How long a request may take until its response headers, and reading
    /// a response body (see [`Client::with_limits`]).
    timeout: Option<Duration>,
    /// The largest response body [`Client::read_body`] reads.
    max_body: Option<usize>,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Client {
        Client {
            socket: socket.into(),
            in_root: None,
            timeout: None,
            max_body: None,
        }
    }

    /// A client of the socket at `rel` inside the tree rooted at `root`
    /// (`/proc/PID/root` of a session). Everything below `root` belongs to
    /// the session, so the path is resolved as the session would resolve it
    /// (`drums_sys::open_in_root`): a session that makes the socket a
    /// symlink to a host socket reaches nothing of the host's.
    pub fn in_root(root: impl Into<PathBuf>, rel: impl Into<PathBuf>) -> Client {
        let (root, rel) = (root.into(), rel.into());
        let mut c = Client::new(root.join(rel.strip_prefix("/").unwrap_or(&rel)));
        c.in_root = Some((root, rel));
        c
    }

    /// Bound what a peer can cost: `timeout` until response headers (and
    /// again for reading a body), `max_body` bytes of a body read whole. For
    /// peers that are not trusted, such as a session's guest agent.
    pub fn with_limits(mut self, timeout: Option<Duration>, max_body: Option<usize>) -> Client {
        self.timeout = timeout;
        self.max_body = max_body;
        self
    }

    async fn connect(&self) -> Result<UnixStream, std::io::Error> {
        match &self.in_root {
            None => UnixStream::connect(&self.socket).await,
            Some((root, rel)) => {
                let fd = drums_sys::open_in_root(root, rel, nix::fcntl::OFlag::O_PATH)?;
                // connect() through the O_PATH handle's /proc/self/fd link
                // reaches exactly the inode resolved above.
                let via = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
                let stream = UnixStream::connect(&via).await;
                drop(fd);
                stream
            }
        }
    }

    async fn limited<T, F: std::future::Future<Output = Result<T, ClientError>>>(
        &self,
        f: F,
    ) -> Result<T, ClientError> {
        match self.timeout {
            None => f.await,
            Some(after) => {
                tokio::time::timeout(after, f)
                    .await
                    .map_err(|_| ClientError::Timeout {
                        path: self.socket.clone(),
                        after,
                    })?
            }
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Send any request; the response body is left to the caller to stream.
    pub async fn send<B>(&self, req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.limited(self.send_unlimited(req)).await
    }

    async fn send_unlimited<B>(&self, req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = &self.socket;
        let stream = self
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                path: path.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| ClientError::Http {
                path: path.clone(),
                source,
            })?;
        // The connection task ends with the response body: when the caller drops
        // it, the socket closes, which is how a cancelled exec reaches the guest.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender
            .send_request(req)
            .await
            .map_err(|source| ClientError::Http {
                path: path.clone(),
                source,
            })
    }

    /// A request with an optional JSON body, expecting success.
    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "drums");
        let bytes = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(v).expect("API types always serialize"))
            }
            None => Bytes::new(),
        };
        let req = b
            .body(Full::new(bytes))
            .expect("static request parts are valid");
        let resp = self.send(req).await?;
        self.check(resp).await
    }

    /// A JSON request whose answer is JSON.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, ClientError> {
        let resp = self.call(method, uri, body).await?;
        let bytes = self.read_body(resp).await?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            path: self.socket.clone(),
            source,
        })
    }

    /// Turn an error status into [`ClientError::Api`].
    pub async fn check(&self, resp: Response<Incoming>) -> Result<Response<Incoming>, ClientError> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let bytes = self.read_body(resp).await?;
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => ClientError::Api {
                status: status.as_u16(),
                kind: e.error.kind,
                message: e.error.message,
            },
            Err(_) => ClientError::Api {
                status: status.as_u16(),
                kind: kind_of(status).into(),
                message: String::from_utf8_lossy(&bytes).trim().to_owned(),
            },
        })
    }

    pub async fn read_body(&self, resp: Response<Incoming>) -> Result<Bytes, ClientError> {
        let path = &self.socket;
        let read = async {
            match self.max_body {
                None => resp
                    .into_body()
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .map_err(|e| ClientError::Body {
                        path: path.clone(),
                        source: Box::new(e),
                    }),
                Some(max) => http_body_util::Limited::new(resp.into_body(), max)
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .map_err(|e| {
                        if e.is::<http_body_util::LengthLimitError>() {
                            ClientError::TooLarge {
                                path: path.clone(),
                                max,
                            }
                        } else {
                            ClientError::Body {
                                path: path.clone(),
                                source: e,
                            }
                        }
                    }),
            }
        };
        self.limited(read).await
    }
}

fn kind_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        404 => "not_found",
        409 => "conflict",
        _ => "internal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A peer that accepts, reads the request, then answers with `reply`
    /// (or never, for `None`).
    fn peer(listener: UnixListener, reply: Option<Vec<u8>>) {
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let reply = reply.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    match reply {
                        Some(r) => {
                            let _ = s.write_all(&r).await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
    }

    #[test]
    fn a_peer_that_never_answers_costs_the_timeout_and_no_more() {
        rt().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let sock = dir.path().join("s");
            peer(UnixListener::bind(&sock).unwrap(), None);
            let c = Client::new(&sock).with_limits(Some(Duration::from_millis(200)), None);
            let e = c
                .call(Method::GET, "/v1/health", None::<&()>)
                .await
                .unwrap_err();
            assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        });
    }

    #[test]
    fn a_body_over_the_cap_is_refused_not_read() {
        rt().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let sock = dir.path().join("s");
            let mut reply = b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n".to_vec();
            reply.extend(std::iter::repeat_n(b'x', 1_000_000));
            peer(UnixListener::bind(&sock).unwrap(), Some(reply));
            let c = Client::new(&sock).with_limits(Some(Duration::from_secs(10)), Some(1000));
            let e = c
                .json::<serde_json::Value>(Method::GET, "/v1/health", None::<&()>)
                .await
                .unwrap_err();
            assert!(matches!(e, ClientError::TooLarge { max: 1000, .. }), "{e}");
            // Under the cap, the same peer's answer is read.
            let c = Client::new(&sock).with_limits(None, Some(2_000_000));
            let r = c.call(Method::GET, "/", None::<&()>).await.unwrap();
            assert_eq!(c.read_body(r).await.unwrap().len(), 1_000_000);
        });
    }

    #[test]
    fn a_socket_inside_a_root_is_never_reached_through_a_symlink_out_of_it() {
        rt().block_on(async {
            let host = tempfile::tempdir().unwrap();
            let host_sock = host.path().join("host.sock");
            peer(
                UnixListener::bind(&host_sock).unwrap(),
                Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_vec()),
            );
            let root = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(root.path().join("run/drums")).unwrap();
            // Directly, the host's socket answers...
            let direct = Client::new(&host_sock);
            direct.call(Method::GET, "/", None::<&()>).await.unwrap();
            // ...but a session's symlink to it does not reach it.
            std::os::unix::fs::symlink(&host_sock, root.path().join("run/drums/guest.sock"))
                .unwrap();
            let c = Client::in_root(root.path(), "/run/drums/guest.sock");
            let e = c.call(Method::GET, "/", None::<&()>).await.unwrap_err();
            assert!(matches!(e, ClientError::Connect { .. }), "{e}");
            // A real socket inside the root is reached.
            std::fs::remove_file(root.path().join("run/drums/guest.sock")).unwrap();
            peer(
                UnixListener::bind(root.path().join("run/drums/guest.sock")).unwrap(),
                Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_vec()),
            );
            c.call(Method::GET, "/", None::<&()>).await.unwrap();
        });
    }
}
