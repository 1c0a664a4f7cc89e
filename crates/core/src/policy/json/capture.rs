//! The fast path: validate a whole JSON document with serde_json's strict
//! parser (after [`flat`], a reader of records in their learned layout,
//! and [`scan`], a plain-document scanner, each of which accepts or gives
//! up) but keep only the values a policy's rules read. A [`Plan`] (a trie
//! of the rules' pointers, compiled at load) says which; they land in
//! [`Captures`], read by the rules by slot. Everything else is visited and
//! dropped without allocating.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

use super::{too_deep, BuildValue};

mod captures;
mod decimal;
mod flat;
mod layout;
mod plan;
mod scan;
mod skip;
mod strings;

use crate::policy::shape::{same_key, Member, Seen, Shape, ShapeNode};
pub(crate) use captures::{Captured, Captures};
use plan::Node;
pub(crate) use plan::Plan;
use skip::{skip_map, skip_seq, Skip};

/// [`capture`] for a policy with a JSON Schema compiled to a shape: the
/// captures if the document is valid JSON and surely meets the schema;
/// `None` when the full path must judge it (and word the reason).
///
/// `caps` must be fresh (`Captures::new(plan.slots())`); it is filled in
/// place, because moving it out of each layer cost more than filling it.
pub(crate) fn capture_shaped<'de>(
    bytes: &'de [u8],
    max_depth: usize,
    plan: &Plan,
    caps: &mut Captures<'de>,
) -> bool {
    plan.shape.is_some() && run(bytes, max_depth, plan, caps).is_ok()
}

/// Fills the fresh `caps` from `bytes`, or says why they are not valid
/// JSON (or not surely in the shape).
pub(super) fn run<'de>(
    bytes: &'de [u8],
    max_depth: usize,
    plan: &Plan,
    caps: &mut Captures<'de>,
) -> Result<(), serde_json::Error> {
    // A flat record in its layout's order first (`flat.rs`), from the raw
    // bytes: it accepts only ASCII strings, so it needs no UTF-8 check.
    if fast_flat(bytes, max_depth, plan, caps) {
        return Ok(());
    }
    // UTF-8 is checked once for the whole document, so the parser reads
    // it as text and does not check each string again (those checks were
    // 4 % of a judged record's CPU); a document that is not UTF-8 is parsed
    // as bytes, which words the error exactly where it is. simdutf8's
    // `basic` check accepts exactly what `std::str::from_utf8` accepts.
    match simdutf8::basic::from_utf8(bytes) {
        Ok(text) => {
            if scan::scan(text, max_depth, plan, caps) {
                return Ok(());
            }
            *caps = Captures::new(plan.slots);
            drive(
                serde_json::Deserializer::from_str(text),
                max_depth,
                plan,
                caps,
            )
        }
        Err(_) => drive(
            serde_json::Deserializer::from_slice(bytes),
            max_depth,
            plan,
            caps,
        ),
    }
}

/// Whether the flat reader accepts `bytes` (filling `caps`); when it does
/// not, `caps` is fresh again.
#[inline]
fn fast_flat<'de>(
    bytes: &'de [u8],
    max_depth: usize,
    plan: &Plan,
    caps: &mut Captures<'de>,
) -> bool {
    let Some(flat) = plan.flat().filter(|_| max_depth > 0) else {
        return false;
    };
    if flat.read(bytes, caps) {
        return true;
    }
    *caps = Captures::new(plan.slots);
    false
}

/// Whether the flat reader's template reads `bytes` (agreeing with its
/// member loop).
#[cfg(test)]
pub(crate) fn template_takes(bytes: &[u8], plan: &Plan) -> bool {
    plan.flat()
        .is_some_and(|f| f.template_agrees(bytes, plan.slots) == Ok(true))
}

/// Whether the flat reader or [`scan`] accepts `bytes`; when one does, the
/// visitor path must accept them too with the same captures (`Err` naming
/// both otherwise, or when what they accepted is not UTF-8). The flat
/// reader's template must agree with its member loop too.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn scanner_agrees(bytes: &[u8], max_depth: usize, plan: &Plan) -> Result<bool, String> {
    if let Some(flat) = plan.flat() {
        flat.template_agrees(bytes, plan.slots)?;
    }
    let mut scanned = Captures::new(plan.slots);
    let accepted = fast_flat(bytes, max_depth, plan, &mut scanned)
        || std::str::from_utf8(bytes).is_ok_and(|t| scan::scan(t, max_depth, plan, &mut scanned));
    if !accepted {
        return Ok(false);
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(format!("accepted bytes that are not UTF-8: {scanned:?}"));
    };
    let mut visited = Captures::new(plan.slots);
    match drive(
        serde_json::Deserializer::from_str(text),
        max_depth,
        plan,
        &mut visited,
    ) {
        Ok(()) if visited == scanned => Ok(true),
        other => Err(format!(
            "scanner {scanned:?}, visitor {other:?} {visited:?}"
        )),
    }
}

