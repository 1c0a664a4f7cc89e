//! The Protobuf fast path: read a message straight from its bytes into the
//! rules' captures (a [`Plan`], shared with JSON), instead of decoding a
//! `DynamicMessage` and converting it to a `serde_json::Value`.
//!
//! [`Tables`] are compiled at load from the descriptors: per message type,
//! its fields by number with their kind, presence and default. Message
//! types with repeated or map fields, groups, real oneofs or extensions are
//! not read here (proto3 `optional`, a synthetic oneof, is).
//!
//! It never rejects. It gives up, and the full decoder decides, on anything
//! it does not surely accept: a bad key, tag or wire type, a varint prost
//! refuses, a length past the end, invalid UTF-8, a NaN or infinite float
//! anywhere, a group, nesting deeper than [`MAX_DEPTH`], a nested message a
//! rule reads from appearing twice (prost merges those), and a rule that
//! wants a message whole. Accepted messages decode to the values
//! `DynamicMessage::decode` and the JSON conversion give: last value wins,
//! fields without presence read as their default, unknown fields skipped,
//! enums by name (the number when unknown). `protobuf_proptests` checks
//! both paths give the same verdicts.

use std::collections::HashMap;

use base64::{engine::general_purpose::STANDARD as BASE64, Engine};
use prost_reflect::MessageDescriptor;
use serde_json::Number;

use crate::policy::json::{Captured, Captures, Plan};
use crate::policy::wire::{is_utf8, varint_at, Tenth};

mod compile;

/// Nested messages read at most this deep (prost allows 100).
const MAX_DEPTH: usize = 32;

/// The message types the fast path reads, compiled from descriptors.
#[derive(Debug, Default)]
pub struct Tables {
    by_name: HashMap<String, usize>,
    msgs: Vec<Msg>,
}

#[derive(Debug)]
struct Msg {
    /// Sorted by number.
    fields: Vec<Field>,
    supported: bool,
    /// Per one-byte key (fields 1-15), the index + 1 of the field it names
    /// with the wire type that field's values have; 0 for any other key.
    by_key: Box<[u16; 128]>,
}

impl Msg {
    /// The index of field `number`: where it is when the fields are
    /// numbered from 1 without gaps (most messages), else searched.
    /// `number` is not 0 (a key with field number 0 gives up before).
    #[inline]
    fn field(&self, number: u32) -> Result<usize, usize> {
        let at = (number as usize).wrapping_sub(1);
        match self.fields.get(at) {
            Some(f) if f.number == number => Ok(at),
            _ => self.fields.binary_search_by_key(&number, |f| f.number),
        }
    }
}

#[derive(Debug)]
struct Field {
    number: u32,
    name: String,
    kind: K,
    /// The wire type its values must have.
    wire: u8,
    /// What the JSON shows when the field is absent: `None` for fields
    /// with presence (absent from the object).
    default: Option<Def>,
}

/// A field's kind. A tag byte of its own (`repr(u8)`), so reading a field
/// dispatches on one byte rather than decoding a niche.
#[derive(Debug)]
#[repr(u8)]
enum K {
    Int32,
    Sint32,
    Sfixed32,
    Int64,
    Sint64,
    Sfixed64,
    Uint32,
    Fixed32,
    Uint64,
    Fixed64,
    Float,
    Double,
    Bool,
    Str,
    Bytes,
    /// Value names by number, sorted.
    Enum(Vec<(i32, String)>),
    Message(usize),
}

#[derive(Debug)]
enum Def {
    Bool(bool),
    Num(Number),
    Str(String),
}

impl Tables {
    /// Read the captures of `payload`, a `desc` message, into `caps`
    /// (`Captures::new` of the plan `links` were made for, filled in place);
    /// false when the full decoder must judge it.
    #[inline(always)]
    pub(crate) fn capture<'a>(
        &'a self,
        desc: &MessageDescriptor,
        payload: &'a [u8],
        links: &Links,
        caps: &mut Captures<'a>,
    ) -> bool {
        match self.by_name.get(desc.full_name()) {
            Some(&m) => self.capture_index(m, payload, links, caps),
            None => false,
        }
    }

    /// The table index of message type `name`.
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// [`Self::capture`] for the message type at table index `m`.
    #[inline(always)]
    pub(crate) fn capture_index<'a>(
        &'a self,
        m: usize,
        payload: &'a [u8],
        links: &Links,
        caps: &mut Captures<'a>,
    ) -> bool {
        if !self.msgs.get(m).is_some_and(|msg| msg.supported) {
            return false;
        }
        let mut r = Reader {
            t: self,
            links,
            caps,
            entered: 0,
        };
        let mut at = Cur { b: payload, i: 0 };
        r.message(&mut at, m, Some(0), payload.len(), 0).is_ok()
    }
}

