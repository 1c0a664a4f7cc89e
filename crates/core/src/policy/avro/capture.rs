//! The Avro fast path: read a datum straight from its bytes with the writer
//! schema, keeping only the values the rules' pointers name (a
//! [`Plan`], shared with JSON) in [`Captures`], instead of building an
//! `apache_avro` value and a `serde_json::Value` from it (allocation was
//! about a third of a judged record's CPU).
//!
//! It never rejects. It gives up, and the full decoder decides, on anything
//! it does not surely accept: a read past the end, a bad boolean, union or
//! enum index, invalid UTF-8, a NaN or infinite float anywhere (the full
//! path cannot judge those), trailing bytes, a block count larger than the
//! bytes left, and a rule that wants a record, array or map whole. Schemas
//! with logical types or named references never take it. What it accepts,
//! `apache_avro::from_avro_datum` accepts too and decodes to the same
//! values (reads replicate its varint, length and block rules);
//! `avro_proptests` checks the two paths give the same verdicts.

use std::borrow::Cow;

use apache_avro::Schema;
use base64::{engine::general_purpose::STANDARD as BASE64, Engine};
use serde_json::Number;

use super::AVRO_MAX_ALLOCATION;
use crate::policy::json::{Captured, Captures, Plan};

/// Whether the fast path reads `schema`: primitives, records, enums,
/// fixed, arrays, maps and unions of those.
pub(super) fn supported(schema: &Schema) -> bool {
    match schema {
        Schema::Null
        | Schema::Boolean
        | Schema::Int
        | Schema::Long
        | Schema::Float
        | Schema::Double
        | Schema::Bytes
        | Schema::String
        | Schema::Enum(_)
        | Schema::Fixed(_) => true,
        Schema::Record(r) => r.fields.iter().all(|f| supported(&f.schema)),
        Schema::Array(a) => supported(&a.items),
        Schema::Map(m) => supported(&m.types),
        Schema::Union(u) => u.variants().iter().all(supported),
        _ => false,
    }
}

/// The fast path stops: the full decoder must decide.
struct GiveUp;

type Read<T> = Result<T, GiveUp>;

/// The captures of `datum` written with `writer` (a [`supported`] schema),
/// or `None` when the full decoder must decide.
pub(super) fn capture<'a>(
    writer: &'a Schema,
    datum: &'a [u8],
    plan: &Plan,
) -> Option<Captures<'a>> {
    let mut r = Reader {
        b: datum,
        i: 0,
        plan,
        caps: Captures::new(plan.slots()),
    };
    r.value(writer, Some(0)).ok()?;
    (r.i == datum.len()).then_some(r.caps)
}

struct Reader<'p, 'a> {
    b: &'a [u8],
    i: usize,
    plan: &'p Plan,
    caps: Captures<'a>,
}

