//! Where requests go: one upstream per API style, over HTTP or HTTPS.

use std::str::FromStr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::http::uri::{Authority, Scheme};
use hyper::{HeaderMap, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The two API families the proxy knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `/v1/chat/completions`, `/v1/responses`.
    OpenAi,
    /// `/v1/messages`.
    Anthropic,
}

impl Style {
    pub fn as_str(self) -> &'static str {
        match self {
            Style::OpenAi => "openai",
            Style::Anthropic => "anthropic",
        }
    }

    /// The style of a request, and whether it asks a model for an answer (a
    /// turn boundary). Paths of neither family go to the style their headers
    /// name: Anthropic's SDK always sends `anthropic-version`.
    pub fn of(method: &hyper::Method, path: &str, headers: &HeaderMap) -> (Style, bool) {
        let post = method == hyper::Method::POST;
        match path {
            "/v1/chat/completions" | "/v1/responses" => (Style::OpenAi, post),
            "/v1/messages" => (Style::Anthropic, post),
            _ if headers.contains_key("anthropic-version") => (Style::Anthropic, false),
            _ => (Style::OpenAi, false),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {0:?}: expected STYLE=URL, STYLE one of openai, anthropic")]
    Spec(String),
    #[error("upstream {spec:?}: {why}")]
    Url { spec: String, why: String },
}

/// One upstream's base: scheme, host and an optional path prefix that
/// request paths are appended to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    scheme: Scheme,
    authority: Authority,
    prefix: String,
}

impl Base {
    /// The upstream URI of a request for `path_and_query`.
    pub fn join(&self, path_and_query: &str) -> Uri {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{path_and_query}", self.prefix))
            .build()
            .expect("a valid base and a path the server parsed")
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// `drumsd --llm-upstream STYLE=URL`, for each style.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstreams {
    pub openai: Option<Base>,
    pub anthropic: Option<Base>,
}

impl Upstreams {
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Upstreams, UpstreamError> {
        let mut u = Upstreams::default();
        for spec in specs {
            let spec = spec.as_ref();
            let (style, url) = spec
                .split_once('=')
                .ok_or_else(|| UpstreamError::Spec(spec.to_owned()))?;
            let base = parse_base(spec, url)?;
            match style {
                "openai" => u.openai = Some(base),
                "anthropic" => u.anthropic = Some(base),
                _ => return Err(UpstreamError::Spec(spec.to_owned())),
            }
        }
        Ok(u)
    }

    pub fn of(&self, style: Style) -> Option<&Base> {
        match style {
            Style::OpenAi => self.openai.as_ref(),
            Style::Anthropic => self.anthropic.as_ref(),
        }
    }
}

fn parse_base(spec: &str, url: &str) -> Result<Base, UpstreamError> {
    let bad = |why: &str| UpstreamError::Url {
        spec: spec.to_owned(),
        why: why.to_owned(),
    };
    let uri = Uri::from_str(url).map_err(|e| bad(&e.to_string()))?;
    let scheme = uri.scheme().cloned().ok_or_else(|| bad("no scheme"))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(bad("the scheme must be http or https"));
    }
    if uri.query().is_some() {
        return Err(bad("a base URL has no query"));
    }
    let authority = uri.authority().cloned().ok_or_else(|| bad("no host"))?;
    Ok(Base {
        scheme,
        authority,
        prefix: uri.path().trim_end_matches('/').to_owned(),
    })
}

pub type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The client for every upstream: HTTP, or HTTPS checked against the host's
/// CA certificates (rustls).
pub fn client() -> std::io::Result<HttpsClient> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(std::time::Duration::from_secs(10)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_parse_and_join() {
        let u = Upstreams::parse(&[
            "openai=http://127.0.0.1:9000/",
            "anthropic=https://example.org/proxy/",
        ])
        .unwrap();
        assert_eq!(
            u.openai
                .unwrap()
                .join("/v1/chat/completions?x=1")
                .to_string(),
            "http://127.0.0.1:9000/v1/chat/completions?x=1"
        );
        assert_eq!(
            u.anthropic.unwrap().join("/v1/messages").to_string(),
            "https://example.org/proxy/v1/messages"
        );
        for bad in [
            "openai",
            "other=http://x",
            "openai=ftp://x",
            "openai=x",
            "openai=http://x/?q",
        ] {
            assert!(Upstreams::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn styles_and_boundaries() {
        let h = HeaderMap::new();
        let post = hyper::Method::POST;
        assert_eq!(
            Style::of(&post, "/v1/chat/completions", &h),
            (Style::OpenAi, true)
        );
        assert_eq!(Style::of(&post, "/v1/responses", &h), (Style::OpenAi, true));
        assert_eq!(
            Style::of(&post, "/v1/messages", &h),
            (Style::Anthropic, true)
        );
        assert_eq!(
            Style::of(&hyper::Method::GET, "/v1/models", &h),
            (Style::OpenAi, false)
        );
        let mut a = HeaderMap::new();
        a.insert("anthropic-version", "2023-06-01".parse().unwrap());
        assert_eq!(
            Style::of(&post, "/v1/messages/count_tokens", &a),
            (Style::Anthropic, false)
        );
    }
}
