//! Length-prefixed Kafka framing: read whole frames, peek request headers.
//!
//! Framing is "check, then parse": a frame is only handed on once all of it
//! is buffered, and its length is checked against the configured maximum
//! before any memory is reserved for it, so a hostile length prefix (say
//! 2 GiB) ends one connection instead of the process. Frames are kept as the
//! exact bytes that arrived, length prefix included, so a frame that needs no
//! inspection is forwarded without being decoded or re-encoded.

use std::io::IoSlice;

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The process-wide cap on request bytes being received and handled
/// (`limits.max_queued_request_bytes`), one permit a KiB, shared by every
/// client connection's [`FrameReader::with_queue`].
#[derive(Debug, Clone)]
pub struct RequestQueue {
    sem: Arc<Semaphore>,
    permits: u32,
}

impl RequestQueue {
    pub fn new(bytes: usize) -> Self {
        // tokio's own limit is far above 2^30 KiB (1 TiB).
        let permits = (bytes / 1024).clamp(1, 1 << 30);
        RequestQueue {
            sem: Arc::new(Semaphore::new(permits)),
            permits: permits as u32,
        }
    }

    /// Bytes held by frames right now.
    pub fn held_bytes(&self) -> usize {
        (self.permits as usize - self.sem.available_permits()) * 1024
    }
}

/// Why a peer's byte stream could not be framed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {0} is negative")]
    Negative(i32),
    #[error("frame length {len} exceeds the limit of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Largest chunk reserved at once while a big frame arrives: resident
/// memory grows with the bytes a peer actually sends, not with the length
/// it claims (a reservation is address space until written; blocks of
/// 4 MiB and more are mappings of their own, see `src/main.rs`). A typical
/// Fetch response (1-3 MB) is reserved once: growing it in 256 KiB steps
/// copied it again on each doubling (12 % of the pass-through CPU,
/// `scripts/bench/deterministic.py`).
const READ_CHUNK: usize = 4 << 20;

/// Most bytes [`FrameReader::next_head`] reads at once.
const HEAD_READ: usize = 64 * 1024;

/// Frames that arrive whole within this many bytes take nothing from a
/// [`FrameReader::with_queue`] cap: each connection buffers at most this
/// much of a frame before it has to wait for room.
const QUEUE_FREE: usize = HEAD_READ;

