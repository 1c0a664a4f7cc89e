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
//! and either forwards the bytes as they arrived or hands them to the
//! exchange of its kind (`exchange`: Fetch, ShareFetch, Produce,
//! ApiVersions, broker addresses, ...). A large forwarded response between
//! plain-TCP sockets is spliced: its head is read and checked, the rest
//! moves socket to socket in the kernel (`transport::splice`). A malformed
//! or oversized frame from either side ends this connection only, with one
//! log line.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::debug;

use crate::intercept::fetch::Holds;
use crate::intercept::produce as door;
use crate::proxy::classify::classify_request;
use crate::proxy::exchange::{self, Handling, Pending, Send};
use crate::proxy::sasl_phase::{Raw, SaslPhase};
use crate::proxy::Shared;
use crate::transport::frame::{self, FrameError, FrameReader, ResponseFrame, RESPONSE_ID_END};
use crate::transport::net::Conn;
use crate::transport::splice::{self, AsTcp};

pub use super::error::RelayError;

/// State the two pumps of one connection share.
#[derive(Default)]
struct ConnState {
    /// The raw SASL tokens expected after a SaslHandshake v0, if any.
    sasl: SaslPhase,
    /// Requests whose answers have not yet been written to the client; the
    /// idle timeout never closes a connection with one pending.
    in_flight: AtomicUsize,
    /// Correlation ids of the last requests sent expecting no answer
    /// (Produce with acks=0), at most [`MAX_PENDING`].
    unanswered: std::sync::Mutex<std::collections::VecDeque<i32>>,
    /// Partitions the door answered retriably, and the requests answered.
    door: Arc<door::Marks>,
    /// The node id of the broker this connection leads to (-1: a bootstrap
    /// server): share sessions are per broker.
    node: i32,
    /// Share sessions on this connection: the proxy's renewals in them.
    share: crate::intercept::share::renew::Conn,
}

impl ConnState {
    /// A request goes to the broker expecting no answer.
    fn expect_no_answer(&self, correlation_id: i32) {
        let mut ids = self.unanswered.lock().unwrap_or_else(|p| p.into_inner());
        if ids.len() == MAX_PENDING {
            ids.pop_front();
        }
        ids.push_back(correlation_id);
    }

    /// Whether `frame` answers a request that expected none. Kafka never
    /// answers Produce with acks=0, but some brokers do (tansu 0.6); the
    /// client expects nothing, so such an answer is dropped, once, instead
    /// of ending the connection as an unsolicited frame.
    fn answers_unanswered(&self, frame: &[u8]) -> bool {
        let Some(id) = frame::peek_correlation_id(frame) else {
            return false;
        };
        let mut ids = self.unanswered.lock().unwrap_or_else(|p| p.into_inner());
        match ids.iter().position(|&x| x == id) {
            Some(i) => {
                ids.remove(i);
                debug!(
                    correlation_id = id,
                    "dropped the broker's answer to a Produce with acks=0"
                );
                true
            }
            None => false,
        }
    }
}

/// Pipelined requests allowed in flight per connection before the proxy
/// stops reading from the client (backpressure, bounded memory).
const MAX_PENDING: usize = 1024;

/// Forwarded responses with at least this many bytes still to arrive once
/// their head is read are spliced (when both sides are plain TCP); below
/// it, a pipe's set-up costs more than the copies it saves.
const SPLICE_MIN: usize = 64 * 1024;

/// Relay between `client` and `broker` (the node id `node`, -1 for a
/// bootstrap server) until either side closes or shutdown is requested
/// (in-flight responses are still delivered then).
pub async fn relay(
    shared: Arc<Shared>,
    client: Conn,
    broker: Conn,
    node: i32,
) -> Result<(), RelayError> {
    match (client, broker) {
        (Conn::Tcp(client), Conn::Tcp(broker)) => {
            let (cr, cw) = client.into_split();
            let (br, bw) = broker.into_split();
            relay_halves(&shared, (cr, cw, br, bw), node).await
        }
        (client, broker) => {
            let (cr, cw) = tokio::io::split(client.boxed());
            let (br, bw) = tokio::io::split(broker.boxed());
            relay_halves(&shared, (cr, cw, br, bw), node).await
        }
    }
}

