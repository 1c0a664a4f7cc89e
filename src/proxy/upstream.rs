//! Connections to the broker behind a client connection's target: the
//! bootstrap servers, or one broker by node id (learned from metadata; an
//! unknown id costs one single-flight lookup, then a negative cache).

use std::sync::Arc;

use super::{refresh_metadata, Shared, Target};
use crate::config::HostPort;
use crate::transport::net;

/// How long a node id still unknown after a metadata lookup is not looked
/// up again (its connections are refused meanwhile; the background refresh
/// learns new brokers anyway).
pub(super) const NODE_NEGATIVE_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// A raw byte stream to the broker behind `target`.
pub(super) async fn connect(shared: &Arc<Shared>, target: Target) -> std::io::Result<net::Conn> {
    let addrs: Vec<HostPort> = match target {
        Target::Bootstrap => shared.config.upstream.bootstrap_servers.clone(),
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
