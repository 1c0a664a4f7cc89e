//! Connections to the broker behind a client connection's target: the
//! bootstrap servers, or one broker by node id (learned from metadata; an
//! unknown id costs one single-flight lookup, then a negative cache).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{refresh_metadata, Shared, Target};
use crate::config::HostPort;
use crate::transport::net;

/// How long a node id still unknown after a metadata lookup is not looked
/// up again (its connections are refused meanwhile; the background refresh
/// learns new brokers anyway).
pub(super) const NODE_NEGATIVE_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// Which bootstrap server is tried first, for the proxy's metadata requests
/// and for clients' bootstrap connections. The first server that accepts a
/// connection is used, and a server that accepts but never answers (a
/// frozen broker: its kernel still completes handshakes) would take every
/// one of them: a metadata request that fails through a server moves the
/// next one to the front.
#[derive(Debug, Default)]
pub struct BootstrapOrder {
    first: AtomicUsize,
}

impl BootstrapOrder {
    /// Indexes of `n` servers, in the order to try them.
    pub fn order(&self, n: usize) -> impl Iterator<Item = usize> {
        let first = self.first.load(Ordering::Relaxed) % n.max(1);
        (0..n).map(move |k| (first + k) % n)
    }

    /// A request through server `i` of `n` failed: the next server comes
    /// first (unless another failure moved the order meanwhile). Whether
    /// this call moved it.
    pub fn failed(&self, i: usize, n: usize) -> bool {
        let next = (i + 1) % n.max(1);
        self.first
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// A raw byte stream to the broker behind `target`.
pub(super) async fn connect(shared: &Arc<Shared>, target: Target) -> std::io::Result<net::Conn> {
    let addrs: Vec<HostPort> = match target {
        Target::Bootstrap => {
            let servers = &shared.config.upstream.bootstrap_servers;
            shared
                .bootstrap_order
                .order(servers.len())
                .map(|i| servers[i].clone())
                .collect()
        }
        Target::Broker(node) => {
            // Single-flight and negatively cached: a client can name any
            // node id in its TLS server name, once per handshake.
            shared
                .node_resolver
                .resolve(
                    &[node],
                    |n| shared.brokers.contains_key(n),
                    || async {
                        let _ = refresh_metadata(shared).await;
                    },
                )
                .await;
            match shared.brokers.get(&node) {
                Some(a) => vec![a.clone()],
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("broker {node} is not in the cluster metadata"),
                    ))
                }
            }
        }
    };
    let mut last = None;
    for addr in &addrs {
        match net::connect_conn(addr, shared.relay_tls.as_ref(), shared.upstream.timeout).await {
            Ok(io) => return Ok(io),
            Err(e) => last = Some(std::io::Error::new(e.kind(), format!("{addr}: {e}"))),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no upstream address")))
}

#[cfg(test)]
mod tests {
    use super::BootstrapOrder;

    #[test]
    fn a_failed_server_goes_to_the_back_of_the_order() {
        let o = BootstrapOrder::default();
        assert_eq!(o.order(3).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(o.failed(0, 3));
        assert_eq!(o.order(3).collect::<Vec<_>>(), [1, 2, 0]);
        // A failure through a server no longer first (reported late, by
        // another request) does not move the order again.
        assert!(!o.failed(0, 3));
        assert_eq!(o.order(3).collect::<Vec<_>>(), [1, 2, 0]);
        assert!(o.failed(1, 3));
        assert!(o.failed(2, 3));
        assert_eq!(o.order(3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(o.order(0).count(), 0);
    }
}
