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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::debug;

use crate::intercept::Holds;
use crate::proxy::frame::{self, FrameError, FrameReader, Reader};
use crate::proxy::net::BoxIo;
use crate::proxy::rewrite::{self, Seen};
use crate::proxy::{produce, versions, Shared};

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
    /// A SaslHandshake v0 answer: if it accepts, raw SASL tokens follow.
    SaslHandshakeV0,
    /// A Produce answer into which refused dead-letter partitions are merged.
    Produce(produce::Refused),
}

#[derive(Debug)]
struct Pending {
    correlation_id: Option<i32>,
    version: i16,
    handling: Handling,
}

/// What the request pump sends to the broker for one client frame.
#[derive(Debug)]
enum Send {
    /// The frame as it arrived.
    Original,
    /// A rewritten frame (a Produce without its dead-letter topics).
    Replaced(Bytes),
    /// Nothing: the proxy answers (or, for acks=0, drops) it itself.
    Nothing,
}

/// One client frame, classified.
#[derive(Debug)]
struct Classified {
    pending: Option<Pending>,
    send: Send,
}

impl Classified {
    fn forward(pending: Option<Pending>) -> Self {
        let send = match pending.as_ref().map(|p| &p.handling) {
            Some(Handling::Local(_)) => Send::Nothing,
            _ => Send::Original,
        };
        Classified { pending, send }
    }
}

/// What classifying a request needs to know about the connection and the proxy.
struct Context<'a> {
    /// The broker accepted a SaslHandshake v0: unparseable frames are tokens.
    raw_sasl: bool,
    intercepting: bool,
    /// Set while client Produce to dead-letter topics is refused.
    dead_letters: Option<&'a dyn produce::Topics>,
}

/// State the two pumps of one connection share.
#[derive(Default)]
struct ConnState {
    /// Set from the response side, when the broker accepts a SaslHandshake
    /// v0 (the client sends no token before it has seen that answer).
    raw_sasl: AtomicBool,
    /// Requests whose answers have not yet been written to the client; the
    /// idle timeout never closes a connection with one pending.
    in_flight: AtomicUsize,
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
    let state = ConnState::default();
    let requests = request_pump(&shared, &state, FrameReader::new(cr, max), bw, tx);
    let responses = response_pump(&shared, &state, FrameReader::new(br, max), cw, rx);
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

/// The next client frame; `None` at a clean end, at shutdown, or once the
/// connection has been idle (no request, no answer pending) for
/// `limits.idle_timeout`.
async fn next_request<R: tokio::io::AsyncRead + Unpin>(
    shared: &Shared,
    state: &ConnState,
    client: &mut FrameReader<R>,
) -> Result<Option<Bytes>, RelayError> {
    let idle = shared.config.limits.idle_timeout;
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return Ok(None),
            // FrameReader::next keeps partial frames in its buffer, so
            // abandoning it for the timer loses nothing.
            f = client.next() => return f.map_err(RelayError::ClientFrame),
            _ = tokio::time::sleep(idle) => {
                if state.in_flight.load(Ordering::SeqCst) == 0 {
                    debug!(?idle, "closing idle client connection");
                    return Ok(None);
                }
            }
        }
    }
}

async fn request_pump<R, W>(
    shared: &Arc<Shared>,
    state: &ConnState,
    mut client: FrameReader<R>,
    mut broker: W,
    pending: mpsc::Sender<Pending>,
) -> Result<(), RelayError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let Some(frame) = next_request(shared, state, &mut client).await? else {
            return Ok(());
        };
        learn_produce_topic_ids(shared, &frame).await;
        let c = classify_with_policies(shared, state, &frame)?;
        if let Some(p) = c.pending {
            if matches!(p.handling, Handling::SaslHandshakeV0) {
                // Until the broker accepts it, frames are still requests.
                state.raw_sasl.store(false, Ordering::SeqCst);
            }
            state.in_flight.fetch_add(1, Ordering::SeqCst);
            if pending.send(p).await.is_err() {
                return Ok(()); // response side is gone; its error is reported there
            }
        }
        let out = match c.send {
            Send::Original => frame,
            Send::Replaced(f) => f,
            Send::Nothing => continue,
        };
        broker
            .write_all(&out)
            .await
            .map_err(RelayError::BrokerWrite)?;
        // A no-op on TCP; on TLS it pushes the record out now.
        broker.flush().await.map_err(RelayError::BrokerWrite)?;
    }
}

