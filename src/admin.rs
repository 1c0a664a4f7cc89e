//! The admin HTTP listener: `GET /metrics`, `/healthz` and `/readyz`, and
//! the DLT console under `/console` when `admin.console` is on.
//!
//! Owns the HTTP/1 side of operations: `hyper`'s server, one request per
//! connection (answered with `Connection: close`), routed to a few fixed
//! bodies or handed to the [`Console`]. It never touches the data path; it
//! only renders [`Metrics`] and reads a readiness flag.
//!
//! Robustness: a peer can only cost us a bounded amount. The request head is
//! at most [`MAX_HEAD`] bytes (hyper answers 431 above it) and must arrive
//! within [`READ_TIMEOUT`] (hyper closes the connection otherwise); a whole
//! connection, the response write included, ends after
//! [`CONNECTION_TIMEOUT`]; at most [`MAX_CONNECTIONS`] are served at once
//! (others wait in the accept queue). A request hyper cannot parse gets its
//! 400; nothing a peer sends can panic the server.
//!
//! - `/healthz`: 200 while the process runs (liveness).
//! - `/readyz`: 200 once the proxy's [`Readiness`] says so, else 503.
//! - `/metrics`: the Prometheus text format (0.0.4).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::HostPort;
use crate::console::Console;
use crate::metrics::Metrics;

/// Largest request head (request line and headers) accepted. hyper's
/// smallest allowed read buffer, which is also what the hand-written server
/// this replaced allowed.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a peer may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may last, head, routing and response write
/// included: a peer that stops reading cannot hold a task longer.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Why the admin listener could not run.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin listener: cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Why one admin connection ended early (logged at debug, never fatal).
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("connection lasted longer than {CONNECTION_TIMEOUT:?}")]
    TimedOut,
}

/// Whatever says whether the proxy is ready for `/readyz`.
///
/// Implemented for `AtomicBool` (true = ready), so `Arc<AtomicBool>` works
/// as is; the proxy implements it for its shared state (ready = upstream
/// metadata fetched and the dead-letter ledger rebuilt).
pub trait Readiness: Send + Sync + 'static {
    fn is_ready(&self) -> bool;
}

impl Readiness for AtomicBool {
    fn is_ready(&self) -> bool {
        self.load(Ordering::SeqCst)
    }
}