impl<'a> Reader<'_, 'a> {
    fn take(&mut self, n: usize) -> Read<&'a [u8]> {
        let end = self
            .i
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(GiveUp)?;
        let s = &self.b[self.i..end];
        self.i = end;
        Ok(s)
    }

    /// A variable-length integer, as apache-avro reads it: at most 10
    /// bytes, bits past 64 dropped.
    fn varint(&mut self) -> Read<u64> {
        let mut v = 0u64;
        for j in 0..10 {
            let byte = *self.b.get(self.i).ok_or(GiveUp)?;
            self.i += 1;
            v |= u64::from(byte & 0x7f) << (j * 7);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(GiveUp)
    }

    fn long(&mut self) -> Read<i64> {
        let z = self.varint()?;
        Ok(if z & 1 == 0 {
            (z >> 1) as i64
        } else {
            !(z >> 1) as i64
        })
    }

    fn int(&mut self) -> Read<i32> {
        i32::try_from(self.long()?).map_err(|_| GiveUp)
    }

    /// A length prefix (bytes, string), within the allocation limit.
    fn len(&mut self) -> Read<usize> {
        usize::try_from(self.long()?)
            .ok()
            .filter(|&n| n <= AVRO_MAX_ALLOCATION)
            .ok_or(GiveUp)
    }

    /// A block's item count (a negative count is followed by the block's
    /// size in bytes); 0 ends the array or map. Counts larger than the
    /// bytes left give up, which bounds the work by the datum's size.
    fn block(&mut self) -> Read<usize> {
        let raw = self.long()?;
        let n = if raw < 0 {
            self.long()?;
            raw.checked_neg().ok_or(GiveUp)?
        } else {
            raw
        };
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.b.len() - self.i)
            .ok_or(GiveUp)
    }

    fn string(&mut self) -> Read<&'a str> {
        let n = self.len()?;
        std::str::from_utf8(self.take(n)?).map_err(|_| GiveUp)
    }

    /// The value of `schema` at trie node `node` (`None`: no rule reads at
    /// or below it).
    fn value(&mut self, schema: &'a Schema, node: Option<usize>) -> Read<()> {
        let slot = node.and_then(|n| self.plan.slot(n));
        let v = match schema {
            Schema::Null => Captured::Null,
            Schema::Boolean => match self.take(1)? {
                [0] => Captured::Bool(false),
                [1] => Captured::Bool(true),
                _ => return Err(GiveUp),
            },
            Schema::Int => Captured::Number(self.int()?.into()),
            Schema::Long => Captured::Number(self.long()?.into()),
            Schema::Float => {
                let b = self.take(4)?;
                let f = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                Captured::Number(Number::from_f64(f64::from(f)).ok_or(GiveUp)?)
            }
            Schema::Double => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Captured::Number(Number::from_f64(f64::from_le_bytes(a)).ok_or(GiveUp)?)
            }
            Schema::Bytes => {
                let n = self.len()?;
                let b = self.take(n)?;
                bytes(b, slot)
            }
            Schema::Fixed(f) => {
                let b = self.take(f.size)?;
                bytes(b, slot)
            }
            Schema::String => Captured::Str(Cow::Borrowed(self.string()?)),
            Schema::Enum(e) => {
                let i = usize::try_from(self.int()?).map_err(|_| GiveUp)?;
                Captured::Str(Cow::Borrowed(e.symbols.get(i).ok_or(GiveUp)?))
            }
            Schema::Union(u) => {
                let i = usize::try_from(self.long()?).map_err(|_| GiveUp)?;
                let variant = u.variants().get(i).ok_or(GiveUp)?;
                return self.value(variant, node);
            }
            Schema::Record(r) if slot.is_none() => {
                for f in &r.fields {
                    let child = node.and_then(|n| self.plan.key_child(n, &f.name));
                    self.value(&f.schema, child)?;
                }
                return Ok(());
            }
            Schema::Array(a) if slot.is_none() => {
                let mut i = 0usize;
                loop {
                    let n = self.block()?;
                    if n == 0 {
                        return Ok(());
                    }
                    for _ in 0..n {
                        let child = node.and_then(|nd| self.plan.index_child(nd, i));
                        self.value(&a.items, child)?;
                        i += 1;
                    }
                }
            }
            Schema::Map(m) if slot.is_none() => loop {
                let n = self.block()?;
                if n == 0 {
                    return Ok(());
                }
                for _ in 0..n {
                    let key = self.string()?;
                    let child = node.and_then(|nd| self.plan.key_child(nd, key));
                    if let Some(c) = child {
                        // A repeated key replaces the earlier value.
                        for &s in self.plan.below(c) {
                            self.caps.set(s, Captured::Missing);
                        }
                    }
                    self.value(&m.types, child)?;
                }
            },
            _ => return Err(GiveUp),
        };
        if let Some(s) = slot {
            self.caps.set(s, v);
        }
        Ok(())
    }
}

/// Bytes and fixed as the full path shows them to rules: base64 text
/// (encoded only when a rule reads them).
fn bytes<'a>(b: &[u8], slot: Option<usize>) -> Captured<'a> {
    match slot {
        Some(_) => Captured::Str(Cow::Owned(BASE64.encode(b))),
        None => Captured::Missing,
    }
}
