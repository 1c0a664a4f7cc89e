//! Broker addresses in responses: every address a broker hands a client is
//! replaced by the proxy's own (advertised host, `broker_port_base + node
//! id`), so a client that only knows the proxy's bootstrap address never
//! learns, and never connects to, a broker's real address.
//!
//! Covered: Metadata brokers, FindCoordinator (v0-3 single, v4+ list),
//! DescribeCluster brokers, Produce v10+ and Fetch v16+ NodeEndpoints. Any
//! other API that carries addresses is not advertised (see `versions`).
//! Rewriting also reports what it saw (brokers' real addresses, topic ids)
//! so the proxy can open listeners and resolve topic ids.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeClusterResponse, FetchResponse, FindCoordinatorResponse,
    MetadataResponse, ProduceResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use crate::config::HostPort;

/// The proxy's public face: the host and port scheme written into responses.
#[derive(Debug, Clone)]
pub struct Addresses {
    pub host: StrBytes,
    pub port_base: u16,
}

impl Addresses {
    pub fn new(host: &str, port_base: u16) -> Self {
        Addresses {
            host: StrBytes::from_string(host.to_string()),
            port_base,
        }
    }

    /// The proxy port serving broker `node_id`, if it fits in a port number.
    pub fn port_for(&self, node_id: i32) -> Option<u16> {
        u16::try_from(self.port_base as i64 + node_id as i64)
            .ok()
            .filter(|_| node_id >= 0)
    }

    /// Rewrite one address in place, remembering the real one.
    fn rewrite(&self, node_id: BrokerId, host: &mut StrBytes, port: &mut i32, seen: &mut Seen) {
        if node_id.0 < 0 || host.is_empty() {
            return; // "no coordinator" and similar placeholders carry no address
        }
        if let Ok(real_port) = u16::try_from(*port) {
            seen.brokers.push((
                node_id.0,
                HostPort {
                    host: host.to_string(),
                    port: real_port,
                },
            ));
        }
        *host = self.host.clone();
        // A node id that cannot be mapped to a port gets an address no
        // client can reach: never the real one.
        *port = self.port_for(node_id.0).map(i32::from).unwrap_or(-1);
    }
}

/// What a response revealed about the cluster.
#[derive(Debug, Default)]
pub struct Seen {
    /// (node id, real address) of every broker named.
    pub brokers: Vec<(i32, HostPort)>,
    /// (topic id, topic name) pairs from Metadata v10+.
    pub topics: Vec<(uuid::Uuid, StrBytes)>,
}

/// Whether responses of this API (at this version) carry broker addresses.
pub fn carries_addresses(key: ApiKey, version: i16) -> bool {
    match key {
        ApiKey::Metadata | ApiKey::FindCoordinator | ApiKey::DescribeCluster => true,
        ApiKey::Produce => version >= 10,
        ApiKey::Fetch => version >= 16,
        _ => false,
    }
}

/// Decode a response body, rewrite its addresses, and encode it again.
/// `Ok(None)` when the body names no broker, so the caller can forward the
/// original bytes.
pub fn rewrite_body(
    key: ApiKey,
    version: i16,
    body: Bytes,
    addrs: &Addresses,
    seen: &mut Seen,
) -> anyhow::Result<Option<BytesMut>> {
    let mut buf = body;
    macro_rules! reencode {
        ($msg:expr) => {{
            let msg = $msg;
            let mut out = BytesMut::with_capacity(msg.compute_size(version)?);
            msg.encode(&mut out, version)?;
            Ok(Some(out))
        }};
    }
    match key {
        ApiKey::Metadata => {
            let mut m = MetadataResponse::decode(&mut buf, version)?;
            for b in &mut m.brokers {
                addrs.rewrite(b.node_id, &mut b.host, &mut b.port, seen);
            }
            for t in &m.topics {
                if let Some(name) = &t.name {
                    if !t.topic_id.is_nil() {
                        seen.topics.push((t.topic_id, name.0.clone()));
                    }
                }
            }
            reencode!(m)
        }
        ApiKey::FindCoordinator => {
            let mut m = FindCoordinatorResponse::decode(&mut buf, version)?;
            addrs.rewrite(m.node_id, &mut m.host, &mut m.port, seen);
            for c in &mut m.coordinators {
                addrs.rewrite(c.node_id, &mut c.host, &mut c.port, seen);
            }
            reencode!(m)
        }
        ApiKey::DescribeCluster => {
            let mut m = DescribeClusterResponse::decode(&mut buf, version)?;
            for b in &mut m.brokers {
                addrs.rewrite(b.broker_id, &mut b.host, &mut b.port, seen);
            }
            reencode!(m)
        }
        ApiKey::Produce => {
            let mut m = ProduceResponse::decode(&mut buf, version)?;
            if m.node_endpoints.is_empty() {
                return Ok(None);
            }
            for e in &mut m.node_endpoints {
                addrs.rewrite(e.node_id, &mut e.host, &mut e.port, seen);
            }
            reencode!(m)
        }
        ApiKey::Fetch => {
            let mut m = FetchResponse::decode(&mut buf, version)?;
            if !rewrite_fetch_endpoints(&mut m, addrs, seen) {
                return Ok(None);
            }
            reencode!(m)
        }
        _ => Ok(None),
    }
}

