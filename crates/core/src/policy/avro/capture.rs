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
//! bytes left, more items in all than [`bound::check`] allows (it charges
//! the same budget), and a rule that wants a record, array or map whole. Schemas
//! with logical types or named references never take it. What it accepts,
//! `apache_avro::from_avro_datum` accepts too and decodes to the same
//! values (reads replicate its varint, length and block rules);
//! `avro_proptests` checks the two paths give the same verdicts.

use apache_avro::Schema;
use base64::{engine::general_purpose::STANDARD as BASE64, Engine};
use serde_json::Number;

use super::{bound, AVRO_MAX_ALLOCATION};
use crate::policy::json::{Captured, Captures, Plan};
use crate::policy::shape::same_key;
use crate::policy::wire::{is_utf8, varint_at, Tenth};

/// A writer schema compiled against a [`Plan`] once: the schema's shape,
/// with every record field's trie node looked up in advance (the lookup by
/// field name was about a sixth of a record's CPU when done per datum).
#[derive(Debug)]
pub(crate) struct Prog {
    kind: Kind,
    /// The trie node of this value (`None`: no rule reads at or below it).
    node: Option<usize>,
    /// The slot of the pointer ending here, if one does.
    slot: Option<usize>,
}

#[derive(Debug)]
#[repr(u8)]
enum Kind {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    Fixed(usize),
    String,
    Enum(Vec<String>),
    Union(Vec<Prog>),
    Record(Vec<Prog>),
    /// `items` for elements no rule reads; `at`: the elements that have a
    /// trie node, by index; `weight`: what an item is charged
    /// ([`bound::item_weight`]).
    Array {
        items: Box<Prog>,
        at: Vec<(usize, Prog)>,
        weight: usize,
    },
    /// `values` for keys no rule reads; `at`: the keys that have a trie
    /// node, with it.
    Map {
        values: Box<Prog>,
        at: Vec<(String, Prog)>,
    },
    /// A record, array or map a rule wants whole: the full path decides.
    Whole,
}

impl Prog {
    /// `writer` compiled against `plan`, or `None` if the fast path does
    /// not read it: it reads primitives, records, enums, fixed, arrays,
    /// maps and unions of those (no logical types, no named references).
    pub(crate) fn compile(writer: &Schema, plan: &Plan) -> Option<Prog> {
        Prog::at(writer, plan, Some(0))
    }

    fn at(schema: &Schema, plan: &Plan, node: Option<usize>) -> Option<Prog> {
        let slot = node.and_then(|n| plan.slot(n));
        let whole = slot.is_some();
        let kind = match schema {
            Schema::Null => Kind::Null,
            Schema::Boolean => Kind::Boolean,
            Schema::Int => Kind::Int,
            Schema::Long => Kind::Long,
            Schema::Float => Kind::Float,
            Schema::Double => Kind::Double,
            Schema::Bytes => Kind::Bytes,
            Schema::String => Kind::String,
            Schema::Fixed(f) => Kind::Fixed(f.size),
            Schema::Enum(e) => Kind::Enum(e.symbols.clone()),
            Schema::Union(u) => Kind::Union(
                (u.variants().iter())
                    .map(|v| Prog::at(v, plan, node))
                    .collect::<Option<_>>()?,
            ),
            Schema::Record(r) => {
                let fields = (r.fields.iter())
                    .map(|f| {
                        Prog::at(
                            &f.schema,
                            plan,
                            node.and_then(|n| plan.key_child(n, &f.name)),
                        )
                    })
                    .collect::<Option<_>>()?;
                if whole {
                    Kind::Whole
                } else {
                    Kind::Record(fields)
                }
            }
            Schema::Array(a) => {
                let items = Box::new(Prog::at(&a.items, plan, None)?);
                let at = (node.map_or(&[][..], |n| plan.children(n)).iter())
                    .filter_map(|&(_, index, child)| Some((index?, child)))
                    .map(|(i, child)| Some((i, Prog::at(&a.items, plan, Some(child))?)))
                    .collect::<Option<_>>()?;
                if whole {
                    Kind::Whole
                } else {
                    let weight = bound::item_weight(&a.items);
                    Kind::Array { items, at, weight }
                }
            }
            Schema::Map(m) => {
                let values = Box::new(Prog::at(&m.types, plan, None)?);
                let at = (node.map_or(&[][..], |n| plan.children(n)).iter())
                    .map(|(key, _, child)| {
                        Some((key.clone(), Prog::at(&m.types, plan, Some(*child))?))
                    })
                    .collect::<Option<_>>()?;
                if whole {
                    Kind::Whole
                } else {
                    Kind::Map { values, at }
                }
            }
            _ => return None,
        };
        Some(Prog { kind, node, slot })
    }
}

/// The fast path stops: the full decoder must decide.
struct GiveUp;

type Read<T> = Result<T, GiveUp>;

/// Read the captures of `datum` with `prog` (its writer schema compiled
/// against `plan`) into `caps` (`Captures::new(plan.slots())`, filled in
/// place: ~280 bytes not moved per record); false when the full decoder
/// must decide.
#[inline(always)]
pub(super) fn capture<'a>(
    prog: &'a Prog,
    datum: &'a [u8],
    plan: &Plan,
    caps: &mut Captures<'a>,
) -> bool {
    let mut r = Reader {
        b: datum,
        i: 0,
        left: bound::item_budget(datum.len()),
        plan,
        caps,
    };
    r.value(prog).is_ok() && r.i == datum.len()
}

