//! The proxy's own client against the in-process mock broker (version
//! negotiation, metadata and leaders, produce) and against raw sockets that
//! misbehave (a broker that hangs up mid-request).

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, DescribeClusterRequest, FetchRequest, MetadataRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::kafka::batch::Batch;
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};

use super::mock_broker::MockBroker;

fn endpoint() -> Endpoint {
    Endpoint {
        tls: None,
        sasl: None,
        timeout: Duration::from_secs(2),
        max_frame: 1 << 20,
    }
}

async fn connect(mock: &MockBroker) -> Connection {
    Connection::connect(&mock.addr, &endpoint())
        .await
        .expect("connect to the mock broker")
}

#[tokio::test]
async fn the_highest_version_both_sides_support_within_the_callers_range_is_picked() {
    let mock = MockBroker::start().await;
    let conn = connect(&mock).await;
    // The mock offers Metadata 4..=12; the client knows up to 13.
    let v = |min, max| conn.version::<MetadataRequest>(min, max).ok();
    assert_eq!(v(0, 20), Some(12), "capped by the broker's maximum");
    assert_eq!(v(5, 8), Some(8), "capped by the caller's maximum");
    assert_eq!(v(12, 12), Some(12));
    assert_eq!(v(0, 4), Some(4), "the broker's minimum is enough");
    // ApiVersions: the mock offers 0..=3.
    assert_eq!(conn.version::<ApiVersionsRequest>(0, 3).ok(), Some(3));
}

#[tokio::test]
async fn no_common_version_is_a_no_version_error_naming_the_api_and_range() {
    let mock = MockBroker::start().await;
    let conn = connect(&mock).await;
    // Below the broker's minimum (Metadata 4..=12).
    match conn.version::<MetadataRequest>(0, 3) {
        Err(ClientError::NoVersion { key, min, max, .. }) => {
            assert_eq!((key, min, max), (ApiKey::Metadata, 0, 3));
        }
        other => panic!("expected NoVersion, got {other:?}"),
    }
    // Above the broker's maximum (Fetch 4..=12).
    assert!(matches!(
        conn.version::<FetchRequest>(13, 17),
        Err(ClientError::NoVersion {
            key: ApiKey::Fetch,
            ..
        })
    ));
    // An API the broker does not list at all.
    assert!(matches!(
        conn.version::<DescribeClusterRequest>(0, 1),
        Err(ClientError::NoVersion { .. })
    ));
}

#[tokio::test]
async fn a_broker_that_closes_instead_of_answering_gives_a_protocol_error_not_a_hang() {
    let mock = MockBroker::start().await;
    let mut conn = connect(&mock).await;
    // The mock closes the connection on an API it does not serve.
    let started = tokio::time::Instant::now();
    let err = conn
        .send_at(DescribeClusterRequest::default(), 0)
        .await
        .expect_err("a closed connection is an error");
    match err {
        ClientError::Protocol { addr, msg } => {
            assert_eq!(addr, mock.addr);
            assert!(msg.contains("connection closed"), "{msg}");
        }
        other => panic!("expected Protocol, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "not the timeout"
    );
}

/// A broker that reads one request, writes `reply` and hangs up.
async fn broker_replying(reply: &'static [u8]) -> HostPort {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        if let Ok((mut sock, _)) = listener.accept().await {
            let mut len = [0u8; 4];
            if sock.read_exact(&mut len).await.is_ok() {
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                let _ = sock.read_exact(&mut body).await;
                let _ = sock.write_all(reply).await;
            }
        }
    });
    HostPort {
        host: "127.0.0.1".into(),
        port,
    }
}

#[tokio::test]
async fn a_broker_that_hangs_up_in_the_middle_of_its_answer_gives_a_typed_error() {
    // A frame that claims 100 bytes, then 6 of them, then EOF.
    let addr = broker_replying(b"\x00\x00\x00\x64\x00\x00\x00\x01\x00\x00").await;
    let err = Connection::connect(&addr, &endpoint())
        .await
        .err()
        .expect("a truncated answer is an error");
    match err {
        ClientError::Protocol { addr: a, msg } => {
            assert_eq!(a, addr);
            assert!(msg.contains("middle of a frame"), "{msg}");
        }
        other => panic!("expected Protocol, got {other:?}"),
    }
    // And one that hangs up without a byte of answer.
    let addr = broker_replying(b"").await;
    let err = Connection::connect(&addr, &endpoint()).await.err();
    assert!(
        matches!(&err, Some(ClientError::Protocol { msg, .. }) if msg.contains("connection closed")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_silent_broker_gives_a_timeout_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = HostPort {
        host: "127.0.0.1".into(),
        port: listener.local_addr().expect("addr").port(),
    };
    // Accepted (by the kernel's backlog) and never answered.
    let ep = Endpoint {
        timeout: Duration::from_millis(300),
        ..endpoint()
    };
    let err = Connection::connect(&addr, &ep).await.err();
    assert!(matches!(err, Some(ClientError::Timeout { .. })), "{err:?}");
    drop(listener);
}

#[tokio::test]
async fn metadata_gives_partition_counts_and_leaders() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 3);
    let mut cluster = Cluster::new(vec![mock.addr.clone()], endpoint());
    assert_eq!(cluster.partitions("t").await.expect("metadata"), Some(3));
    assert_eq!(cluster.partitions("missing").await.expect("metadata"), None);
    // Every partition's leader is the mock's node 1, at its address.
    for p in 0..3 {
        let leader = cluster.leader("t", p).await.expect("leader");
        assert_eq!(leader.addr(), &mock.addr);
    }
    // A partition the topic does not have has no leader: an error, not a
    // connection to some broker.
    let err = cluster.leader("t", 3).await.err();
    assert!(
        matches!(&err, Some(ClientError::Protocol { msg, .. }) if msg.contains("no leader for t-3")),
        "{:?}",
        err.map(|e| e.to_string())
    );
    assert!(cluster.leader("missing", 0).await.is_err());
}

fn batch(values: &[&'static str]) -> Bytes {
    let records: Vec<NewRecord> = values
        .iter()
        .map(|v| NewRecord {
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::from_static(v.as_bytes())),
            headers: vec![],
        })
        .collect();
    build_batch(&records, &BuildOptions::default()).expect("batch")
}

#[tokio::test]
async fn produce_writes_to_the_partitions_leader_and_returns_its_answer() {
    let mock = MockBroker::start().await;
    mock.add_topic("t", 2);
    let mut cluster = Cluster::new(vec![mock.addr.clone()], endpoint());
    let r = cluster
        .produce("t", 1, batch(&["a", "b"]))
        .await
        .expect("produce");
    assert_eq!((r.index, r.error_code, r.base_offset), (1, 0, 0));
    let r = cluster
        .produce("t", 1, batch(&["c"]))
        .await
        .expect("produce");
    assert_eq!((r.error_code, r.base_offset), (0, 2), "appended after a, b");
    assert!(mock.records("t", 0).is_empty(), "nothing in partition 0");
    let values: Vec<Vec<u8>> = mock
        .records("t", 1)
        .into_iter()
        .flat_map(|(_, b)| {
            let d = Batch::new(b).expect("batch").decode().expect("decode");
            d.records()
                .map(|r| r.value.unwrap_or_default().to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(values, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    // A partition-level refusal is the broker's answer, not a client error.
    mock.state().fail.insert(("t".into(), 0), 19);
    let r = cluster
        .produce("t", 0, batch(&["d"]))
        .await
        .expect("answer");
    assert_eq!(r.error_code, 19);
}