/// One [`Plan`]'s trie nodes for the fields of a [`Tables`]' message
/// types, looked up once (by field name, which per field and record was
/// about a fifth of a record's CPU): per message type, per trie node it can
/// be read at, each field's child node and slot, and the defaults to set.
#[derive(Debug, Default)]
pub(crate) struct Links {
    at: Vec<Vec<At>>,
    /// Whether the file's first message is the type every record must
    /// have (or none is required): then an index array `[0]` needs no
    /// name compared per record ([`super::IndexedFile::capture`]).
    pub(super) first_expected: bool,
}

/// Message type `m` read at trie node `node`.
#[derive(Debug)]
struct At {
    node: usize,
    /// Per field, in the type's field order.
    kids: Box<[Kid]>,
    /// (field index, slot) of the fields without presence a rule reads:
    /// their defaults are set before the fields are read.
    defaults: Box<[(usize, usize)]>,
    /// Their bits (fields below 64), as `seen` sets them: when all are
    /// seen, no default is set.
    defaulted: u64,
}

#[derive(Debug, Clone, Copy)]
struct Kid {
    node: Option<usize>,
    slot: Option<usize>,
}

impl Kid {
    /// A field no rule reads, at no node.
    const NONE: Kid = Kid {
        node: None,
        slot: None,
    };
}

impl Links {
    /// Every type read at the root (an index array may name any of them),
    /// and every nested type at each node a rule reaches it by.
    pub(crate) fn new(t: &Tables, plan: &Plan) -> Links {
        let mut at: Vec<Vec<At>> = (0..t.msgs.len()).map(|_| Vec::new()).collect();
        let mut todo: Vec<(usize, usize)> = (0..t.msgs.len()).map(|m| (m, 0)).collect();
        while let Some((m, node)) = todo.pop() {
            if at[m].iter().any(|e| e.node == node) {
                continue;
            }
            let fields = &t.msgs[m].fields;
            let kids: Box<[Kid]> = (fields.iter())
                .map(|f| {
                    let child = plan.key_child(node, &f.name);
                    Kid {
                        node: child,
                        slot: child.and_then(|c| plan.slot(c)),
                    }
                })
                .collect();
            for (f, kid) in fields.iter().zip(kids.iter()) {
                if let (K::Message(inner), Some(k)) = (&f.kind, kid.node) {
                    todo.push((*inner, k));
                }
            }
            let defaults: Box<[(usize, usize)]> = (fields.iter().zip(kids.iter()).enumerate())
                .filter_map(|(i, (f, kid))| Some((i, kid.slot.filter(|_| f.default.is_some())?)))
                .collect();
            let defaulted = (defaults.iter())
                .filter(|&&(fi, _)| fi < 64)
                .fold(0u64, |bits, &(fi, _)| bits | 1 << fi);
            at[m].push(At {
                node,
                kids,
                defaults,
                defaulted,
            });
        }
        Links {
            at,
            first_expected: false,
        }
    }

    /// Message type `m` read at `node`.
    fn get(&self, m: usize, node: usize) -> Option<&At> {
        self.at.get(m)?.iter().find(|e| e.node == node)
    }
}

fn enum_name(names: &[(i32, String)], n: i32) -> Option<&str> {
    names
        .binary_search_by_key(&n, |e| e.0)
        .ok()
        .map(|i| names[i].1.as_str())
}

/// The fast path stops: the full decoder must decide.
struct GiveUp;

type Read<T> = Result<T, GiveUp>;

struct Reader<'p, 'c, 'a> {
    t: &'a Tables,
    links: &'p Links,
    caps: &'c mut Captures<'a>,
    /// Trie nodes of nested messages entered so far (bit per node < 128).
    entered: u128,
}

