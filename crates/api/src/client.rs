//! A small HTTP/1.1 client over a unix socket: one connection per request, which
//! costs tens of microseconds on a local socket and keeps no state to go stale.

use std::path::{Path, PathBuf};

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
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Client {
        Client {
            socket: socket.into(),
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
        let path = &self.socket;
        let stream = UnixStream::connect(path)
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
        resp.into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| ClientError::Body {
                path: self.socket.clone(),
                source: Box::new(e),
            })
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
