//! A decoded batch: its records section (decompressed if need be) and the
//! reading of its records where they lie. The first walk over all of them
//! checks each record's framing and keeps where each one starts, the only
//! index a batch has (4 bytes a record), for random access after it.

use std::ops::ControlFlow;
use std::sync::OnceLock;

use bytes::Bytes;

use super::BatchError;
use crate::kafka::compression::{Compression, SnappyFraming};
use crate::kafka::crc::Marks;
use crate::kafka::record::{Header, Record};
use crate::kafka::varint::{read_varint, read_varlong};

/// A batch's records, decompressed. For an uncompressed batch the buffer is
/// a slice of the batch itself (no copy). Records are read where they lie:
/// the only index is where each one starts, kept by the first walk over
/// all of them, which also checks every record's framing.
#[derive(Debug, Clone)]
pub struct DecodedBatch {
    buf: Bytes,
    base_offset: i64,
    base_timestamp: i64,
    compression: Compression,
    snappy_framing: SnappyFraming,
    /// recordsCount as the header declares it (a walk checks it).
    count: usize,
    /// Where each record starts in `buf`, once a walk has read them all,
    /// or what it found wrong.
    pub(super) starts: OnceLock<Result<Box<[u32]>, BatchError>>,
    /// The running CRC of the batch as it was verified (uncompressed
    /// batches only), for a splice to derive its CRC from.
    marks: Marks,
}

/// The value of a record-field read, or a `Malformed` error naming the
/// field and the byte where it failed.
#[inline(always)]
fn need<T>(v: Option<T>, at: usize, what: &str) -> Result<T, BatchError> {
    match v {
        Some(v) => Ok(v),
        None => Err(malformed(at, what)),
    }
}

#[cold]
fn malformed(at: usize, what: &str) -> BatchError {
    BatchError::Malformed(format!("{what} at byte {at} of the records"))
}

/// A nullable byte string (a record's key, value, header key or value): a
/// zig-zag varint length, -1 for null, then that many bytes of `b`.
#[inline(always)]
pub(super) fn nullable<'b>(b: &'b [u8], p: &mut usize) -> Option<Option<&'b [u8]>> {
    let n = read_varint(b, p)?;
    if n == -1 {
        return Some(None);
    }
    let end = p.checked_add(usize::try_from(n).ok()?)?;
    let s = b.get(*p..end)?;
    *p = end;
    Some(Some(s))
}

/// The first fields of the record at `p`: where its fields start (after
/// its length), where it ends, its timestampDelta and offsetDelta.
#[inline(always)]
fn record_head(buf: &[u8], mut p: usize) -> Result<(usize, usize, i64, i32), BatchError> {
    let len = need(read_varint(buf, &mut p), p, "record length")?;
    let len = usize::try_from(len).map_err(|_| malformed(p, "negative record length"))?;
    let end = need(
        p.checked_add(len).filter(|&e| e <= buf.len()),
        p,
        "record runs past the end",
    )?;
    // Reads past the record's end fail.
    let b = &buf[..end];
    if p >= end {
        return Err(malformed(p, "record attributes"));
    }
    p += 1;
    let timestamp_delta = need(read_varlong(b, &mut p), p, "timestampDelta")?;
    let offset_delta = need(read_varint(b, &mut p), p, "offsetDelta")?;
    Ok((p, end, timestamp_delta, offset_delta))
}

impl DecodedBatch {
    /// A records section `buf` of `count` records, not read yet.
    pub(super) fn new(
        buf: Bytes,
        (base_offset, base_timestamp): (i64, i64),
        (compression, snappy_framing): (Compression, SnappyFraming),
        count: usize,
        marks: Marks,
    ) -> DecodedBatch {
        DecodedBatch {
            buf,
            base_offset,
            base_timestamp,
            compression,
            snappy_framing,
            count,
            starts: OnceLock::new(),
            marks,
        }
    }

