//! Writing a filtered Fetch response without encoding it again: the body as
//! it arrived, with the changed partitions' records sections (and their
//! length prefixes) replaced, as a list of chunks. Kept batches stay slices
//! of the broker's bytes, so no record is copied; encoding the whole
//! response was one more copy of every record (4 % of a judged record's
//! CPU, on top of building the new section). Only records sections change
//! this way: a response whose broker endpoints were rewritten, or a section
//! that cannot be located with its minimal length prefix, is encoded in
//! full by the caller. Outside the records sections the broker's bytes are
//! kept as they are (the encoder would drop an empty tagged field, for
//! example). Debug builds decode every patched body and compare it with
//! the response the encoder would write, so the whole test suite checks it.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::protocol::{Decodable, Encodable};

use super::FilterError;

/// Where each partition's records section lies in the body, by topic and
/// partition index, as decoded (`None`: null, empty or not a slice of it).
pub(super) struct Sections {
    base: usize,
    ranges: Vec<Vec<Option<Range<usize>>>>,
}

impl Sections {
    pub(super) fn of(body: &Bytes, resp: &FetchResponse) -> Sections {
        let base = body.as_ptr() as usize;
        let ranges = (resp.responses.iter())
            .map(|t| {
                (t.partitions.iter())
                    .map(|p| {
                        let r = p.records.as_ref().filter(|r| !r.is_empty())?;
                        let start = (r.as_ptr() as usize).checked_sub(base)?;
                        let end = start.checked_add(r.len()).filter(|&e| e <= body.len())?;
                        Some(start..end)
                    })
                    .collect()
            })
            .collect();
        Sections { base, ranges }
    }

    fn get(&self, ti: usize, pi: usize) -> Option<Range<usize>> {
        self.ranges.get(ti)?.get(pi)?.clone()
    }
}

/// The new body: `replaced` gives the chunks of the partitions (topic and
/// partition index) whose sections were rebuilt; any other partition whose
/// records are no longer its original section (withheld) gets its current
/// records. `None` when this cannot be done exactly; the caller encodes.
pub(super) fn patch(
    body: &Bytes,
    version: i16,
    sections: &Sections,
    resp: &FetchResponse,
    replaced: &[((usize, usize), Vec<Bytes>)],
) -> Option<Vec<Bytes>> {
    let flexible = version >= 12;
    let mut edits: Vec<(Range<usize>, Vec<Bytes>)> = Vec::new();
    for (ti, t) in resp.responses.iter().enumerate() {
        for (pi, p) in t.partitions.iter().enumerate() {
            let orig = sections.get(ti, pi);
            let new = match replaced.iter().find(|(at, _)| *at == (ti, pi)) {
                Some((_, chunks)) => Some(chunks.clone()),
                None => {
                    let current = p.records.as_ref().filter(|r| !r.is_empty());
                    match (&orig, current) {
                        (None, None) => None,
                        (Some(range), Some(r))
                            if r.as_ptr() as usize == sections.base + range.start
                                && r.len() == range.len() =>
                        {
                            None
                        }
                        (Some(_), current) => Some(current.cloned().into_iter().collect()),
                        // A section where there was none: not a withholding.
                        (None, Some(_)) => return None,
                    }
                }
            };
            if let Some(chunks) = new {
                edits.push((orig?, chunks));
            }
        }
    }
    let mut spliced = Vec::with_capacity(edits.len());
    for (range, chunks) in edits {
        let old = length_prefix(range.len(), flexible)?;
        let at = range.start.checked_sub(old.len())?;
        if body.get(at..range.start)? != &old[..] {
            return None;
        }
        let mut new = Vec::with_capacity(chunks.len() + 1);
        new.push(length_prefix(
            chunks.iter().map(Bytes::len).sum(),
            flexible,
        )?);
        new.extend(chunks);
        spliced.push((at..range.end, new));
    }
    assemble(body, spliced)
}

/// The body with each range of `edits` (disjoint) replaced by its chunks;
/// empty chunks are left out, the rest of the body stays slices of it.
/// `None` if two ranges overlap or one lies outside the body.
pub(super) fn assemble(
    body: &Bytes,
    mut edits: Vec<(Range<usize>, Vec<Bytes>)>,
) -> Option<Vec<Bytes>> {
    edits.sort_by_key(|(range, _)| range.start);
    let mut out = Vec::with_capacity(edits.len() * 4 + 1);
    let mut cursor = 0;
    for (range, chunks) in edits {
        if range.start < cursor || range.end > body.len() {
            return None;
        }
        if range.start > cursor {
            out.push(body.slice(cursor..range.start));
        }
        out.extend(chunks.into_iter().filter(|c| !c.is_empty()));
        cursor = range.end;
    }
    if cursor < body.len() {
        out.push(body.slice(cursor..));
    }
    Some(out)
}