struct Reader<'p, 'c, 'a> {
    b: &'a [u8],
    i: usize,
    /// What is left of the datum's item budget ([`bound::item_budget`]).
    left: usize,
    plan: &'p Plan,
    caps: &'c mut Captures<'a>,
}

impl<'a> Reader<'_, '_, 'a> {
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

    /// Bytes and fixed as the full path shows them to rules: base64 text
    /// (encoded only when a rule reads them).
    fn bytes(&mut self, b: &[u8], slot: Option<usize>) {
        if let Some(s) = slot {
            self.caps.set_owned(s, BASE64.encode(b));
        }
    }

    /// A variable-length integer, as apache-avro reads it: at most 10
    /// bytes, bits past 64 dropped.
    #[inline(always)]
    fn varint(&mut self) -> Read<u64> {
        varint_at(self.b, &mut self.i, Tenth::Any).ok_or(GiveUp)
    }

    // `long`, `int` and `len` out of line (the compiler's choice once the
    // code around them grew) cost ~75 instructions per Avro record
    // (`FILTER_FORMAT=avro judge-cost.sh --filter`).
    #[inline(always)]
    fn long(&mut self) -> Read<i64> {
        let z = self.varint()?;
        Ok(if z & 1 == 0 {
            (z >> 1) as i64
        } else {
            !(z >> 1) as i64
        })
    }

    #[inline(always)]
    fn int(&mut self) -> Read<i32> {
        i32::try_from(self.long()?).map_err(|_| GiveUp)
    }

    /// A length prefix (bytes, string), within the allocation limit.
    #[inline(always)]
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

    /// Charge `n` items of weight `w` ([`bound::check`]'s rule).
    fn charge(&mut self, n: usize, w: usize) -> Read<()> {
        self.left = self.left.checked_sub(n.saturating_mul(w)).ok_or(GiveUp)?;
        Ok(())
    }

    fn string(&mut self) -> Read<&'a str> {
        let n = self.len()?;
        simdutf8::basic::from_utf8(self.take(n)?).map_err(|_| GiveUp)
    }

    /// The value `prog` reads: a leaf here, without a call (most record
    /// fields are leaves), anything else in [`Self::compound`].
    #[inline(always)]
    fn value(&mut self, prog: &'a Prog) -> Read<()> {
        let v = match &prog.kind {
            Kind::Null => Captured::Null,
            Kind::Boolean => match self.take(1)? {
                [0] => Captured::Bool(false),
                [1] => Captured::Bool(true),
                _ => return Err(GiveUp),
            },
            Kind::Int => Captured::Number(self.int()?.into()),
            Kind::Long => Captured::Number(self.long()?.into()),
            Kind::Float => {
                let b = self.take(4)?;
                let f = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                Captured::Number(Number::from_f64(f64::from(f)).ok_or(GiveUp)?)
            }
            Kind::Double => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Captured::Number(Number::from_f64(f64::from_le_bytes(a)).ok_or(GiveUp)?)
            }
            Kind::Bytes => {
                let n = self.len()?;
                let b = self.take(n)?;
                self.bytes(b, prog.slot);
                return Ok(());
            }
            Kind::Fixed(size) => {
                let b = self.take(*size)?;
                self.bytes(b, prog.slot);
                return Ok(());
            }
            Kind::String if prog.slot.is_none() => {
                // No rule reads it: only whether it is text matters.
                let n = self.len()?;
                return match is_utf8(self.take(n)?) {
                    true => Ok(()),
                    false => Err(GiveUp),
                };
            }
            Kind::String => Captured::Str(self.string()?),
            Kind::Enum(symbols) => {
                let i = usize::try_from(self.int()?).map_err(|_| GiveUp)?;
                Captured::Str(symbols.get(i).ok_or(GiveUp)?)
            }
            _ => return self.compound(prog),
        };
        if let Some(s) = prog.slot {
            self.caps.set(s, v);
        }
        Ok(())
    }

    /// A union, record, array or map.
    fn compound(&mut self, prog: &'a Prog) -> Read<()> {
        match &prog.kind {
            Kind::Union(variants) => {
                let i = usize::try_from(self.long()?).map_err(|_| GiveUp)?;
                self.value(variants.get(i).ok_or(GiveUp)?)
            }
            Kind::Record(fields) => {
                for f in fields {
                    self.value(f)?;
                }
                Ok(())
            }
            Kind::Array { items, at, weight } => {
                let mut i = 0usize;
                loop {
                    let n = self.block()?;
                    if n == 0 {
                        return Ok(());
                    }
                    self.charge(n, *weight)?;
                    for _ in 0..n {
                        let item = at.iter().find(|e| e.0 == i).map_or(&**items, |e| &e.1);
                        self.value(item)?;
                        i += 1;
                    }
                }
            }
            Kind::Map { values, at } => loop {
                let n = self.block()?;
                if n == 0 {
                    return Ok(());
                }
                self.charge(n, 1)?;
                for _ in 0..n {
                    let key = self.string()?;
                    let value = match at.iter().find(|e| same_key(&e.0, key)) {
                        Some((_, v)) => {
                            // A repeated key replaces the earlier value.
                            for &s in v.node.map_or(&[][..], |c| self.plan.below(c)) {
                                self.caps.set(s, Captured::Missing);
                            }
                            v
                        }
                        None => &**values,
                    };
                    self.value(value)?;
                }
            },
            _ => Err(GiveUp),
        }
    }
}
