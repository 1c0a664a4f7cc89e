//! Client connections: accepting them on the bootstrap and broker
//! listeners (within `limits.max_connections`), the TLS handshake and the
//! SNI route, the upstream connection, then the relay's pumps.
//!
//! A plain-TCP client gets its broker connection only once its first bytes
//! start a request the proxy knows (`first_request`): a connection that
//! sends garbage, or nothing, never makes the proxy open (and close) a
//! connection to a broker, so a flood of them costs the brokers nothing;
//! such refusals are warned of once a second at most (`REFUSALS`), so it
//! does not flood the log either.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn, Instrument};

use super::{relay, upstream, Shared, Target};
use crate::metrics;
use crate::transport::{net, tls};

/// Accept connections until shutdown. Boxed with an explicit `Send` bound:
/// listeners are opened from inside connections (as brokers appear), and the
/// compiler cannot see through that cycle of async types on its own.
pub(super) fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    target: Target,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(accept_connections(shared, listener, target))
}

async fn accept_connections(shared: Arc<Shared>, listener: TcpListener, target: Target) {
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let Some(slot) = shared.connections.try_acquire() else {
                    refuse(&shared, tcp);
                    continue;
                };
                let span = tracing::info_span!("conn", %peer, listener = ?target);
                let conn = shared.clone();
                shared.tasks.spawn(
                    async move {
                        // Held for the connection's life: frees its place.
                        let _slot = slot;
                        serve(conn, tcp, peer, target).await
                    }
                    .instrument(span),
                );
            }
            Err(e) => {
                // Usually EMFILE: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Close a connection over `limits.max_connections` at once (dropping it
/// resets nothing the client could wait on); count it, warn now and then.
/// Counted (and warned about, if due) before it is closed, so a client
/// that has seen the close finds its refusal in the metrics and the log.
fn refuse(shared: &Shared, tcp: TcpStream) {
    metrics::global().connection_refused();
    if let Some(n) = shared.connections.refused(std::time::Instant::now()) {
        warn!(
            refused = n,
            max = shared.config.limits.max_connections,
            "connection limit reached: new client connections are closed at once"
        );
    }
    drop(tcp);
}

/// Serve one client connection: TLS, upstream connection, relay.
async fn serve(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr, listener: Target) {
    let _ = tcp.set_nodelay(true);
    let Some((client, target)) = accept_client(&shared, tcp, listener).await else {
        return;
    };
    let label = match target {
        Target::Bootstrap => "bootstrap".to_string(),
        Target::Broker(n) => format!("broker-{n}"),
    };
    let _open = metrics::ConnectionGuard::new(metrics::global().clone(), label);
    let checked = match &client {
        net::Conn::Tcp(tcp) => first_request(&shared, tcp).await,
        // Behind TLS the handshake came first, and bytes cannot be peeked.
        net::Conn::Boxed(_) => Ok(()),
    };
    if let Err(why) = checked {
        return match why {
            Some(e) => match REFUSALS.admit(refusal_second()) {
                Some(not_logged) => warn!(%peer, error = %e, not_logged, "connection closed"),
                None => debug!(%peer, error = %e, "connection closed"),
            },
            None => debug!(%peer, "connection closed before its first request"),
        };
    }
    let broker = match upstream::connect(&shared, target).await {
        Ok(b) => b,
        Err(e) => {
            metrics::global().upstream_error("connect");
            return warn!(error = %e, "cannot reach upstream; closing client connection");
        }
    };
    debug!(%peer, ?target, "connected");
    let node = match target {
        Target::Bootstrap => -1,
        Target::Broker(n) => n,
    };
    match relay::relay(shared, client, broker, node).await {
        Ok(()) => debug!("connection closed"),
        Err(e) => {
            if matches!(
                e,
                relay::RelayError::BrokerFrame(_)
                    | relay::RelayError::BadResponse(_)
                    | relay::RelayError::BrokerClosed(_)
                    | relay::RelayError::BrokerWrite(_)
            ) {
                metrics::global().upstream_error("relay");
            }
            warn!(error = %e, "connection closed")
        }
    }
}

/// At most one warning a second for connections refused at their first
/// frame: a flood of garbage connections must not become a flood of log
/// lines (one each cost the proxy more than refusing them). The rest are
/// logged at debug level and counted into the next warning (`not_logged`).
static REFUSALS: Refusals = Refusals {
    second: AtomicU64::new(0),
    skipped: AtomicU64::new(0),
};

struct Refusals {
    /// The second (from [`refusal_second`]) of the last warning.
    second: AtomicU64,
    /// Refusals not warned of since then.
    skipped: AtomicU64,
}

impl Refusals {
    /// `Some(refusals not warned of since the last warning)` when this one
    /// is to be warned of (the first in second `now`), else `None` (counted).
    fn admit(&self, now: u64) -> Option<u64> {
        let last = self.second.load(Ordering::Relaxed);
        if now > last
            && (self.second)
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.skipped.swap(0, Ordering::Relaxed));
        }
        self.skipped.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Whole seconds since the first refusal's clock reading, from 1 (a
/// monotonic clock: a wall clock set back would silence the warnings).
fn refusal_second() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs()
        + 1
}

