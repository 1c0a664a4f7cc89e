//! The bounds-checked reader of Kafka protocol bytes: big-endian integers,
//! unsigned varints (request headers, tagged fields) and byte ranges.
//! Every read returns `None` at the end of its window instead of
//! panicking, and leaves the position unchanged when it fails. The proxy's
//! request and response peeks read through it; a batch's records are read
//! by `batch`'s own index over plain slices (`kafka/varint.rs`), which is
//! on the hot path.

use std::ops::Range;

use crate::kafka::varint::read_uvarint;

/// A position in `buf[..end]`.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over all of `buf`, starting at `pos`.
    pub fn new(buf: &'a [u8], pos: usize) -> Self {
        Cursor {
            buf,
            pos,
            end: buf.len(),
        }
    }

    /// A cursor over `buf[window]` only (reads past `window.end` fail).
    pub fn within(buf: &'a [u8], window: Range<usize>) -> Self {
        Cursor {
            buf,
            pos: window.start,
            end: window.end.min(buf.len()),
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Whether the window is read to its end.
    pub fn at_end(&self) -> bool {
        self.pos >= self.end
    }

    /// Bytes left in the window.
    pub fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    /// The range of the next `n` bytes, consumed.
    pub fn take(&mut self, n: usize) -> Option<Range<usize>> {
        if n > self.remaining() {
            return None;
        }
        let r = self.pos..self.pos + n;
        self.pos += n;
        Some(r)
    }

    /// The next `n` bytes, consumed.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let r = self.take(n)?;
        self.buf.get(r)
    }

    pub fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    pub fn i8(&mut self) -> Option<i8> {
        self.array().map(i8::from_be_bytes)
    }

    pub fn i16(&mut self) -> Option<i16> {
        self.array().map(i16::from_be_bytes)
    }

    pub fn i32(&mut self) -> Option<i32> {
        self.array().map(i32::from_be_bytes)
    }

    pub fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_be_bytes)
    }

    /// An unsigned varint (at most 5 bytes), as in flexible-version headers.
    pub fn uvarint(&mut self) -> Option<u32> {
        self.with_window(read_uvarint)
    }

    fn with_window<T>(&mut self, read: fn(&[u8], &mut usize) -> Option<T>) -> Option<T> {
        let mut p = self.pos;
        let v = read(self.buf.get(..self.end)?, &mut p)?;
        self.pos = p;
        Some(v)
    }

    /// Skip a nullable string: i16 length, or compact (uvarint length + 1).
    pub fn skip_nullable_string(&mut self, compact: bool) -> Option<()> {
        let len = if compact {
            i64::from(self.uvarint()?) - 1
        } else {
            i64::from(self.i16()?)
        };
        if len > 0 {
            self.skip(len as usize)?;
        }
        Some(())
    }

    /// Skip a tagged-fields section (flexible versions).
    pub fn skip_tagged_fields(&mut self) -> Option<()> {
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(size as usize)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fail_at_the_window_end_and_leave_the_position() {
        let buf = [0, 1, 0, 0, 0, 2, 0xff];
        let mut c = Cursor::within(&buf, 0..6);
        assert_eq!(c.i16(), Some(1));
        assert_eq!(c.i32(), Some(2));
        assert!(c.at_end());
        assert_eq!(c.i8(), None);
        assert_eq!(c.pos(), 6);
        let mut c = Cursor::new(&buf, 6);
        assert_eq!(c.i16(), None);
        assert_eq!(c.pos(), 6);
    }

    #[test]
    fn never_panics_on_any_short_input() {
        for len in 0..12 {
            let buf = vec![0xffu8; len];
            let mut c = Cursor::new(&buf, 0);
            assert!(c.uvarint().is_none() || len >= 5);
            let mut c = Cursor::new(&buf, len + 3);
            assert_eq!(c.i8(), None);
            assert_eq!(c.skip_tagged_fields(), None);
            assert_eq!(c.skip_nullable_string(true), None);
        }
    }
}
