//! One client connection and its upstream broker connection.
//!
//! Two pumps share an in-order queue of pending responses. The request pump
//! reads client frames, peeks each header (api key, version, correlation id)
//! and records what the matching response will need, then forwards the
//! frame's bytes unchanged. The response pump pairs each broker frame with
//! the head of that queue (Kafka answers a connection's requests in order)
//! and either forwards the bytes as they arrived or hands them to a rewrite
//! (ApiVersions, broker addresses). A malformed or oversized frame from
//! either side ends this connection only, with one log line.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::intercept::Holds;
use crate::proxy::frame::{self, FrameError, FrameReader, Reader};
use crate::proxy::net::BoxIo;
use crate::proxy::rewrite::{self, Seen};
use crate::proxy::{versions, Shared};

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("client: {0}")]
    ClientFrame(FrameError),
    #[error("broker: {0}")]
    BrokerFrame(FrameError),
    #[error("client sent a malformed request: {0}")]
    BadRequest(String),
    #[error("broker sent a malformed response: {0}")]
    BadResponse(String),
    #[error("broker closed the connection with {0} response(s) pending")]
    BrokerClosed(usize),
    #[error("writing to client: {0}")]
    ClientWrite(std::io::Error),
    #[error("writing to broker: {0}")]
    BrokerWrite(std::io::Error),
}

/// What the response to one request needs on its way back.
#[derive(Debug)]
enum Handling {
    /// Forward the broker's bytes untouched.
    Forward,
    /// Intersect the broker's API versions with the proxy's.
    ApiVersions,
    /// Rewrite the broker addresses it carries.
    Addresses(ApiKey),
    /// Answer from the proxy without asking the broker.
    Local(Bytes),
    /// A Fetch response to inspect for poison records.
    Fetch { isolation: i8 },
}

#[derive(Debug)]
struct Pending {
    correlation_id: Option<i32>,
    version: i16,
    handling: Handling,
}

/// Pipelined requests allowed in flight per connection before the proxy
/// stops reading from the client (backpressure, bounded memory).
const MAX_PENDING: usize = 1024;

/// Relay between `client` and `broker` until either side closes or shutdown
/// is requested (in-flight responses are still delivered then).
pub async fn relay(shared: Arc<Shared>, client: BoxIo, broker: BoxIo) -> Result<(), RelayError> {
    let max = shared.config.limits.max_frame_bytes;
    let (cr, cw) = tokio::io::split(client);
    let (br, bw) = tokio::io::split(broker);
    let (tx, rx) = mpsc::channel(MAX_PENDING);
    let requests = request_pump(&shared, FrameReader::new(cr, max), bw, tx);
    let responses = response_pump(&shared, FrameReader::new(br, max), cw, rx);
    tokio::pin!(requests, responses);
    tokio::select! {
        r = &mut responses => r,
        r = &mut requests => {
            // The client is done (or shutdown began): deliver what is pending.
            let done = responses.await;
            r.and(done)
        }
    }
}

async fn request_pump<R, W>(
    shared: &Arc<Shared>,
    mut client: FrameReader<R>,
    mut broker: W,
    pending: mpsc::Sender<Pending>,
) -> Result<(), RelayError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // After a SaslHandshake v0, SASL tokens travel as bare length-prefixed
    // blobs, each answered by one blob (protocol-notes §7).
    let mut raw_sasl = false;
    loop {
        let frame = tokio::select! {
            _ = shared.shutdown.cancelled() => return Ok(()),
            f = client.next() => match f.map_err(RelayError::ClientFrame)? {
                Some(f) => f,
                None => return Ok(()),
            },
        };
        let p = classify(&frame, &mut raw_sasl, shared.intercepting())?;
        let forward = !matches!(p.as_ref().map(|p| &p.handling), Some(Handling::Local(_)));
        if let Some(p) = p {
            if pending.send(p).await.is_err() {
                return Ok(()); // response side is gone; its error is reported there
            }
        }
        if forward {
            broker
                .write_all(&frame)
                .await
                .map_err(RelayError::BrokerWrite)?;
            // A no-op on TCP; on TLS it pushes the record out now.
            broker.flush().await.map_err(RelayError::BrokerWrite)?;
        }
    }
}

/// The isolation level of a Fetch request (v4+), found by hand.
fn fetch_isolation(frame: &[u8], version: i16) -> Option<i8> {
    let flexible = ApiKey::Fetch.request_header_version(version) >= 2;
    let mut r = Reader::new(frame, frame::request_body_offset(frame, flexible)?);
    if version < 15 {
        r.i32()?; // replica_id (a tagged field from v15)
    }
    r.skip(12)?; // max_wait_ms, min_bytes, max_bytes
    if version >= 4 {
        r.i8()
    } else {
        Some(0)
    }
}

