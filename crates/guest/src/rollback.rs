//! `GET /v1/versions` and `POST /v1/rollback`: the agent's rollback tool, for
//! processes inside the session (see docs/agent-tool.md).
//!
//! The agent cannot roll back the session it runs in: the versions, the
//! CRIU images and the snapshots are drumsd's, on the host. So it forwards
//! each call to drumsd's session API on the session's gateway (the bridge
//! address), which knows the caller by the connection's source address alone
//! and offers it nothing but its own session's versions. What the agent adds
//! is the way in: a process of the session reaches it on its unix socket,
//! as it reaches exec and files, without knowing drumsd's address or port.

use std::net::Ipv4Addr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use crate::error::ApiError;

/// The largest request body forwarded; a real one is a few dozen bytes.
pub const MAX_REQUEST: usize = 64 << 10;
/// The largest answer read from drumsd: a session keeps 8 versions plus the
/// pinned ones, a few KiB of JSON.
pub const MAX_ANSWER: usize = 1 << 20;
/// How long drumsd may take to answer. It answers a rollback before it
/// starts one, so this never waits for a restore.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Where drumsd's session API is: the port drumsd gave the session's init,
/// on the bridge address ([`drumsd_address`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionApi {
    pub port: Option<u16>,
}

pub fn router(api: SessionApi) -> Router {
    Router::new()
        .route("/v1/versions", get(versions))
        .route("/v1/rollback", post(rollback))
        .with_state(api)
}

async fn versions(State(api): State<SessionApi>) -> Result<Response, ApiError> {
    forward(api, Method::GET, "/v1/self/versions", None).await
}

async fn rollback(State(api): State<SessionApi>, req: Request) -> Result<Response, ApiError> {
    let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
    let body = axum::body::to_bytes(req.into_body(), MAX_REQUEST)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "bad_request",
                format!(
                    "the request body is larger than {MAX_REQUEST} bytes or could not be read: {e}"
                ),
            )
        })?;
    // drumsd checks the body (a JSON object, `to` a number or an id) and
    // answers with the error the caller should see.
    forward(
        api,
        Method::POST,
        "/v1/self/rollback",
        Some((body, content_type)),
    )
    .await
}

fn unsupported(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_supported",
        format!(
            "{why}: this session cannot reach drumsd's session API, so it cannot roll itself back; \
             the harness outside can, with drumsd's POST /v1/sessions/{{session}}/rollback"
        ),
    )
}

async fn forward(
    api: SessionApi,
    method: Method,
    path: &str,
    body: Option<(Bytes, Option<HeaderValue>)>,
) -> Result<Response, ApiError> {
    let Some(port) = api.port else {
        return Err(unsupported("drumsd serves no session API to this session"));
    };
    let routes = tokio::fs::read_to_string("/proc/net/route")
        .await
        .unwrap_or_default();
    let Some(gateway) = drumsd_address(&routes) else {
        return Err(unsupported("the session has no network (network: none)"));
    };
    let unavailable = |what: String| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "session_api_unavailable",
            format!("drumsd's session API at {gateway}:{port}: {what}"),
        )
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect((gateway, port))
            .await
            .map_err(|e| unavailable(format!("connect: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unavailable(format!("handshake: {e}")))?;
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, format!("{gateway}:{port}"));
        let bytes = match body {
            Some((bytes, content_type)) => {
                if let Some(ct) = content_type {
                    req = req.header(header::CONTENT_TYPE, ct);
                }
                bytes
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| unavailable(format!("build request: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unavailable(format!("request: {e}")))?;
        let status = resp.status();
        let answer = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| unavailable(format!("read the answer: {e}")))?
            .to_bytes();
        Ok::<_, ApiError>((status, answer))
    };
    let (status, answer) = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| unavailable(format!("no answer within {TIMEOUT:?}")))??;
    // drumsd's answers, errors included, are JSON bodies of the same shape
    // as the agent's own: passed on as they are.
    Ok((
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(answer),
    )
        .into_response())
}

/// Where drumsd is from inside the session, read from `/proc/net/route`'s
/// text: the gateway of the default route (a session with egress has one);
/// else the first address of the subnet of the session's link (one without
/// egress has only that route, and drums gives the bridge the subnet's first
/// address). `None` without either: a session with network `none`.
///
/// The kernel prints each address as the 32-bit word it stores in network
/// byte order, read as a native integer: its native bytes are the address.
pub fn drumsd_address(routes: &str) -> Option<Ipv4Addr> {
    const RTF_UP: u32 = 0x1;
    const RTF_GATEWAY: u32 = 0x2;
    struct Route {
        dest: u32,
        gateway: u32,
        flags: u32,
        mask: u32,
    }
    let routes: Vec<Route> = routes
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let hex = |i: usize| f.get(i).and_then(|s| u32::from_str_radix(s, 16).ok());
            (f.first() != Some(&"lo")).then_some(())?;
            Some(Route {
                dest: hex(1)?,
                gateway: hex(2)?,
                flags: hex(3)?,
                mask: hex(7)?,
            })
        })
        .filter(|r| r.flags & RTF_UP != 0)
        .collect();
    let addr = |word: u32| Ipv4Addr::from(word.to_ne_bytes());
    let default = routes
        .iter()
        .find(|r| r.dest == 0 && r.mask == 0 && r.flags & RTF_GATEWAY != 0 && r.gateway != 0);
    if let Some(r) = default {
        return Some(addr(r.gateway));
    }
    routes
        .iter()
        .find(|r| r.flags & RTF_GATEWAY == 0 && r.mask != 0)
        .map(|r| Ipv4Addr::from(u32::from(addr(r.dest & r.mask)) + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
    /// The link route of 10.213.0.0/16 on eth0.
    const LINK: &str = "eth0\t0000D50A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";

    #[cfg(target_endian = "little")]
    #[test]
    fn the_default_gateway_first() {
        let routes =
            format!("{HEADER}{LINK}eth0\t00000000\t0200D50A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n");
        assert_eq!(drumsd_address(&routes), Some(Ipv4Addr::new(10, 213, 0, 2)));
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn else_the_first_address_of_the_link() {
        let routes = format!("{HEADER}{LINK}");
        assert_eq!(drumsd_address(&routes), Some(Ipv4Addr::new(10, 213, 0, 1)));
    }

    #[test]
    fn no_network_no_address() {
        assert_eq!(drumsd_address(HEADER), None);
        assert_eq!(drumsd_address(""), None);
        let lo = format!("{HEADER}lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n");
        assert_eq!(drumsd_address(&lo), None);
    }
}
