//! The admin HTTP listener: `GET /metrics`, `/healthz` and `/readyz`.
//!
//! Owns a deliberately tiny HTTP/1.1 server: one request per connection,
//! answered with `Connection: close`. It never touches the data path; it
//! only renders [`Metrics`] and reads a readiness flag. Scrapers and probes
//! need nothing more, and a hand-written server keeps a web framework out of
//! the proxy.
//!
//! Robustness: a peer can only cost us a bounded amount. The request head is
//! read up to [`MAX_HEAD`] bytes within [`READ_TIMEOUT`]; a write must finish
//! within [`WRITE_TIMEOUT`]; at most [`MAX_CONNECTIONS`] are served at once
//! (others wait in the accept queue). Garbage gets a 400 and the connection
//! closes; nothing a peer sends can panic the server.
//!
//! - `/healthz`: 200 while the process runs (liveness).
//! - `/readyz`: 200 once `ready` is true (upstream metadata fetched), else 503.
//! - `/metrics`: the Prometheus text format (0.0.4).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::HostPort;
use crate::metrics::Metrics;

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a peer may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing a response may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
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

/// Whatever says whether the proxy is ready for `/readyz`.
///
/// Implemented for `AtomicBool` (true = ready), so `Arc<AtomicBool>` works
/// as is; the proxy may instead implement it for its shared state and pass
/// that (e.g. ready = upstream metadata fetched and the dead-letter ledger
/// rebuilt).
pub trait Readiness: Send + Sync + 'static {
    fn is_ready(&self) -> bool;
}

impl Readiness for AtomicBool {
    fn is_ready(&self) -> bool {
        self.load(Ordering::SeqCst)
    }
}