async fn relay_halves<CR, CW, BR, BW>(
    shared: &Arc<Shared>,
    (cr, cw, br, bw): (CR, CW, BR, BW),
    node: i32,
) -> Result<(), RelayError>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + AsTcp + Unpin,
    BR: AsyncRead + AsTcp + Unpin,
    BW: AsyncWrite + Unpin,
{
    let max = shared.config.limits.max_frame_bytes;
    let (tx, rx) = mpsc::channel(MAX_PENDING);
    let state = ConnState {
        node,
        ..ConnState::default()
    };
    let client = FrameReader::new(cr, max).with_queue(shared.request_queue.clone());
    let requests = request_pump(shared, &state, client, bw, tx);
    let responses = response_pump(shared, &state, FrameReader::new(br, max), cw, rx);
    tokio::pin!(requests, responses);
    let out = tokio::select! {
        r = &mut responses => r,
        r = &mut requests => {
            // The client is done (or shutdown began): deliver what is pending.
            let done = responses.await;
            r.and(done)
        }
    };
    // The broker ends a share session with the connection that opened it.
    let mut seen = crate::metrics::ShareSeen::default();
    for session in state.share.sessions() {
        (shared.share_acks.withheld).forget(&session, "member_gone", &mut seen);
    }
    crate::metrics::global().share_seen(seen);
    out
}

/// The next client frame; `None` at a clean end, at shutdown, or once the
/// connection has been idle (no request, no answer pending) for
/// `limits.idle_timeout`.
async fn next_request<R: AsyncRead + Unpin>(
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
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let Some(frame) = next_request(shared, state, &mut client).await? else {
            return Ok(());
        };
        let raw_sasl = state.sasl.next_frame();
        let head = frame::peek_request(&frame);
        if let Some(head) = head.filter(|_| raw_sasl != Raw::Token) {
            crate::metrics::global()
                .requests
                .request(head.api_key, head.api_version);
        }
        let conn = (raw_sasl, state.node, &state.share);
        let (mut c, frame) = classify_request(shared, &state.door, conn, (head, frame)).await?;
        if let Some((p, f)) = c.inject.take() {
            if !inject(state, &mut broker, &pending, p, &f).await? {
                return Ok(());
            }
        }
        let expects_answer = c.pending.is_some();
        if let Some(p) = c.pending {
            if matches!(p.handling, Handling::SaslHandshake(_)) {
                state.sasl.handshake_sent();
            }
            state.in_flight.fetch_add(1, Ordering::SeqCst);
            if pending.send(p).await.is_err() {
                return Ok(()); // response side is gone; its error is reported there
            }
        }
        let close = c.close;
        let out = match c.send {
            Send::Original => frame,
            Send::Replaced(f) => f,
            Send::Nothing if close => {
                closing_for_acks_zero();
                return Ok(());
            }
            Send::Nothing => continue,
        };
        if !expects_answer {
            // Known before the request leaves, so before any answer arrives.
            if let Some(head) = frame::peek_request(&out) {
                state.expect_no_answer(head.correlation_id);
            }
        }
        broker
            .write_all(&out)
            .await
            .map_err(RelayError::BrokerWrite)?;
        // A no-op on TCP; on TLS it pushes the record out now.
        broker.flush().await.map_err(RelayError::BrokerWrite)?;
        if close {
            return close_after_barrier(state, &mut broker, &pending).await;
        }
    }
}

/// Send the proxy's own request `frame` before a client's (a renewal in a
/// share session), its answer expected as `p`. False if the response side
/// is gone.
async fn inject<W: AsyncWrite + Unpin>(
    state: &ConnState,
    broker: &mut W,
    pending: &mpsc::Sender<Pending>,
    p: Pending,
    frame: &[u8],
) -> Result<bool, RelayError> {
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    if pending.send(p).await.is_err() {
        return Ok(false);
    }
    broker
        .write_all(frame)
        .await
        .map_err(RelayError::BrokerWrite)?;
    Ok(true)
}