    /// Read the record whose length varint is at `start` into `r` (its
    /// header vector reused); where it ends. Every field is checked: a
    /// length past the record, a null header key, a header count larger
    /// than the bytes left, or bytes left over are `Malformed`.
    #[inline(always)]
    fn read_at<'a>(&'a self, start: usize, r: &mut Record<'a>) -> Result<usize, BatchError> {
        let buf = &self.buf[..];
        let (mut p, end, timestamp_delta, offset_delta) = record_head(buf, start)?;
        let b = &buf[..end];
        let key = need(nullable(b, &mut p), p, "key")?;
        let value = need(nullable(b, &mut p), p, "value")?;
        let n_headers = need(read_varint(b, &mut p), p, "header count")?;
        let n_headers =
            usize::try_from(n_headers).map_err(|_| malformed(p, "negative header count"))?;
        // Each header takes at least 2 bytes: the header vector of one
        // record is at most 16 times its bytes, and lives while it is read.
        if n_headers > (end - p) / 2 {
            return Err(malformed(p, "header count larger than the record"));
        }
        r.offset = self.base_offset.wrapping_add(i64::from(offset_delta));
        r.timestamp = self.base_timestamp.wrapping_add(timestamp_delta);
        (r.key, r.value) = (key, value);
        r.headers.clear();
        for _ in 0..n_headers {
            let key = need(nullable(b, &mut p), p, "header key")?
                .ok_or_else(|| malformed(p, "null header key"))?;
            let value = need(nullable(b, &mut p), p, "header value")?;
            r.headers.push(Header { key, value });
        }
        if p != end {
            return Err(malformed(p, "record length does not match its fields"));
        }
        Ok(end)
    }

    /// The records in batch order, each read into one `Record` whose
    /// header vector is reused (a vector per record cost 4-5 % of a judged
    /// record's CPU in `malloc` and `free`), until `f` breaks. A malformed
    /// record (or a count that is not recordsCount, or bytes after the
    /// last record) ends the walk with its error, after the records before
    /// it were passed to `f`. The first complete walk keeps where each
    /// record starts, for [`Self::record`], [`Self::offset`] and
    /// [`Self::raw_record`].
    pub fn try_each_record<'a, B>(
        &'a self,
        mut f: impl FnMut(usize, &Record<'a>) -> ControlFlow<B>,
    ) -> Result<ControlFlow<B>, BatchError> {
        let keep = self.starts.get().is_none();
        let mut starts = Vec::new();
        if keep {
            // Every record takes at least 7 bytes, so this bounds the count
            // (and `memory` counted it).
            starts.reserve_exact(self.count.min(self.buf.len() / 7));
        }
        let mut r = Record::default();
        let mut p = 0;
        let walked = (|| {
            for i in 0..self.count {
                if keep {
                    let at = u32::try_from(p).map_err(|_| malformed(p, "record start"))?;
                    starts.push(at);
                }
                p = self.read_at(p, &mut r)?;
                if let ControlFlow::Break(b) = f(i, &r) {
                    return Ok(ControlFlow::Break(b));
                }
            }
            if p != self.buf.len() {
                return Err(malformed(p, "bytes left after recordsCount records"));
            }
            Ok(ControlFlow::Continue(()))
        })();
        if keep {
            match &walked {
                Ok(ControlFlow::Continue(())) => {
                    let _ = self.starts.set(Ok(starts.into_boxed_slice()));
                }
                Err(e) => {
                    let _ = self.starts.set(Err(e.clone()));
                }
                Ok(ControlFlow::Break(_)) => {}
            }
        }
        walked
    }

    /// [`Self::try_each_record`] to the end.
    pub fn each_record<'a>(
        &'a self,
        mut f: impl FnMut(usize, &Record<'a>),
    ) -> Result<(), BatchError> {
        self.try_each_record(|i, r| {
            f(i, r);
            ControlFlow::<()>::Continue(())
        })
        .map(|_| ())
    }

    /// Whether every record is well formed (walking them once if no walk
    /// has read them all yet).
    pub fn check(&self) -> Result<(), BatchError> {
        self.starts().map(|_| ())
    }

    /// Where each record starts, walking the batch if no walk has.
    fn starts(&self) -> Result<&[u32], BatchError> {
        if self.starts.get().is_none() {
            let _ = self.each_record(|_, _| {});
        }
        match self.starts.get() {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(e.clone()),
            None => Err(malformed(0, "records not walked")),
        }
    }

    /// The records (0 for a malformed batch).
    pub fn len(&self) -> usize {
        self.starts().map_or(0, <[u32]>::len)
    }
    /// Bytes this decoded batch holds beyond the batch itself: the
    /// decompressed records (0 when uncompressed: they are a slice of the
    /// batch), where each record starts (4 bytes a record, reserved for
    /// as many as recordsCount declares and the bytes can hold) and the
    /// CRC marks (4 bytes per 24 KiB, uncompressed batches only).
    pub fn memory(&self) -> usize {
        let buf = if self.compression == Compression::None {
            0
        } else {
            self.buf.len()
        };
        buf + self.count.min(self.buf.len() / 7) * std::mem::size_of::<u32>() + self.marks.memory()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The batch's baseOffset (record offsets are relative to it).
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    /// The codec the records were compressed with.
    pub fn compression(&self) -> Compression {
        self.compression
    }
    /// For snappy batches: the framing of the input (splice writes the same).
    pub fn snappy_framing(&self) -> SnappyFraming {
        self.snappy_framing
    }
    /// The decompressed records section.
    pub fn buffer(&self) -> &Bytes {
        &self.buf
    }
    /// Where record `i` starts.
    fn start(&self, i: usize) -> Option<usize> {
        self.starts().ok()?.get(i).map(|&s| s as usize)
    }
    /// Absolute offset of record `i`.
    pub fn offset(&self, i: usize) -> Option<i64> {
        let (_, _, _, delta) = record_head(&self.buf, self.start(i)?).ok()?;
        Some(self.base_offset.wrapping_add(i64::from(delta)))
    }
    /// The exact bytes of record `i` (length varint included), as in the batch.
    pub fn raw_record(&self, i: usize) -> Option<&[u8]> {
        let starts = self.starts().ok()?;
        let (s, e) = self.range(starts, i)?;
        self.buf.get(s..e)
    }

    /// The exact bytes of each record, in batch order (none for a
    /// malformed batch).
    pub fn raw_records(&self) -> impl Iterator<Item = &[u8]> {
        let starts = self.starts().unwrap_or_default();
        (0..starts.len())
            .filter_map(move |i| self.range(starts, i))
            .map(|(s, e)| self.buf.get(s..e).unwrap_or_default())
    }

    /// The running CRC of the batch as it was verified (none for a
    /// compressed batch).
    pub fn marks(&self) -> &Marks {
        &self.marks
    }

    /// Where the records `first..end` start and end together in
    /// [`Self::buffer`] (`first < end`).
    pub fn span(&self, first: usize, end: usize) -> Option<(usize, usize)> {
        let starts = self.starts().ok()?;
        let (start, _) = self.range(starts, first)?;
        let (_, stop) = self.range(starts, end.checked_sub(1)?)?;
        (first < end).then_some((start, stop))
    }

    /// Where record `i` starts and ends, given where every record starts.
    #[inline]
    fn range(&self, starts: &[u32], i: usize) -> Option<(usize, usize)> {
        let end = starts.get(i + 1).map_or(self.buf.len(), |&e| e as usize);
        Some((*starts.get(i)? as usize, end))
    }

    /// Record `i`. `offset` and `timestamp` are baseOffset/baseTimestamp plus
    /// the record's deltas. Note: under LogAppendTime (`Batch::timestamp_type`)
    /// Java consumers report the batch's maxTimestamp instead.
    pub fn record(&self, i: usize) -> Option<Record<'_>> {
        let mut r = Record::default();
        self.read_at(self.start(i)?, &mut r).ok()?;
        Some(r)
    }

    /// All records in batch order (none for a malformed batch).
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> {
        (0..self.len()).filter_map(move |i| self.record(i))
    }
}
