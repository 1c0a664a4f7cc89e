//! SASL passthrough against a mock broker: raw SASL tokens after a
//! SaslHandshake v0 (and only as many as the mechanism takes: after them,
//! requests outside the offered versions are refused, never relayed as
//! tokens), SaslHandshake v1 + SaslAuthenticate, and KIP-368
//! re-authentication mid-connection with other requests interleaved.
//!
//! A mock broker is used because the test broker (tansu) cannot be made to
//! speak the v0 raw-token framing; every other behaviour is tested against
//! tansu with real clients in tests/*.py.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use antidote::config::Config;
use antidote::policy::PolicySet;
use antidote::proxy;
use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn read_frame(s: &mut TcpStream) -> Option<Bytes> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(Bytes::from(body))
}

async fn write_frame(s: &mut TcpStream, body: &[u8]) {
    s.write_all(&(body.len() as u32).to_be_bytes())
        .await
        .unwrap();
    s.write_all(body).await.unwrap();
}

fn response<M: Encodable>(key: ApiKey, version: i16, correlation: i32, m: &M) -> BytesMut {
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation)
        .encode(&mut out, key.response_header_version(version))
        .unwrap();
    m.encode(&mut out, version).unwrap();
    out
}

/// A broker that speaks just enough: ApiVersions, Metadata, SASL (PLAIN,
/// and SCRAM-SHA-256 with its two raw tokens after a v0 handshake). Raw
/// tokens after a v0 handshake are answered with "server:" + token. Every
/// token, and any other request that reaches it, is recorded in `tokens`.
async fn mock_broker(listener: TcpListener, port: u16, tokens: Arc<Mutex<Vec<Bytes>>>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let tokens = tokens.clone();
        tokio::spawn(async move {
            // Raw tokens still expected after a v0 handshake.
            let mut raw = 0;
            while let Some(mut frame) = read_frame(&mut s).await {
                if raw > 0 {
                    tokens.lock().unwrap().push(frame.clone());
                    let mut reply = b"server:".to_vec();
                    reply.extend_from_slice(&frame);
                    write_frame(&mut s, &reply).await;
                    raw -= 1;
                    continue;
                }
                let Ok(key) = ApiKey::try_from((&frame[..2]).get_i16()) else {
                    // Not a request: record what reached the broker, hang up.
                    tokens.lock().unwrap().push(frame.clone());
                    return;
                };
                let version = (&frame[2..4]).get_i16();
                let header =
                    RequestHeader::decode(&mut frame, key.request_header_version(version)).unwrap();
                let c = header.correlation_id;
                let out = match key {
                    ApiKey::ApiVersions => {
                        let keys = [(18, 0, 3), (3, 0, 12), (17, 0, 1), (36, 0, 2)]
                            .iter()
                            .map(|&(k, lo, hi)| {
                                ApiVersion::default()
                                    .with_api_key(k)
                                    .with_min_version(lo)
                                    .with_max_version(hi)
                            })
                            .collect();
                        response(
                            key,
                            0.max(version.min(3)),
                            c,
                            &ApiVersionsResponse::default().with_api_keys(keys),
                        )
                    }
                    ApiKey::Metadata => response(
                        key,
                        version,
                        c,
                        &MetadataResponse::default().with_brokers(vec![
                            MetadataResponseBroker::default()
                                .with_node_id(BrokerId(1))
                                .with_host(StrBytes::from_static_str("127.0.0.1"))
                                .with_port(port as i32),
                        ]),
                    ),
                    ApiKey::SaslHandshake => {
                        let req = SaslHandshakeRequest::decode(&mut frame, version).unwrap();
                        // Only PLAIN and SCRAM-SHA-256 are offered: anything
                        // else is refused (UNSUPPORTED_SASL_MECHANISM) and no
                        // token follows.
                        let rounds = match req.mechanism.as_str() {
                            "PLAIN" => 1,
                            "SCRAM-SHA-256" => 2,
                            _ => 0,
                        };
                        let ok = rounds > 0;
                        raw = if version == 0 { rounds } else { 0 };
                        response(
                            key,
                            version,
                            c,
                            &SaslHandshakeResponse::default()
                                .with_error_code(if ok { 0 } else { 33 })
                                .with_mechanisms(vec![StrBytes::from_static_str("PLAIN")]),
                        )
                    }
                    ApiKey::SaslAuthenticate => {
                        let req = SaslAuthenticateRequest::decode(&mut frame, version).unwrap();
                        tokens.lock().unwrap().push(req.auth_bytes.clone());
                        let mut reply = b"server:".to_vec();
                        reply.extend_from_slice(&req.auth_bytes);
                        response(
                            key,
                            version,
                            c,
                            &SaslAuthenticateResponse::default()
                                .with_auth_bytes(Bytes::from(reply))
                                .with_session_lifetime_ms(60_000),
                        )
                    }
                    _ => {
                        // Anything else: record that it got here, hang up.
                        tokens.lock().unwrap().push(frame.clone());
                        return;
                    }
                };
                write_frame(&mut s, &out).await;
            }
        });
    }
}

