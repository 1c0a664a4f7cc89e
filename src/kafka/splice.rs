//! Rebuilding a v2 batch that loses records (`splice`), and the header
//! patching shared with `builder`.
//!
//! Owned separately from `batch` (which only reads) because this is the one
//! place that writes batch bytes for clients: it keeps everything a consumer
//! uses to track its position (baseOffset, lastOffsetDelta, timestamps,
//! producer fields, attribute bits 3-6) and changes only batchLength,
//! recordsCount, crc and the records section, as Kafka's log cleaner does.

use bytes::{Bytes, BytesMut};

use crate::kafka::batch::{
    Batch, BatchError, DecodedBatch, ATTRIBUTES, ATTR_CODEC_MASK, BATCH_LENGTH, CRC, HEADER_LEN,
    LAST_OFFSET_DELTA, LOG_OVERHEAD, RECORDS_COUNT,
};
use crate::kafka::compression::{self, Compression};

/// Rebuild `batch` keeping only the records `keep[i] == true`, in order.
/// If `cut_before` is `Some(offset)`, records at or after `offset` are also
/// dropped and lastOffsetDelta is lowered so the client fetches `offset` next
/// (used to hold a partition at a record not yet safely diverted).
///
/// `decoded` must come from `batch.decode()` and `keep.len()` must equal
/// `decoded.len()`. `cut_before` must satisfy
/// `baseOffset < offset <= batch.next_offset()`.
///
/// If nothing changes, the original bytes are returned (no copy). A batch
/// that loses every record is written as an empty header: recordsCount 0,
/// codec none, lastOffsetDelta kept (or cut). Control batches are never
/// rewritten: asking to drop anything from one is an error.
pub fn splice(
    batch: &Batch,
    decoded: &DecodedBatch,
    keep: &[bool],
    cut_before: Option<i64>,
) -> Result<Bytes, BatchError> {
    if keep.len() != decoded.len() {
        return Err(BatchError::Invalid(format!(
            "keep has {} entries for {} records",
            keep.len(),
            decoded.len()
        )));
    }
    let count = usize::try_from(batch.records_count()).ok();
    if count != Some(decoded.len()) {
        return Err(BatchError::Invalid(
            "decoded records do not belong to this batch".into(),
        ));
    }
    let base = batch.base_offset();
    let last_offset_delta = match cut_before {
        None => batch.last_offset_delta(),
        Some(off) => {
            if off <= base || off > batch.next_offset() {
                return Err(BatchError::Invalid(format!(
                    "cut_before {off} outside ({base}, {}]",
                    batch.next_offset()
                )));
            }
            // off - 1 - base fits: base < off <= base + lastOffsetDelta + 1.
            i32::try_from(off - 1 - base)
                .map_err(|_| BatchError::Invalid(format!("cut_before {off} too far")))?
        }
    };
    let kept: Vec<usize> = (0..decoded.len())
        .filter(|&i| keep[i])
        .filter(|&i| match (cut_before, decoded.offset(i)) {
            (Some(off), Some(o)) => o < off,
            _ => true,
        })
        .collect();
    if kept.len() == decoded.len() && last_offset_delta == batch.last_offset_delta() {
        return Ok(batch.bytes().clone());
    }
    if batch.is_control() {
        return Err(BatchError::Invalid(
            "control batches are passed through, never rewritten".into(),
        ));
    }

    let src = batch.bytes();
    let mut attributes = batch.attributes();
    let records: Vec<u8> = if kept.is_empty() {
        attributes &= !ATTR_CODEC_MASK;
        Vec::new()
    } else {
        let mut raw = Vec::with_capacity(decoded.buffer().len());
        for &i in &kept {
            raw.extend_from_slice(decoded.raw_record(i).unwrap_or_default());
        }
        match decoded.compression() {
            Compression::None => raw,
            codec => compression::compress(codec, &raw, decoded.snappy_framing())?,
        }
    };
    let mut out = BytesMut::with_capacity(HEADER_LEN + records.len());
    out.extend_from_slice(&src[..HEADER_LEN]);
    out.extend_from_slice(&records);
    out[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    out[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4].copy_from_slice(&last_offset_delta.to_be_bytes());
    let n = i32::try_from(kept.len())
        .map_err(|_| BatchError::Invalid("too many records".into()))?;
    out[RECORDS_COUNT..RECORDS_COUNT + 4].copy_from_slice(&n.to_be_bytes());
    finish_header(&mut out)?;
    Ok(out.freeze())
}

/// Set batchLength from the buffer's size and recompute the CRC. `out` holds
/// a whole batch (header + records section).
pub(crate) fn finish_header(out: &mut [u8]) -> Result<(), BatchError> {
    let len = i32::try_from(out.len() - LOG_OVERHEAD)
        .map_err(|_| BatchError::Invalid("batch larger than 2 GiB".into()))?;
    out[BATCH_LENGTH..BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES..]);
    out[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}
