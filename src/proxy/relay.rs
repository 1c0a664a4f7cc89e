//! One client connection and its upstream broker connection.
//!
//! Two pumps share an in-order queue of pending responses. The request pump
//! reads client frames, has each classified (`classify`: what the matching
//! response will need, and what goes to the broker), then forwards the
//! frame's bytes unchanged (or a Produce without the partitions it refuses, or
//! nothing when the proxy answers itself). It closes a connection idle for
//! `limits.idle_timeout` with no answer pending; large Produce requests are
//! classified (judged at the door) on a blocking thread. The response pump pairs each broker frame with
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

use crate::filter::Holds;
use crate::proxy::addresses::{self, Seen};
use crate::proxy::classify::{
    classify, Classified, Context, Handling, Pending, ProduceGuard, Send,
};
use crate::proxy::{produce, versions, Shared};
use crate::transport::frame::{
    self, Cursor, FrameError, FrameReader, ResponseFrame, LENGTH_PREFIX, RESPONSE_ID_END,
};
use crate::transport::net::BoxIo;

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
    #[error("Fetch response: {0}")]
    Filter(#[from] crate::filter::FilterError),
    #[error("broker closed the connection with {0} response(s) pending")]
    BrokerClosed(usize),
    #[error("writing to client: {0}")]
    ClientWrite(std::io::Error),
    #[error("writing to broker: {0}")]
    BrokerWrite(std::io::Error),
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
            // A frame that is ready wins over a timer that fired with it.
            biased;
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
        let c = classify_request(shared, state, frame.clone()).await?;
        if let Some(p) = c.pending {
            if matches!(p.handling, Handling::SaslHandshake) {
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
/// topics and at the door, look up ids the proxy has not seen (a topic
/// created since the last metadata refresh). Ids still unknown are not
/// dead-letter topics the proxy knows of (the broker answers for them);
/// the door refuses them retriably (UNKNOWN_TOPIC_ID).
async fn learn_produce_topic_ids(shared: &Arc<Shared>, frame: &Bytes) {
    let Some(head) = frame::peek_request(frame) else {
        return;
    };
    let checked = !shared.config.dead_letter.allow_client_produce
        || shared.fetch_filter.policies().rejects_at_produce();
    if head.api_key != ApiKey::Produce as i16
        || head.api_version < 13
        || !checked
        || !shared.intercepting()
    {
        return;
    }
    let ids = produce::topic_ids(frame, head.api_version);
    if ids.iter().any(|id| !shared.topic_names.contains_key(id)) {
        shared.resolve_topic_ids(&ids).await;
    }
}

/// Produce frames at least this large are classified (and so judged at the
/// door) on a blocking thread: judging costs about a microsecond per record,
/// and a worker thread busy with it stalls every connection it serves.
const OFFLOAD_BYTES: usize = 256 * 1024;

/// Classify one frame, large Produce requests off the async workers.
async fn classify_request(
    shared: &Arc<Shared>,
    state: &ConnState,
    frame: Bytes,
) -> Result<Classified, RelayError> {
    let raw_sasl = state.raw_sasl.load(Ordering::SeqCst);
    let produce = frame::peek_request(&frame).is_some_and(|h| h.api_key == ApiKey::Produce as i16);
    if !(produce && frame.len() >= OFFLOAD_BYTES) {
        return classify_with_policies(shared, raw_sasl, &frame);
    }
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || classify_with_policies(&shared, raw_sasl, &frame))
        .await
        .map_err(|e| RelayError::BadRequest(format!("judging a Produce request failed: {e}")))?
}

/// Classify one frame under the current policies (read per request, so a
/// reload applies to open connections too).
fn classify_with_policies(
    shared: &Shared,
    raw_sasl: bool,
    frame: &Bytes,
) -> Result<Classified, RelayError> {
    let policies = shared.fetch_filter.policies();
    let refuse_dlt = !shared.config.dead_letter.allow_client_produce && !policies.is_empty();
    let guard = ProduceGuard {
        shared,
        policies: &policies,
        refuse_dead_letters: refuse_dlt,
    };
    let checked = refuse_dlt || policies.rejects_at_produce();
    let ctx = Context {
        raw_sasl,
        intercepting: shared.intercepting(),
        produce_guard: checked.then_some(&guard as &dyn produce::Topics),
    };
    classify(frame, &ctx)
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
        let mut arrived = None;
        let out = match p.handling {
            Handling::Local(frame) => ResponseFrame::whole(frame),
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
                arrived = Some(std::time::Instant::now());
                if matches!(handling, Handling::SaslHandshake) {
                    // Set before the client sees the answer, hence before
                    // its first token can arrive.
                    let raw = p.version == 0 && handshake_accepted(&frame).unwrap_or(false);
                    state.raw_sasl.store(raw, Ordering::SeqCst);
                }
                respond(shared, &mut holds, handling, p.version, frame).await?
            }
        };
        let ready = arrived.map(|t| t.elapsed());
        out.write_to(&mut client)
            .await
            .map_err(RelayError::ClientWrite)?;
        // A no-op on TCP; on TLS a response must not wait in the session
        // buffer for the next one (which may be a long-polling Fetch).
        client.flush().await.map_err(RelayError::ClientWrite)?;
        if let (Some(t), Some(ready)) = (arrived, ready) {
            crate::metrics::global().response_relayed(out.rewritten(), ready, t.elapsed());
        }
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
) -> Result<ResponseFrame, RelayError> {
    let bad = |e: anyhow::Error| RelayError::BadResponse(e.to_string());
    match handling {
        Handling::Forward | Handling::Local(_) | Handling::SaslHandshake => {
            Ok(ResponseFrame::whole(frame))
        }
        Handling::Produce(refused) => {
            let key = ApiKey::Produce;
            let header_end = response_header_end(&frame, key, version)
                .ok_or_else(|| RelayError::BadResponse("Produce response header".into()))?;
            let body = produce::merge(frame.slice(header_end..), version, &refused)
                .map_err(|e| RelayError::BadResponse(e.to_string()))?;
            let body = body.freeze();
            // v10+ answers name brokers (NodeEndpoints) like any other.
            let rewritten = if addresses::carries_addresses(key, version) {
                let mut seen = Seen::default();
                let b =
                    addresses::rewrite_body(key, version, body.clone(), &shared.addrs, &mut seen)
                        .map_err(bad)?;
                shared.learn(seen).await;
                b
            } else {
                None
            };
            let body = rewritten.map_or(body, BytesMut::freeze);
            Ok(ResponseFrame::new(&frame[LENGTH_PREFIX..header_end], body))
        }
        Handling::ApiVersions => {
            // The ApiVersions response header is always v0: the correlation id alone.
            let body = versions::rewrite(frame.slice(8..), version).map_err(bad)?;
            Ok(ResponseFrame::new(
                &frame[LENGTH_PREFIX..RESPONSE_ID_END],
                Bytes::from(body),
            ))
        }
        Handling::Fetch { isolation } => {
            let fetch_filter = &shared.fetch_filter;
            let key = ApiKey::Fetch;
            let header_end = response_header_end(&frame, key, version)
                .ok_or_else(|| RelayError::BadResponse("Fetch response header".into()))?;
            let started = std::time::Instant::now();
            let body = fetch_filter
                .filter(shared, holds, frame.slice(header_end..), version, isolation)
                .await?;
            crate::metrics::global().fetch_rewrite_latency(started.elapsed());
            Ok(match body {
                Some(body) => ResponseFrame::chunks(&frame[LENGTH_PREFIX..header_end], body),
                None => ResponseFrame::whole(frame),
            })
        }
        Handling::Addresses(key) => {
            let header_end = response_header_end(&frame, key, version)
                .ok_or_else(|| RelayError::BadResponse(format!("{key:?} response header")))?;
            let mut seen = Seen::default();
            let body = addresses::rewrite_body(
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
                Some(body) => ResponseFrame::new(&frame[LENGTH_PREFIX..header_end], body.freeze()),
                None => ResponseFrame::whole(frame),
            })
        }
    }
}

/// Whether a SaslHandshake v0 answer (v0 header, then error_code) accepts
/// the mechanism.
fn handshake_accepted(frame: &[u8]) -> Option<bool> {
    Cursor::new(frame, RESPONSE_ID_END)
        .i16()
        .map(|code| code == 0)
}

/// Where a response's body starts (length prefix included in the offset).
fn response_header_end(frame: &[u8], key: ApiKey, version: i16) -> Option<usize> {
    let mut r = Cursor::new(frame, RESPONSE_ID_END);
    if key.response_header_version(version) >= 1 {
        r.skip_tagged_fields()?;
    }
    Some(r.pos())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
