//! Writing a judged ShareFetch response without encoding it again, as
//! `patch` does for a Fetch: the body as it arrived, with each changed
//! partition's records section and acquired ranges (adjacent, the last
//! fields of a partition in v1 and v2) replaced, as chunks. Kept batches
//! stay slices of the broker's bytes: encoding the whole response copied
//! every record once more. A response whose endpoints were rewritten, or a
//! partition whose fields cannot be located exactly (a length not in its
//! shortest form, tagged fields in an acquired range, ranges without a
//! records section), is encoded in full by the caller. Debug builds decode
//! every patched body and compare it with the response the encoder would
//! write, so the whole test suite checks it.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::share_fetch_response::AcquiredRecords;
use kafka_protocol::messages::ShareFetchResponse;

use super::patch::{assemble, length_prefix, Patchable};

/// Where one partition's records and acquired ranges lie in the body.
#[derive(Clone)]
enum Place {
    /// The records section, and where the acquired ranges after it end.
    Located(Range<usize>, usize),
    /// No records section in the body; whether it came with ranges.
    Bare { ranges: bool },
    /// Not located exactly: only the encoder can change it.
    Unknown,
}

/// Where each partition's fields lie, by topic and partition index.
pub(super) struct ShareSections {
    base: usize,
    places: Vec<Vec<Place>>,
}

impl ShareSections {
    pub(super) fn of(body: &Bytes, resp: &ShareFetchResponse) -> ShareSections {
        let base = body.as_ptr() as usize;
        let place = |p: &kafka_protocol::messages::share_fetch_response::PartitionData| {
            let Some(r) = p.records.as_ref().filter(|r| !r.is_empty()) else {
                let ranges = !p.acquired_records.is_empty();
                return Place::Bare { ranges };
            };
            let located = || {
                let start = (r.as_ptr() as usize).checked_sub(base)?;
                let end = start.checked_add(r.len()).filter(|&e| e <= body.len())?;
                let ranges = ranges_bytes(&p.acquired_records)?;
                let ranges_end = end.checked_add(ranges.len())?;
                (body.get(end..ranges_end)? == &ranges[..])
                    .then_some(Place::Located(start..end, ranges_end))
            };
            located().unwrap_or(Place::Unknown)
        };
        let places = (resp.responses.iter())
            .map(|t| t.partitions.iter().map(place).collect())
            .collect();
        ShareSections { base, places }
    }

    fn get(&self, ti: usize, pi: usize) -> Place {
        (self.places.get(ti))
            .and_then(|t| t.get(pi))
            .cloned()
            .unwrap_or(Place::Unknown)
    }
}

/// The new body: `replaced` gives the records chunks of the partitions
/// whose sections were rebuilt; every partition whose records or acquired
/// ranges are not the body's any more gets its current ones. `None` when
/// this cannot be done exactly; the caller encodes.
pub(super) fn patch_share(
    body: &Bytes,
    sections: &ShareSections,
    resp: &ShareFetchResponse,
    replaced: &[((usize, usize), Vec<Bytes>)],
) -> Option<Vec<Bytes>> {
    let mut edits = Vec::new();
    for (ti, t) in resp.responses.iter().enumerate() {
        for (pi, p) in t.partitions.iter().enumerate() {
            let current = p.records.as_ref().filter(|r| !r.is_empty());
            let new = replaced.iter().find(|(at, _)| *at == (ti, pi));
            let (records, range_end) = match (sections.get(ti, pi), new) {
                (Place::Bare { ranges: false }, None)
                    if current.is_none() && p.acquired_records.is_empty() =>
                {
                    continue;
                }
                (Place::Located(records, end), None) => {
                    let same = current.is_some_and(|r| {
                        r.as_ptr() as usize == sections.base + records.start
                            && r.len() == records.len()
                    });
                    let ranges = ranges_bytes(&p.acquired_records)?;
                    if same && body.get(records.end..end)? == &ranges[..] {
                        continue;
                    }
                    (records, end)
                }
                (Place::Located(records, end), Some(_)) => (records, end),
                _ => return None,
            };
            let chunks = match new {
                Some((_, chunks)) => chunks.clone(),
                None => current.cloned().into_iter().collect(),
            };
            edits.push(edit(body, records, range_end, chunks, &p.acquired_records)?);
        }
    }
    assemble(body, edits)
}

/// One partition's edit: from its records' length prefix (checked to be
/// the body's, in its shortest form) to the end of its acquired ranges.
fn edit(
    body: &Bytes,
    records: Range<usize>,
    ranges_end: usize,
    chunks: Vec<Bytes>,
    acquired: &[AcquiredRecords],
) -> Option<(Range<usize>, Vec<Bytes>)> {
    let old = length_prefix(records.len(), true)?;
    let at = records.start.checked_sub(old.len())?;
    if body.get(at..records.start)? != &old[..] {
        return None;
    }
    let mut new = Vec::with_capacity(chunks.len() + 2);
    new.push(length_prefix(chunks.iter().map(Bytes::len).sum(), true)?);
    new.extend(chunks);
    new.push(ranges_bytes(acquired)?);
    Some((at..ranges_end, new))
}

