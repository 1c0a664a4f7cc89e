//! Broker addresses in DescribeCluster, Produce v10+ and Fetch v16+
//! responses are rewritten to the proxy's own (README "Port mapping"):
//! tansu 0.6 speaks none of these versions, so the responses are built
//! with kafka-protocol here, fed through `proxy::rewrite::rewrite_body` as
//! the relay does, and decoded again. A response naming no broker is left
//! alone (`Ok(None)`: the original bytes are forwarded).

use antidote::config::HostPort;
use antidote::proxy::addresses::{carries_addresses, rewrite_body, Addresses, Seen};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{
    fetch_response, produce_response, ApiKey, BrokerId, DescribeClusterResponse, FetchResponse,
    ProduceResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

const REAL: &str = "10.9.8.7";

fn encode<M: Encodable>(m: &M, v: i16) -> Bytes {
    let mut b = BytesMut::new();
    m.encode(&mut b, v).expect("encode");
    b.freeze()
}

fn addrs() -> Addresses {
    Addresses::new("proxy.example", 29100)
}

fn real(port: u16) -> HostPort {
    HostPort {
        host: REAL.into(),
        port,
    }
}

#[test]
fn describe_cluster_brokers_point_at_the_proxy() {
    for v in 0..=2 {
        let m = DescribeClusterResponse::default().with_brokers(vec![
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(1))
                .with_host(StrBytes::from_static_str(REAL))
                .with_port(9092),
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(2))
                .with_host(StrBytes::from_static_str(REAL))
                .with_port(9093),
        ]);
        assert!(carries_addresses(ApiKey::DescribeCluster, v));
        let mut seen = Seen::default();
        let out = rewrite_body(
            ApiKey::DescribeCluster,
            v,
            encode(&m, v),
            &addrs(),
            &mut seen,
        )
        .expect("rewrite")
        .expect("DescribeCluster names brokers: it must be rewritten");
        let back = DescribeClusterResponse::decode(&mut out.freeze(), v).expect("decode");
        let got: Vec<_> = back
            .brokers
            .iter()
            .map(|b| (b.host.to_string(), b.port))
            .collect();
        assert_eq!(
            got,
            vec![
                ("proxy.example".into(), 29101),
                ("proxy.example".into(), 29102)
            ],
            "v{v}"
        );
        assert_eq!(seen.brokers, vec![(1, real(9092)), (2, real(9093))], "v{v}");
    }
}

#[test]
fn produce_v10_and_later_node_endpoints_point_at_the_proxy() {
    assert!(!carries_addresses(ApiKey::Produce, 9));
    for v in 10..=11 {
        let m = ProduceResponse::default().with_node_endpoints(vec![
            produce_response::NodeEndpoint::default()
                .with_node_id(BrokerId(111))
                .with_host(StrBytes::from_static_str(REAL))
                .with_port(9092),
        ]);
        assert!(carries_addresses(ApiKey::Produce, v));
        let mut seen = Seen::default();
        let out = rewrite_body(ApiKey::Produce, v, encode(&m, v), &addrs(), &mut seen)
            .expect("rewrite")
            .expect("node endpoints must be rewritten");
        let back = ProduceResponse::decode(&mut out.freeze(), v).expect("decode");
        let e = &back.node_endpoints[0];
        assert_eq!((e.host.as_str(), e.port), ("proxy.example", 29211), "v{v}");
        assert_eq!(seen.brokers, vec![(111, real(9092))]);
        // No endpoints: nothing to rewrite, the original bytes go out.
        let empty = encode(&ProduceResponse::default(), v);
        let none = rewrite_body(ApiKey::Produce, v, empty, &addrs(), &mut Seen::default());
        assert!(none.expect("rewrite").is_none(), "v{v}");
    }
}

#[test]
fn fetch_v16_and_later_node_endpoints_point_at_the_proxy() {
    assert!(!carries_addresses(ApiKey::Fetch, 15));
    for v in 16..=17 {
        let m = FetchResponse::default().with_node_endpoints(vec![
            fetch_response::NodeEndpoint::default()
                .with_node_id(BrokerId(7))
                .with_host(StrBytes::from_static_str(REAL))
                .with_port(19092),
            // A node id past the port range is advertised unreachable, never real.
            fetch_response::NodeEndpoint::default()
                .with_node_id(BrokerId(70000))
                .with_host(StrBytes::from_static_str(REAL))
                .with_port(19093),
        ]);
        assert!(carries_addresses(ApiKey::Fetch, v));
        let mut seen = Seen::default();
        let out = rewrite_body(ApiKey::Fetch, v, encode(&m, v), &addrs(), &mut seen)
            .expect("rewrite")
            .expect("node endpoints must be rewritten");
        let back = FetchResponse::decode(&mut out.freeze(), v).expect("decode");
        let got: Vec<_> = back
            .node_endpoints
            .iter()
            .map(|e| (e.host.to_string(), e.port))
            .collect();
        assert_eq!(
            got,
            vec![
                ("proxy.example".into(), 29107),
                ("proxy.example".into(), -1)
            ],
            "v{v}"
        );
        assert!(
            !format!("{back:?}").contains(REAL),
            "v{v}: a real address survived"
        );
        assert_eq!(seen.brokers, vec![(7, real(19092)), (70000, real(19093))]);
    }
}