/// Decide what the response to `frame` will need; `None` if no response
/// will come (Produce with acks=0).
fn classify(
    frame: &Bytes,
    raw_sasl: &mut bool,
    intercepting: bool,
) -> Result<Option<Pending>, RelayError> {
    let head = frame::peek_request(frame).filter(|h| is_known_request(h.api_key, h.api_version));
    let Some(head) = head else {
        if *raw_sasl {
            return Ok(Some(Pending {
                correlation_id: None,
                version: 0,
                handling: Handling::Forward,
            }));
        }
        return Err(RelayError::BadRequest(match frame::peek_request(frame) {
            Some(h) => format!("unknown api key {} version {}", h.api_key, h.api_version),
            None => format!(
                "a {}-byte frame is too short for a request header",
                frame.len()
            ),
        }));
    };
    let key = ApiKey::try_from(head.api_key)
        .map_err(|_| RelayError::BadRequest("unknown api key".into()))?;
    let v = head.api_version;
    let handling = match key {
        ApiKey::ApiVersions if v > versions::max_api_versions_version() => {
            let body = versions::unsupported_version_body()
                .map_err(|e| RelayError::BadRequest(e.to_string()))?;
            Handling::Local(response_frame(head.correlation_id, &[], &body))
        }
        ApiKey::ApiVersions => Handling::ApiVersions,
        ApiKey::Produce if produce_acks(frame, v) == Some(0) => return Ok(None),
        ApiKey::SaslHandshake => {
            *raw_sasl = v == 0;
            Handling::Forward
        }
        ApiKey::Fetch if intercepting => Handling::Fetch {
            isolation: fetch_isolation(frame, v)
                .ok_or_else(|| RelayError::BadRequest("truncated Fetch request".into()))?,
        },
        k if rewrite::carries_addresses(k, v) => Handling::Addresses(k),
        _ => Handling::Forward,
    };
    Ok(Some(Pending {
        correlation_id: Some(head.correlation_id),
        version: v,
        handling,
    }))
}

/// Whether a header names an API key and version the proxy knows; used to
/// tell requests from raw SASL tokens, which never look like one.
fn is_known_request(key: i16, version: i16) -> bool {
    ApiKey::try_from(key)
        .map(|k| {
            let r = k.valid_versions();
            // ApiVersions may legitimately be newer than we know (KIP-511).
            version >= 0 && (version <= r.max || k == ApiKey::ApiVersions && version < 100)
        })
        .unwrap_or(false)
}

/// The `acks` field of a Produce request, found by hand so that produce
/// traffic is never decoded.
fn produce_acks(frame: &[u8], version: i16) -> Option<i16> {
    let flexible = ApiKey::Produce.request_header_version(version) >= 2;
    let mut r = Reader::new(frame, frame::request_body_offset(frame, flexible)?);
    if version >= 3 {
        r.skip_nullable_string(version >= 9)?; // transactional_id
    }
    r.i16()
}

async fn response_pump<R, W>(
    shared: &Arc<Shared>,
    mut broker: FrameReader<R>,
    mut client: W,
    mut pending: mpsc::Receiver<Pending>,
) -> Result<(), RelayError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut holds = Holds::default();
    loop {
        let p = tokio::select! {
            // A response's entry is queued before its request is sent, so
            // checking the queue first never mistakes a response for an
            // unsolicited frame.
            biased;
            p = pending.recv() => match p {
                Some(p) => p,
                None => return Ok(()),
            },
            // Nothing is pending: a frame now is unsolicited, EOF is a close.
            f = broker.next() => return match f.map_err(RelayError::BrokerFrame)? {
                None => Ok(()),
                Some(_) => Err(RelayError::BadResponse("unsolicited frame".into())),
            },
        };
        let out = match p.handling {
            Handling::Local(frame) => frame,
            handling => {
                let frame = match broker.next().await.map_err(RelayError::BrokerFrame)? {
                    Some(f) => f,
                    None => return Err(RelayError::BrokerClosed(1 + pending.len())),
                };
                if let Some(id) = p.correlation_id {
                    if frame::peek_correlation_id(&frame) != Some(id) {
                        return Err(RelayError::BadResponse(format!(
                            "expected correlation id {id}, got {:?}",
                            frame::peek_correlation_id(&frame)
                        )));
                    }
                }
                respond(shared, &mut holds, handling, p.version, frame).await?
            }
        };
        client
            .write_all(&out)
            .await
            .map_err(RelayError::ClientWrite)?;
        // A no-op on TCP; on TLS a response must not wait in the session
        // buffer for the next one (which may be a long-polling Fetch).
        client.flush().await.map_err(RelayError::ClientWrite)?;
    }
}