fn request<R: Request + Encodable>(correlation: i32, version: i16, req: &R) -> BytesMut {
    let mut out = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("sasl-test")))
        .encode(&mut out, R::header_version(version))
        .unwrap();
    req.encode(&mut out, version).unwrap();
    out
}

fn decode<R: Request>(mut frame: Bytes, version: i16, correlation: i32) -> R::Response {
    let key = ApiKey::try_from(R::KEY).unwrap();
    let h = ResponseHeader::decode(&mut frame, key.response_header_version(version)).unwrap();
    assert_eq!(h.correlation_id, correlation);
    <R::Response as Decodable>::decode(&mut frame, version).unwrap()
}

async fn start_proxy() -> (Arc<proxy::Shared>, u16, Arc<Mutex<Vec<Bytes>>>) {
    start_proxy_with("").await
}

async fn start_proxy_with(
    upstream_extra: &str,
) -> (Arc<proxy::Shared>, u16, Arc<Mutex<Vec<Bytes>>>) {
    start_proxy_with_policies(upstream_extra, PolicySet::load(&[]).unwrap()).await
}

async fn start_proxy_with_policies(
    upstream_extra: &str,
    policies: PolicySet,
) -> (Arc<proxy::Shared>, u16, Arc<Mutex<Vec<Bytes>>>) {
    let broker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broker_port = broker.local_addr().unwrap().port();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(mock_broker(broker, broker_port, tokens.clone()));
    let proxy_port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        - 1;
    let yaml = format!(
        "listen:\n  bootstrap: 127.0.0.1:{proxy_port}\n  broker_port_base: {base}\nupstream:\n  bootstrap_servers: [127.0.0.1:{broker_port}]\n{upstream_extra}"
    );
    let config = Config::parse(&yaml, Path::new("test.yaml")).unwrap();
    let shared = proxy::start(config, policies, Vec::new()).await.unwrap();
    (shared, proxy_port, tokens)
}

#[tokio::test]
async fn raw_sasl_tokens_after_a_v0_handshake_are_relayed_untouched() {
    let (shared, port, tokens) = start_proxy().await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();

    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"));
    write_frame(&mut c, &request(1, 0, &hs)).await;
    let resp = decode::<SaslHandshakeRequest>(read_frame(&mut c).await.unwrap(), 0, 1);
    assert_eq!(resp.mechanisms[0].as_str(), "PLAIN");

    // A PLAIN token whose first bytes happen to look like api key 65.
    let token = b"\0Alice\0secret";
    write_frame(&mut c, token).await;
    let reply = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut c))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply[..], b"server:\0Alice\0secret");
    assert_eq!(tokens.lock().unwrap()[0], Bytes::from_static(token));

    // Back to Kafka framing: metadata flows, with the proxy's address.
    write_frame(&mut c, &request(2, 1, &MetadataRequest::default())).await;
    let md = decode::<MetadataRequest>(read_frame(&mut c).await.unwrap(), 1, 2);
    assert_eq!(md.brokers[0].port, shared.addrs.port_for(1).unwrap() as i32);
    proxy::stop(&shared).await;
}