/// Produce v13+ names topics by id: before checking it for dead-letter
/// topics, look up ids the proxy has not seen (a topic created since the
/// last metadata refresh). Ids still unknown are not dead-letter topics the
/// proxy knows of; the broker answers for them.
async fn learn_produce_topic_ids(shared: &Arc<Shared>, frame: &Bytes) {
    let Some(head) = frame::peek_request(frame) else {
        return;
    };
    if head.api_key != ApiKey::Produce as i16
        || head.api_version < 13
        || shared.config.dead_letter.allow_client_produce
        || !shared.intercepting()
    {
        return;
    }
    let ids = produce::topic_ids(frame, head.api_version);
    if ids.iter().any(|id| !shared.topic_names.contains_key(id)) {
        shared.resolve_topic_ids(&ids).await;
    }
}

/// Classify one frame under the current policies (read per request, so a
/// reload applies to open connections too).
fn classify_with_policies(
    shared: &Shared,
    state: &ConnState,
    frame: &Bytes,
) -> Result<Classified, RelayError> {
    let policies = shared.interceptor.policies();
    let guard = DeadLetterTopics {
        shared,
        policies: &policies,
    };
    let refuse_dlt = !shared.config.dead_letter.allow_client_produce && !policies.is_empty();
    let ctx = Context {
        raw_sasl: state.raw_sasl.load(Ordering::SeqCst),
        intercepting: shared.intercepting(),
        dead_letters: refuse_dlt.then_some(&guard as &dyn produce::Topics),
    };
    classify(frame, &ctx)
}

/// Dead-letter topics as the Produce check sees them: the policies this
/// connection started with, topic ids resolved through the proxy's metadata.
struct DeadLetterTopics<'a> {
    shared: &'a Shared,
    policies: &'a crate::policy::PolicySet,
}