/// Where a message is read: its bytes and the position in them. A reader
/// works on its own copy (`Reader::message`), so the position stays in a
/// register instead of being stored at every byte read.
#[derive(Clone, Copy)]
struct Cur<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cur<'a> {
    /// A varint as prost reads it: at most 10 bytes, the 10th at most 1.
    #[inline(always)]
    fn varint(&mut self) -> Read<u64> {
        varint_at(self.b, &mut self.i, Tenth::ZeroOrOne).ok_or(GiveUp)
    }

    #[inline(always)]
    fn take(&mut self, n: usize, end: usize) -> Read<&'a [u8]> {
        let stop = self.i.checked_add(n).filter(|&s| s <= end).ok_or(GiveUp)?;
        let s = self.b.get(self.i..stop).ok_or(GiveUp)?;
        self.i = stop;
        Ok(s)
    }

    #[inline(always)]
    fn fixed<const N: usize>(&mut self, end: usize) -> Read<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, end)?);
        Ok(a)
    }

    #[inline(always)]
    fn len(&mut self, end: usize) -> Read<usize> {
        let n = usize::try_from(self.varint()?).map_err(|_| GiveUp)?;
        match end.checked_sub(self.i) {
            Some(left) if n <= left => Ok(n),
            _ => Err(GiveUp),
        }
    }

    /// An unknown field's value.
    fn skip(&mut self, wire: u8, end: usize) -> Read<()> {
        match wire {
            0 => {
                self.varint()?;
            }
            1 => {
                self.take(8, end)?;
            }
            2 => {
                let n = self.len(end)?;
                self.take(n, end)?;
            }
            5 => {
                self.take(4, end)?;
            }
            _ => return Err(GiveUp),
        }
        Ok(())
    }
}

impl<'a> Reader<'_, '_, 'a> {
    /// The fields of message `m` (trie node `node`) up to byte `end`.
    fn message(
        &mut self,
        at: &mut Cur<'a>,
        m: usize,
        node: Option<usize>,
        end: usize,
        depth: usize,
    ) -> Read<()> {
        let mut cur = *at;
        self.fields(&mut cur, m, node, end, depth)?;
        *at = cur;
        Ok(())
    }

    /// [`Self::message`] on the reader's own copy of the position.
    #[inline(always)]
    fn fields(
        &mut self,
        cur: &mut Cur<'a>,
        m: usize,
        node: Option<usize>,
        end: usize,
        depth: usize,
    ) -> Read<()> {
        let t = self.t;
        let msg = t.msgs.get(m).ok_or(GiveUp)?;
        let mut kids: &[Kid] = &[];
        let (mut defaults, mut defaulted): (&[(usize, usize)], u64) = (&[], 0);
        // Defaults go to the fields a rule reads that the message left out,
        // once it is read; a message with more fields than `seen` has bits
        // gets them first, to be replaced as fields are read.
        let early = msg.fields.len() > 64;
        let mut seen = 0u64;
        if let Some(n) = node {
            if n != 0 {
                // prost merges a repeated message field; not followed here.
                let bit = 1u128
                    .checked_shl(n as u32)
                    .filter(|&b| b != 0)
                    .ok_or(GiveUp)?;
                if self.entered & bit != 0 {
                    return Err(GiveUp);
                }
                self.entered |= bit;
            }
            let at = self.links.get(m, n).ok_or(GiveUp)?;
            (kids, defaults, defaulted) = (&at.kids, &at.defaults, at.defaulted);
            if early {
                self.defaults(msg, defaults, 0);
            }
        }
        while cur.i < end {
            // Most keys are one byte naming a known field with the wire
            // type its values have: found by that byte alone.
            let by_key = (cur.b.get(cur.i))
                .and_then(|&k| msg.by_key.get(usize::from(k)))
                .map_or(0, |&f| usize::from(f));
            let (fi, f, wire) = match by_key.checked_sub(1) {
                Some(fi) => {
                    cur.i += 1;
                    let f = msg.fields.get(fi).ok_or(GiveUp)?;
                    (fi, f, f.wire)
                }
                None => {
                    let key = cur.varint()?;
                    let number = u32::try_from(key >> 3).map_err(|_| GiveUp)?;
                    if number == 0 || key > u64::from(u32::MAX) {
                        return Err(GiveUp);
                    }
                    let wire = (key & 7) as u8;
                    match msg.field(number) {
                        Ok(fi) => (fi, msg.fields.get(fi).ok_or(GiveUp)?, wire),
                        Err(_) => {
                            cur.skip(wire, end)?;
                            continue;
                        }
                    }
                }
            };
            seen |= 1u64 << (fi & 63);
            let kid = kids.get(fi).unwrap_or(&Kid::NONE);
            self.field(cur, f, wire, kid, end, depth)?
        }
        if cur.i != end {
            return Err(GiveUp);
        }
        // (Without `early`, every field index is below 64: all have bits.)
        if !early && seen & defaulted != defaulted {
            self.defaults(msg, defaults, seen);
        }
        Ok(())
    }

