//! What apache-avro's full decoder may build for a datum, bounded by the
//! datum's bytes before it runs.
//!
//! apache-avro reserves and builds every item an array or map block
//! declares, and its `max_allocation_bytes` counts items, not bytes: an item
//! of a type encoded in zero bytes (`null`, a `fixed` of size 0, a record of
//! such fields) costs memory but no input, so a few bytes declaring a block
//! of 50 M nulls built 50 M values (~2.6 GB). [`check`] walks the datum as
//! apache-avro reads it (same varint, length, block and end-of-input rules)
//! without building anything, and charges every block before its items:
//!
//! ```text
//! Σ over array and map blocks of  count × w(item)  ≤  datum bytes + AVRO_FREE_ITEMS
//! w(item) = the values one item builds, for an item type encoded in zero bytes
//!         = 1 otherwise (a map entry has a key, so always 1)
//! ```
//!
//! An item of any other type takes at least one byte, so a datum without
//! zero-byte items never reaches the bound; beyond it, at most
//! [`AVRO_FREE_ITEMS`] values come free. A datum over the bound is poison
//! with rule `limits`: the decision depends on its bytes and the policy's
//! schemas only, so every instance reaches it. Where apache-avro would fail
//! the walk stops and apache-avro reports the failure itself, having built
//! no more than the walk charged. The fast path ([`super::capture`]) charges
//! the same budget and gives up where the walk would refuse.

use std::collections::HashMap;

use apache_avro::schema::{Name, ResolvedSchema};
use apache_avro::Schema;

use super::AVRO_MAX_ALLOCATION;
use crate::policy::Invalid;

/// Array and map items (weighted by [`item_weight`]) a datum may declare
/// beyond one per byte: the items of zero-byte types it may hold.
pub(crate) const AVRO_FREE_ITEMS: usize = 4096;

/// Deeper than any schema antidote loads (recursive schemas are refused):
/// the walk never overflows the stack.
const MAX_DEPTH: usize = 512;

/// The weighted items a datum of `len` bytes may declare.
pub(crate) fn item_budget(len: usize) -> usize {
    len.saturating_add(AVRO_FREE_ITEMS)
}

/// What one array item of type `items` is charged (a schema without named
/// references, as the fast path reads).
pub(crate) fn item_weight(items: &Schema) -> usize {
    zero_values(items, None, None, 0).unwrap_or(1)
}

type Names<'s> = HashMap<Name, &'s Schema>;

/// Refuse (poison, rule `limits`) a datum written with `writer` (named
/// types from `named`) that declares more array and map items than its
/// bytes allow; see the module's formula.
pub(crate) fn check(writer: &Schema, named: &[Schema], datum: &[u8]) -> Result<(), Invalid> {
    match walk(writer, named, datum) {
        Ok(_) | Err(Stop::Decoder) => Ok(()),
        Err(Stop::Limits(reason)) => Err(Invalid::poison("limits", reason)),
    }
}

/// Walk `datum` as apache-avro reads it: where the value ends.
fn walk(writer: &Schema, named: &[Schema], datum: &[u8]) -> Result<usize, Stop> {
    let names = if has_ref(writer, 0) {
        let schemata: Vec<&Schema> = named.iter().chain(std::iter::once(writer)).collect();
        // apache-avro fails the same way before reading a byte.
        let rs = ResolvedSchema::try_from(schemata).map_err(|_| Stop::Decoder)?;
        Some(rs.get_names().clone())
    } else {
        None
    };
    let mut scan = Scan {
        b: datum,
        i: 0,
        names: names.as_ref(),
        budget: item_budget(datum.len()),
        used: 0,
    };
    scan.value(writer, None, 0)?;
    Ok(scan.i)
}

/// For tests: where the walk ends (`Err(None)`: where apache-avro fails;
/// `Err(Some(reason))`: over the bound).
#[cfg(test)]
pub(super) fn walk_end(
    writer: &Schema,
    named: &[Schema],
    datum: &[u8],
) -> Result<usize, Option<String>> {
    walk(writer, named, datum).map_err(|s| match s {
        Stop::Limits(r) => Some(r),
        Stop::Decoder => None,
    })
}

/// Why the walk stopped.
enum Stop {
    /// Over the bound: refuse the datum.
    Limits(String),
    /// apache-avro fails here: let it say why.
    Decoder,
}

type Step<T = ()> = Result<T, Stop>;

struct Scan<'m, 'd> {
    b: &'d [u8],
    i: usize,
    names: Option<&'m Names<'m>>,
    budget: usize,
    used: usize,
}