/// Reads whole frames (length prefix included) from one side of a connection.
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max: u32,
    /// The process-wide cap on request bytes being received and handled
    /// (`limits.max_queued_request_bytes`, in KiB permits), if any.
    queue: Option<RequestQueue>,
    /// What the current (or last returned) frame holds of `queue`.
    held: Option<OwnedSemaphorePermit>,
    /// A frame was returned: its hold ends at the next call for a frame
    /// (the caller has handled it by then).
    returned: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max: u32) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(64 * 1024),
            max,
            queue: None,
            held: None,
            returned: false,
        }
    }

    /// Hold every frame larger than [`QUEUE_FREE`] against `queue` (one
    /// permit a KiB) from before its body is read until the next frame is
    /// asked for: the bytes all connections buffer at once are bounded, as
    /// Kafka's `queued.max.request.bytes` (KIP-72) bounds a broker's. A
    /// frame waits (its connection is not read) until there is room; one
    /// larger than the whole cap takes all of it.
    pub fn with_queue(mut self, queue: RequestQueue) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Wait for room in the queue for a frame of `total` bytes.
    async fn hold(&mut self, total: usize) -> Result<(), FrameError> {
        let Some(q) = self.queue.clone().filter(|_| self.held.is_none()) else {
            return Ok(());
        };
        let want = u32::try_from(total.div_ceil(1024)).unwrap_or(u32::MAX);
        let permits = want.min(q.permits).max(1);
        let permit =
            q.sem.acquire_many_owned(permits).await.map_err(|_| {
                FrameError::Io(std::io::Error::other("the request queue is closed"))
            })?;
        self.held = Some(permit);
        Ok(())
    }

    /// The next whole frame, or `None` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Bytes>, FrameError> {
        if std::mem::take(&mut self.returned) {
            self.held = None;
        }
        loop {
            if let Some(total) = self.complete_frame_len()? {
                self.returned = true;
                return Ok(Some(self.buf.split_to(total).freeze()));
            }
            if let Some(total) = self.claimed_len().filter(|&t| t > QUEUE_FREE) {
                self.hold(total).await?;
            }
            let want = match self.claimed_len() {
                Some(total) => (total - self.buf.len()).min(READ_CHUNK),
                None => 4,
            };
            if !self.fill(want).await? {
                return Ok(None);
            }
        }
    }

    /// Read once: `want` bytes are made room for, and at most
    /// `want.max(HEAD_READ)` are read, so a read for one frame takes in no
    /// more than [`HEAD_READ`] of the next (whose rest can then be spliced).
    /// `false` at a clean end of stream between frames.
    async fn fill(&mut self, want: usize) -> Result<bool, FrameError> {
        self.buf.reserve(want.max(4096));
        let mut limited = (&mut self.inner).take(want.max(HEAD_READ) as u64);
        if limited.read_buf(&mut self.buf).await? > 0 {
            Ok(true)
        } else if self.buf.is_empty() {
            Ok(false)
        } else {
            Err(FrameError::Truncated)
        }
    }

    /// The start of the next frame: once its first `head` bytes (length
    /// prefix included) or all of it are buffered, its total length and how
    /// many of its bytes are buffered. `None` on a clean end of stream
    /// between frames. The frame stays buffered: [`next`](Self::next) still
    /// returns it whole, or [`take_buffered`](Self::take_buffered) hands out
    /// its start and the caller reads the rest from the stream itself. Reads
    /// at most [`HEAD_READ`] bytes at a time, so most of a large frame is
    /// still in the socket when its head is known.
    pub async fn next_head(&mut self, head: usize) -> Result<Option<(usize, usize)>, FrameError> {
        loop {
            if let Some(total) = self.complete_frame_len()? {
                return Ok(Some((total, total)));
            }
            if let Some(total) = self.claimed_len().filter(|_| self.buf.len() >= head) {
                return Ok(Some((total, self.buf.len())));
            }
            if !self.fill(4).await? {
                return Ok(None);
            }
        }
    }

    /// Everything buffered, when it is all the start of one frame that has
    /// not fully arrived (after [`next_head`](Self::next_head) said so).
    pub fn take_buffered(&mut self) -> Bytes {
        debug_assert!(self.claimed_len().is_some_and(|t| t > self.buf.len()));
        self.buf.split().freeze()
    }

    /// The stream frames are read from.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Bytes already read but not yet returned (used when a connection
    /// changes hands, e.g. after a TLS upgrade; normally empty).
    pub fn into_parts(self) -> (R, BytesMut) {
        (self.inner, self.buf)
    }

    /// Total length (prefix included) the buffered frame claims, if its
    /// prefix has arrived.
    fn claimed_len(&self) -> Option<usize> {
        (self.buf.len() >= 4).then(|| 4 + (&self.buf[..4]).get_u32() as usize)
    }

    /// `Some(total)` once a whole frame is buffered; an error as soon as the
    /// prefix is known to be unacceptable.
    fn complete_frame_len(&self) -> Result<Option<usize>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = (&self.buf[..4]).get_i32();
        if len < 0 {
            return Err(FrameError::Negative(len));
        }
        if len as u32 > self.max {
            return Err(FrameError::TooLarge {
                len: len as u32,
                max: self.max,
            });
        }
        let total = 4 + len as usize;
        Ok((self.buf.len() >= total).then_some(total))
    }
}

pub use antidote_core::kafka::cursor::Cursor;

/// Bytes of a frame's length prefix.
pub const LENGTH_PREFIX: usize = 4;
/// End of a request's fixed header part (length prefix, api key, api
/// version, correlation id); the client id follows.
pub const REQUEST_HEAD_END: usize = LENGTH_PREFIX + 2 + 2 + 4;
/// End of a response's correlation id (length prefix included); a flexible
/// response header's tagged fields follow, then the body.
pub const RESPONSE_ID_END: usize = LENGTH_PREFIX + 4;

/// The fixed start of every request header (all header versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
}

/// Peek api key, version and correlation id from a request frame
/// (length prefix included). `None` if the frame is too short to be a request.
pub fn peek_request(frame: &[u8]) -> Option<RequestHead> {
    let mut c = Cursor::new(frame, LENGTH_PREFIX);
    Some(RequestHead {
        api_key: c.i16()?,
        api_version: c.i16()?,
        correlation_id: c.i32()?,
    })
}

/// Peek the correlation id of a response frame (length prefix included).
pub fn peek_correlation_id(frame: &[u8]) -> Option<i32> {
    Cursor::new(frame, LENGTH_PREFIX).i32()
}

/// Offset of the request body in a request frame (length prefix included),
/// given whether the header is flexible (v2: client id then tagged fields).
/// `None` if the header is malformed.
pub fn request_body_offset(frame: &[u8], flexible_header: bool) -> Option<usize> {
    let mut r = Cursor::new(frame, REQUEST_HEAD_END);
    let client_id_len = r.i16()?;
    if client_id_len > 0 {
        r.skip(client_id_len as usize)?;
    }
    if flexible_header {
        r.skip_tagged_fields()?;
    }
    Some(r.pos())
}

