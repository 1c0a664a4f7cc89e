//! The flat reader: most records are one object of scalars whose keys come
//! in the same order every time. For them, once the root's layout is
//! learned (`layout.rs`), [`Flat::read`] reads the raw bytes in one pass:
//! `{`, then each member's bytes as compared with the remembered ones and
//! its value, then `,` or `}`. No recursion, no trie or schema lookups per
//! member (each member carries its own schema node, compiled once per
//! plan), and no UTF-8 check of the whole document: every byte outside a
//! string is compared with ASCII or with the remembered key bytes, and a
//! string is accepted only if it is ASCII, so an accepted document is ASCII
//! (and valid UTF-8) by construction. Numbers are read by the scanner's
//! reader (`scan.rs`), and values are checked and captured as the scanner
//! does, so the outcome is the scanner's; anything else
//! (a member out of order or spaced differently, an object or array value,
//! a key the layout does not have, a string with an escape or a byte above
//! 0x7f) gives up, and the caller reads the document from its start as
//! before.

use super::layout::Layout;
use super::scan::{captured, number, special, word_at};
use super::{Captured, Captures, Plan};
use crate::policy::shape::{same_bytes, Seen, ShapeNode};

/// A plan's flat members, in layout order.
#[derive(Debug)]
pub(in crate::policy::json) struct Flat {
    members: Box<[Member]>,
    /// The root schema's required-property bits (0 without a schema).
    required: u64,
}

#[derive(Debug)]
pub(super) struct Member {
    /// `"key":`, exactly as the layout remembered it.
    text: Box<[u8]>,
    /// Where the value is captured, if a rule reads it.
    slot: Option<usize>,
    /// The value's schema, if the schema has one (a copy, so that
    /// reading needs no lookup).
    shape: Option<ShapeNode>,
    /// The member's required-property bit under the root schema (0 if not
    /// required).
    bit: u64,
}

impl Flat {
    /// `None` when the layout is not one of plain members the flat reader
    /// can take: the root is wanted whole, a rule reads below a member, or
    /// a member is remembered twice.
    pub(super) fn build(plan: &Plan, layout: &Layout) -> Option<Flat> {
        let all = plan.shape.as_ref();
        let shape = all.map(|s| s.root());
        if !layout.fits(shape)
            || plan.nodes.first()?.slot.is_some()
            || shape.is_some_and(|s| !s.open_object())
        {
            return None;
        }
        let mut members: Vec<Member> = Vec::new();
        for (text, entry) in layout.members() {
            let slot = match entry.child {
                None => None,
                Some(n) => {
                    let node = plan.nodes.get(n)?;
                    if !node.children.is_empty() {
                        return None;
                    }
                    node.slot
                }
            };
            if members.iter().any(|m| *m.text == *text) {
                return None;
            }
            members.push(Member {
                text: text.into(),
                slot,
                shape: entry.schema.sub.and_then(|i| all?.get(i)).cloned(),
                bit: entry.schema.bit,
            });
        }
        Some(Flat {
            members: members.into_boxed_slice(),
            required: shape.map_or(0, ShapeNode::required),
        })
    }

    /// The member whose bytes start `b[i..]`, if it is the `k`th or the
    /// one after it (an optional member left out): the member, where its
    /// bytes end, and the member to try next.
    #[inline]
    fn member_at(&self, k: usize, b: &[u8], i: usize) -> Option<(&Member, usize, usize)> {
        let rest = b.get(i..)?;
        for k in [k, k + 1] {
            let m = self.members.get(k)?;
            let n = m.text.len();
            if rest.len() >= n && same_bytes(&rest[..n], &m.text) {
                return Some((m, i + n, k + 1));
            }
        }
        None
    }
}

impl Flat {
    /// Whether `b` is one object of these members in their order (an
    /// optional one may be left out), every value a scalar, that surely
    /// meets the schema; its captures are then in `caps` (fresh from
    /// `Captures::new`, left partly filled when it is not). The caller
    /// checks that the depth limit allows an object.
    pub(super) fn read<'de>(&self, b: &'de [u8], caps: &mut Captures<'de>) -> bool {
        self.members(b, caps).is_some()
    }

    fn members<'de>(&self, b: &'de [u8], caps: &mut Captures<'de>) -> Option<()> {
        let mut i = ws(b, 0);
        if *b.get(i)? != b'{' {
            return None;
        }
        i += 1;
        let (mut next, mut seen) = (0usize, 0u64);
        loop {
            let (m, end, k) = self.member_at(next, b, i)?;
            let first;
            ((first, i), next) = (token(b, end)?, k);
            let value = match first {
                b'"' => {
                    let (s, end) = ascii_string(b, i + 1)?;
                    i = end;
                    if m.shape.as_ref().is_some_and(|sh| !sh.ascii_string(s)) {
                        return None;
                    }
                    if let Some(slot) = m.slot {
                        // ASCII, so this cannot fail.
                        caps.set(slot, Captured::Str(std::str::from_utf8(s).ok()?));
                    }
                    seen |= m.bit;
                    None
                }
                b't' => Some(literal(b, &mut i, b"true", Seen::Bool(true))?),
                b'f' => Some(literal(b, &mut i, b"false", Seen::Bool(false))?),
                b'n' => Some(literal(b, &mut i, b"null", Seen::Null)?),
                _ => {
                    let (v, end) = number(b, i)?;
                    i = end;
                    Some(v)
                }
            };
            if let Some(v) = value {
                if m.shape.as_ref().is_some_and(|sh| !sh.scalar(v)) {
                    return None;
                }
                if let Some(slot) = m.slot {
                    caps.set(slot, captured(v));
                }
                seen |= m.bit;
            }
            let sep;
            (sep, i) = token(b, i)?;
            match sep {
                b',' => i += 1,
                b'}' => break,
                _ => return None,
            }
        }
        (ws(b, i + 1) == b.len() && seen & self.required == self.required).then_some(())
    }
}

/// The first byte from `i` on that is not JSON whitespace, and where it
/// is. Most records have none between tokens: one comparison then.
#[inline(always)]
fn token(b: &[u8], i: usize) -> Option<(u8, usize)> {
    match *b.get(i)? {
        c if c > b' ' => Some((c, i)),
        _ => {
            let i = ws(b, i);
            Some((*b.get(i)?, i))
        }
    }
}

/// Past JSON whitespace from `i`.
#[inline(always)]
fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// `word` at `b[*i..]`, read as `v`.
#[inline]
fn literal(b: &[u8], i: &mut usize, word: &[u8], v: Seen<'static>) -> Option<Seen<'static>> {
    let end = *i + word.len();
    (b.get(*i..end)? == word).then(|| {
        *i = end;
        v
    })
}

/// A string of ASCII without escapes or control characters, after its
/// opening quote at `start - 1`: its bytes and where it ends (past its
/// closing quote); `None` for any other string.
#[inline(always)]
fn ascii_string(b: &[u8], start: usize) -> Option<(&[u8], usize)> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = start;
    // Eight bytes at a time to the first quote, backslash, control
    // character or byte above 0x7f (exact: `special` flags no byte below
    // the first special one, and high bits are each their own byte's).
    while let Some(w) = word_at(b, i) {
        let m = special(w) | (w & HIGH);
        if m != 0 {
            i += (m.trailing_zeros() / 8) as usize;
            return (b[i] == b'"').then(|| (&b[start..i], i + 1));
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' {
            return Some((&b[start..i], i + 1));
        }
        if c == b'\\' || !(0x20..0x80).contains(&c) {
            return None;
        }
        i += 1;
    }
    None
}