/// A records section's length prefix: compact (unsigned varint of length
/// + 1) in flexible versions (Fetch v12+), else a 32-bit length.
pub(super) fn length_prefix(len: usize, flexible: bool) -> Option<Bytes> {
    let mut b = BytesMut::with_capacity(5);
    if flexible {
        let mut v = len as u64 + 1;
        while v >= 0x80 {
            b.put_u8((v as u8) | 0x80);
            v >>= 7;
        }
        b.put_u8(v as u8);
    } else {
        b.put_i32(i32::try_from(len).ok()?);
    }
    Some(b.freeze())
}

/// A response that can be written as its body patched (`Fresh`).
pub(super) trait Patchable: Encodable + Decodable + PartialEq + std::fmt::Debug {
    /// Where its changeable fields lie in the body.
    type Sections;
    /// The body with the changes made to `self` (and the `replaced`
    /// records) patched in; `None` when this cannot be done exactly.
    fn patch(
        &self,
        body: &Bytes,
        version: i16,
        sections: &Self::Sections,
        replaced: &[((usize, usize), Vec<Bytes>)],
    ) -> Option<Vec<Bytes>>;
    /// Set the records of partition `at` (topic, partition index).
    fn set_records(&mut self, at: (usize, usize), records: Bytes);
}

impl Patchable for FetchResponse {
    type Sections = Sections;
    fn patch(
        &self,
        body: &Bytes,
        version: i16,
        sections: &Sections,
        replaced: &[((usize, usize), Vec<Bytes>)],
    ) -> Option<Vec<Bytes>> {
        patch(body, version, sections, self, replaced)
    }
    fn set_records(&mut self, (ti, pi): (usize, usize), records: Bytes) {
        if let Some(p) = (self.responses.get_mut(ti)).and_then(|t| t.partitions.get_mut(pi)) {
            p.records = Some(records);
        }
    }
}

/// What the new body is made from: the body as it arrived, its version,
/// where its changeable fields were, and whether broker endpoints in it
/// were rewritten (then only the full encoder can write it).
pub(super) struct Fresh<'a, S> {
    pub(super) body: &'a Bytes,
    pub(super) version: i16,
    pub(super) sections: &'a S,
    pub(super) endpoints: bool,
}

impl<S> Fresh<'_, S> {
    /// The new body, `replaced` giving the rebuilt partitions' sections:
    /// patched into the original bytes when it can be, else encoded.
    pub(super) fn body<R: Patchable<Sections = S>>(
        &self,
        resp: &mut R,
        replaced: Vec<((usize, usize), Vec<Bytes>)>,
    ) -> Result<Vec<Bytes>, FilterError> {
        let patched = (!self.endpoints)
            .then(|| resp.patch(self.body, self.version, self.sections, &replaced))
            .flatten();
        if patched.is_some() && !cfg!(debug_assertions) {
            return Ok(patched.unwrap_or_default());
        }
        for (at, chunks) in replaced {
            let section = join(&chunks);
            if cfg!(debug_assertions) {
                if let Some(why) = out_of_order(&section) {
                    // Every integration test fails on this line in the
                    // proxy's log (harness.py `stop_and_check`).
                    tracing::error!(?at, "{ORDER_BUG}: {why}");
                }
            }
            resp.set_records(at, section);
        }
        if let Some(chunks) = patched {
            // Debug builds (every test) check that the patch decodes to the
            // response the encoder would write (bytes may differ only where
            // the encoder normalises: it drops an empty tagged field the
            // patch keeps as the broker sent it), then send the patch, so
            // the chunked write is what they test.
            let again = R::decode(&mut join(&chunks), self.version);
            assert!(
                again.as_ref().is_ok_and(|again| again == resp),
                "patched response decodes to {again:?}, not {resp:?}"
            );
            return Ok(chunks);
        }
        let encoded = crate::transport::frame::encode(resp, self.version);
        Ok(vec![encoded.map_err(FilterError::Encode)?.freeze()])
    }
}

