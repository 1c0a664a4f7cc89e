//! Schema-registry wire framing shared by the formats: `raw` (the datum
//! alone), `confluent` (magic byte 0, then a 4-byte big-endian schema id,
//! then the datum; Protobuf adds message indexes), and Apicurio's own
//! (`registry: true` only): `apicurio-headers` (the id, an 8-byte
//! big-endian long, in a record header; the value is the datum alone),
//! `apicurio-8byte` (magic byte 0, then the id as 8 bytes) and
//! `apicurio-4byte` (magic byte 0, then the id as 4 bytes: Confluent's
//! framing, the id Apicurio's and the datum as Apicurio's serializers
//! write it). Apicurio ids are global ids or content ids, each its own
//! namespace.

use super::document::ValueDoc;
pub(crate) use super::document::Wire;
use super::located::not_for;
use super::located::{at, At};
use super::{Class, Invalid};
use crate::kafka::record::Header;

/// Which of Apicurio's ids a record carries: a namespace of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApicurioId {
    /// One artifact version (`apicurio.value.globalId`).
    Global,
    /// One schema text, shared by identical versions (`apicurio.value.contentId`).
    Content,
}

impl ApicurioId {
    pub fn as_str(self) -> &'static str {
        match self {
            ApicurioId::Global => "global id",
            ApicurioId::Content => "content id",
        }
    }
}

/// How a registry-backed value names its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Framing {
    Confluent,
    /// The id in the last header named `header`; the value is the datum.
    Headers {
        header: String,
        id: ApicurioId,
    },
    /// Magic byte 0, then the id as an 8-byte big-endian long.
    Long {
        id: ApicurioId,
    },
    /// Magic byte 0, then the id as a 4-byte big-endian int
    /// (`Default4ByteIdHandler`, 3.x's default).
    Int {
        id: ApicurioId,
    },
}

/// A schema id and the namespace it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemaKey {
    Confluent(u32),
    Apicurio(ApicurioId, u64),
}

impl std::fmt::Display for SchemaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaKey::Confluent(id) => write!(f, "schema id {id}"),
            SchemaKey::Apicurio(kind, id) => write!(f, "Apicurio {} {id}", kind.as_str()),
        }
    }
}

impl Framing {
    /// The schema key of a value and its datum. A missing id header is
    /// `unknown` (rule `schema-id`): the validator cannot decide; a header
    /// or frame that is not Apicurio's is poison.
    pub(crate) fn split<'a>(
        &self,
        bytes: &'a [u8],
        headers: &[Header<'_>],
    ) -> Result<(SchemaKey, &'a [u8]), Invalid> {
        match self {
            Framing::Confluent => {
                confluent_header(bytes).map(|(id, rest)| (SchemaKey::Confluent(id), rest))
            }
            Framing::Int { id } => confluent_header(bytes)
                .map(|(n, rest)| (SchemaKey::Apicurio(*id, u64::from(n)), rest)),
            Framing::Long { id } => match bytes {
                [0, rest @ ..] if rest.len() >= 8 => {
                    let (head, datum) = rest.split_at(8);
                    let n = u64::from_be_bytes(head.try_into().unwrap_or([0; 8]));
                    Ok((SchemaKey::Apicurio(*id, n), datum))
                }
                [m, ..] if *m != 0 => Err(Invalid::poison(
                    "decode",
                    format!("magic byte is 0x{m:02x}, not 0: not an Apicurio 8-byte framed value"),
                )),
                _ => Err(Invalid::poison(
                    "decode",
                    format!(
                        "value is {} bytes, too short for the 9-byte Apicurio header",
                        bytes.len()
                    ),
                )),
            },
            Framing::Headers { header, id } => {
                let found = headers.iter().rev().find(|h| h.key == header.as_bytes());
                match found.map(|h| h.value) {
                    None | Some(None) => Err(Invalid {
                        class: Class::Unknown,
                        rule: "schema-id".into(),
                        reason: format!("no header {header} names the schema"),
                        contract: None,
                    }),
                    Some(Some(v)) => match <[u8; 8]>::try_from(v) {
                        Ok(b) => Ok((SchemaKey::Apicurio(*id, u64::from_be_bytes(b)), bytes)),
                        Err(_) => Err(Invalid::poison(
                            "decode",
                            format!("header {header} is {} bytes, not an 8-byte id", v.len()),
                        )),
                    },
                }
            }
        }
    }
}

