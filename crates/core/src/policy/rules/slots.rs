//! Capture slots for the pointers rules read: one slot per distinct
//! pointer text, assigned at load, so that a record's captures are read
//! by index rather than by walking the value.

use super::{MaxAge, Pointer, Rule};

/// Give every distinct pointer (by text) of `rules` and `stale` a slot, in
/// order of first use, and return one pointer per slot.
pub(crate) fn assign_slots(rules: &mut [Rule], stale: &mut [MaxAge]) -> Vec<Pointer> {
    let mut distinct: Vec<Pointer> = Vec::new();
    for r in rules.iter_mut() {
        match r {
            Rule::OneOf { ptr, .. } | Rule::Range { ptr, .. } | Rule::Absent { ptr, .. } => {
                assign(&mut distinct, ptr)
            }
            Rule::Coordinates(c) => {
                assign(&mut distinct, &mut c.lat);
                assign(&mut distinct, &mut c.lon);
            }
        }
    }
    for s in stale.iter_mut() {
        assign(&mut distinct, &mut s.ptr);
    }
    distinct
}

/// [`assign_slots`] for more pointers (a `cel` rule's fields), after it:
/// a pointer already in `distinct` shares its slot.
pub(crate) fn assign_more<'p>(
    distinct: &mut Vec<Pointer>,
    more: impl Iterator<Item = &'p mut Pointer>,
) {
    for p in more {
        assign(distinct, p);
    }
}

fn assign(distinct: &mut Vec<Pointer>, p: &mut Pointer) {
    let slot = match distinct.iter().position(|d| d.text == p.text) {
        Some(i) => i,
        None => {
            distinct.push(p.clone());
            distinct.len() - 1
        }
    };
    p.slot = slot;
    if let Some(d) = distinct.get_mut(slot) {
        d.slot = slot;
    }
}