#[tokio::test]
async fn after_a_refused_v0_handshake_frames_are_requests_again() {
    let (shared, port, tokens) = start_proxy().await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI"));
    write_frame(&mut c, &request(1, 0, &hs)).await;
    let resp = decode::<SaslHandshakeRequest>(read_frame(&mut c).await.unwrap(), 0, 1);
    assert_eq!(resp.error_code, 33);

    // Requests still flow in Kafka framing.
    write_frame(&mut c, &request(2, 1, &MetadataRequest::default())).await;
    decode::<MetadataRequest>(read_frame(&mut c).await.unwrap(), 1, 2);

    // A frame that is no request is not relayed as a raw token: the proxy
    // ends the connection and the broker never sees it.
    write_frame(&mut c, b"\0alice\0secret").await;
    let closed = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut c))
        .await
        .expect("the proxy must close the connection");
    assert!(closed.is_none());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tokens.lock().unwrap().is_empty(),
        "the token reached the broker"
    );
    proxy::stop(&shared).await;
}

#[tokio::test]
async fn sasl_authenticate_and_kip_368_reauthentication_pass_through_in_order() {
    let (shared, port, tokens) = start_proxy().await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"));
    let auth = |t: &'static [u8]| {
        SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(t))
    };

    write_frame(&mut c, &request(1, 1, &hs)).await;
    write_frame(&mut c, &request(2, 2, &auth(b"\0bob\0pw1"))).await;
    // Re-authentication later on the same connection, pipelined with metadata.
    write_frame(&mut c, &request(3, 1, &MetadataRequest::default())).await;
    write_frame(&mut c, &request(4, 1, &hs)).await;
    write_frame(&mut c, &request(5, 2, &auth(b"\0bob\0pw2"))).await;

    decode::<SaslHandshakeRequest>(read_frame(&mut c).await.unwrap(), 1, 1);
    let a1 = decode::<SaslAuthenticateRequest>(read_frame(&mut c).await.unwrap(), 2, 2);
    assert_eq!(&a1.auth_bytes[..], b"server:\0bob\0pw1");
    assert_eq!(a1.session_lifetime_ms, 60_000);
    decode::<MetadataRequest>(read_frame(&mut c).await.unwrap(), 1, 3);
    decode::<SaslHandshakeRequest>(read_frame(&mut c).await.unwrap(), 1, 4);
    let a2 = decode::<SaslAuthenticateRequest>(read_frame(&mut c).await.unwrap(), 2, 5);
    assert_eq!(&a2.auth_bytes[..], b"server:\0bob\0pw2");
    assert_eq!(tokens.lock().unwrap().len(), 2);
    proxy::stop(&shared).await;
}

#[tokio::test]
async fn the_proxys_own_connections_authenticate_with_sasl_plain() {
    let (shared, _port, tokens) =
        start_proxy_with("  sasl: { mechanism: PLAIN, username: svc, password: pw }\n").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !shared.ready.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "metadata never fetched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tokens.lock().unwrap()[0], Bytes::from_static(b"\0svc\0pw"));
    proxy::stop(&shared).await;
}

/// A request frame built by hand (for versions the crate will not encode):
/// header with client id "t", tagged fields when flexible, then `body`.
fn raw_request(key: ApiKey, version: i16, correlation: i32, body: &[u8]) -> Vec<u8> {
    let mut b = (key as i16).to_be_bytes().to_vec();
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&correlation.to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes());
    b.push(b't');
    if key.request_header_version(version) >= 2 {
        b.push(0);
    }
    b.extend_from_slice(body);
    b
}

/// A v0 handshake for `mechanism`, accepted by the mock broker.
async fn v0_handshake(c: &mut TcpStream, mechanism: &'static str) {
    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
    write_frame(c, &request(1, 0, &hs)).await;
    let resp = decode::<SaslHandshakeRequest>(read_frame(c).await.unwrap(), 0, 1);
    assert_eq!(resp.error_code, 0);
}

/// One raw token and the mock broker's raw answer to it.
async fn raw_round(c: &mut TcpStream, token: &[u8]) {
    write_frame(c, token).await;
    let reply = tokio::time::timeout(Duration::from_secs(5), read_frame(c))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply[..], &[b"server:", token].concat()[..]);
}