/// Close an acks=0 connection whose Produce the proxy refused in part.
/// Kafka handles a connection's requests one at a time, in order: once it
/// answers the barrier (an ApiVersions of the proxy's), the forwarded part
/// of the Produce is appended. Closing before that could make it drop the
/// request with the connection.
async fn close_after_barrier<W: AsyncWrite + Unpin>(
    state: &ConnState,
    broker: &mut W,
    pending: &mpsc::Sender<Pending>,
) -> Result<(), RelayError> {
    let barrier = frame::api_versions_v0(BARRIER_CORRELATION_ID);
    let p = Pending {
        correlation_id: Some(BARRIER_CORRELATION_ID),
        version: 0,
        handling: Handling::Discard,
    };
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    if pending.send(p).await.is_ok() {
        broker
            .write_all(&barrier)
            .await
            .map_err(RelayError::BrokerWrite)?;
        broker.flush().await.map_err(RelayError::BrokerWrite)?;
    }
    closing_for_acks_zero();
    Ok(())
}

/// The correlation id of the proxy's own barrier request (the connection
/// closes after it, so it cannot meet a client's later id).
const BARRIER_CORRELATION_ID: i32 = i32::MIN;

/// The request side ends after a Produce with acks=0 was refused in part:
/// the answers pending are still delivered, then the connection closes.
fn closing_for_acks_zero() {
    debug!(
        "closing the client connection: a Produce with acks=0 was refused in part, as Kafka does"
    );
}