    /// The defaults of `defaults` (field index, slot) whose field's bit is
    /// not set in `seen`.
    fn defaults(&mut self, msg: &'a Msg, defaults: &[(usize, usize)], seen: u64) {
        for &(fi, slot) in defaults {
            if fi < 64 && seen & (1 << fi) != 0 {
                continue;
            }
            if let Some(d) = msg.fields.get(fi).and_then(|f| f.default.as_ref()) {
                self.caps.set(slot, def(d));
            }
        }
    }

    #[inline(always)]
    fn field(
        &mut self,
        cur: &mut Cur<'a>,
        f: &'a Field,
        wire: u8,
        kid: &Kid,
        end: usize,
        depth: usize,
    ) -> Read<()> {
        let &Kid { node: child, slot } = kid;
        if wire != f.wire {
            return Err(GiveUp);
        }
        let v = match &f.kind {
            K::Int32 => Captured::Number((cur.varint()? as i32).into()),
            K::Int64 => Captured::Number((cur.varint()? as i64).into()),
            K::Uint32 => Captured::Number((cur.varint()? as u32).into()),
            K::Uint64 => Captured::Number(cur.varint()?.into()),
            K::Sint32 => {
                let n = cur.varint()? as u32;
                Captured::Number((((n >> 1) as i32) ^ -((n & 1) as i32)).into())
            }
            K::Sint64 => {
                let n = cur.varint()?;
                Captured::Number((((n >> 1) as i64) ^ -((n & 1) as i64)).into())
            }
            K::Bool => Captured::Bool(cur.varint()? != 0),
            K::Fixed32 => Captured::Number(u32::from_le_bytes(cur.fixed(end)?).into()),
            K::Sfixed32 => Captured::Number(i32::from_le_bytes(cur.fixed(end)?).into()),
            K::Fixed64 => Captured::Number(u64::from_le_bytes(cur.fixed(end)?).into()),
            K::Sfixed64 => Captured::Number(i64::from_le_bytes(cur.fixed(end)?).into()),
            K::Float => {
                let x = f64::from(f32::from_le_bytes(cur.fixed(end)?));
                Captured::Number(Number::from_f64(x).ok_or(GiveUp)?)
            }
            K::Double => {
                let x = f64::from_le_bytes(cur.fixed(end)?);
                Captured::Number(Number::from_f64(x).ok_or(GiveUp)?)
            }
            K::Str => {
                let n = cur.len(end)?;
                let b = cur.take(n, end)?;
                if slot.is_none() {
                    // No rule reads it: only whether it is text matters.
                    return if is_utf8(b) { Ok(()) } else { Err(GiveUp) };
                }
                let s = simdutf8::basic::from_utf8(b).map_err(|_| GiveUp)?;
                Captured::Str(s)
            }
            K::Bytes => {
                let n = cur.len(end)?;
                let b = cur.take(n, end)?;
                // Base64 text, as the full path shows bytes to rules.
                if let Some(s) = slot {
                    self.caps.set_owned(s, BASE64.encode(b));
                }
                return Ok(());
            }
            K::Enum(names) => {
                let n = cur.varint()? as i32;
                match enum_name(names, n) {
                    Some(name) => Captured::Str(name),
                    None => Captured::Number(n.into()),
                }
            }
            K::Message(m) => {
                if slot.is_some() || depth >= MAX_DEPTH {
                    return Err(GiveUp);
                }
                let n = cur.len(end)?;
                let stop = cur.i + n;
                return self.message(cur, *m, child, stop, depth + 1);
            }
        };
        if let Some(s) = slot {
            self.caps.set(s, v);
        }
        Ok(())
    }
}

fn def(d: &Def) -> Captured<'_> {
    match d {
        Def::Bool(b) => Captured::Bool(*b),
        Def::Num(n) => Captured::Number(n.clone()),
        Def::Str(s) => Captured::Str(s),
    }
}
