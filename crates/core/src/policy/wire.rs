//! Schema-registry wire framing shared by Avro and Protobuf values:
//! `raw` (the datum alone) or `confluent` (magic byte 0, then a 4-byte
//! big-endian schema id, then the datum; Protobuf adds message indexes).

use super::{Class, Invalid};

/// How a value's bytes are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Wire {
    #[default]
    Raw,
    Confluent,
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
    }
}

/// Whether `b` is UTF-8, as `std::str::from_utf8` decides, for text no
/// rule reads: ASCII (most of it) is checked a word at a time, without
/// the validator (which takes `std`'s byte path below 64 bytes).
#[inline]
pub(crate) fn is_utf8(b: &[u8]) -> bool {
    b.is_ascii() || simdutf8::basic::from_utf8(b).is_ok()
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

fn long_varint_at(b: &[u8], i: &mut usize, tenth: Tenth) -> Option<u64> {
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
}
