//! One HTTP/1.1 GET to a schema registry, over TCP or TLS (rustls, the
//! same connector as for brokers), with basic auth, a deadline covering
//! connect, request and body, and a bounded body: a registry answer is data
//! from the network and is never read past [`MAX_BODY`].
//!
//! A fresh connection per request: requests are rare (once per new schema
//! id, and per subject list every `cache_ttl`), so pooling would buy
//! nothing and keep sockets open to a registry that may go away.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::RegistryUrl;
use crate::transport::tls;

/// Largest registry answer read, in bytes (schemas are a few KiB).
pub const MAX_BODY: usize = 1 << 20;

/// Why a request got no usable answer. All of them mean "ask again later".
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("tls: {0}")]
    Tls(String),
    #[error("http: {0}")]
    Http(String),
    #[error("answer is over {MAX_BODY} bytes")]
    Oversized,
}

/// How to reach the registry: TLS connector and credentials.
#[derive(Clone)]
pub struct Client {
    pub tls: Option<tls::Upstream>,
    /// `Basic <base64(user:password)>`.
    pub authorization: Option<String>,
    pub timeout: Duration,
}

impl Client {
    pub fn new(tls: Option<tls::Upstream>, basic: Option<(&str, &str)>, timeout: Duration) -> Self {
        let authorization = basic.map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        });
        Client {
            tls,
            authorization,
            timeout,
        }
    }

    /// GET `path` (below the URL's base) from `url`: status and body.
    pub async fn get(&self, url: &RegistryUrl, path: &str) -> Result<(u16, Bytes), HttpError> {
        tokio::time::timeout(self.timeout, self.get_inner(url, path))
            .await
            .map_err(|_| HttpError::Timeout(self.timeout))?
    }

    async fn get_inner(&self, url: &RegistryUrl, path: &str) -> Result<(u16, Bytes), HttpError> {
        let tcp = TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(HttpError::Connect)?;
        let _ = tcp.set_nodelay(true);
        if url.tls {
            let Some(t) = &self.tls else {
                return Err(HttpError::Tls(
                    "an https:// URL needs schema_registry.tls".into(),
                ));
            };
            let name = t
                .server_name(&url.host)
                .map_err(|e| HttpError::Tls(e.to_string()))?;
            let stream = t
                .connector
                .connect(name, tcp)
                .await
                .map_err(|e| HttpError::Tls(e.to_string()))?;
            self.exchange(TokioIo::new(stream), url, path).await
        } else {
            self.exchange(TokioIo::new(tcp), url, path).await
        }
    }

    async fn exchange<S>(
        &self,
        io: S,
        url: &RegistryUrl,
        path: &str,
    ) -> Result<(u16, Bytes), HttpError>
    where
        S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let http = |e: hyper::Error| HttpError::Http(e.to_string());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(http)?;
        // The connection task ends with the exchange (or the deadline,
        // which drops the sender and so ends it too).
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = hyper::Request::get(format!("{}{path}", url.base))
            .header(hyper::header::HOST, format!("{}:{}", url.host, url.port))
            .header(
                hyper::header::ACCEPT,
                "application/vnd.schemaregistry.v1+json, application/json",
            );
        if let Some(a) = &self.authorization {
            req = req.header(hyper::header::AUTHORIZATION, a);
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| HttpError::Http(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(http)?;
        let status = resp.status().as_u16();
        if resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n > MAX_BODY)
        {
            return Err(HttpError::Oversized);
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    HttpError::Oversized
                } else {
                    HttpError::Http(e.to_string())
                }
            })?
            .to_bytes();
        Ok((status, body))
    }
}
