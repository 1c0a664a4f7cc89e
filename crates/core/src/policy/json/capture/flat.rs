//! The flat reader: most records are one object of scalars whose keys come
//! in the same order every time. For them, once the root's layout is
//! learned (`layout.rs`), [`Flat::read`] reads the raw bytes in one pass:
//! `{`, then each member's bytes as compared with the remembered ones and
//! its value, then `,` or `}`. No recursion, no trie or schema lookups per
//! member (each member carries its own schema node, compiled once per
//! plan), and no UTF-8 check of the whole document: every byte outside a
//! string is compared with ASCII or with the remembered (UTF-8) key bytes,
//! and a string is either ASCII, seen while looking for its end, or checked
//! to be UTF-8 on its own, so an accepted document is UTF-8 by
//! construction. Numbers are read by the scanner's reader (`scan.rs`), and
//! values are checked and captured as the scanner does, so the outcome is
//! the scanner's; anything else (a member out of order or spaced
//! differently, an object or array value, a key the layout does not have, a
//! string with an escape or that is not UTF-8) gives up, and the caller
//! reads the document from its start as before.

mod template;

use super::layout::Layout;
use super::scan::{captured, literal, number, ws};
use super::strings::plain_string;
use super::{Captured, Captures, Plan};
use crate::policy::shape::{same_bytes, AsciiCheck, NumberCheck, Seen, ShapeNode};

/// A plan's flat members, in layout order.
#[derive(Debug)]
pub(in crate::policy::json) struct Flat {
    members: Box<[Member]>,
    /// The root schema's required-property bits (0 without a schema).
    required: u64,
    /// The members as a template, tried first (`None` when a member's
    /// bytes are too long for one).
    template: Option<template::Template>,
}

#[derive(Debug, Clone)]
pub(super) struct Member {
    /// `"key":`, exactly as the layout remembered it.
    text: Box<[u8]>,
    /// Where the value is captured, if a rule reads it.
    slot: Option<usize>,
    /// The value's schema, if the schema has one (a copy, so that
    /// reading needs no lookup).
    shape: Option<ShapeNode>,
    /// What `shape` checks of an ASCII string (`Any` without a schema).
    ascii: AsciiCheck,
    /// What `shape` checks of a number (any number without a schema).
    number: NumberCheck,
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
            let shape: Option<ShapeNode> = entry.schema.sub.and_then(|i| all?.get(i)).cloned();
            members.push(Member {
                text: text.into(),
                slot,
                ascii: shape
                    .as_ref()
                    .map_or(AsciiCheck::Any, ShapeNode::ascii_check),
                number: shape
                    .as_ref()
                    .map_or_else(NumberCheck::default, ShapeNode::number_check),
                shape,
                bit: entry.schema.bit,
            });
        }
        let required = shape.map_or(0, ShapeNode::required);
        Some(Flat {
            template: template::Template::build(&members, required),
            members: members.into_boxed_slice(),
            required,
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
    /// checks that the depth limit allows an object. The template reads
    /// first; where it stops, the member loop goes on. Inlined into its
    /// one caller (`fast_flat`), whatever else grows around it: out of line
    /// it cost ~33 instructions more per record (`exchange_cost.py`).
    #[inline(always)]
    pub(super) fn read<'de>(&self, b: &'de [u8], caps: &mut Captures<'de>) -> bool {
        if let Some(t) = &self.template {
            match t.read(b, caps.slots_mut()) {
                Ok(()) => return true,
                // The members the template read stand (the loop reads
                // them the same way): it goes on from the one it missed.
                Err(stop) if stop.next > 0 => {
                    return self.members_from(b, caps.slots_mut(), stop).is_some()
                }
                // Nothing read: from the start.
                Err(_) => {}
            }
        }
        self.members(b, caps).is_some()
    }

    /// The template, and the member loop going on from where the
    /// template stopped, decide `b` as the member loop alone does, with
    /// the same captures (`Err` naming both otherwise); whether the
    /// template alone read it.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn template_agrees(&self, b: &[u8], slots: usize) -> Result<bool, String> {
        let Some(t) = &self.template else {
            return Ok(false);
        };
        let mut read = Captures::new(slots);
        let accepted = self.read(b, &mut read);
        let mut looped = Captures::new(slots);
        let alone = self.members(b, &mut looped).is_some();
        if accepted != alone || (accepted && read != looped) {
            return Err(format!(
                "template and loop {accepted} {read:?}, loop alone {alone} {looped:?}"
            ));
        }
        Ok(t.read(b, Captures::new(slots).slots_mut()).is_ok())
    }

    fn members<'de>(&self, b: &'de [u8], caps: &mut Captures<'de>) -> Option<()> {
        let i = ws(b, 0);
        if *b.get(i)? != b'{' {
            return None;
        }
        let start = Stop {
            at: i + 1,
            next: 0,
            seen: 0,
        };
        self.members_from(b, caps.slots_mut(), start)
    }

    /// The member loop from `stop`: after the `{` (no member read yet) or
    /// after the value of the member before `stop.next`.
    fn members_from<'de>(
        &self,
        b: &'de [u8],
        slots: &mut [Captured<'de>],
        stop: Stop,
    ) -> Option<()> {
        let Stop {
            at: mut i,
            mut next,
            mut seen,
        } = stop;
        loop {
            if next > 0 {
                let sep;
                (sep, i) = token(b, i)?;
                match sep {
                    b',' => i += 1,
                    b'}' => break,
                    _ => return None,
                }
            }
            let (m, end, k) = self.member_at(next, b, i)?;
            let first;
            ((first, i), next) = (token(b, end)?, k);
            i = m.value(b, i, first, slots)?;
            seen |= m.bit;
        }
        (ws(b, i + 1) == b.len() && seen & self.required == self.required).then_some(())
    }
}

