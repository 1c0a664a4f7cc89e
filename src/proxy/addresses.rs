//! Broker addresses in responses: every address a broker hands a client is
//! replaced by the proxy's own, so a client that only knows the proxy's
//! bootstrap address never learns, and never connects to, a broker's real
//! address. Two schemes: one port per broker (advertised host,
//! `broker_port_base + node id`), or SNI (`listen.sni`: the name
//! `broker-{node}...` on the bootstrap port), where this module also maps
//! a ClientHello's server name back to its target ([`Addresses::route`]).
//!
//! Covered: Metadata brokers, FindCoordinator (v0-3 single, v4+ list),
//! DescribeCluster brokers, Produce v10+, Fetch v16+, ShareFetch and
//! ShareAcknowledge NodeEndpoints. Any
//! other API that carries addresses is not advertised (see `versions`).
//! Rewriting also reports what it saw (brokers' real addresses, topic ids)
//! so the proxy can open listeners and resolve topic ids.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeClusterResponse, FetchResponse, FindCoordinatorResponse,
    MetadataResponse, ProduceResponse, ShareAcknowledgeResponse, ShareFetchResponse,
};
use kafka_protocol::protocol::{Decodable, StrBytes};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{HostPort, Sni, SniPattern};

/// Which upstream a client connection goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Any bootstrap server.
    Bootstrap,
    /// The broker with this node id.
    Broker(i32),
}

/// How broker addresses are written for clients.
#[derive(Debug, Clone)]
enum Scheme {
    /// Broker N at `host:port_base + N`.
    Ports,
    /// Broker N at `pattern(N):port`; the bootstrap at `bootstrap:port`.
    Sni {
        bootstrap: String,
        pattern: SniPattern,
        port: u16,
    },
}

/// The proxy's public face: the host and port scheme written into responses.
#[derive(Debug, Clone)]
pub struct Addresses {
    pub host: StrBytes,
    pub port_base: u16,
    scheme: Scheme,
}

impl Addresses {
    /// One port per broker.
    pub fn new(host: &str, port_base: u16) -> Self {
        Addresses {
            host: StrBytes::from_string(host.to_string()),
            port_base,
            scheme: Scheme::Ports,
        }
    }

    /// Every broker on `port`, told apart by server name.
    pub fn sni(sni: &Sni, port: u16) -> Self {
        Addresses {
            host: StrBytes::from_string(sni.bootstrap.clone()),
            port_base: 0,
            scheme: Scheme::Sni {
                bootstrap: sni.bootstrap.clone(),
                pattern: sni.broker.clone(),
                port,
            },
        }
    }

    /// Whether brokers share the bootstrap port (no per-broker listeners).
    pub fn is_sni(&self) -> bool {
        matches!(self.scheme, Scheme::Sni { .. })
    }

    /// The target a ClientHello's server name stands for under SNI; `None`
    /// for a name that is neither the bootstrap nor a broker, or no name.
    pub fn route(&self, server_name: Option<&str>) -> Option<Target> {
        let Scheme::Sni {
            bootstrap, pattern, ..
        } = &self.scheme
        else {
            return None;
        };
        let name = server_name?.to_ascii_lowercase();
        if name == *bootstrap {
            return Some(Target::Bootstrap);
        }
        pattern.node(&name).map(Target::Broker)
    }

    /// The proxy port serving broker `node_id`, if it fits in a port number.
    pub fn port_for(&self, node_id: i32) -> Option<u16> {
        if let Scheme::Sni { port, .. } = self.scheme {
            return (node_id >= 0).then_some(port);
        }
        u16::try_from(self.port_base as i64 + node_id as i64)
            .ok()
            .filter(|_| node_id >= 0)
    }

    /// The host clients are told for broker `node_id`.
    fn host_for(&self, node_id: i32) -> StrBytes {
        match &self.scheme {
            Scheme::Ports => self.host.clone(),
            Scheme::Sni { pattern, .. } => StrBytes::from_string(pattern.name(node_id)),
        }
    }

    /// Rewrite one address in place, remembering the real one.
    /// Point one broker endpoint at the proxy (what `rewrite_body` does to
    /// each it finds), for a response decoded elsewhere.
    pub fn rewrite_endpoint(
        &self,
        node_id: BrokerId,
        host: &mut StrBytes,
        port: &mut i32,
        seen: &mut Seen,
    ) {
        self.rewrite(node_id, host, port, seen)
    }

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
        *host = self.host_for(node_id.0);
        // A node id that cannot be mapped to a port gets an address no
        // client can reach: never the real one.
        *port = self.port_for(node_id.0).map(i32::from).unwrap_or(-1);
    }
}

/// Connections refused for their server name: counted, and logged at most
/// once per `LOG_EVERY` so that a scan cannot flood the log.
#[derive(Debug, Default)]
pub struct Refusals {
    since_log: AtomicU64,
    last_log: Mutex<Option<Instant>>,
}

/// At most one warning about refused server names per this long.
const LOG_EVERY: Duration = Duration::from_secs(5);