/// A message body encoded at `version`: the one place the proxy encodes a
/// decoded message again (size computed first, one allocation).
pub fn encode<M: kafka_protocol::protocol::Encodable>(
    m: &M,
    version: i16,
) -> anyhow::Result<BytesMut> {
    let mut out = BytesMut::with_capacity(m.compute_size(version)?);
    m.encode(&mut out, version)?;
    Ok(out)
}

/// `body` with its length prefix.
pub fn with_length_prefix(body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out.freeze()
}

/// A response frame with a v0 header (correlation id) or a flexible header
/// whose tagged fields are `tags`.
pub fn response_frame(correlation_id: i32, tags: &[u8], body: &[u8]) -> Bytes {
    let mut header = correlation_id.to_be_bytes().to_vec();
    header.extend_from_slice(tags);
    response_frame_raw(&header, body)
}

/// A response frame in two parts written one after the other: the length
/// prefix with the header bytes (`head`), then the `body`. A rewritten body
/// (a filtered Fetch response is megabytes) goes out without being copied
/// into a new frame; that copy was 2.8 % of a judged record's CPU.
pub struct ResponseFrame {
    pub head: Bytes,
    /// The body's pieces, in order (a filtered Fetch response is the
    /// broker's bytes around new records sections, none of them copied).
    pub body: Vec<Bytes>,
}

impl ResponseFrame {
    /// A frame forwarded as it arrived.
    pub fn whole(frame: Bytes) -> Self {
        ResponseFrame {
            head: frame,
            body: Vec::new(),
        }
    }

    /// The original header bytes (prefix excluded) and a new body.
    pub fn new(header: &[u8], body: Bytes) -> Self {
        Self::chunks(header, vec![body])
    }

    /// The original header bytes (prefix excluded) and a new body in pieces.
    pub fn chunks(header: &[u8], body: Vec<Bytes>) -> Self {
        let len = header.len() + body.iter().map(Bytes::len).sum::<usize>();
        let mut head = BytesMut::with_capacity(4 + header.len());
        head.extend_from_slice(&(len as u32).to_be_bytes());
        head.extend_from_slice(header);
        ResponseFrame {
            head: head.freeze(),
            body,
        }
    }

    /// Whether the body is new (the response was rewritten).
    pub fn rewritten(&self) -> bool {
        !self.body.is_empty()
    }

    /// Write the frame: head and body pieces with vectored writes (one
    /// system call for many pieces where the stream supports it).
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, w: &mut W) -> std::io::Result<()> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + self.body.len());
        parts.push(&self.head);
        parts.extend(self.body.iter().map(|b| &b[..]).filter(|b| !b.is_empty()));
        let mut first = 0;
        let mut offset = 0;
        while first < parts.len() {
            let slices: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&parts[first][offset..]))
                .chain(parts[first + 1..].iter().take(63).map(|p| IoSlice::new(p)))
                .collect();
            let mut n = w.write_vectored(&slices).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            // Advance past what was written.
            while n > 0 && first < parts.len() {
                let left = parts[first].len() - offset;
                if n >= left {
                    n -= left;
                    first += 1;
                    offset = 0;
                } else {
                    offset += n;
                    n = 0;
                }
            }
        }
        Ok(())
    }
}

/// Length prefix + the original header bytes + a new body.
pub fn response_frame_raw(header: &[u8], body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + header.len() + body.len());
    out.extend_from_slice(&((header.len() + body.len()) as u32).to_be_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(body);
    out.freeze()
}