/// After the exchange: DescribeQuorum v2 (whose answers carry controller
/// endpoints the proxy does not rewrite) is answered UNSUPPORTED_VERSION by
/// the proxy, and a Fetch v3 (no top-level error code) closes the
/// connection; neither reaches the broker.
async fn out_of_range_requests_are_refused(c: &mut TcpStream) {
    write_frame(c, &raw_request(ApiKey::DescribeQuorum, 2, 8, &[1, 0])).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), read_frame(c))
        .await
        .unwrap()
        .expect("an UNSUPPORTED_VERSION answer");
    let resp = decode::<DescribeQuorumRequest>(answer, 2, 8);
    assert_eq!(resp.error_code, 35);
    write_frame(c, &raw_request(ApiKey::Fetch, 3, 9, &[0; 16])).await;
    let closed = tokio::time::timeout(Duration::from_secs(5), read_frame(c))
        .await
        .expect("the proxy must close the connection");
    assert!(closed.is_none(), "a Fetch v3 was answered");
}

#[tokio::test]
async fn after_a_plain_v0_token_out_of_range_requests_are_refused_not_relayed() {
    let (shared, port, tokens) = start_proxy().await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    v0_handshake(&mut c, "PLAIN").await;
    raw_round(&mut c, b"\0alice\0secret").await;
    out_of_range_requests_are_refused(&mut c).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        *tokens.lock().unwrap(),
        vec![Bytes::from_static(b"\0alice\0secret")],
        "only the token reached the broker"
    );
    proxy::stop(&shared).await;
}

#[tokio::test]
async fn after_scrams_two_v0_tokens_requests_are_classified_again() {
    let (shared, port, tokens) = start_proxy().await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    v0_handshake(&mut c, "SCRAM-SHA-256").await;
    let first = b"n,,n=alice,r=rOprNGfwEbeRWgbNEkqO";
    // A client-final whose first bytes happen to look like Fetch v3.
    let last = b"\x00\x01\x00\x03c=biws,r=rOprNGfwEbeRWgbNEkqO,p=proof";
    raw_round(&mut c, first).await;
    raw_round(&mut c, last).await;
    // Back to Kafka framing: metadata flows, with the proxy's address.
    write_frame(&mut c, &request(2, 1, &MetadataRequest::default())).await;
    let md = decode::<MetadataRequest>(read_frame(&mut c).await.unwrap(), 1, 2);
    assert_eq!(md.brokers[0].port, shared.addrs.port_for(1).unwrap() as i32);
    out_of_range_requests_are_refused(&mut c).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seen = tokens.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![Bytes::from_static(first), Bytes::from_static(last)]
    );
    proxy::stop(&shared).await;
}

fn a_policy() -> PolicySet {
    PolicySet::parse(
        "policies:\n  - name: f\n    topics: [orders]\n",
        Path::new("/tmp/sasl-test-policies.yaml"),
    )
    .unwrap()
}

#[tokio::test]
async fn with_policies_loaded_a_gssapi_v0_handshake_is_refused_and_v1_is_not() {
    let (shared, port, tokens) = start_proxy_with_policies("", a_policy()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI"));
    write_frame(&mut c, &request(1, 0, &hs)).await;
    let closed = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut c))
        .await
        .expect("the proxy must close the connection");
    assert!(closed.is_none(), "the v0 handshake was answered");

    // v1 is relayed as before (the mock broker offers no GSSAPI).
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    write_frame(&mut c, &request(1, 1, &hs)).await;
    let resp = decode::<SaslHandshakeRequest>(read_frame(&mut c).await.unwrap(), 1, 1);
    assert_eq!(resp.error_code, 33);

    // PLAIN v0 still works with policies loaded, for one token.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    v0_handshake(&mut c, "PLAIN").await;
    raw_round(&mut c, b"\0alice\0secret").await;
    out_of_range_requests_are_refused(&mut c).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The proxy's own connections may have sent requests of their own.
    let seen = tokens.lock().unwrap().clone();
    assert!(
        seen.contains(&Bytes::from_static(b"\0alice\0secret")),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|f| f.starts_with(&[0, 1, 0, 3]) || f.starts_with(&[0, 78])),
        "a refused request reached the broker: {seen:?}"
    );
    proxy::stop(&shared).await;
}