/// Rewrite the NodeEndpoints of a decoded Fetch response (v16+); returns
/// whether there were any. Used directly by the Fetch interception path,
/// which decodes Fetch responses anyway.
pub fn rewrite_fetch_endpoints(m: &mut FetchResponse, addrs: &Addresses, seen: &mut Seen) -> bool {
    for e in &mut m.node_endpoints {
        addrs.rewrite(e.node_id, &mut e.host, &mut e.port, seen);
    }
    !m.node_endpoints.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;

    fn encode<M: Encodable>(m: &M, v: i16) -> Bytes {
        let mut b = BytesMut::new();
        m.encode(&mut b, v).unwrap();
        b.freeze()
    }

    #[test]
    fn metadata_brokers_point_at_the_proxy_at_every_version() {
        let addrs = Addresses::new("proxy.example", 29100);
        for v in 0..=13 {
            let m =
                MetadataResponse::default().with_brokers(vec![MetadataResponseBroker::default()
                    .with_node_id(BrokerId(111))
                    .with_host(StrBytes::from_static_str("10.1.2.3"))
                    .with_port(9092)]);
            let mut seen = Seen::default();
            let out = rewrite_body(ApiKey::Metadata, v, encode(&m, v), &addrs, &mut seen)
                .unwrap()
                .unwrap();
            let back = MetadataResponse::decode(&mut out.freeze(), v).unwrap();
            assert_eq!(back.brokers[0].host.as_str(), "proxy.example", "v{v}");
            assert_eq!(back.brokers[0].port, 29211, "v{v}");
            assert_eq!(seen.brokers, vec![(111, "10.1.2.3:9092".parse().unwrap())]);
        }
    }

    #[test]
    fn find_coordinator_single_and_list_forms_are_rewritten() {
        use kafka_protocol::messages::find_coordinator_response::Coordinator;
        let addrs = Addresses::new("127.0.0.1", 100);
        for v in 0..=6 {
            let m = if v < 4 {
                FindCoordinatorResponse::default()
                    .with_node_id(BrokerId(7))
                    .with_host(StrBytes::from_static_str("broker"))
                    .with_port(9092)
            } else {
                FindCoordinatorResponse::default().with_coordinators(vec![Coordinator::default()
                    .with_node_id(BrokerId(7))
                    .with_host(StrBytes::from_static_str("broker"))
                    .with_port(9092)])
            };
            let mut seen = Seen::default();
            let out = rewrite_body(ApiKey::FindCoordinator, v, encode(&m, v), &addrs, &mut seen)
                .unwrap()
                .unwrap();
            let back = FindCoordinatorResponse::decode(&mut out.freeze(), v).unwrap();
            let (host, port) = if v < 4 {
                (back.host, back.port)
            } else {
                (back.coordinators[0].host.clone(), back.coordinators[0].port)
            };
            assert_eq!((host.as_str(), port), ("127.0.0.1", 107), "v{v}");
        }
    }

    #[test]
    fn a_node_id_beyond_the_port_range_never_reveals_the_real_address() {
        let addrs = Addresses::new("p", 65000);
        let mut host = StrBytes::from_static_str("secret-broker");
        let mut port = 9092;
        addrs.rewrite(BrokerId(1000), &mut host, &mut port, &mut Seen::default());
        assert_eq!((host.as_str(), port), ("p", -1));
    }
}
