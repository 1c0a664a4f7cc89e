//! Broker bytes that declare huge lengths must be decode errors, never an
//! allocation of the declared size (which aborts the process). These are the
//! responses the proxy decodes; each is fed a body whose first array or
//! string claims far more elements than the frame holds.

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiVersionsResponse, DescribeClusterResponse, FetchResponse, FindCoordinatorResponse,
    MetadataResponse, ProduceResponse,
};
use kafka_protocol::protocol::Decodable;

/// The body from issue 9: error code 0, then a compact array claiming ~2^32
/// elements (ApiVersions v3+ is flexible).
const APIVERSIONS_BOMB: &[u8] = &[0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f];

#[test]
fn api_versions_with_a_huge_compact_array_count_is_an_error() {
    let r = ApiVersionsResponse::decode(&mut Bytes::from_static(APIVERSIONS_BOMB), 3);
    assert!(r.is_err());
}

#[test]
fn api_versions_with_a_huge_classic_array_count_is_an_error() {
    // v0-2: i32 count.
    let body = [0x00, 0x00, 0x7f, 0xff, 0xff, 0xff];
    assert!(ApiVersionsResponse::decode(&mut Bytes::copy_from_slice(&body), 2).is_err());
}

/// Throttle time (i32) then a huge count, the shape of several responses.
fn throttle_then(count: &[u8]) -> Bytes {
    let mut b = vec![0, 0, 0, 0];
    b.extend_from_slice(count);
    Bytes::from(b)
}

#[test]
fn metadata_with_huge_broker_counts_is_an_error() {
    // v1-8 classic: brokers array i32.
    assert!(MetadataResponse::decode(&mut throttle_then(&[0x7f, 0xff, 0xff, 0xff]), 8).is_err());
    // v9+ flexible: compact array varint.
    assert!(
        MetadataResponse::decode(&mut throttle_then(&[0xff, 0xff, 0xff, 0xff, 0x0f]), 12).is_err()
    );
}

#[test]
fn fetch_with_huge_topic_counts_is_an_error() {
    // v7-11: throttle, error code, session id, then responses array i32.
    let mut b = vec![0u8; 4 + 2 + 4];
    b.extend_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
    assert!(FetchResponse::decode(&mut Bytes::from(b), 11).is_err());
    // v12+: compact array.
    let mut b = vec![0u8; 4 + 2 + 4];
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(FetchResponse::decode(&mut Bytes::from(b), 13).is_err());
}

#[test]
fn strings_and_bytes_with_huge_lengths_are_errors() {
    // FindCoordinator v1: throttle, error code, error message (i16 length).
    let b = throttle_then(&[0x00, 0x00, 0x7f, 0xff]);
    assert!(FindCoordinatorResponse::decode(&mut b.clone(), 1).is_err());
    // DescribeCluster v0 (flexible): throttle, error code, error message
    // as a compact nullable string with a ~2^32 length.
    let b = throttle_then(&[0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(DescribeClusterResponse::decode(&mut b.clone(), 0).is_err());
}

#[test]
fn produce_with_huge_counts_is_an_error() {
    // v9 (flexible): responses compact array first.
    let b = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(ProduceResponse::decode(&mut b.clone(), 9).is_err());
}
