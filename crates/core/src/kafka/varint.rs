//! Kafka's zig-zag varints (`varint` for i32, `varlong` for i64), as used
//! inside v2 records.
//!
//! Owned here so that record parsing (`batch`) and record writing (`builder`)
//! agree on one bounded, non-panicking implementation: a read never looks past
//! the slice, never reads more than 5 (varint) or 10 (varlong) bytes, and
//! reports truncation or over-long encodings as `None`.

/// Read a zig-zag varint (at most 5 bytes) from `buf` at `*pos`, advancing
/// `*pos`. Like Java's `ByteUtils.readVarint`, bits above 32 are ignored.
/// Returns `None` if the input ends early or the encoding is longer than 5 bytes.
#[inline]
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i32> {
    let raw = read_short(buf, pos, 5)?;
    let raw = raw as u32;
    Some(((raw >> 1) as i32) ^ -((raw & 1) as i32))
}

/// Read a zig-zag varlong (at most 10 bytes) from `buf` at `*pos`, advancing `*pos`.
#[inline]
pub fn read_varlong(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let raw = read_short(buf, pos, 10)?;
    Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

/// Read an unsigned varint (at most 5 bytes), as used in flexible-version
/// request headers and tagged fields; bits above 32 are ignored.
pub fn read_uvarint(buf: &[u8], pos: &mut usize) -> Option<u32> {
    read_unsigned(buf, pos, 5).map(|v| v as u32)
}

/// One or two bytes inline (most record fields: deltas, lengths under
/// 8 KiB, header counts), longer encodings out of line.
#[inline(always)]
fn read_short(buf: &[u8], pos: &mut usize, max_bytes: usize) -> Option<u64> {
    let p = *pos;
    if let Some(&b0) = buf.get(p) {
        if b0 < 0x80 {
            *pos = p + 1;
            return Some(u64::from(b0));
        }
        if let Some(&b1) = buf.get(p + 1) {
            if b1 < 0x80 {
                *pos = p + 2;
                return Some(u64::from(b0 & 0x7f) | u64::from(b1) << 7);
            }
        }
    }
    read_unsigned(buf, pos, max_bytes)
}

fn read_unsigned(buf: &[u8], pos: &mut usize, max_bytes: usize) -> Option<u64> {
    let mut value: u64 = 0;
    let mut at = *pos;
    for i in 0..max_bytes {
        let b = *buf.get(at)?;
        at += 1;
        let shift = 7 * i as u32;
        if shift < 64 {
            value |= u64::from(b & 0x7f) << shift;
        }
        if b & 0x80 == 0 {
            *pos = at;
            return Some(value);
        }
    }
    None
}

/// Append a zig-zag varint.
pub fn write_varint(out: &mut Vec<u8>, v: i32) {
    write_unsigned(out, u64::from(((v << 1) ^ (v >> 31)) as u32));
}

/// Append a zig-zag varlong.
pub fn write_varlong(out: &mut Vec<u8>, v: i64) {
    write_unsigned(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Number of bytes `write_varint(v)` appends.
pub fn varint_len(v: i32) -> usize {
    unsigned_len(u64::from(((v << 1) ^ (v >> 31)) as u32))
}

/// Number of bytes `write_varlong(v)` appends.
pub fn varlong_len(v: i64) -> usize {
    unsigned_len(((v << 1) ^ (v >> 63)) as u64)
}

fn write_unsigned(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn unsigned_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings() {
        let cases: &[(i32, &[u8])] = &[
            (0, &[0x00]),
            (-1, &[0x01]),
            (1, &[0x02]),
            (63, &[0x7e]),
            (-64, &[0x7f]),
            (64, &[0x80, 0x01]),
            (i32::MAX, &[0xfe, 0xff, 0xff, 0xff, 0x0f]),
            (i32::MIN, &[0xff, 0xff, 0xff, 0xff, 0x0f]),
        ];
        for (v, enc) in cases {
            let mut out = Vec::new();
            write_varint(&mut out, *v);
            assert_eq!(&out[..], *enc, "{v}");
            assert_eq!(varint_len(*v), enc.len());
            let mut pos = 0;
            assert_eq!(read_varint(enc, &mut pos), Some(*v));
            assert_eq!(pos, enc.len());
        }
    }

    #[test]
    fn truncated_and_overlong_are_errors() {
        let mut pos = 0;
        assert_eq!(read_varint(&[0x80, 0x80], &mut pos), None);
        assert_eq!(pos, 0);
        assert_eq!(read_varint(&[0x80; 6], &mut pos), None);
        assert_eq!(read_varlong(&[0xff; 11], &mut pos), None);
        assert_eq!(read_varint(&[], &mut pos), None);
    }

    proptest! {
        #[test]
        fn varint_round_trip(v: i32) {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            prop_assert_eq!(out.len(), varint_len(v));
            let mut pos = 0;
            prop_assert_eq!(read_varint(&out, &mut pos), Some(v));
            prop_assert_eq!(pos, out.len());
        }

        #[test]
        fn varlong_round_trip(v: i64) {
            let mut out = Vec::new();
            write_varlong(&mut out, v);
            prop_assert_eq!(out.len(), varlong_len(v));
            let mut pos = 0;
            prop_assert_eq!(read_varlong(&out, &mut pos), Some(v));
            prop_assert_eq!(pos, out.len());
        }

        #[test]
        fn varint_never_panics(data: Vec<u8>, start in 0usize..16) {
            // Some(v): the cursor moved just past the first byte without its
            // continuation bit, within the width; None: the cursor did not
            // move, and no such byte is within the width.
            let mut p32 = start;
            let v32 = read_varint(&data, &mut p32).map(i64::from);
            let mut p64 = start;
            let v64 = read_varlong(&data, &mut p64);
            for (width, value, pos) in [(5usize, v32, p32), (10, v64, p64)] {
                let end = data
                    .iter()
                    .enumerate()
                    .skip(start)
                    .take(width)
                    .find(|(_, b)| **b & 0x80 == 0)
                    .map(|(i, _)| i + 1);
                match value {
                    Some(_) => prop_assert_eq!(Some(pos), end),
                    None => {
                        prop_assert_eq!(pos, start);
                        prop_assert_eq!(end, None);
                    }
                }
            }
        }
    }
}
