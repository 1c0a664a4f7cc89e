//! Client connections: accepting them on the bootstrap and broker
//! listeners (within `limits.max_connections`), the TLS handshake and the
//! SNI route, the upstream connection, then the relay's pumps.

use std::net::SocketAddr;
use std::sync::Arc;

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
    let broker = match upstream::connect(&shared, target).await {
        Ok(b) => b,
        Err(e) => {
            metrics::global().upstream_error("connect");
            return warn!(error = %e, "cannot reach upstream; closing client connection");
        }
    };
    debug!(%peer, ?target, "connected");
    match relay::relay(shared, client, broker).await {
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