/// What debug builds log when a rebuilt records section is out of order.
const ORDER_BUG: &str = "BUG: rebuilt records section out of offset order";

/// Why a rebuilt records section would hand a client records out of order
/// (its batches' base offsets must rise: a spliced batch keeps its base,
/// and a commit marker after it sits at its last offset), or `None`. A
/// client that does not check (kafka-python) would deliver them so.
fn out_of_order(section: &Bytes) -> Option<String> {
    let mut last: Option<i64> = None;
    for seg in crate::kafka::batch::segments(section) {
        if let crate::kafka::batch::Segment::Batch(b) = seg {
            let base = b.base_offset();
            if let Some(l) = last.filter(|&l| base <= l) {
                return Some(format!("batch at {base} after one at {l}"));
            }
            last = Some(base);
        }
    }
    None
}

use crate::kafka::splice::join;

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn response(version: i16) -> Bytes {
        let partition = |i: i32, len: usize| {
            PartitionData::default()
                .with_partition_index(i)
                .with_high_watermark(1000)
                .with_records(Some(Bytes::from(vec![i as u8 + 1; len])))
        };
        let topic = |name: &str| {
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_string(name.into())))
                .with_topic_id(uuid::Uuid::from_u128(name.len() as u128))
                .with_partitions(vec![partition(0, 300), partition(1, 5), partition(2, 0)])
        };
        let resp = FetchResponse::default().with_responses(vec![topic("a"), topic("bb")]);
        let mut out = BytesMut::new();
        resp.encode(&mut out, version).expect("encode");
        out.freeze()
    }

    /// Replaced, shortened, emptied and withheld sections, in flexible and
    /// older versions, patch into exactly what the encoder writes.
    #[test]
    fn a_patched_body_is_byte_for_byte_the_encoded_response() {
        for version in [4i16, 11, 12, 13, 16] {
            let body = response(version);
            let mut resp = FetchResponse::decode(&mut body.clone(), version).expect("decode");
            let sections = Sections::of(&body, &resp);
            let first = resp.responses[0].partitions[0]
                .records
                .clone()
                .expect("records");
            // Topic 0 partition 0 loses its middle; topic 1 partition 1 is
            // emptied; topic 1 partition 0 is withheld (set directly).
            let replaced = vec![
                (
                    (0, 0),
                    vec![
                        first.slice(..100),
                        Bytes::from_static(b"spliced"),
                        first.slice(250..),
                    ],
                ),
                ((1, 1), Vec::new()),
            ];
            resp.responses[1].partitions[0].records = Some(Bytes::new());
            let chunks = patch(&body, version, &sections, &resp, &replaced).expect("patchable");
            for ((ti, pi), c) in &replaced {
                resp.responses[*ti].partitions[*pi].records = Some(join(c));
            }
            let mut full = BytesMut::new();
            resp.encode(&mut full, version).expect("encode");
            assert_eq!(join(&chunks).to_vec(), full.to_vec(), "version {version}");
            // Kept bytes are the original's, not copies.
            assert!(
                chunks.iter().any(|c| c.as_ptr() == first.as_ptr()),
                "version {version}"
            );
        }
    }

    /// The debug builds' order check finds batches out of order, and only
    /// those (a batch before an earlier one, or the same one twice).
    #[test]
    fn a_section_out_of_offset_order_is_found() {
        use super::super::fetch_tests::batch;
        let section = |bases: &[i64]| {
            join(
                &bases
                    .iter()
                    .map(|&b| batch(&["{}", "{}"], b))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(out_of_order(&section(&[0, 49, 98])), None);
        assert_eq!(out_of_order(&section(&[])), None);
        assert_eq!(
            out_of_order(&section(&[49, 0, 98])).as_deref(),
            Some("batch at 0 after one at 49")
        );
        assert!(out_of_order(&section(&[0, 0])).is_some());
    }

    /// A section added where there was none is not a patch.
    #[test]
    fn a_section_where_there_was_none_is_left_to_the_encoder() {
        let body = response(12);
        let mut resp = FetchResponse::decode(&mut body.clone(), 12).expect("decode");
        let sections = Sections::of(&body, &resp);
        resp.responses[0].partitions[2].records = Some(Bytes::from_static(b"new"));
        assert!(patch(&body, 12, &sections, &resp, &[]).is_none());
    }
}