fn drive<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    max_depth: usize,
    plan: &Plan,
    caps: &mut Captures<'de>,
) -> Result<(), serde_json::Error> {
    At {
        plan,
        node: Some(0),
        shape: plan.shape.as_ref().map(Shape::root),
        depth: 0,
        max: max_depth,
        caps,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
}

/// Visits the value at trie node `node` (`None`: no rule reads at or below
/// it), capturing what the plan wants and checking it against `shape`
/// (`None`: no schema constraint here).
pub(super) struct At<'p, 'c, 'de> {
    plan: &'p Plan,
    node: Option<usize>,
    shape: Option<&'p ShapeNode>,
    depth: usize,
    max: usize,
    caps: &'c mut Captures<'de>,
}

/// The error a visitor raises when the shape rejects (or cannot decide).
pub(super) fn mismatch<E: de::Error>() -> E {
    E::custom("value does not meet the schema's fast subset")
}

impl<'p, 'de> At<'p, '_, 'de> {
    fn node(&self) -> Option<&'p Node> {
        self.node.and_then(|n| self.plan.nodes.get(n))
    }

    fn scalar<E: de::Error>(
        self,
        seen: Seen<'_>,
        v: impl FnOnce() -> Captured<'de>,
    ) -> Result<(), E> {
        if self.shape.is_some_and(|s| !s.scalar(seen)) {
            return Err(mismatch());
        }
        if let Some(slot) = self.node().and_then(|n| n.slot) {
            self.caps.set(slot, v());
        }
        Ok(())
    }

    /// Entering an array or object: checks depth and that the shape allows
    /// it (`opens`). `Some(depth of its members)` to visit them one by one,
    /// `None` when a rule needs it whole (build it with [`Self::builder`]).
    fn enter<E: de::Error>(&self, opens: fn(&ShapeNode) -> bool) -> Result<Option<usize>, E> {
        if self.depth >= self.max {
            return Err(too_deep(self.max));
        }
        if self.shape.is_some_and(|s| !opens(s)) {
            return Err(mismatch());
        }
        let whole = self.node().is_some_and(|n| n.slot.is_some());
        Ok((!whole).then_some(self.depth + 1))
    }

    fn builder(&self) -> BuildValue {
        BuildValue {
            depth: self.depth,
            max: self.max,
        }
    }

    /// This value's schema node with the whole shape it belongs to.
    fn shapes(&self) -> Option<(&'p ShapeNode, &'p Shape)> {
        Some((self.shape?, self.plan.shape.as_ref()?))
    }

    /// A pointer ends at this array or object: build it in full, check it
    /// against the shape, and resolve the pointers that continue below it
    /// from the built value.
    fn whole<E: de::Error>(self, v: Value) -> Result<(), E> {
        if let Some((s, shape)) = self.shapes() {
            if !shape.accepts(s, &v) {
                return Err(mismatch());
            }
        }
        let Some(node) = self.node() else {
            return Ok(());
        };
        for &slot in node.below.iter().filter(|&&s| Some(s) != node.slot) {
            let found = self
                .plan
                .pointers
                .get(slot)
                .and_then(|p| p.get_below(&v, node.level))
                .map(|x| match x {
                    Value::Null => Ok(Captured::Null),
                    Value::Bool(b) => Ok(Captured::Bool(*b)),
                    Value::Number(n) => Ok(Captured::Number(n.clone())),
                    other => Err(other.clone()),
                });
            match found {
                None => self.caps.set(slot, Captured::Missing),
                Some(Ok(c)) => self.caps.set(slot, c),
                Some(Err(Value::String(s))) => self.caps.set_owned(slot, s),
                Some(Err(other)) => self.caps.set_value(slot, other),
            }
        }
        if let Some(slot) = node.slot {
            self.caps.set_value(slot, v);
        }
        Ok(())
    }

    /// The visitor for a child: trie node `node`, schema `shape`.
    fn child<'c2>(
        &'c2 mut self,
        node: Option<usize>,
        shape: Option<&'p ShapeNode>,
        depth: usize,
    ) -> At<'p, 'c2, 'de> {
        At {
            plan: self.plan,
            node,
            shape,
            depth,
            max: self.max,
            caps: &mut *self.caps,
        }
    }
}