impl produce::Topics for DeadLetterTopics<'_> {
    fn is_dead_letter(&self, name: &str) -> bool {
        self.policies.is_dead_letter_topic(name)
    }
    fn name_of(&self, id: &uuid::Uuid) -> Option<String> {
        self.shared.topic_names.get(id).map(|n| n.to_string())
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

/// Decide what the response to `frame` will need and what goes to the
/// broker; a request the proxy refuses outright is an error (the
/// connection closes).
fn classify(frame: &Bytes, ctx: &Context) -> Result<Classified, RelayError> {
    let head = frame::peek_request(frame).filter(|h| is_known_request(h.api_key, h.api_version));
    let Some(head) = head else {
        if ctx.raw_sasl {
            return Ok(Classified::forward(Some(raw_token())));
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
    let pending = |handling| Pending {
        correlation_id: Some(head.correlation_id),
        version: v,
        handling,
    };
    let handling = match key {
        ApiKey::ApiVersions if v > versions::max_api_versions_version() => {
            let body = versions::unsupported_version_body()
                .map_err(|e| RelayError::BadRequest(e.to_string()))?;
            Handling::Local(response_frame(head.correlation_id, &[], &body))
        }
        // Raw tokens that happen to look like a request are still tokens.
        _ if !versions::in_proxy_range(key, v) && ctx.raw_sasl => {
            return Ok(Classified::forward(Some(raw_token())))
        }
        _ if !versions::in_proxy_range(key, v) => Handling::Local(refusal(key, head)?),
        ApiKey::ApiVersions => Handling::ApiVersions,
        ApiKey::Produce if ctx.dead_letters.is_some() => {
            return classify_produce(frame, head, ctx.dead_letters)
        }
        ApiKey::Produce if produce_acks(frame, v) == Some(0) => {
            return Ok(Classified::forward(None))
        }
        ApiKey::SaslHandshake if v == 0 => Handling::SaslHandshakeV0,
        ApiKey::Fetch if ctx.intercepting => Handling::Fetch {
            isolation: fetch_isolation(frame, v)
                .ok_or_else(|| RelayError::BadRequest("truncated Fetch request".into()))?,
        },
        k if rewrite::carries_addresses(k, v) => Handling::Addresses(k),
        _ => Handling::Forward,
    };
    Ok(Classified::forward(Some(pending(handling))))
}

/// A raw SASL token: answered by one raw blob, no correlation id.
fn raw_token() -> Pending {
    Pending {
        correlation_id: None,
        version: 0,
        handling: Handling::Forward,
    }
}

/// The UNSUPPORTED_VERSION answer to a request outside the advertised
/// ranges, or an error (closing the connection, as a broker does) when the
/// API has no top-level error code to carry it.
fn refusal(key: ApiKey, head: frame::RequestHead) -> Result<Bytes, RelayError> {
    let v = head.api_version;
    let body = versions::refusal(key, v).ok_or_else(|| {
        RelayError::BadRequest(format!(
            "{key:?} v{v} is outside the versions the proxy offers"
        ))
    })?;
    Ok(response_frame(
        head.correlation_id,
        response_tags(key, v),
        &body,
    ))
}

/// The tagged-field bytes of an empty response header for `key`/`version`.
fn response_tags(key: ApiKey, version: i16) -> &'static [u8] {
    if key.response_header_version(version) >= 1 {
        &[0]
    } else {
        &[]
    }
}

/// A Produce while writes to dead-letter topics are refused.
fn classify_produce(
    frame: &Bytes,
    head: frame::RequestHead,
    topics: Option<&dyn produce::Topics>,
) -> Result<Classified, RelayError> {
    let v = head.api_version;
    let pending = |handling| {
        Some(Pending {
            correlation_id: Some(head.correlation_id),
            version: v,
            handling,
        })
    };
    let decision = match topics {
        Some(t) => {
            produce::check(frame, v, t).map_err(|e| RelayError::BadRequest(e.to_string()))?
        }
        None => produce::Decision::Untouched,
    };
    Ok(match decision {
        produce::Decision::Untouched => match produce_acks(frame, v) {
            Some(0) => Classified::forward(None),
            _ => Classified::forward(pending(Handling::Forward)),
        },
        produce::Decision::Split {
            request,
            refused,
            acks,
        } => Classified {
            pending: if acks == 0 {
                None
            } else {
                pending(Handling::Produce(refused))
            },
            send: Send::Replaced(request),
        },
        produce::Decision::AllRefused { body } => Classified {
            pending: body.and_then(|b| {
                let out =
                    response_frame(head.correlation_id, response_tags(ApiKey::Produce, v), &b);
                pending(Handling::Local(out))
            }),
            send: Send::Nothing,
        },
    })
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
    state: &ConnState,
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
                if matches!(handling, Handling::SaslHandshakeV0) {
                    // Set before the client sees the answer, hence before
                    // its first token can arrive.
                    state.raw_sasl.store(
                        handshake_accepted(&frame).unwrap_or(false),
                        Ordering::SeqCst,
                    );
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
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
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
        Handling::Forward | Handling::Local(_) | Handling::SaslHandshakeV0 => Ok(frame),
        Handling::Produce(refused) => {
            let key = ApiKey::Produce;
            let header_end = response_header_end(&frame, key, version)
                .ok_or_else(|| RelayError::BadResponse("Produce response header".into()))?;
            let body = produce::merge(frame.slice(header_end..), version, &refused)
                .map_err(|e| RelayError::BadResponse(e.to_string()))?;
            Ok(response_frame_raw(&frame[4..header_end], &body))
        }
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

/// Whether a SaslHandshake v0 answer (v0 header, then error_code) accepts
/// the mechanism.
fn handshake_accepted(frame: &[u8]) -> Option<bool> {
    Reader::new(frame, 8).i16().map(|code| code == 0)
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

    fn ctx(raw_sasl: bool) -> Context<'static> {
        Context {
            raw_sasl,
            intercepting: false,
            dead_letters: None,
        }
    }

    fn pending(frame: &Bytes, raw_sasl: bool) -> Option<Pending> {
        classify(frame, &ctx(raw_sasl)).unwrap().pending
    }

    #[test]
    fn produce_with_acks_zero_expects_no_response() {
        // v3: transactional_id null (-1), acks 0
        assert!(pending(&request(0, 3, &[0xff, 0xff, 0, 0]), false).is_none());
        // v9 (flexible): compact null transactional id (0), acks -1
        assert!(pending(&request(0, 9, &[0, 0xff, 0xff]), false).is_some());
        assert_eq!(produce_acks(&request(0, 2, &[0, 1]), 2), Some(1));
    }

    #[test]
    fn raw_sasl_tokens_are_relayed_only_in_raw_mode() {
        let token = frame::with_length_prefix(b"\0admin\0secret");
        assert!(classify(&token, &ctx(false)).is_err());
        let p = pending(&token, true).unwrap();
        assert_eq!(p.correlation_id, None);
        // The handshake v0 itself does not switch modes: its answer does.
        let p = pending(&request(17, 0, &[]), false).unwrap();
        assert!(matches!(p.handling, Handling::SaslHandshakeV0));
        let p = pending(&request(17, 1, &[]), false).unwrap();
        assert!(matches!(p.handling, Handling::Forward));
    }

    #[test]
    fn a_handshake_answer_switches_to_raw_mode_only_when_it_accepts() {
        let answer = |code: i16| {
            let mut b = 9i32.to_be_bytes().to_vec();
            b.extend_from_slice(&code.to_be_bytes());
            b.extend_from_slice(&0i32.to_be_bytes()); // no mechanisms
            frame::with_length_prefix(&b)
        };
        assert_eq!(handshake_accepted(&answer(0)), Some(true));
        assert_eq!(handshake_accepted(&answer(33)), Some(false));
        assert_eq!(handshake_accepted(&[0, 0, 0, 4, 0, 0, 0, 9]), None);
    }

    #[test]
    fn requests_outside_the_offered_versions_are_refused() {
        // ShareFetch v1: answered locally with UNSUPPORTED_VERSION.
        let c = classify(&request(78, 1, &[]), &ctx(false)).unwrap();
        assert!(matches!(c.send, Send::Nothing));
        let Some(Pending {
            handling: Handling::Local(out),
            ..
        }) = c.pending
        else {
            panic!("expected a local answer");
        };
        assert_eq!(frame::peek_correlation_id(&out), Some(7));
        // Flexible response header: one empty tagged-field byte, then
        // throttle_time_ms, then error_code.
        assert_eq!(&out[9..13], &[0, 0, 0, 0]);
        assert_eq!(&out[13..15], &35i16.to_be_bytes());
        // Fetch v3 has no top-level error code: the connection closes.
        assert!(classify(&request(1, 3, &[]), &ctx(false)).is_err());
        // In raw SASL mode such a frame is a token.
        assert!(pending(&request(1, 3, &[]), true)
            .unwrap()
            .correlation_id
            .is_none());
    }

    #[test]
    fn metadata_and_coordinator_responses_are_marked_for_rewriting() {
        for key in [3i16, 10, 60] {
            let p = pending(&request(key, 1, &[]), false).unwrap();
            assert!(matches!(p.handling, Handling::Addresses(_)), "key {key}");
        }
        let p = pending(&request(1, 12, &[]), false).unwrap();
        assert!(matches!(p.handling, Handling::Forward));
    }
}