/// Bind `addr` (e.g. `127.0.0.1:9100` from `admin.listen`).
pub async fn bind(addr: &HostPort) -> Result<TcpListener, AdminError> {
    TcpListener::bind((addr.host.as_str(), addr.port))
        .await
        .map_err(|source| AdminError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Bind `addr` and serve until `shutdown` is cancelled.
///
/// Intended call site: `proxy::run`, right after the bootstrap listener,
/// when `config.admin.listen` is set:
///
/// ```ignore
/// if let Some(addr) = shared.config.admin.listen.clone() {
///     let listener = admin::bind(&addr).await?; // fail start-up on a bad address
///     shared.tasks.spawn(admin::serve_listener(
///         listener, metrics::global().clone(), ready, shared.shutdown.clone()));
/// }
/// ```
///
/// where `ready` is an `Arc<AtomicBool>` set once upstream metadata has
/// been fetched (today `Shared::ready` is a plain `AtomicBool`: make it an
/// `Arc`, or implement [`Readiness`] for `Shared` and pass the `Arc<Shared>`).
pub async fn serve<R: Readiness + ?Sized>(
    addr: &HostPort,
    metrics: Arc<Metrics>,
    ready: Arc<R>,
    shutdown: CancellationToken,
) -> Result<(), AdminError> {
    let listener = bind(addr).await?;
    serve_listener(listener, metrics, ready, shutdown).await;
    Ok(())
}

/// Serve on an already bound listener until `shutdown` is cancelled.
pub async fn serve_listener<R: Readiness + ?Sized>(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<R>,
    shutdown: CancellationToken,
) {
    if let Ok(a) = listener.local_addr() {
        info!(addr = %a, "serving admin endpoints (/metrics, /healthz, /readyz)");
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
                tokio::spawn(async move {
                    if let Err(e) = handle(tcp, &metrics, &*ready).await {
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

/// A parsed request line; headers are read and ignored.
#[derive(Debug, PartialEq, Eq)]
struct RequestLine {
    method: String,
    path: String,
}

/// What reading the request head produced.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    Request(RequestLine),
    TooLarge,
    Malformed,
}

async fn handle<R: Readiness + ?Sized>(
    mut tcp: TcpStream,
    metrics: &Metrics,
    ready: &R,
) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut tcp)).await {
        Ok(r) => r?,
        Err(_) => {
            let resp = response(
                408,
                "Request Timeout",
                "text/plain",
                b"request timeout\n",
                false,
            );
            return write(&mut tcp, &resp).await;
        }
    };
    let resp = match head {
        Head::TooLarge => response(
            431,
            "Request Header Fields Too Large",
            "text/plain",
            b"request head too large\n",
            false,
        ),
        Head::Malformed => response(400, "Bad Request", "text/plain", b"bad request\n", false),
        Head::Request(req) => route(&req, metrics, ready),
    };
    write(&mut tcp, &resp).await
}

async fn write(tcp: &mut TcpStream, resp: &[u8]) -> std::io::Result<()> {
    match tokio::time::timeout(WRITE_TIMEOUT, async {
        tcp.write_all(resp).await?;
        tcp.flush().await?;
        tcp.shutdown().await
    })
    .await
    {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "admin response write timed out",
        )),
    }
}

/// Read until the blank line that ends the head, at most `MAX_HEAD` bytes.
async fn read_head(tcp: &mut TcpStream) -> std::io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_head_end(&buf) {
            return Ok(parse_head(&buf[..end]));
        }
        if buf.len() >= MAX_HEAD {
            return Ok(Head::TooLarge);
        }
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            // Peer closed before a full head: answer what we can.
            return Ok(if buf.is_empty() {
                Head::Malformed
            } else {
                parse_head(&buf)
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

fn parse_head(head: &[u8]) -> Head {
    let Ok(text) = std::str::from_utf8(head) else {
        return Head::Malformed;
    };
    let line = text.lines().next().unwrap_or("").trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Head::Malformed;
    };
    if !version.starts_with("HTTP/1.")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
    {
        return Head::Malformed;
    }
    // Absolute-form targets (`http://host/metrics`) are allowed by HTTP/1.1.
    let path = match target.find("://") {
        Some(i) => target[i + 3..]
            .find('/')
            .map_or("/", |j| &target[i + 3 + j..]),
        None => target,
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Head::Malformed;
    }
    Head::Request(RequestLine {
        method: method.to_string(),
        path: path.to_string(),
    })
}

fn route<R: Readiness + ?Sized>(req: &RequestLine, metrics: &Metrics, ready: &R) -> Vec<u8> {
    let head_only = req.method == "HEAD";
    if req.method != "GET" && !head_only {
        return response(
            405,
            "Method Not Allowed",
            "text/plain",
            b"only GET and HEAD\n",
            false,
        );
    }
    match req.path.as_str() {
        "/metrics" => {
            let body = metrics.render();
            response(
                200,
                "OK",
                crate::metrics::CONTENT_TYPE,
                body.as_bytes(),
                head_only,
            )
        }
        "/healthz" => response(200, "OK", "text/plain", b"ok\n", head_only),
        "/readyz" => {
            if ready.is_ready() {
                response(200, "OK", "text/plain", b"ready\n", head_only)
            } else {
                response(
                    503,
                    "Service Unavailable",
                    "text/plain",
                    b"not ready: upstream metadata not fetched yet\n",
                    head_only,
                )
            }
        }
        "/" => response(
            200,
            "OK",
            "text/plain",
            b"antidote admin: /metrics /healthz /readyz\n",
            head_only,
        ),
        _ => response(404, "Not Found", "text/plain", b"not found\n", head_only),
    }
}

fn response(code: u16, reason: &str, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

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
            shutdown.clone(),
        ));
        (addr, metrics, ready, shutdown)
    }

    async fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    fn status(resp: &str) -> &str {
        resp.split(' ').nth(1).unwrap_or("")
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics() {
        let (addr, metrics, ready, shutdown) = start().await;
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status(&r), "200", "{r}");
        assert!(r.contains("Connection: close\r\n"));
        assert_eq!(
            status(&raw(addr, b"GET /readyz HTTP/1.1\r\n\r\n").await),
            "503"
        );
        ready.store(true, Ordering::SeqCst);
        assert_eq!(
            status(&raw(addr, b"GET /readyz HTTP/1.0\r\n\r\n").await),
            "200"
        );
        metrics.record_validated("geo", 2, "p", 7);
        let r = raw(addr, b"GET /metrics?x=1 HTTP/1.1\r\nAccept: */*\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        assert!(r.contains("Content-Type: text/plain; version=0.0.4"));
        assert!(
            r.contains(
                "antidote_records_validated_total{topic=\"geo\",partition=\"2\",policy=\"p\"} 7\n"
            ),
            "{r}"
        );
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        let r = raw(addr, b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(r.ends_with("\r\n\r\n"), "HEAD has no body: {r}");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn garbage_gets_an_error_not_a_panic() {
        let (addr, _m, _r, shutdown) = start().await;
        assert_eq!(
            status(&raw(addr, b"GET /nope HTTP/1.1\r\n\r\n").await),
            "404"
        );
        assert_eq!(
            status(&raw(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await),
            "405"
        );
        assert_eq!(status(&raw(addr, b"\x00\x01\x02\xff\r\n\r\n").await), "400");
        assert_eq!(status(&raw(addr, b"GET\r\n\r\n").await), "400");
        assert_eq!(
            status(&raw(addr, b"get /metrics HTTP/1.1\r\n\r\n").await),
            "400"
        );
        assert_eq!(
            status(&raw(addr, b"GET metrics HTTP/1.1\r\n\r\n").await),
            "400"
        );
        // A head that never ends is cut off at MAX_HEAD.
        let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD * 2));
        assert_eq!(status(&raw(addr, &big).await), "431");
        // Half a request then close: still answered, and the server lives on.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        s.shutdown().await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
        assert_eq!(
            status(&raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await),
            "200"
        );
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (addr, _m, _r, shutdown) = start().await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(READ_TIMEOUT * 2, s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"));
        shutdown.cancel();
    }

    #[test]
    fn parses_absolute_form_targets() {
        assert_eq!(
            parse_head(b"GET http://h:9/readyz HTTP/1.1"),
            Head::Request(RequestLine {
                method: "GET".into(),
                path: "/readyz".into()
            })
        );
    }
}