/// Bind `addr` (e.g. `127.0.0.1:9100` from `admin.listen`); the proxy binds
/// before it starts, so a bad address fails start-up.
pub async fn bind(addr: &HostPort) -> Result<TcpListener, AdminError> {
    TcpListener::bind((addr.host.as_str(), addr.port))
        .await
        .map_err(|source| AdminError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serve on an already bound listener until `shutdown` is cancelled.
pub async fn serve_listener<R: Readiness + ?Sized>(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<R>,
    console: Option<Arc<Console>>,
    shutdown: CancellationToken,
) {
    if let Ok(a) = listener.local_addr() {
        let console = match &console {
            Some(c) if c.actions() => ", /console with actions",
            Some(_) => ", /console (read-only)",
            None => "",
        };
        info!(addr = %a, "serving admin endpoints (/metrics, /healthz, /readyz{console})");
    }
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let metrics = metrics.clone();
                let ready = ready.clone();
                let console = console.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(tcp, metrics, ready, console).await {
                        debug!(%peer, error = %e, "admin connection ended");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serve one connection: one request, then close.
async fn handle<R: Readiness + ?Sized>(
    tcp: TcpStream,
    metrics: Arc<Metrics>,
    ready: Arc<R>,
    console: Option<Arc<Console>>,
) -> Result<(), ConnectionError> {
    let service = service_fn(move |req: Request<Incoming>| {
        let path = req.uri().path();
        let console = console
            .clone()
            .filter(|_| path == "/console" || path.starts_with("/console/"));
        let resp = match console {
            Some(_) => None,
            None => Some(route(req.method(), path, &metrics, &*ready)),
        };
        async move {
            match (resp, console) {
                (Some(r), _) => Ok::<_, Infallible>(r),
                (None, Some(c)) => Ok(c.serve(req).await),
                (None, None) => Ok(text(StatusCode::NOT_FOUND, "not found\n")),
            }
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .serve_connection(TokioIo::new(tcp), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(ConnectionError::TimedOut),
    }
}

fn route<R: Readiness + ?Sized>(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    ready: &R,
) -> Response<Full<Bytes>> {
    // hyper leaves the body out of a HEAD response itself.
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    match path {
        "/metrics" => response(
            StatusCode::OK,
            crate::metrics::CONTENT_TYPE,
            metrics.render().into(),
        ),
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if ready.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: upstream metadata not fetched yet\n",
        ),
        "/" => text(
            StatusCode::OK,
            "antidote admin: /metrics /healthz /readyz\n",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    response(status, "text/plain", Bytes::from_static(body.as_bytes()))
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start() -> (SocketAddr, Arc<Metrics>, Arc<AtomicBool>, CancellationToken) {
        let listener = bind(&HostPort {
            host: "127.0.0.1".into(),
            port: 0,
        })
        .await
        .unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        let ready = Arc::new(AtomicBool::new(false));
        let shutdown = CancellationToken::new();
        tokio::spawn(serve_listener(
            listener,
            metrics.clone(),
            ready.clone(),
            None,
            shutdown.clone(),
        ));
        (addr, metrics, ready, shutdown)
    }

    /// Send `request`, read until the server closes; the head is lowercased
    /// (hyper writes header names in lowercase).
    async fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        match text.split_once("\r\n\r\n") {
            Some((head, body)) => format!("{}\r\n\r\n{body}", head.to_ascii_lowercase()),
            None => text,
        }
    }

    fn status(resp: &str) -> &str {
        resp.split(' ').nth(1).unwrap_or("")
    }

    fn body(resp: &str) -> &str {
        resp.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics() {
        let (addr, metrics, ready, shutdown) = start().await;
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!((status(&r), body(&r)), ("200", "ok\n"), "{r}");
        assert!(r.contains("connection: close\r\n"), "{r}");
        assert!(r.contains("cache-control: no-store\r\n"), "{r}");
        let r = raw(addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
        assert_eq!(
            (status(&r), body(&r)),
            ("503", "not ready: upstream metadata not fetched yet\n")
        );
        ready.store(true, Ordering::SeqCst);
        let r = raw(addr, b"GET /readyz HTTP/1.0\r\n\r\n").await;
        assert_eq!((status(&r), body(&r)), ("200", "ready\n"), "{r}");
        metrics.record_validated("geo", 2, "p", 7);
        let r = raw(addr, b"GET /metrics?x=1 HTTP/1.1\r\nAccept: */*\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        assert!(
            r.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{r}"
        );
        assert!(
            r.contains(
                "antidote_records_validated_total{topic=\"geo\",partition=\"2\",policy=\"p\"} 7\n"
            ),
            "{r}"
        );
        let len: usize = r
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body(&r).len());
        let r = raw(addr, b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(r.ends_with("\r\n\r\n"), "HEAD has no body: {r}");
        let r = raw(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert_eq!(body(&r), "antidote admin: /metrics /healthz /readyz\n");
        // Absolute-form targets are allowed by HTTP/1.1.
        let r = raw(addr, b"GET http://h:9/readyz HTTP/1.1\r\n\r\n").await;
        assert_eq!((status(&r), body(&r)), ("200", "ready\n"), "{r}");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn garbage_gets_an_error_not_a_panic() {
        let (addr, _m, _r, shutdown) = start().await;
        let r = raw(addr, b"GET /nope HTTP/1.1\r\n\r\n").await;
        assert_eq!((status(&r), body(&r)), ("404", "not found\n"));
        // No console unless admin.console is on.
        let r = raw(addr, b"GET /console/api/overview HTTP/1.1\r\n\r\n").await;
        assert_eq!((status(&r), body(&r)), ("404", "not found\n"));
        let r = raw(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!((status(&r), body(&r)), ("405", "only GET and HEAD\n"));
        assert_eq!(status(&raw(addr, b"\x00\x01\x02\xff\r\n\r\n").await), "400");
        assert_eq!(status(&raw(addr, b"GET\r\n\r\n").await), "400");
        // A head that never ends is cut off at MAX_HEAD.
        let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD * 2));
        assert_eq!(status(&raw(addr, &big).await), "431");
        // Half a request then close: no answer, and the server lives on.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        s.shutdown().await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        assert_eq!(
            status(&raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await),
            "200"
        );
        shutdown.cancel();
    }

    /// A peer that sends nothing, or drips its head a byte a second, is
    /// disconnected once READ_TIMEOUT has passed.
    #[tokio::test]
    async fn a_silent_or_dripping_peer_is_cut_off() {
        let (addr, _m, _r, shutdown) = start().await;
        let silent = async {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut out = Vec::new();
            let started = std::time::Instant::now();
            let _ = s.read_to_end(&mut out).await;
            started.elapsed()
        };
        let dripping = async {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let started = std::time::Instant::now();
            s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if s.write_all(b"X").await.is_err() || started.elapsed() > READ_TIMEOUT * 3 {
                    break;
                }
                let mut b = [0u8; 1];
                if let Ok(Ok(0)) =
                    tokio::time::timeout(Duration::from_millis(1), s.read(&mut b)).await
                {
                    break;
                }
            }
            started.elapsed()
        };
        let (a, b) = tokio::join!(silent, dripping);
        for t in [a, b] {
            assert!(
                t >= READ_TIMEOUT && t < READ_TIMEOUT * 2,
                "cut off after {t:?}"
            );
        }
        shutdown.cancel();
    }
}