/// The `wire` of a format that reads schema files (Avro, Protobuf): `raw`
/// carries no schema id, so `schema_ids` needs `confluent`, and
/// `confluent` needs `schema_ids` (or `registry: true`).
pub(crate) fn check_file_wire(v: &ValueDoc, errs: &mut Vec<At>) -> Wire {
    let wire = v.wire.as_ref().map_or(Wire::Raw, |w| w.v);
    if let Some(w) = v.wire.as_ref().filter(|_| apicurio(wire)) {
        errs.push(at(w, "value.wire: Apicurio's wires need `registry: true`"));
        return Wire::Confluent;
    }
    if wire == Wire::Raw {
        not_for(
            errs,
            &v.schema_ids,
            "value.schema_ids: needs `wire: confluent` (raw values carry no schema id)",
        );
    }
    if wire == Wire::Confluent && v.schema_ids.as_ref().is_none_or(|m| m.v.is_empty()) {
        if let Some(w) = &v.wire {
            errs.push(at(
                w,
                "value.wire: `confluent` needs value.schema_ids (schema id: file) or `registry: true`",
            ));
        }
    }
    wire
}

/// Whether `wire` is one of Apicurio's own.
pub(crate) fn apicurio(wire: Wire) -> bool {
    matches!(
        wire,
        Wire::ApicurioHeaders | Wire::Apicurio8Byte | Wire::Apicurio4Byte
    )
}

/// Split a Confluent-framed value into its schema id and payload.
pub(crate) fn confluent_header(bytes: &[u8]) -> Result<(u32, &[u8]), Invalid> {
    match bytes {
        [0, a, b, c, d, rest @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        [m, ..] if *m != 0 => Err(Invalid::poison(
            "decode",
            format!("magic byte is 0x{m:02x}, not 0: not a schema-registry framed value"),
        )),
        _ => Err(Invalid::poison(
            "decode",
            format!(
                "value is {} bytes, too short for the 5-byte schema-registry header",
                bytes.len()
            ),
        )),
    }
}

/// A schema id the policy does not list: the validator cannot decide.
pub(crate) fn unknown_id(id: u32) -> Invalid {
    Invalid {
        class: Class::Unknown,
        rule: "schema_id".into(),
        reason: format!("schema id {id} is not listed in this policy's schema_ids"),
        contract: None,
    }
}

/// Whether `b` is UTF-8, as `std::str::from_utf8` decides, for text no
/// rule reads: ASCII (most of it) is checked a word at a time, without
/// the validator (which takes `std`'s byte path below 64 bytes).
#[inline(always)]
pub(crate) fn is_utf8(b: &[u8]) -> bool {
    ascii(b) || simdutf8::basic::from_utf8(b).is_ok()
}

/// Whether every byte of `b` is below 0x80: the bytes ORed a word at a
/// time, the last word overlapping the one before (std's `is_ascii`
/// aligns its reads first, which costs more than it saves on the short
/// strings of a record: ~40 instructions for a 12-byte id).
#[inline(always)]
fn ascii(b: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let word = |at: usize| {
        b.get(at..at + 8).map_or(HIGH, |w| {
            u64::from_le_bytes(w.try_into().unwrap_or([0x80; 8]))
        })
    };
    let n = b.len();
    if n < 8 {
        return b.iter().fold(0u8, |a, &c| a | c) < 0x80;
    }
    let mut acc = word(n - 8);
    let mut i = 0;
    while i + 8 <= n {
        acc |= word(i);
        i += 8;
    }
    acc & HIGH == 0
}

/// Varints as the binary decoders read them: which rule a 10th byte follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tenth {
    /// apache-avro: any 10th byte, the bits past 64 dropped.
    Any,
    /// prost: the 10th byte is 0 or 1.
    ZeroOrOne,
}

/// The base-128 varint at `b[*i..]` (at most 10 bytes), with `*i` moved
/// past it; `None` if it is cut off or breaks `tenth`. One byte is read
/// without a call (the caller's loop keeps it inline).
#[inline(always)]
pub(crate) fn varint_at(b: &[u8], i: &mut usize, tenth: Tenth) -> Option<u64> {
    match b.get(*i) {
        Some(&byte) if byte < 0x80 => {
            *i += 1;
            Some(u64::from(byte))
        }
        _ => long_varint_at(b, i, tenth),
    }
}

// Inlined: a call cost the Avro reader ~13 instructions per record
// (judge-cost --filter avro; timestamps take this path).
#[inline(always)]
fn long_varint_at(b: &[u8], i: &mut usize, tenth: Tenth) -> Option<u64> {
    // Up to eight bytes from one word where eight are there (timestamps
    // in milliseconds take six): the first byte without its high bit ends
    // the varint, and its 7-bit groups are packed by halving shifts.
    if let Some(w) = b.get(*i..*i + 8) {
        let word = u64::from_le_bytes(w.try_into().unwrap_or([0xff; 8]));
        let ends = !word & 0x8080_8080_8080_8080;
        if ends != 0 {
            let n = ends.trailing_zeros() as usize / 8 + 1;
            let x = (word & (u64::MAX >> (64 - 8 * n))) & 0x7f7f_7f7f_7f7f_7f7f;
            let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
            let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
            let x = (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4);
            *i += n;
            return Some(x);
        }
    }
    bytewise_varint_at(b, i, tenth)
}