/// Turn a broker's response frame into what the client receives.
async fn respond(
    shared: &Arc<Shared>,
    holds: &mut Holds,
    handling: Handling,
    version: i16,
    frame: Bytes,
) -> Result<Bytes, RelayError> {
    let bad = |e: anyhow::Error| RelayError::BadResponse(e.to_string());
    match handling {
        Handling::Forward | Handling::Local(_) => Ok(frame),
        Handling::ApiVersions => {
            // The ApiVersions response header is always v0: the correlation id alone.
            let body = versions::rewrite(frame.slice(8..), version).map_err(bad)?;
            Ok(response_frame_raw(&frame[4..8], &body))
        }
        Handling::Fetch { isolation } => {
            let interceptor = &shared.interceptor;
            let key = ApiKey::Fetch;
            let header_end = response_header_end(&frame, key, version)
                .ok_or_else(|| RelayError::BadResponse("Fetch response header".into()))?;
            let started = std::time::Instant::now();
            let body = interceptor
                .rewrite(shared, holds, frame.slice(header_end..), version, isolation)
                .await
                .map_err(bad)?;
            crate::metrics::global().fetch_rewrite_latency(started.elapsed());
            Ok(match body {
                Some(body) => response_frame_raw(&frame[4..header_end], &body),
                None => frame,
            })
        }
        Handling::Addresses(key) => {
            let header_end = response_header_end(&frame, key, version)
                .ok_or_else(|| RelayError::BadResponse(format!("{key:?} response header")))?;
            let mut seen = Seen::default();
            let body = rewrite::rewrite_body(
                key,
                version,
                frame.slice(header_end..),
                &shared.addrs,
                &mut seen,
            )
            .map_err(bad)?;
            // Listeners for newly seen brokers open before the client can
            // learn their ports.
            shared.learn(seen).await;
            Ok(match body {
                Some(body) => response_frame_raw(&frame[4..header_end], &body),
                None => frame,
            })
        }
    }
}

/// Where a response's body starts (length prefix included in the offset).
fn response_header_end(frame: &[u8], key: ApiKey, version: i16) -> Option<usize> {
    let mut r = Reader::new(frame, 8);
    if key.response_header_version(version) >= 1 {
        r.skip_tagged_fields()?;
    }
    Some(r.pos)
}

/// A response frame with a v0 header (correlation id) or a flexible header
/// whose tagged fields are `tags`.
fn response_frame(correlation_id: i32, tags: &[u8], body: &[u8]) -> Bytes {
    let mut header = correlation_id.to_be_bytes().to_vec();
    header.extend_from_slice(tags);
    response_frame_raw(&header, body)
}

/// Length prefix + the original header bytes + a new body.
fn response_frame_raw(header: &[u8], body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + header.len() + body.len());
    out.extend_from_slice(&((header.len() + body.len()) as u32).to_be_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(body);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: i16, version: i16, body: &[u8]) -> Bytes {
        let mut b = vec![];
        b.extend_from_slice(&key.to_be_bytes());
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&7i32.to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
        if ApiKey::try_from(key)
            .map(|k| k.request_header_version(version) >= 2)
            .unwrap_or(false)
        {
            b.push(0); // no tagged fields
        }
        b.extend_from_slice(body);
        frame::with_length_prefix(&b)
    }

    #[test]
    fn produce_with_acks_zero_expects_no_response() {
        let mut raw = false;
        // v3: transactional_id null (-1), acks 0
        assert!(
            classify(&request(0, 3, &[0xff, 0xff, 0, 0]), &mut raw, false)
                .unwrap()
                .is_none()
        );
        // v9 (flexible): compact null transactional id (0), acks -1
        assert!(classify(&request(0, 9, &[0, 0xff, 0xff]), &mut raw, false)
            .unwrap()
            .is_some());
        assert_eq!(produce_acks(&request(0, 2, &[0, 1]), 2), Some(1));
    }

    #[test]
    fn raw_sasl_tokens_are_relayed_only_after_a_v0_handshake() {
        let token = frame::with_length_prefix(b"\0admin\0secret");
        let mut raw = false;
        assert!(classify(&token, &mut raw, false).is_err());
        classify(&request(17, 0, &[]), &mut raw, false).unwrap();
        assert!(raw);
        let p = classify(&token, &mut raw, false).unwrap().unwrap();
        assert_eq!(p.correlation_id, None);
        // A v1 handshake means tokens travel in SaslAuthenticate requests.
        classify(&request(17, 1, &[]), &mut raw, false).unwrap();
        assert!(classify(&token, &mut raw, false).is_err());
    }

    #[test]
    fn metadata_and_coordinator_responses_are_marked_for_rewriting() {
        let mut raw = false;
        for key in [3i16, 10, 60] {
            let p = classify(&request(key, 1, &[]), &mut raw, false)
                .unwrap()
                .unwrap();
            assert!(matches!(p.handling, Handling::Addresses(_)), "key {key}");
        }
        let p = classify(&request(1, 12, &[]), &mut raw, false)
            .unwrap()
            .unwrap();
        assert!(matches!(p.handling, Handling::Forward));
    }
}