impl<'de> DeserializeSeed<'de> for At<'_, '_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // A repeated object key replaces the earlier value (as in a
        // `serde_json::Value`): forget what was captured under it.
        if let Some(n) = self.node() {
            if self.node != Some(0) {
                for &slot in &n.below {
                    self.caps.set(slot, Captured::Missing);
                }
            }
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for At<'_, '_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(Seen::Bool(v), || Captured::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(Seen::I64(v), || Captured::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(Seen::U64(v), || Captured::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.scalar(Seen::F64(v), || {
            Number::from_f64(v).map_or(Captured::Null, Captured::Number)
        })
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<(), E> {
        self.scalar(Seen::Str(v), || Captured::Str(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.visit_string(v.to_string())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<(), E> {
        if self.shape.is_some_and(|s| !s.scalar(Seen::Str(&v))) {
            return Err(mismatch());
        }
        if let Some(slot) = self.node().and_then(|n| n.slot) {
            self.caps.set_owned(slot, v);
        }
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar(Seen::Null, || Captured::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, seq: A) -> Result<(), A::Error> {
        let Some(depth) = self.enter(ShapeNode::open_array)? else {
            let v = self.builder().visit_seq(seq)?;
            return self.whole(v);
        };
        let node = self.node();
        let indexed = node.is_some_and(|n| n.children.iter().any(|c| c.1.is_some()));
        let (shape, items) = match self.shapes() {
            Some((s, all)) => (Some(s), all.items(s)),
            None => (None, None),
        };
        if !indexed && shape.is_none() {
            return skip_seq(seq, depth, self.max);
        }
        let mut seq = seq;
        let mut i = 0usize;
        loop {
            let child = node
                .and_then(|n| n.children.iter().find(|c| c.1 == Some(i)))
                .map(|c| c.2);
            let more = if child.is_none() && items.is_none() {
                seq.next_element_seed(Skip {
                    depth,
                    max: self.max,
                })?
                .is_some()
            } else {
                seq.next_element_seed(self.child(child, items, depth))?
                    .is_some()
            };
            if !more {
                break;
            }
            i += 1;
        }
        if shape.is_some_and(|s| !s.items_ok(i as u64)) {
            return Err(mismatch());
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, map: A) -> Result<(), A::Error> {
        let Some(depth) = self.enter(ShapeNode::open_object)? else {
            let v = self.builder().visit_map(map)?;
            return self.whole(v);
        };
        let children: &[_] = self.node().map_or(&[], |n| &n.children);
        let shape = self.shapes();
        if children.is_empty() && shape.is_none() {
            return skip_map(map, depth, self.max);
        }
        let mut map = map;
        let mut seen = 0u64;
        while let Some((child, member)) = map.next_key_seed(Key {
            children,
            shape: shape.map(|s| s.0),
        })? {
            let sub = match (shape, member) {
                (Some((s, all)), Some(m)) => {
                    seen |= s.bit(m);
                    all.member(s, m).map_err(|()| mismatch::<A::Error>())?
                }
                _ => None,
            };
            if child.is_none() && sub.is_none() {
                map.next_value_seed(Skip {
                    depth,
                    max: self.max,
                })?;
            } else {
                map.next_value_seed(self.child(child, sub, depth))?;
            }
        }
        if shape.is_some_and(|(s, _)| !s.complete(seen)) {
            return Err(mismatch());
        }
        Ok(())
    }
}

/// An object key, looked up among a trie node's children and a shape's
/// named keys (no allocation).
pub(super) struct Key<'n> {
    children: &'n [(String, Option<usize>, usize)],
    shape: Option<&'n ShapeNode>,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = (Option<usize>, Option<Member>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = (Option<usize>, Option<Member>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok((
            self.children
                .iter()
                .find(|c| same_key(&c.0, v))
                .map(|c| c.2),
            self.shape.map(|s| s.key(v)),
        ))
    }
}
