//! Validating the values no rule reads: visited by serde_json's strict
//! parser (strings, numbers and depth checked) and dropped, allocating
//! nothing.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::super::too_deep;
use super::Key;

/// Validates a value the rules do not need, without keeping or allocating
/// anything (strings and numbers are still fully checked by the parser).
#[derive(Clone, Copy)]
pub(super) struct Skip {
    pub(super) depth: usize,
    pub(super) max: usize,
}

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        if self.depth >= self.max {
            return Err(too_deep(self.max));
        }
        skip_seq(seq, self.depth + 1, self.max)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        if self.depth >= self.max {
            return Err(too_deep(self.max));
        }
        skip_map(map, self.depth + 1, self.max)
    }
}

/// Skip the elements of an array whose own depth is `depth`.
pub(super) fn skip_seq<'de, A: SeqAccess<'de>>(
    mut seq: A,
    depth: usize,
    max: usize,
) -> Result<(), A::Error> {
    while seq.next_element_seed(Skip { depth, max })?.is_some() {}
    Ok(())
}

/// Skip the members of an object whose own depth is `depth`.
pub(super) fn skip_map<'de, A: MapAccess<'de>>(
    mut map: A,
    depth: usize,
    max: usize,
) -> Result<(), A::Error> {
    while map
        .next_key_seed(Key {
            children: &[],
            shape: None,
        })?
        .is_some()
    {
        map.next_value_seed(Skip { depth, max })?;
    }
    Ok(())
}
