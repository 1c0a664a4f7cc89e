//! The end of a JSON string: the first quote, backslash or control
//! character after its opening quote, looked for 16 bytes at a time (the
//! `wide` crate's safe vectors: SSE2 on x86-64, NEON on ARM, plain arrays
//! elsewhere), for both readers: the flat reader's strings and the
//! scanner's.

use wide::u8x16;

/// A string without escapes or control characters, after its opening
/// quote at `start - 1`: its bytes, the same as text when they are not all
/// ASCII (checked to be UTF-8 then; `None` when ASCII), and where it ends
/// (past its closing quote). `None` for any other string.
#[inline(always)]
pub(super) fn plain_string(b: &[u8], start: usize) -> Option<(&[u8], Option<&str>, usize)> {
    let (i, ascii) = string_end(b, start)?;
    let s = &b[start..i];
    // Its ends are ASCII quotes, so it is UTF-8 if the document is.
    let text = if ascii {
        None
    } else {
        Some(std::str::from_utf8(s).ok()?)
    };
    Some((s, text, i + 1))
}

/// Where the string after its opening quote at `start - 1` closes (the
/// index of its closing quote), and whether its bytes are all ASCII;
/// `None` for a string with an escape or a control character, or one
/// that `b` ends first.
#[inline(always)]
pub(super) fn string_end(b: &[u8], start: usize) -> Option<(usize, bool)> {
    let (mut i, mut ascii) = (start, true);
    // Sixteen bytes at a time to the first quote, backslash, control
    // character or (until one is seen) byte above 0x7f; the last bytes of
    // a record padded with quotes, which end nothing: a string must close
    // before `b` does.
    loop {
        let rest = b.get(i..)?;
        let block = match rest.first_chunk::<16>() {
            Some(block) => *block,
            None => padded(rest),
        };
        let (special, high) = block_marks(&block);
        let m = special | if ascii { high } else { 0 };
        if m == 0 {
            i += 16;
            continue;
        }
        i += m.trailing_zeros() as usize;
        if *b.get(i)? < 0x80 {
            break;
        }
        ascii = false;
    }
    (b[i] == b'"').then_some((i, ascii))
}

/// The last bytes of a record (fewer than 16) and quotes after them.
#[cold]
fn padded(rest: &[u8]) -> [u8; 16] {
    let mut block = [b'"'; 16];
    block[..rest.len()].copy_from_slice(rest);
    block
}

/// For 16 bytes: a bit per byte (bit k for byte k) that is `"`, `\\` or
/// below 0x20, and a bit per byte above 0x7f.
#[inline(always)]
fn block_marks(block: &[u8; 16]) -> (u32, u32) {
    let v = u8x16::new(*block);
    let quote = v.simd_eq(u8x16::splat(b'"'));
    let backslash = v.simd_eq(u8x16::splat(b'\\'));
    // Bytes 0..=0x1f saturate to 0.
    let control = v.saturating_sub(u8x16::splat(0x1f)).simd_eq(u8x16::ZERO);
    ((quote | backslash | control).to_bitmask(), v.to_bitmask())
}

#[cfg(test)]
mod tests {
    use super::plain_string;

    /// Every special byte at every position of a string up to 40 bytes
    /// long, followed by more bytes or not: the same end, bytes and text
    /// as reading one byte at a time and checking the string as UTF-8.
    #[test]
    fn plain_string_is_what_one_byte_at_a_time_reads() {
        let naive = |b: &[u8], start: usize| -> Option<(Vec<u8>, Option<String>, usize)> {
            let mut i = start;
            loop {
                match *b.get(i)? {
                    b'"' => break,
                    b'\\' | 0..0x20 => return None,
                    _ => i += 1,
                }
            }
            let s = &b[start..i];
            let text = match std::str::from_utf8(s) {
                Ok(t) if t.is_ascii() => None,
                Ok(t) => Some(t.to_string()),
                Err(_) => return None,
            };
            Some((s.to_vec(), text, i + 1))
        };
        let specials: [&[u8]; 9] = [
            b"\"",
            b"\\",
            b"\x01",
            b"\x1f",
            b"\x7f",
            "é".as_bytes(),
            "\u{10348}".as_bytes(),
            b"\xff",
            b"\xc3",
        ];
        for n in 0..40 {
            for special in specials {
                for at in 0..=n {
                    for after in [
                        &b"\",\"x\":12345678901234567890}"[..],
                        "\"é\"".as_bytes(),
                        b"\"",
                        b"",
                    ] {
                        let mut b = b"\"".to_vec();
                        b.extend((0..at).map(|j| b'a' + (j % 26) as u8));
                        b.extend_from_slice(special);
                        b.extend((at..n).map(|j| b'A' + (j % 26) as u8));
                        b.extend_from_slice(after);
                        let got = plain_string(&b, 1)
                            .map(|(s, t, end)| (s.to_vec(), t.map(str::to_string), end));
                        assert_eq!(got, naive(&b, 1), "{:?}", String::from_utf8_lossy(&b));
                    }
                }
            }
        }
    }
}
