//! The members of a flat record, compiled once per plan from the root
//! object's learned layout (`layout.rs`): per member, its bytes from after
//! `{` or `,` through the colon, where its value is captured, its value's
//! schema and its required-property bit.
//!
//! Most records are one object of scalars whose keys come in the same
//! order every time. For them the scanner's `flat` reads `{`, then each
//! member's bytes as compared with these and its value with the scanner's
//! own string, number and literal readers, then `,` or `}`: no recursion,
//! no trie or schema lookups per member. Values, captures and schema
//! checks are the scanner's own, so the outcome is the scanner's; anything
//! else (a member out of order or spaced differently, an object or array
//! value, a key the layout does not have) gives up, and the scanner reads
//! the document from its start as before.

use super::layout::Layout;
use super::Plan;
use crate::policy::shape::same_bytes;

/// A plan's flat members, in layout order.
#[derive(Debug)]
pub(in crate::policy::json) struct Flat {
    members: Box<[Member]>,
}

#[derive(Debug)]
pub(super) struct Member {
    /// `"key":`, exactly as the layout remembered it.
    text: Box<[u8]>,
    /// Where the value is captured, if a rule reads it.
    pub(super) slot: Option<usize>,
    /// The value's schema node (`Shape::get`), if the schema has one.
    pub(super) shape: Option<usize>,
    /// The member's required-property bit under the root schema (0 if not
    /// required).
    pub(super) bit: u64,
}

impl Flat {
    /// `None` when the layout is not one of plain members the flat reader
    /// can take: the root is wanted whole, a rule reads below a member, or
    /// a member is remembered twice.
    pub(super) fn build(plan: &Plan, layout: &Layout) -> Option<Flat> {
        let shape = plan.shape.as_ref().map(|s| s.root());
        if !layout.fits(shape) || plan.nodes.first()?.slot.is_some() {
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
                shape: entry.schema.sub,
                bit: entry.schema.bit,
            });
        }
        Some(Flat {
            members: members.into_boxed_slice(),
        })
    }

    /// The member whose bytes start `b[i..]`, if it is the `k`th or the
    /// one after it (an optional member left out): the member, where its
    /// bytes end, and the member to try next.
    #[inline]
    pub(super) fn member_at(
        &self,
        k: usize,
        b: &[u8],
        i: usize,
    ) -> Option<(&Member, usize, usize)> {
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
