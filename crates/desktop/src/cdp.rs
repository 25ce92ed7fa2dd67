//! A small Chrome DevTools Protocol client: the HTTP `/json` endpoints and
//! request/response calls over one target's WebSocket. Events are skipped;
//! the few waits drums needs are expressed as promises evaluated in the page
//! (`awaitPromise`), which the browser resolves when the event happens.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::DesktopError;

/// A CDP call may wait for a page load; longer than this means the browser
/// is wedged.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One entry of `/json/list`.
#[derive(Debug, Clone, Deserialize)]
pub struct Target {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub url: String,
    #[serde(rename = "webSocketDebuggerUrl", default)]
    pub ws_url: String,
}

/// `GET http://{host}:{port}{path}` as JSON. The host is 127.0.0.1 inside
/// the session; drumsd's tests reach a session's socat at its address.
pub async fn get_json(host: &str, port: u16, path: &str) -> Result<Value, DesktopError> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        DesktopError::Cdp(format!("GET {path} on {host}:{port}: {what}: {e}"))
    };
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| err("connect", &e))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| err("handshake", &e))?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", format!("{host}:{port}"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| err("request", &e))?;
    let resp = tokio::time::timeout(CALL_TIMEOUT, send.send_request(req))
        .await
        .map_err(|e| err("response", &e))?
        .map_err(|e| err("response", &e))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| err("body", &e))?
        .to_bytes();
    if !status.is_success() {
        return Err(err("status", &status));
    }
    serde_json::from_slice(&body).map_err(|e| err("json", &e))
}

/// The page targets (tabs), in the browser's order.
pub async fn pages(host: &str, port: u16) -> Result<Vec<Target>, DesktopError> {
    let list: Vec<Target> = serde_json::from_value(get_json(host, port, "/json/list").await?)
        .map_err(|e| DesktopError::Cdp(format!("/json/list: {e}")))?;
    Ok(list.into_iter().filter(|t| t.kind == "page").collect())
}

/// The browser-wide endpoint (for `Target.*` and `Storage.*`).
pub async fn browser(host: &str, port: u16) -> Result<Connection, DesktopError> {
    let v = get_json(host, port, "/json/version").await?;
    let url = v["webSocketDebuggerUrl"]
        .as_str()
        .ok_or_else(|| DesktopError::Cdp("/json/version has no webSocketDebuggerUrl".into()))?;
    Connection::open(url).await
}

/// Events kept while waiting for a call's answer, for a later
/// [`Connection::next_event`]; beyond this the oldest are dropped.
const MAX_BUFFERED_EVENTS: usize = 1024;

/// One WebSocket to a target.
pub struct Connection {
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Events that arrived while a call waited for its answer.
    events: std::collections::VecDeque<Value>,
}

impl Connection {
    pub async fn open(url: &str) -> Result<Connection, DesktopError> {
        let (ws, _) = tokio::time::timeout(CALL_TIMEOUT, tokio_tungstenite::connect_async(url))
            .await
            .map_err(|_| DesktopError::Cdp(format!("connect {url}: timed out")))?
            .map_err(|e| DesktopError::Cdp(format!("connect {url}: {e}")))?;
        Ok(Connection {
            ws,
            next_id: 1,
            events: Default::default(),
        })
    }

    /// Sends `method` and returns its `result`, or the protocol's error.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, DesktopError> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws
            .send(Message::Text(msg.into()))
            .await
            .map_err(|e| DesktopError::Cdp(format!("{method}: send: {e}")))?;
        let reply = tokio::time::timeout(CALL_TIMEOUT, async {
            while let Some(frame) = self.ws.next().await {
                let frame = frame.map_err(|e| DesktopError::Cdp(format!("{method}: {e}")))?;
                let Message::Text(text) = frame else { continue };
                let v: Value = serde_json::from_str(text.as_str())
                    .map_err(|e| DesktopError::Cdp(format!("{method}: bad reply: {e}")))?;
                if v["id"].as_u64() == Some(id) {
                    return Ok(v);
                }
                if v.get("method").is_some() {
                    if self.events.len() == MAX_BUFFERED_EVENTS {
                        self.events.pop_front();
                    }
                    self.events.push_back(v);
                }
            }
            Err(DesktopError::Cdp(format!(
                "{method}: the browser closed the connection"
            )))
        })
        .await
        .map_err(|_| DesktopError::Cdp(format!("{method}: no answer within {CALL_TIMEOUT:?}")))??;
        if let Some(e) = reply.get("error") {
            return Err(DesktopError::Cdp(format!("{method}: {e}")));
        }
        Ok(reply["result"].clone())
    }

    /// `Runtime.evaluate` returning the value; a thrown exception is an error.
    pub async fn evaluate(&mut self, expression: &str) -> Result<Value, DesktopError> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await?;
        if let Some(ex) = r.get("exceptionDetails") {
            return Err(DesktopError::Cdp(format!("evaluate {expression:?}: {ex}")));
        }
        Ok(r["result"]["value"].clone())
    }

    /// Waits for the next event `method` whose params pass `pick`, looking
    /// first at the events that arrived while earlier calls waited.
    pub async fn next_event(
        &mut self,
        method: &str,
        pick: impl Fn(&Value) -> bool,
    ) -> Result<Value, DesktopError> {
        if let Some(i) = self
            .events
            .iter()
            .position(|v| v["method"] == method && pick(&v["params"]))
        {
            let v = self.events.remove(i).expect("index from position");
            return Ok(v["params"].clone());
        }
        let wait = async {
            while let Some(frame) = self.ws.next().await {
                let frame =
                    frame.map_err(|e| DesktopError::Cdp(format!("wait for {method}: {e}")))?;
                let Message::Text(text) = frame else { continue };
                let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
                    continue;
                };
                if v["method"] == method && pick(&v["params"]) {
                    return Ok(v["params"].clone());
                }
            }
            Err(DesktopError::Cdp(format!(
                "wait for {method}: the browser closed the connection"
            )))
        };
        tokio::time::timeout(CALL_TIMEOUT, wait)
            .await
            .map_err(|_| DesktopError::Cdp(format!("no {method} within {CALL_TIMEOUT:?}")))?
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}