/// Wait (up to `limits.idle_timeout`) for the first 8 bytes of a plain-TCP
/// client's first frame, peeked rather than read, and check they start a
/// request the relay would take: a length within `limits.max_frame_bytes`
/// and an API key and version the proxy knows. `Err(Some(why))` for a
/// frame the relay would refuse anyway (the same one-line log), `Err(None)`
/// for a client gone, idle or shut down first.
async fn first_request(shared: &Shared, tcp: &TcpStream) -> Result<(), Option<String>> {
    const HEAD: usize = 8;
    let deadline = tokio::time::Instant::now() + shared.config.limits.idle_timeout;
    let mut head = [0u8; HEAD];
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        let peeked = tokio::select! {
            _ = shared.shutdown.cancelled() => return Err(None),
            p = tokio::time::timeout_at(deadline, tcp.peek(&mut head)) => p,
        };
        match peeked {
            Ok(Ok(HEAD..)) => break,
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(None),
            // Part of the head is in: peek returns at once while bytes wait,
            // so pause (2 ms, doubling to 256 ms: a client that stalls
            // mid-head costs a few wakeups a second) instead of spinning.
            Ok(Ok(_)) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(256));
            }
        }
    }
    let len = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let key = i16::from_be_bytes([head[4], head[5]]);
    let version = i16::from_be_bytes([head[6], head[7]]);
    let max = shared.config.limits.max_frame_bytes;
    if len < HEAD as i32 || len as u32 > max {
        return Err(Some(format!(
            "the client's first frame claims {len} bytes, not a request within limits.max_frame_bytes ({max})"
        )));
    }
    if !super::classify::is_known_request(key, version) {
        return Err(Some(format!(
            "the client's first frame is not a request: unknown api key {key} version {version}"
        )));
    }
    Ok(())
}

/// The client's stream (TLS when configured) and the target it goes to:
/// its listener's, or under SNI the one its server name stands for.
/// `None` (logged) when the handshake fails or the name is not served.
async fn accept_client(
    shared: &Shared,
    tcp: TcpStream,
    listener: Target,
) -> Option<(net::Conn, Target)> {
    let Some(server) = &shared.tls else {
        return Some((net::Conn::Tcp(tcp), listener));
    };
    let route = |name: Option<&str>| {
        let target = match shared.addrs.is_sni() {
            true => shared.addrs.route(name),
            false => Some(listener),
        };
        // Counted while the connection is still open: a client that has seen
        // it closed finds its refusal counted, and named if it was the first.
        if target.is_none() {
            if let Some(n) = shared.sni_refusals.refused(std::time::Instant::now()) {
                warn!(server_name = ?name, refused = n, "TLS server name not served; connection closed");
            }
        }
        target
    };
    match tokio::time::timeout(shared.upstream.timeout, tls::accept(server, tcp, route)).await {
        Ok(Ok((stream, target))) => Some((net::Conn::Boxed(Box::new(stream)), target)),
        // Counted and logged by `route`.
        Ok(Err(tls::AcceptError::Refused(_))) => None,
        Ok(Err(e)) => {
            warn!(error = %e, "TLS handshake with client failed");
            None
        }
        Err(_) => {
            warn!("TLS handshake with client timed out");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first refusal of each second is warned of, with the count of
    /// those only counted since the last warning; the others are counted.
    #[test]
    fn one_refusal_warning_a_second() {
        let r = Refusals {
            second: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        };
        assert_eq!(r.admit(1), Some(0));
        assert_eq!(r.admit(1), None);
        assert_eq!(r.admit(1), None);
        assert_eq!(r.admit(2), Some(2));
        assert_eq!(r.admit(2), None);
        assert_eq!(r.admit(7), Some(1));
        assert_eq!(r.admit(8), Some(0));
        // A second already past (threads racing) is only counted.
        assert_eq!(r.admit(3), None);
        assert_eq!(r.admit(9), Some(1));
    }
}
