//! A record's captures: the values its rules asked for, by slot, borrowed
//! from the record's bytes where it holds them as they are.

use serde_json::{Number, Value};

use crate::policy::rules::{Doc, Field, Pointer};

/// A value the rules asked for. Owns nothing, so a record's slots need no
/// drop glue (issue 30): what must be owned lives beside them in
/// [`Captures`], named by index.
#[derive(Debug, Default, PartialEq)]
pub(crate) enum Captured<'de> {
    /// Absent (or not reached).
    #[default]
    Missing,
    Null,
    Bool(bool),
    Number(Number),
    Str(&'de str),
    /// A value the record does not hold as such: a string unescaped or
    /// encoded (JSON escapes, bytes as base64), or an array or an object
    /// built in full (rare: rules read scalars): `Captures::owned[i]`.
    Owned(usize),
}

/// Slots kept inline; policies with more distinct pointers spill to the heap.
pub(super) const INLINE: usize = 8;

/// The captured values of one record, by slot; borrows the record's bytes.
#[derive(Debug, PartialEq)]
pub(crate) struct Captures<'de> {
    inline: [Captured<'de>; INLINE],
    heap: Vec<Captured<'de>>,
    /// What `Captured::Owned` slots name.
    owned: Vec<Value>,
}

impl<'de> Captures<'de> {
    #[inline]
    pub(crate) fn new(slots: usize) -> Self {
        let mut heap = Vec::new();
        if slots > INLINE {
            heap.resize_with(slots, Captured::default);
        }
        Captures {
            inline: Default::default(),
            heap,
            owned: Vec::new(),
        }
    }

    /// What a slot's value reads as.
    #[inline]
    fn field_of<'s>(&'s self, c: &'s Captured<'de>) -> Option<Field<'s>> {
        Some(match c {
            Captured::Missing => return None,
            Captured::Null => Field::Null,
            Captured::Bool(b) => Field::Bool(*b),
            Captured::Number(n) => Field::Number(n),
            Captured::Str(s) => Field::Str(s),
            Captured::Owned(i) => Field::of(self.owned.get(*i)?),
        })
    }

    /// Capture a string the record does not hold as such.
    pub(crate) fn set_owned(&mut self, slot: usize, s: String) {
        self.set_value(slot, Value::String(s));
    }

    /// Capture a value the record does not hold as such.
    pub(crate) fn set_value(&mut self, slot: usize, v: Value) {
        self.owned.push(v);
        self.set(slot, Captured::Owned(self.owned.len() - 1));
    }

    #[inline]
    fn get(&self, slot: usize) -> Option<&Captured<'de>> {
        if self.heap.is_empty() {
            self.inline.get(slot)
        } else {
            self.heap.get(slot)
        }
    }

    #[inline]
    pub(crate) fn set(&mut self, slot: usize, v: Captured<'de>) {
        let cell = if self.heap.is_empty() {
            self.inline.get_mut(slot)
        } else {
            self.heap.get_mut(slot)
        };
        if let Some(c) = cell {
            *c = v;
        }
    }
}

impl Doc for Captures<'_> {
    #[inline]
    fn field(&self, ptr: &Pointer) -> Option<Field<'_>> {
        self.get(ptr.slot()).and_then(|c| self.field_of(c))
    }
}