/// [`long_varint_at`] a byte at a time: near the end of `b`, and for the
/// ninth and tenth bytes.
fn bytewise_varint_at(b: &[u8], i: &mut usize, tenth: Tenth) -> Option<u64> {
    let mut v = 0u64;
    for j in 0..10 {
        let byte = *b.get(*i)?;
        *i += 1;
        if j == 9 && tenth == Tenth::ZeroOrOne && byte > 1 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << (j * 7);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Read a zigzag varint (Confluent Protobuf message indexes).
pub(crate) fn read_zigzag(buf: &mut &[u8]) -> Option<i64> {
    let mut n: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(((n >> 1) as i64) ^ -((n & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header() {
        assert_eq!(
            confluent_header(&[0, 0, 0, 1, 2, 9]).unwrap(),
            (258, &[9u8][..])
        );
        assert_eq!(
            confluent_header(&[1, 0, 0, 0, 1]).unwrap_err().class,
            Class::Poison
        );
        assert_eq!(confluent_header(&[0, 0]).unwrap_err().rule, "decode");
    }

    #[test]
    fn is_utf8_is_what_std_accepts() {
        let cases: [&[u8]; 7] = [
            b"",
            b"device-0042",
            "gr\u{fc}n \u{1f600}".as_bytes(),
            b"\xff",
            b"ab\xc3",
            b"\xed\xa0\x80",
            b"plain ascii, then \xe2\x82",
        ];
        for b in cases {
            assert_eq!(is_utf8(b), std::str::from_utf8(b).is_ok(), "{b:?}");
        }
    }

    #[test]
    fn varints_follow_their_tenth_byte_rule() {
        let at = |b: &[u8], tenth| {
            let mut i = 0;
            varint_at(b, &mut i, tenth).map(|v| (v, i))
        };
        assert_eq!(at(&[0x05, 0xff], Tenth::Any), Some((5, 1)));
        assert_eq!(at(&[0xac, 0x02], Tenth::ZeroOrOne), Some((300, 2)));
        assert_eq!(at(&[0x80, 0x80], Tenth::Any), None);
        let mut ten = [0xff; 10];
        ten[9] = 0x01;
        assert_eq!(at(&ten, Tenth::ZeroOrOne), Some((u64::MAX, 10)));
        ten[9] = 0x03;
        assert_eq!(at(&ten, Tenth::ZeroOrOne), None);
        assert_eq!(at(&ten, Tenth::Any), Some((u64::MAX, 10)));
        assert_eq!(at(&[0xff; 11], Tenth::Any), None);
    }

    #[test]
    fn zigzag() {
        let mut b: &[u8] = &[0x00, 0x02, 0x01, 0x04];
        assert_eq!(read_zigzag(&mut b), Some(0));
        assert_eq!(read_zigzag(&mut b), Some(1));
        assert_eq!(read_zigzag(&mut b), Some(-1));
        assert_eq!(read_zigzag(&mut b), Some(2));
        assert_eq!(read_zigzag(&mut b), None);
    }

    /// The word-at-a-time varint reads what the byte-at-a-time one reads,
    /// for every length from 1 to 11 bytes, at every position near the
    /// end of the input, under both tenth-byte rules.
    #[test]
    fn word_varints_are_bytewise_varints() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let len = (next() % 12) as usize + 1;
            let cont = (next() % 12) as usize; // bytes with the high bit set first
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            for (k, byte) in b.iter_mut().enumerate() {
                if k < cont {
                    *byte |= 0x80;
                } else {
                    *byte &= 0x7f;
                }
            }
            for start in 0..len {
                for tenth in [Tenth::Any, Tenth::ZeroOrOne] {
                    let (mut i, mut j) = (start, start);
                    let fast = long_varint_at(&b, &mut i, tenth);
                    let slow = bytewise_varint_at(&b, &mut j, tenth);
                    assert_eq!((fast, i), (slow, j), "{b:02x?} from {start}");
                }
            }
        }
    }

    #[test]
    fn ascii_is_every_byte_below_0x80() {
        for len in 0..40 {
            let plain = vec![b'a'; len];
            assert!(ascii(&plain));
            for at in 0..len {
                let mut b = plain.clone();
                b[at] = 0x80 | (at as u8);
                assert!(!ascii(&b), "{len} {at}");
            }
        }
    }
}
