//! Member layouts learned from scanned documents: the producers of a topic
//! write the same keys in the same order, so the scanner remembers, per
//! object of the rules' trie, the members of the first such object it read
//! in full, each as the exact bytes from after `{` or `,` through the `:`
//! (`"device_id":`). An object member whose bytes start with the remembered
//! ones is that member: no key scan, no key search in the trie or the
//! schema. Speculating on field positions from earlier records is how Mison
//! (Li et al., VLDB 2017) skips most of a JSON document's parsing.
//!
//! A match is exact bytes, and the remembered bytes were read by the
//! scanner as whitespace, a plain key (no escape), whitespace and a colon,
//! so the same bytes are the same tokens wherever they appear; what the
//! entry says (trie child, schema member) was looked up for that key under
//! the same schema node (checked on use), so the entry also keeps what that
//! schema node says of the key. A mismatch costs a comparison and
//! the member is read as before. A layout is learned once per trie node and
//! never replaced, so a mix of producers keeps the first one's layout.

use crate::policy::shape::{same_bytes, ShapeNode};

/// Members at most remembered per object, and the longest member bytes
/// remembered (a longer key is read as before).
const MAX_MEMBERS: usize = 64;
const MAX_BYTES: usize = 256;

/// The remembered members of an object, in document order.
#[derive(Debug)]
pub(super) struct Layout {
    /// Every member's bytes, back to back.
    bytes: Box<[u8]>,
    members: Box<[Entry]>,
    /// The schema node the members were looked up under (its address), or
    /// 0 without one.
    shape: usize,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    start: u32,
    len: u32,
    /// The trie node below this key, if the rules read below it.
    pub(super) child: Option<usize>,
    /// What the schema node says of this key, looked up once: its
    /// required-property bit and where the schema of its value is.
    pub(super) schema: MemberSchema,
}

/// A key's required-property bit (0 if not required) and the index of the
/// schema node for its value (`Shape::member_slot`), under the schema node
/// a layout was learned under.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct MemberSchema {
    pub(super) bit: u64,
    pub(super) sub: Option<usize>,
}

/// The members of one object as they are read, for a layout.
#[derive(Default)]
pub(super) struct Learning {
    bytes: Vec<u8>,
    members: Vec<Entry>,
}

fn shape_id(shape: Option<&ShapeNode>) -> usize {
    shape.map_or(0, |s| s as *const ShapeNode as usize)
}

impl Layout {
    /// Whether this layout was learned under `shape`.
    #[inline]
    pub(super) fn fits(&self, shape: Option<&ShapeNode>) -> bool {
        self.shape == shape_id(shape)
    }

    /// The member at `b[i..]`, if it is the `k`th remembered member or
    /// the one after it (an optional member left out): its entry, where
    /// its bytes end, and the position to try next.
    #[inline]
    pub(super) fn member_at(&self, k: usize, b: &[u8], i: usize) -> Option<(Entry, usize, usize)> {
        let rest = b.get(i..)?;
        for k in [k, k + 1] {
            let e = *self.members.get(k)?;
            let len = e.len as usize;
            let want = &self.bytes[e.start as usize..][..len];
            if rest.len() >= len && same_bytes(&rest[..len], want) {
                return Some((e, i + len, k + 1));
            }
        }
        None
    }
}

impl Layout {
    /// Every remembered member, in document order: its bytes and entry.
    pub(super) fn members(&self) -> impl Iterator<Item = (&[u8], Entry)> + '_ {
        self.members
            .iter()
            .map(|e| (&self.bytes[e.start as usize..][..e.len as usize], *e))
    }
}

impl Learning {
    /// A member read in full: its bytes, trie child and what the schema
    /// says of it.
    pub(super) fn push(&mut self, text: &[u8], child: Option<usize>, schema: MemberSchema) {
        if self.members.len() < MAX_MEMBERS && text.len() <= MAX_BYTES {
            self.members.push(Entry {
                start: self.bytes.len() as u32,
                len: text.len() as u32,
                child,
                schema,
            });
            self.bytes.extend_from_slice(text);
        }
    }

    pub(super) fn finish(self, shape: Option<&ShapeNode>) -> Layout {
        Layout {
            bytes: self.bytes.into_boxed_slice(),
            members: self.members.into_boxed_slice(),
            shape: shape_id(shape),
        }
    }
}