/// A size-prefixed ApiVersions v0 request (header v1, no client id): the
/// proxy's own request on a client's connection, whose answer it drops.
pub fn api_versions_v0(correlation_id: i32) -> Bytes {
    let mut b = BytesMut::with_capacity(14);
    b.put_i32(10); // api key, version, correlation id, client id length
    b.put_i16(18);
    b.put_i16(0);
    b.put_i32(correlation_id);
    b.put_i16(-1);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most 3 bytes per call.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(3);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_frame_in_pieces_is_written_whole_through_short_writes() {
        let pieces: Vec<Bytes> = (0..70u8)
            .map(|i| Bytes::from(vec![i; usize::from(i % 5)]))
            .collect();
        let frame = ResponseFrame::chunks(b"\x00\x00\x00\x07", pieces.clone());
        let mut w = Trickle(Vec::new());
        frame.write_to(&mut w).await.expect("write");
        let body: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let mut expect = ((4 + body.len()) as u32).to_be_bytes().to_vec();
        expect.extend_from_slice(b"\x00\x00\x00\x07");
        expect.extend_from_slice(&body);
        assert_eq!(w.0, expect);
    }

    async fn frames(input: &[u8], max: u32) -> Vec<Result<Option<Bytes>, String>> {
        let mut r = FrameReader::new(input, max);
        let mut out = vec![];
        loop {
            let f = r.next().await.map_err(|e| e.to_string());
            let stop = !matches!(f, Ok(Some(_)));
            out.push(f);
            if stop {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn splits_pipelined_frames_and_keeps_their_bytes() {
        let input = [0, 0, 0, 2, 9, 9, 0, 0, 0, 0, 0, 0, 0, 1, 7];
        let got = frames(&input, 1024).await;
        assert_eq!(got[0].as_ref().unwrap().as_deref(), Some(&input[..6]));
        assert_eq!(got[1].as_ref().unwrap().as_deref(), Some(&input[6..10]));
        assert_eq!(got[2].as_ref().unwrap().as_deref(), Some(&input[10..]));
        assert_eq!(got[3], Ok(None));
    }

    #[tokio::test]
    async fn a_two_gib_length_prefix_is_refused_before_reading_it() {
        let got = frames(&[0x7f, 0xff, 0xff, 0xff, 1, 2, 3], 100 << 20).await;
        assert!(got[0].as_ref().unwrap_err().contains("exceeds the limit"));
    }

    #[tokio::test]
    async fn negative_length_and_truncation_are_errors() {
        assert!(frames(&[0xff, 0, 0, 0], 1024).await[0].is_err());
        assert!(frames(&[0, 0, 0, 9, 1], 1024).await[0]
            .as_ref()
            .unwrap_err()
            .contains("middle of a frame"));
    }

    #[test]
    fn peeks_never_panic_on_short_input() {
        for n in 0..14 {
            let buf = vec![0xffu8; n];
            // A head needs 12 bytes, a correlation id 8, a client id length 14.
            assert_eq!(peek_request(&buf).is_some(), n >= 12, "{n} bytes");
            assert_eq!(
                peek_correlation_id(&buf),
                (n >= 8).then_some(-1),
                "{n} bytes"
            );
            assert_eq!(request_body_offset(&buf, true), None, "{n} bytes");
        }
        // 14 bytes with a null client id (-1) and no tagged fields: body at 14
        // without flexible headers, malformed (no tag count) with them.
        let mut buf = vec![0u8; 12];
        buf.extend_from_slice(&[0xff, 0xff]);
        assert_eq!(request_body_offset(&buf, false), Some(14));
        assert_eq!(request_body_offset(&buf, true), None);
    }

    /// Two connections each sending a frame of 600 KiB slowly, under a cap
    /// of 1 MiB: the second waits (unread) until the first is handled.
    #[tokio::test]
    async fn frames_past_the_request_queue_wait_until_earlier_ones_are_handled() {
        let queue = RequestQueue::new(1 << 20);
        let frame = |fill: u8| {
            let mut f = (600u32 * 1024 - 4).to_be_bytes().to_vec();
            f.resize(600 * 1024, fill);
            f
        };
        let (mut a_tx, a_rx) = tokio::io::duplex(1 << 20);
        let (mut b_tx, b_rx) = tokio::io::duplex(1 << 20);
        let mut a = FrameReader::new(a_rx, 1 << 30).with_queue(queue.clone());
        let mut b = FrameReader::new(b_rx, 1 << 30).with_queue(queue.clone());
        let fa = frame(1);
        a_tx.write_all(&fa[..100_000]).await.unwrap();
        b_tx.write_all(&frame(2)).await.unwrap();
        // a has claimed its frame's bytes; b cannot get room.
        let a_first = tokio::time::timeout(std::time::Duration::from_millis(100), a.next()).await;
        assert!(a_first.is_err(), "a's frame is not complete yet");
        assert_eq!(queue.held_bytes(), 600 * 1024);
        let b_wait = tokio::time::timeout(std::time::Duration::from_millis(100), b.next()).await;
        assert!(b_wait.is_err(), "b waits for room");
        a_tx.write_all(&fa[100_000..]).await.unwrap();
        assert_eq!(a.next().await.unwrap().unwrap().len(), 600 * 1024);
        // a's frame is handled once a asks for the next one.
        drop(a_tx);
        assert!(a.next().await.unwrap().is_none());
        assert_eq!(b.next().await.unwrap().unwrap().len(), 600 * 1024);
        assert_eq!(
            queue.held_bytes(),
            600 * 1024,
            "b's frame until b's next call"
        );
    }
}