async fn response_pump<R, W>(
    shared: &Arc<Shared>,
    state: &ConnState,
    mut broker: FrameReader<R>,
    mut client: W,
    mut pending: mpsc::Receiver<Pending>,
) -> Result<(), RelayError>
where
    R: AsyncRead + AsTcp + Unpin,
    W: AsyncWrite + AsTcp + Unpin,
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
            // Nothing is pending: a frame now is unsolicited (unless it
            // answers a request that expected none), EOF is a close.
            f = broker.next() => match f.map_err(RelayError::BrokerFrame)? {
                None => return Ok(()),
                Some(f) if state.answers_unanswered(&f) => continue,
                Some(_) => return Err(RelayError::BadResponse("unsolicited frame".into())),
            },
        };
        if matches!(p.handling, Handling::Discard | Handling::Renewal(_)) {
            own_answer(shared, state, &mut broker, p, pending.len()).await?;
            continue;
        }
        if matches!(p.handling, Handling::Forward) {
            let closed = RelayError::BrokerClosed(1 + pending.len());
            if let Some(started) =
                splice_response(&mut broker, &mut client, p.correlation_id, closed).await?
            {
                crate::metrics::global().response_spliced(started.elapsed());
                state.in_flight.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
        }
        let mut arrived = None;
        let out = match p.handling {
            Handling::Local(frame) => ResponseFrame::whole(frame),
            handling => {
                let frame = answer_to(state, &mut broker, p.correlation_id, pending.len()).await?;
                arrived = Some(std::time::Instant::now());
                let cx = exchange::Cx {
                    shared,
                    holds: &mut holds,
                    sasl: &state.sasl,
                    share: &state.share,
                };
                exchange::respond(cx, handling, p.version, frame).await?
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

/// The broker's answer to one of the proxy's own requests (`p`: the
/// barrier before closing, or a renewal in a share session, whose answer
/// settles the withheld book): read, checked, never sent to the client.
/// `queued`: answers pending behind it.
async fn own_answer<R: AsyncRead + Unpin>(
    shared: &Shared,
    state: &ConnState,
    broker: &mut FrameReader<R>,
    p: Pending,
    queued: usize,
) -> Result<(), RelayError> {
    let f = match broker.next().await.map_err(RelayError::BrokerFrame)? {
        Some(f) => f,
        None => return Err(RelayError::BrokerClosed(1 + queued)),
    };
    check_correlation_id(&f, p.correlation_id)?;
    exchange::own_answer(shared, p.handling, &f);
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// The broker's answer to the request of `correlation_id`, skipping
/// answers to requests that expected none (acks=0 Produce) that arrive
/// first; checked to carry that id. `queued`: answers pending behind it.
async fn answer_to<R: AsyncRead + Unpin>(
    state: &ConnState,
    broker: &mut FrameReader<R>,
    correlation_id: Option<i32>,
    queued: usize,
) -> Result<Bytes, RelayError> {
    loop {
        let f = match broker.next().await.map_err(RelayError::BrokerFrame)? {
            Some(f) => f,
            None => return Err(RelayError::BrokerClosed(1 + queued)),
        };
        let Some(id) = correlation_id else {
            return Ok(f);
        };
        let got = frame::peek_correlation_id(&f);
        if got == Some(id) {
            return Ok(f);
        }
        if !state.answers_unanswered(&f) {
            return Err(wrong_correlation_id(id, got));
        }
    }
}

/// A response frame must carry its request's correlation id (`None`: the
/// request had none to check, e.g. a raw SASL token).
fn check_correlation_id(frame: &[u8], expected: Option<i32>) -> Result<(), RelayError> {
    let Some(id) = expected else {
        return Ok(());
    };
    match frame::peek_correlation_id(frame) {
        got if got != Some(id) => Err(wrong_correlation_id(id, got)),
        _ => Ok(()),
    }
}

fn wrong_correlation_id(expected: i32, got: Option<i32>) -> RelayError {
    RelayError::BadResponse(format!("expected correlation id {expected}, got {got:?}"))
}

/// Forward the next response by splicing it, when both sides are plain
/// TCP and at least [`SPLICE_MIN`] of its bytes have yet to arrive once its
/// head is in: its correlation id is checked, the buffered start written,
/// and the rest moved socket to socket. `Some(when its head was in)` once
/// sent; `None` leaves the response (still buffered) to the copying path.
/// `closed` is the error for a broker that closes before the response.
async fn splice_response<R, W>(
    broker: &mut FrameReader<R>,
    client: &mut W,
    correlation_id: Option<i32>,
    closed: RelayError,
) -> Result<Option<std::time::Instant>, RelayError>
where
    R: AsyncRead + AsTcp + Unpin,
    W: AsyncWrite + AsTcp + Unpin,
{
    if broker.get_ref().as_tcp().is_none() || client.as_tcp().is_none() {
        return Ok(None);
    }
    let Some((total, buffered)) = broker
        .next_head(RESPONSE_ID_END)
        .await
        .map_err(RelayError::BrokerFrame)?
    else {
        return Err(closed);
    };
    if total - buffered < SPLICE_MIN {
        return Ok(None);
    }
    // None when no pipe can be opened now (descriptors exhausted): copy.
    let Some(pipe) = splice::pipe() else {
        return Ok(None);
    };
    let started = std::time::Instant::now();
    let head = broker.take_buffered();
    check_correlation_id(&head, correlation_id)?;
    client
        .write_all(&head)
        .await
        .map_err(RelayError::ClientWrite)?;
    let (Some(from), Some(to)) = (broker.get_ref().as_tcp(), client.as_tcp()) else {
        // Both were plain TCP above; a stream does not change its kind.
        return Err(RelayError::ClientWrite(std::io::Error::other(
            "not plain TCP",
        )));
    };
    match pipe.forward(from, to, total - buffered).await {
        Ok(()) => Ok(Some(started)),
        Err((splice::Side::From, e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(RelayError::BrokerFrame(FrameError::Truncated))
        }
        Err((splice::Side::From, e)) => Err(RelayError::BrokerFrame(FrameError::Io(e))),
        Err((splice::Side::To, e)) => Err(RelayError::ClientWrite(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_to_an_acks_zero_request_is_dropped_once_and_only_it() {
        let state = ConnState::default();
        let answer = |id: i32| frame::response_frame(id, &[], &[0; 10]);
        for id in 0..(MAX_PENDING as i32 + 5) {
            state.expect_no_answer(id);
        }
        // The oldest ids were forgotten: at most MAX_PENDING are kept.
        assert!(!state.answers_unanswered(&answer(0)));
        assert!(state.answers_unanswered(&answer(7)));
        assert!(!state.answers_unanswered(&answer(7)), "dropped once only");
        assert!(!state.answers_unanswered(&answer(-3)));
        assert!(
            !state.answers_unanswered(&[0, 0, 0, 1, 9]),
            "too short for an id"
        );
    }

    /// Loopback halves: the broker side's writer, the proxy's reader of it,
    /// the proxy's writer to the client and the client's reader.
    async fn sockets() -> (
        tokio::net::TcpStream,
        FrameReader<tokio::net::tcp::OwnedReadHalf>,
        tokio::net::tcp::OwnedWriteHalf,
        tokio::net::TcpStream,
    ) {
        use crate::transport::splice::tests::pair;
        let (broker, proxy_in) = pair().await;
        let (proxy_out, client) = pair().await;
        let reader = FrameReader::new(proxy_in.into_split().0, 100 << 20);
        (broker, reader, proxy_out.into_split().1, client)
    }

    fn response(correlation_id: i32, body_len: usize) -> Vec<u8> {
        let mut b = correlation_id.to_be_bytes().to_vec();
        b.extend((0..body_len).map(|i| (i % 253) as u8));
        frame::with_length_prefix(&b).to_vec()
    }

    #[tokio::test]
    async fn a_large_forwarded_response_is_spliced_whole_and_the_next_one_stays_framed() {
        use tokio::io::AsyncReadExt;
        let (mut broker, mut reader, mut out, mut client) = sockets().await;
        let big = response(7, 3 << 20);
        let small = response(8, 100);
        let sent = [big.clone(), small.clone()].concat();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(100_003) {
                broker.write_all(chunk).await.unwrap();
            }
            broker
        });
        let closed = RelayError::BrokerClosed(1);
        let spliced = splice_response(&mut reader, &mut out, Some(7), closed).await;
        assert!(matches!(spliced, Ok(Some(_))), "{spliced:?}");
        let mut got = vec![0; big.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == big);
        let _broker = writer.await.unwrap();
        // A small response is left to the copying path, still buffered.
        let closed = RelayError::BrokerClosed(1);
        let left = splice_response(&mut reader, &mut out, Some(8), closed).await;
        assert!(matches!(left, Ok(None)), "{left:?}");
        assert_eq!(reader.next().await.unwrap().unwrap().to_vec(), small);
    }

    #[tokio::test]
    async fn a_spliced_response_with_the_wrong_correlation_id_sends_nothing() {
        use tokio::io::AsyncReadExt;
        let (mut broker, mut reader, mut out, mut client) = sockets().await;
        broker.write_all(&response(9, 1 << 20)).await.unwrap();
        let closed = RelayError::BrokerClosed(1);
        let err = splice_response(&mut reader, &mut out, Some(7), closed).await;
        assert!(matches!(err, Err(RelayError::BadResponse(_))), "{err:?}");
        drop(out);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{} bytes reached the client", rest.len());
    }

    #[tokio::test]
    async fn an_oversized_response_is_refused_before_anything_is_sent() {
        let (mut broker, mut reader, mut out, _client) = sockets().await;
        // Claims 200 MiB against the reader's 100 MiB limit.
        let mut head = (200u32 << 20).to_be_bytes().to_vec();
        head.extend_from_slice(&7i32.to_be_bytes());
        broker.write_all(&head).await.unwrap();
        let closed = RelayError::BrokerClosed(1);
        let err = splice_response(&mut reader, &mut out, Some(7), closed).await;
        assert!(
            matches!(
                err,
                Err(RelayError::BrokerFrame(FrameError::TooLarge { .. }))
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_broker_closing_mid_response_is_a_truncated_frame() {
        let (mut broker, mut reader, mut out, _client) = sockets().await;
        let big = response(7, 1 << 20);
        broker.write_all(&big[..big.len() / 2]).await.unwrap();
        drop(broker);
        let closed = RelayError::BrokerClosed(1);
        let err = splice_response(&mut reader, &mut out, Some(7), closed).await;
        assert!(
            matches!(err, Err(RelayError::BrokerFrame(FrameError::Truncated))),
            "{err:?}"
        );
    }
}