/// Where a read of an object's members stands: at byte `at`, the members
/// before `next` read (none: just after the `{`), `seen` their required
/// bits. The template returns it when it stops, for the loop to go on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stop {
    at: usize,
    next: usize,
    seen: u64,
}

impl Member {
    /// The scalar whose first byte `first` is at `b[i]`, checked against
    /// the member's schema and captured: where it ends.
    #[inline(always)]
    fn value<'de>(
        &self,
        b: &'de [u8],
        i: usize,
        first: u8,
        slots: &mut [Captured<'de>],
    ) -> Option<usize> {
        let (v, end) = match first {
            b'"' => return self.string(b, i + 1, slots),
            c @ (b't' | b'f' | b'n') => literal(b, i, c)?,
            _ => number(b, i)?,
        };
        self.scalar(v, slots)?;
        Some(end)
    }

    /// The string after its opening quote at `b[i - 1]`, checked and
    /// captured (an ASCII one as its bytes): where it ends.
    #[inline(always)]
    fn string<'de>(&self, b: &'de [u8], i: usize, slots: &mut [Captured<'de>]) -> Option<usize> {
        let (s, text, end) = plain_string(b, i)?;
        match text {
            None => {
                if !self.ascii.holds(self.shape.as_ref(), s) {
                    return None;
                }
                self.capture(Captured::Ascii(s), slots);
            }
            Some(text) => self.scalar(Seen::Str(text), slots)?,
        }
        Some(end)
    }

    /// A scalar read, checked and captured.
    #[inline(always)]
    fn scalar<'de>(&self, v: Seen<'de>, slots: &mut [Captured<'de>]) -> Option<()> {
        if !self.number.holds(self.shape.as_ref(), v) {
            return None;
        }
        self.capture(captured(v), slots);
        Some(())
    }

    #[inline(always)]
    fn capture<'de>(&self, c: Captured<'de>, slots: &mut [Captured<'de>]) {
        if let Some(slot) = self.slot {
            if let Some(cell) = slots.get_mut(slot) {
                *cell = c;
            }
        }
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