/// Acquired ranges as the encoder writes them (a compact array of first
/// and last offset, delivery count and no tagged fields); `None` if one
/// has tagged fields (kept only by the encoder).
fn ranges_bytes(acquired: &[AcquiredRecords]) -> Option<Bytes> {
    let mut out = BytesMut::with_capacity(5 + acquired.len() * 19);
    let mut n = acquired.len() as u64 + 1;
    while n >= 0x80 {
        out.put_u8((n as u8) | 0x80);
        n >>= 7;
    }
    out.put_u8(n as u8);
    for a in acquired {
        if !a.unknown_tagged_fields.is_empty() {
            return None;
        }
        out.put_i64(a.first_offset);
        out.put_i64(a.last_offset);
        out.put_i16(a.delivery_count);
        out.put_u8(0);
    }
    Some(out.freeze())
}

impl Patchable for ShareFetchResponse {
    type Sections = ShareSections;
    fn patch(
        &self,
        body: &Bytes,
        _version: i16,
        sections: &ShareSections,
        replaced: &[((usize, usize), Vec<Bytes>)],
    ) -> Option<Vec<Bytes>> {
        patch_share(body, sections, self, replaced)
    }
    fn set_records(&mut self, (ti, pi): (usize, usize), records: Bytes) {
        if let Some(p) = (self.responses.get_mut(ti)).and_then(|t| t.partitions.get_mut(pi)) {
            p.records = Some(records);
        }
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::share_fetch_response::{
        PartitionData, ShareFetchableTopicResponse,
    };
    use kafka_protocol::protocol::{Decodable, Encodable};

    use super::*;
    use crate::kafka::splice::join;

    fn response(version: i16) -> Bytes {
        let ranges = |f: i64, l: i64| {
            AcquiredRecords::default()
                .with_first_offset(f)
                .with_last_offset(l)
                .with_delivery_count(1)
        };
        let partition = |i: i32, len: usize| {
            PartitionData::default()
                .with_partition_index(i)
                .with_records(Some(Bytes::from(vec![i as u8 + 1; len])))
                .with_acquired_records(match len {
                    0 => vec![],
                    _ => vec![ranges(0, 3), ranges(5, 9)],
                })
        };
        let topic = |id: u128| {
            ShareFetchableTopicResponse::default()
                .with_topic_id(uuid::Uuid::from_u128(id))
                .with_partitions(vec![partition(0, 300), partition(1, 5), partition(2, 0)])
        };
        let resp = ShareFetchResponse::default()
            .with_acquisition_lock_timeout_ms(30_000)
            .with_responses(vec![topic(1), topic(2)]);
        let mut out = BytesMut::new();
        resp.encode(&mut out, version).expect("encode");
        out.freeze()
    }

    /// Rebuilt, withheld and narrowed partitions patch into exactly what
    /// the encoder writes; kept bytes stay the broker's.
    #[test]
    fn a_patched_share_body_is_byte_for_byte_the_encoded_response() {
        for version in [1i16, 2] {
            let body = response(version);
            let mut resp = ShareFetchResponse::decode(&mut body.clone(), version).expect("decode");
            let sections = ShareSections::of(&body, &resp);
            let first = resp.responses[0].partitions[0]
                .records
                .clone()
                .expect("records");
            // 0/0 loses its middle and a range; 1/1 is withheld; 1/0 keeps
            // its records but loses its second range.
            let replaced = vec![(
                (0, 0),
                vec![
                    first.slice(..100),
                    Bytes::from_static(b"spliced"),
                    first.slice(250..),
                ],
            )];
            resp.responses[0].partitions[0].acquired_records.truncate(1);
            let withheld = &mut resp.responses[1].partitions[1];
            withheld.records = Some(Bytes::new());
            withheld.acquired_records.clear();
            resp.responses[1].partitions[0].acquired_records.truncate(1);
            let chunks = patch_share(&body, &sections, &resp, &replaced).expect("patchable");
            resp.responses[0].partitions[0].records = Some(join(&replaced[0].1));
            let mut full = BytesMut::new();
            resp.encode(&mut full, version).expect("encode");
            assert_eq!(join(&chunks).to_vec(), full.to_vec(), "version {version}");
            assert!(chunks.iter().any(|c| c.as_ptr() == first.as_ptr()));
        }
    }

    /// Nothing changed: nothing to patch but the body itself.
    #[test]
    fn an_unchanged_share_body_patches_to_itself() {
        let body = response(1);
        let resp = ShareFetchResponse::decode(&mut body.clone(), 1).expect("decode");
        let sections = ShareSections::of(&body, &resp);
        let chunks = patch_share(&body, &sections, &resp, &[]).expect("patchable");
        assert_eq!(join(&chunks), body);
    }

    /// Ranges where the body had no records section: the encoder's work.
    #[test]
    fn ranges_without_a_records_section_are_left_to_the_encoder() {
        let body = response(1);
        let mut resp = ShareFetchResponse::decode(&mut body.clone(), 1).expect("decode");
        let sections = ShareSections::of(&body, &resp);
        resp.responses[0].partitions[2].acquired_records = vec![AcquiredRecords::default()];
        assert!(patch_share(&body, &sections, &resp, &[]).is_none());
    }
}
