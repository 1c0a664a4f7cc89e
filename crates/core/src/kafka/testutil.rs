//! Test helpers shared by the batch tests: a raw v2 batch assembler that can
//! produce what `build_batch` never does (offset gaps, control and
//! transactional bits, LogAppendTime, raw snappy), and a bridge to the
//! `kafka-protocol` crate's independent decoder.

use bytes::{Bytes, BytesMut};

use crate::kafka::batch::{ATTRIBUTES, CRC};
use crate::kafka::compression::{compress, Compression, SnappyFraming};
use crate::kafka::varint::{write_varint, write_varlong};

#[derive(Debug, Clone)]
pub struct RawRecord {
    pub offset_delta: i32,
    pub timestamp_delta: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl RawRecord {
    pub fn simple(offset_delta: i32, value: &str) -> RawRecord {
        RawRecord {
            offset_delta,
            timestamp_delta: i64::from(offset_delta) * 10,
            key: Some(format!("k{offset_delta}").into_bytes()),
            value: Some(value.as_bytes().to_vec()),
            headers: vec![("h".into(), Some(b"v".to_vec())), ("h".into(), None)],
        }
    }
}

#[derive(Debug, Clone)]
pub struct RawBatch {
    pub base_offset: i64,
    pub leader_epoch: i32,
    /// Attribute bits other than the codec.
    pub flags: i16,
    pub codec: Compression,
    pub framing: SnappyFraming,
    /// `None`: the last record's offset delta.
    pub last_offset_delta: Option<i32>,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records: Vec<RawRecord>,
}

impl Default for RawBatch {
    fn default() -> Self {
        RawBatch {
            base_offset: 1000,
            leader_epoch: 7,
            flags: 0,
            codec: Compression::None,
            framing: SnappyFraming::Xerial,
            last_offset_delta: None,
            base_timestamp: 1_700_000_000_000,
            max_timestamp: 1_700_000_009_999,
            producer_id: 4242,
            producer_epoch: 3,
            base_sequence: 17,
            records: Vec::new(),
        }
    }
}

fn nullable(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => write_varint(out, -1),
        Some(b) => {
            write_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

pub fn encode_record(r: &RawRecord) -> Vec<u8> {
    let mut body = vec![0u8];
    write_varlong(&mut body, r.timestamp_delta);
    write_varint(&mut body, r.offset_delta);
    nullable(&mut body, r.key.as_deref());
    nullable(&mut body, r.value.as_deref());
    write_varint(&mut body, r.headers.len() as i32);
    for (k, v) in &r.headers {
        nullable(&mut body, Some(k.as_bytes()));
        nullable(&mut body, v.as_deref());
    }
    let mut out = Vec::new();
    write_varint(&mut out, body.len() as i32);
    out.extend_from_slice(&body);
    out
}

impl RawBatch {
    /// Five records at offsets 1000, 1001, 1003, 1004, 1007 (a compacted
    /// batch), lastOffsetDelta 9: the fixture of the splice and marker tests.
    pub fn compacted_five(codec: Compression, flags: i16) -> RawBatch {
        RawBatch {
            codec,
            flags,
            records: [0, 1, 3, 4, 7]
                .iter()
                .map(|&d| RawRecord::simple(d, &format!("value-{d}")))
                .collect(),
            last_offset_delta: Some(9),
            ..RawBatch::default()
        }
    }

    pub fn encode(&self) -> Bytes {
        let raw: Vec<u8> = self.records.iter().flat_map(encode_record).collect();
        let section = compress(self.codec, &raw, self.framing).unwrap();
        let lod = self
            .last_offset_delta
            .unwrap_or_else(|| self.records.last().map_or(0, |r| r.offset_delta));
        let mut out = BytesMut::new();
        out.extend_from_slice(&self.base_offset.to_be_bytes());
        out.extend_from_slice(&((49 + section.len()) as i32).to_be_bytes());
        out.extend_from_slice(&self.leader_epoch.to_be_bytes());
        out.extend_from_slice(&[2]);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(self.flags | i16::from(self.codec.id())).to_be_bytes());
        out.extend_from_slice(&lod.to_be_bytes());
        out.extend_from_slice(&self.base_timestamp.to_be_bytes());
        out.extend_from_slice(&self.max_timestamp.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.producer_epoch.to_be_bytes());
        out.extend_from_slice(&self.base_sequence.to_be_bytes());
        out.extend_from_slice(&(self.records.len() as i32).to_be_bytes());
        out.extend_from_slice(&section);
        let crc = crc32c::crc32c(&out[ATTRIBUTES..]);
        out[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
        out.freeze()
    }
}

/// Records as the independent `kafka-protocol` decoder sees them:
/// (offset, timestamp, key, value, headers with duplicate keys collapsed).
pub type IndepRecord = (
    i64,
    i64,
    Option<Bytes>,
    Option<Bytes>,
    Vec<(String, Option<Bytes>)>,
);

/// Decode one batch with `kafka_protocol::records::RecordBatchDecoder`.
pub fn independent_decode(batch: &Bytes) -> Result<Vec<IndepRecord>, String> {
    let mut buf = batch.clone();
    let set =
        kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).map_err(|e| e.to_string())?;
    if !buf.is_empty() {
        return Err(format!("{} bytes left over", buf.len()));
    }
    Ok(set
        .records
        .into_iter()
        .map(|r| {
            (
                r.offset,
                r.timestamp,
                r.key,
                r.value,
                r.headers
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            )
        })
        .collect())
}

/// What `independent_decode` should return for records (duplicate header
/// keys collapse: first position, last value, as `IndexMap::insert` does).
pub fn expected_independent(base_offset: i64, base_ts: i64, rs: &[&RawRecord]) -> Vec<IndepRecord> {
    rs.iter()
        .map(|r| {
            let mut headers: Vec<(String, Option<Bytes>)> = Vec::new();
            for (k, v) in &r.headers {
                let v = v.clone().map(Bytes::from);
                match headers.iter_mut().find(|(hk, _)| hk == k) {
                    Some(slot) => slot.1 = v,
                    None => headers.push((k.clone(), v)),
                }
            }
            (
                base_offset + i64::from(r.offset_delta),
                base_ts + r.timestamp_delta,
                r.key.clone().map(Bytes::from),
                r.value.clone().map(Bytes::from),
                headers,
            )
        })
        .collect()
}