impl<'m> Scan<'m, '_> {
    /// A base-128 varint as apache-avro reads it (at most 10 bytes, bits
    /// past 64 dropped); `Err(true)` at the end of the input (all of it
    /// consumed), `Err(false)` past 10 bytes.
    fn varint(&mut self) -> Result<u64, bool> {
        let mut v = 0u64;
        for j in 0..10 {
            let Some(&byte) = self.b.get(self.i) else {
                return Err(true);
            };
            self.i += 1;
            v |= u64::from(byte & 0x7f) << (j * 7);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(false)
    }

    fn long(&mut self) -> Step<i64> {
        let z = self.varint().map_err(|_| Stop::Decoder)?;
        Ok(if z & 1 == 0 {
            (z >> 1) as i64
        } else {
            !(z >> 1) as i64
        })
    }

    fn int(&mut self) -> Step<i32> {
        i32::try_from(self.long()?).map_err(|_| Stop::Decoder)
    }

    fn skip(&mut self, n: usize) -> Step {
        match self.i.checked_add(n).filter(|&e| e <= self.b.len()) {
            Some(end) => {
                self.i = end;
                Ok(())
            }
            None => Err(Stop::Decoder),
        }
    }

    /// A length prefix (bytes, string), as apache-avro's `decode_len`.
    fn len(&mut self) -> Step<usize> {
        usize::try_from(self.long()?)
            .ok()
            .filter(|&n| n <= AVRO_MAX_ALLOCATION)
            .ok_or(Stop::Decoder)
    }

    /// A string; `cut_off_is_null`: a string cut off by the end of the
    /// input is a null to apache-avro (the rest is consumed), except as a
    /// map key.
    fn string(&mut self, cut_off_is_null: bool) -> Step {
        let n = self.len()?;
        match self.i.checked_add(n).filter(|&e| e <= self.b.len()) {
            Some(end) => {
                let ok = std::str::from_utf8(&self.b[self.i..end]).is_ok();
                self.i = end;
                ok.then_some(()).ok_or(Stop::Decoder)
            }
            None if cut_off_is_null => {
                self.i = self.b.len();
                Ok(())
            }
            None => Err(Stop::Decoder),
        }
    }

    /// A block's item count as apache-avro's `decode_seq_len` reads it (a
    /// negative count is followed by the block's size); 0 ends the array
    /// or map.
    fn block(&mut self) -> Step<usize> {
        let raw = self.long()?;
        let n = if raw < 0 {
            self.long()?;
            raw.checked_neg().ok_or(Stop::Decoder)?
        } else {
            raw
        };
        usize::try_from(n).map_err(|_| Stop::Decoder)
    }

    /// Charge `n` items of weight `w`, before apache-avro reserves them.
    fn charge(&mut self, n: usize, w: usize) -> Step {
        let used = self.used.saturating_add(n.saturating_mul(w));
        if used > self.budget {
            return Err(Stop::Limits(format!(
                "Avro value declares {used} or more array and map items (an item of a \
                 zero-byte type counted as the values it builds), over the {} its {} bytes \
                 allow (one per byte plus {AVRO_FREE_ITEMS})",
                self.budget,
                self.b.len()
            )));
        }
        self.used = used;
        Ok(())
    }

    /// The schema a named reference stands for, with its namespace.
    fn resolve(&self, name: &Name, ns: Option<&str>) -> Option<(&'m Schema, Option<&'m str>)> {
        let (key, schema) = self.names?.get_key_value(&full_name(name, ns))?;
        Some((*schema, key.namespace.as_deref()))
    }

    /// Walk one value of `s`; `ns`: the enclosing namespace.
    fn value(&mut self, s: &'m Schema, ns: Option<&'m str>, depth: usize) -> Step {
        if depth > MAX_DEPTH {
            return Err(Stop::Limits(format!(
                "Avro value nests deeper than {MAX_DEPTH}"
            )));
        }
        match s {
            Schema::Null => Ok(()),
            // At the end of the input apache-avro reads a null.
            Schema::Boolean => match self.b.get(self.i) {
                None => Ok(()),
                Some(0 | 1) => self.skip(1),
                Some(_) => Err(Stop::Decoder),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => self.int().map(drop),
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => self.long().map(drop),
            Schema::Float => self.skip(4),
            Schema::Double => self.skip(8),
            Schema::Duration => self.skip(12),
            Schema::Bytes | Schema::BigDecimal | Schema::Uuid => {
                let n = self.len()?;
                self.skip(n)
            }
            Schema::String => self.string(true),
            Schema::Fixed(f) => self.skip(f.size),
            Schema::Decimal(d) => match &*d.inner {
                Schema::Fixed(f) => self.skip(f.size),
                Schema::Bytes => {
                    let n = self.len()?;
                    self.skip(n)
                }
                _ => Err(Stop::Decoder),
            },
            Schema::Enum(e) => {
                let i = usize::try_from(self.int()?).map_err(|_| Stop::Decoder)?;
                (i < e.symbols.len()).then_some(()).ok_or(Stop::Decoder)
            }
            _ => self.compound(s, ns, depth),
        }
    }

    /// [`Self::value`] of a union, record, array, map or named reference:
    /// the values it holds, one level deeper.
    fn compound(&mut self, s: &'m Schema, ns: Option<&'m str>, depth: usize) -> Step {
        match s {
            Schema::Union(u) => match self.varint() {
                // Cut off at the end of the input: a null to apache-avro.
                Err(true) => Ok(()),
                Err(false) => Err(Stop::Decoder),
                Ok(z) => {
                    let index = if z & 1 == 0 {
                        (z >> 1) as i64
                    } else {
                        !(z >> 1) as i64
                    };
                    let v = usize::try_from(index)
                        .ok()
                        .and_then(|i| u.variants().get(i));
                    self.value(v.ok_or(Stop::Decoder)?, ns, depth + 1)
                }
            },
            Schema::Record(r) => {
                let ns = r.name.namespace.as_deref().or(ns.filter(|n| !n.is_empty()));
                for f in &r.fields {
                    self.value(&f.schema, ns, depth + 1)?;
                }
                Ok(())
            }
            Schema::Array(a) => loop {
                let n = self.block()?;
                if n == 0 {
                    return Ok(());
                }
                let zero = zero_values(&a.items, self.names, ns, 0);
                self.charge(n, zero.unwrap_or(1))?;
                if zero.is_none() {
                    for _ in 0..n {
                        self.value(&a.items, ns, depth + 1)?;
                    }
                }
                // Items of a zero-byte type read nothing and cannot fail.
            },
            Schema::Map(m) => loop {
                let n = self.block()?;
                if n == 0 {
                    return Ok(());
                }
                self.charge(n, 1)?;
                for _ in 0..n {
                    self.string(false)?;
                    self.value(&m.types, ns, depth + 1)?;
                }
            },
            Schema::Ref { name } => {
                let (s, ns) = self.resolve(name, ns).ok_or(Stop::Decoder)?;
                self.value(s, ns, depth + 1)
            }
            _ => Err(Stop::Decoder),
        }
    }
}

/// `name` qualified by the enclosing namespace, as apache-avro looks it up.
fn full_name(name: &Name, ns: Option<&str>) -> Name {
    Name {
        name: name.name.clone(),
        namespace: (name.namespace.clone())
            .or_else(|| ns.filter(|n| !n.is_empty()).map(str::to_owned)),
    }
}

/// The values apache-avro builds for one value of `s` when `s` is encoded
/// in zero bytes (`null`, a `fixed` or fixed decimal of size 0, a record of
/// such fields), `None` for any other type: it reads at least one byte, or
/// fails.
fn zero_values(
    s: &Schema,
    names: Option<&Names<'_>>,
    ns: Option<&str>,
    depth: usize,
) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    match s {
        Schema::Null => Some(1),
        Schema::Fixed(f) if f.size == 0 => Some(1),
        Schema::Decimal(d) => match &*d.inner {
            Schema::Fixed(f) if f.size == 0 => Some(1),
            _ => None,
        },
        Schema::Record(r) => {
            let ns = r.name.namespace.as_deref().or(ns.filter(|n| !n.is_empty()));
            (r.fields.iter()).try_fold(1usize, |sum, f| {
                Some(sum.saturating_add(zero_values(&f.schema, names, ns, depth + 1)?))
            })
        }
        Schema::Ref { name } => {
            let (key, s) = names?.get_key_value(&full_name(name, ns))?;
            zero_values(s, names, key.namespace.as_deref(), depth + 1)
        }
        _ => None,
    }
}

/// Whether `s` refers to a named type (so the walk needs the names).
fn has_ref(s: &Schema, depth: usize) -> bool {
    depth <= MAX_DEPTH
        && match s {
            Schema::Ref { .. } => true,
            Schema::Array(a) => has_ref(&a.items, depth + 1),
            Schema::Map(m) => has_ref(&m.types, depth + 1),
            Schema::Union(u) => u.variants().iter().any(|v| has_ref(v, depth + 1)),
            Schema::Record(r) => r.fields.iter().any(|f| has_ref(&f.schema, depth + 1)),
            Schema::Decimal(d) => has_ref(&d.inner, depth + 1),
            _ => false,
        }
}

#[cfg(test)]
#[path = "bound_counting.rs"]
pub(crate) mod counting;

#[cfg(test)]
#[path = "bound_tests.rs"]
mod tests;