impl Refusals {
    /// Count one refusal; how many to report if a warning is due now.
    pub fn refused(&self, now: Instant) -> Option<u64> {
        self.since_log.fetch_add(1, Ordering::SeqCst);
        let mut last = match self.last_log.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return None;
        }
        *last = Some(now);
        Some(self.since_log.swap(0, Ordering::SeqCst))
    }
}

/// Brokers whose per-broker listener could not be opened (port taken, or
/// no port for the node id): clients told their address would not reach
/// them, so the proxy is not ready while any is listed.
#[derive(Debug, Default)]
pub struct Unserved(Mutex<std::collections::HashSet<i32>>);

impl Unserved {
    /// Record whether broker `node` is served now.
    pub fn set(&self, node: i32, unserved: bool) {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if unserved {
            set.insert(node);
        } else {
            set.remove(&node);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
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
        // NodeEndpoints at every version (KIP-932).
        ApiKey::ShareFetch | ApiKey::ShareAcknowledge => true,
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
            Ok(Some(crate::transport::frame::encode(&$msg, version)?))
        }};
    }
    match key {
        ApiKey::Metadata => {
            let mut m = MetadataResponse::decode(&mut buf, version)?;
            rewrite_metadata(&mut m, addrs, seen);
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
        ApiKey::ShareFetch => {
            let mut m = ShareFetchResponse::decode(&mut buf, version)?;
            if !rewrite_share_fetch_endpoints(&mut m, addrs, seen) {
                return Ok(None);
            }
            reencode!(m)
        }
        ApiKey::ShareAcknowledge => {
            let mut m = ShareAcknowledgeResponse::decode(&mut buf, version)?;
            if m.node_endpoints.is_empty() {
                return Ok(None);
            }
            for e in &mut m.node_endpoints {
                addrs.rewrite(e.node_id, &mut e.host, &mut e.port, seen);
            }
            reencode!(m)
        }
        _ => Ok(None),
    }
}

/// Point a Metadata answer's brokers at the proxy and note the topic ids
/// it names (Fetch v13+ names topics by id).
fn rewrite_metadata(m: &mut MetadataResponse, addrs: &Addresses, seen: &mut Seen) {
    for b in &mut m.brokers {
        addrs.rewrite(b.node_id, &mut b.host, &mut b.port, seen);
    }
    for t in &m.topics {
        if let Some(name) = t.name.as_ref().filter(|_| !t.topic_id.is_nil()) {
            seen.topics.push((t.topic_id, name.0.clone()));
        }
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

/// Rewrite the NodeEndpoints of a decoded ShareFetch response; returns
/// whether there were any (the share filter decodes these responses anyway).
pub fn rewrite_share_fetch_endpoints(
    m: &mut ShareFetchResponse,
    addrs: &Addresses,
    seen: &mut Seen,
) -> bool {
    for e in &mut m.node_endpoints {
        addrs.rewrite(e.node_id, &mut e.host, &mut e.port, seen);
    }
    !m.node_endpoints.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;

    fn encode<M: kafka_protocol::protocol::Encodable>(m: &M, v: i16) -> Bytes {
        crate::transport::frame::encode(m, v).unwrap().freeze()
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

    fn sni_addresses() -> Addresses {
        let sni: Sni = serde_yaml::from_str(
            "{ bootstrap: Bootstrap.kafka.test, broker: \"broker-{node}.kafka.test\" }",
        )
        .unwrap();
        Addresses::sni(&sni, 29092)
    }

    #[test]
    fn under_sni_every_broker_is_its_name_on_the_one_port() {
        let addrs = sni_addresses();
        for v in [0, 12] {
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
            assert_eq!(back.brokers[0].host.as_str(), "broker-111.kafka.test");
            assert_eq!(back.brokers[0].port, 29092);
        }
        // Node ids far beyond a port range still have a name and the port.
        assert_eq!(addrs.port_for(70_000), Some(29092));
    }

    #[test]
    fn server_names_route_to_the_bootstrap_or_a_node_and_nothing_else() {
        let addrs = sni_addresses();
        assert_eq!(
            addrs.route(Some("bootstrap.kafka.test")),
            Some(Target::Bootstrap)
        );
        assert_eq!(
            addrs.route(Some("BOOTSTRAP.kafka.test")),
            Some(Target::Bootstrap)
        );
        assert_eq!(
            addrs.route(Some("broker-7.kafka.test")),
            Some(Target::Broker(7))
        );
        assert_eq!(addrs.route(Some("broker-7.other.test")), None);
        assert_eq!(addrs.route(Some("kafka.test")), None);
        assert_eq!(addrs.route(None), None);
        let ports = Addresses::new("127.0.0.1", 100);
        assert_eq!(ports.route(Some("bootstrap.kafka.test")), None);
    }

    #[test]
    fn refused_names_are_logged_at_most_once_per_interval_with_their_count() {
        let r = Refusals::default();
        let t0 = Instant::now();
        assert_eq!(r.refused(t0), Some(1));
        assert_eq!(r.refused(t0 + Duration::from_secs(1)), None);
        assert_eq!(r.refused(t0 + LOG_EVERY + Duration::from_secs(1)), Some(2));
    }
}
