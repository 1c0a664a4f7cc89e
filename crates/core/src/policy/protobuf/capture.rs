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
use prost_reflect::{Kind, MessageDescriptor, Value as P};
use serde_json::Number;

use crate::policy::json::{Captured, Captures, Plan};
use crate::policy::wire::{is_utf8, varint_at, Tenth};

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

#[derive(Debug)]
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
    /// Tables for `roots` and every message type they reach.
    pub(crate) fn compile(roots: impl IntoIterator<Item = MessageDescriptor>) -> Tables {
        let mut t = Tables::default();
        let mut todo: Vec<MessageDescriptor> = roots.into_iter().collect();
        let mut descs = Vec::new();
        while let Some(d) = todo.pop() {
            if t.by_name.contains_key(d.full_name()) {
                continue;
            }
            t.by_name.insert(d.full_name().to_string(), descs.len());
            todo.extend(d.child_messages());
            for f in d.fields() {
                if let Kind::Message(m) = f.kind() {
                    todo.push(m);
                }
            }
            descs.push(d);
        }
        t.msgs = descs.iter().map(|d| t.message(d)).collect();
        // A message is read only if every message type it holds is.
        loop {
            let before: Vec<bool> = t.msgs.iter().map(|m| m.supported).collect();
            for m in &mut t.msgs {
                m.supported &= m.fields.iter().all(|f| match f.kind {
                    K::Message(i) => before.get(i).copied().unwrap_or(false),
                    _ => true,
                });
            }
            if t.msgs.iter().map(|m| m.supported).eq(before) {
                break;
            }
        }
        t
    }

    fn message(&self, d: &MessageDescriptor) -> Msg {
        let mut supported = d.extensions().len() == 0;
        let mut fields = Vec::new();
        for f in d.fields() {
            let synthetic = f.containing_oneof().is_none_or(|o| o.is_synthetic());
            if f.is_list() || f.is_map() || f.is_group() || !synthetic {
                supported = false;
                continue;
            }
            let kind = match f.kind() {
                Kind::Int32 => K::Int32,
                Kind::Sint32 => K::Sint32,
                Kind::Sfixed32 => K::Sfixed32,
                Kind::Int64 => K::Int64,
                Kind::Sint64 => K::Sint64,
                Kind::Sfixed64 => K::Sfixed64,
                Kind::Uint32 => K::Uint32,
                Kind::Fixed32 => K::Fixed32,
                Kind::Uint64 => K::Uint64,
                Kind::Fixed64 => K::Fixed64,
                Kind::Float => K::Float,
                Kind::Double => K::Double,
                Kind::Bool => K::Bool,
                Kind::String => K::Str,
                Kind::Bytes => K::Bytes,
                Kind::Enum(e) => {
                    let mut names: Vec<(i32, String)> = e
                        .values()
                        .map(|v| (v.number(), v.name().to_string()))
                        .collect();
                    names.sort_by_key(|n| n.0);
                    let count = names.len();
                    names.dedup_by_key(|n| n.0);
                    if names.len() != count {
                        // Aliases: which name the full path shows is the
                        // descriptor's binary search's choice.
                        supported = false;
                    }
                    K::Enum(names)
                }
                Kind::Message(m) => match self.by_name.get(m.full_name()) {
                    Some(&i) => K::Message(i),
                    None => {
                        supported = false;
                        continue;
                    }
                },
            };
            let default = if f.supports_presence() {
                None
            } else {
                match default(&f.default_value(), &kind) {
                    Some(d) => Some(d),
                    None => {
                        supported = false;
                        continue;
                    }
                }
            };
            let wire = match kind {
                K::Float | K::Fixed32 | K::Sfixed32 => 5,
                K::Double | K::Fixed64 | K::Sfixed64 => 1,
                K::Str | K::Bytes | K::Message(_) => 2,
                _ => 0,
            };
            fields.push(Field {
                number: f.number(),
                name: f.name().to_string(),
                kind,
                wire,
                default,
            });
        }
        fields.sort_by_key(|f| f.number);
        let mut by_key = Box::new([0u16; 128]);
        for (i, f) in fields.iter().enumerate() {
            let key = (f.number << 3) | u32::from(f.wire);
            if let (Some(slot), Ok(index)) = (by_key.get_mut(key as usize), u16::try_from(i + 1)) {
                *slot = index;
            }
        }
        Msg {
            fields,
            supported,
            by_key,
        }
    }

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
            b: payload,
            i: 0,
            links,
            caps,
            entered: 0,
        };
        r.message(m, Some(0), payload.len(), 0).is_ok()
    }
}

/// One [`Plan`]'s trie nodes for the fields of a [`Tables`]' message
/// types, looked up once (by field name, which per field and record was
/// about a fifth of a record's CPU): per message type, per trie node it can
/// be read at, each field's child node and slot, and the defaults to set.
#[derive(Debug, Default)]
pub(crate) struct Links {
    at: Vec<Vec<At>>,
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

#[derive(Debug, Default, Clone, Copy)]
struct Kid {
    node: Option<usize>,
    slot: Option<usize>,
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
        Links { at }
    }

    /// Message type `m` read at `node`.
    fn get(&self, m: usize, node: usize) -> Option<&At> {
        self.at.get(m)?.iter().find(|e| e.node == node)
    }
}

/// The JSON a field without presence shows when absent.
fn default(v: &P, kind: &K) -> Option<Def> {
    Some(match (v, kind) {
        (P::Bool(b), _) => Def::Bool(*b),
        (P::I32(i), _) => Def::Num((*i).into()),
        (P::I64(i), _) => Def::Num((*i).into()),
        (P::U32(i), _) => Def::Num((*i).into()),
        (P::U64(i), _) => Def::Num((*i).into()),
        (P::F32(x), _) => Def::Num(Number::from_f64(f64::from(*x))?),
        (P::F64(x), _) => Def::Num(Number::from_f64(*x)?),
        (P::String(s), _) => Def::Str(s.clone()),
        (P::Bytes(b), _) => Def::Str(BASE64.encode(b)),
        (P::EnumNumber(n), K::Enum(names)) => match enum_name(names, *n) {
            Some(name) => Def::Str(name.to_string()),
            None => Def::Num((*n).into()),
        },
        _ => return None,
    })
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
    b: &'a [u8],
    i: usize,
    links: &'p Links,
    caps: &'c mut Captures<'a>,
    /// Trie nodes of nested messages entered so far (bit per node < 128).
    entered: u128,
}

impl<'a> Reader<'_, '_, 'a> {
    /// A varint as prost reads it: at most 10 bytes, the 10th at most 1.
    #[inline(always)]
    fn varint(&mut self) -> Read<u64> {
        varint_at(self.b, &mut self.i, Tenth::ZeroOrOne).ok_or(GiveUp)
    }

    fn take(&mut self, n: usize, end: usize) -> Read<&'a [u8]> {
        let stop = self.i.checked_add(n).filter(|&s| s <= end).ok_or(GiveUp)?;
        let s = &self.b[self.i..stop];
        self.i = stop;
        Ok(s)
    }

    fn fixed<const N: usize>(&mut self, end: usize) -> Read<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, end)?);
        Ok(a)
    }

    fn len(&mut self, end: usize) -> Read<usize> {
        let n = usize::try_from(self.varint()?).map_err(|_| GiveUp)?;
        match end.checked_sub(self.i) {
            Some(left) if n <= left => Ok(n),
            _ => Err(GiveUp),
        }
    }

    /// The fields of message `m` (trie node `node`) up to byte `end`.
    fn message(&mut self, m: usize, node: Option<usize>, end: usize, depth: usize) -> Read<()> {
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
        while self.i < end {
            // Most keys are one byte naming a known field with the wire
            // type its values have: found by that byte alone.
            let by_key = (self.b.get(self.i))
                .and_then(|&k| msg.by_key.get(usize::from(k)))
                .map_or(0, |&f| usize::from(f));
            let (fi, wire) = match by_key.checked_sub(1) {
                Some(fi) => {
                    self.i += 1;
                    (fi, msg.fields.get(fi).ok_or(GiveUp)?.wire)
                }
                None => {
                    let key = self.varint()?;
                    let number = u32::try_from(key >> 3).map_err(|_| GiveUp)?;
                    if number == 0 || key > u64::from(u32::MAX) {
                        return Err(GiveUp);
                    }
                    let wire = (key & 7) as u8;
                    match msg.field(number) {
                        Ok(fi) => (fi, wire),
                        Err(_) => {
                            self.skip(wire, end)?;
                            continue;
                        }
                    }
                }
            };
            seen |= 1u64 << (fi & 63);
            let kid = kids.get(fi).copied().unwrap_or_default();
            self.field(&msg.fields[fi], wire, kid, end, depth)?
        }
        if self.i != end {
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

    fn field(&mut self, f: &'a Field, wire: u8, kid: Kid, end: usize, depth: usize) -> Read<()> {
        let Kid { node: child, slot } = kid;
        if wire != f.wire {
            return Err(GiveUp);
        }
        let v = match &f.kind {
            K::Int32 => Captured::Number((self.varint()? as i32).into()),
            K::Int64 => Captured::Number((self.varint()? as i64).into()),
            K::Uint32 => Captured::Number((self.varint()? as u32).into()),
            K::Uint64 => Captured::Number(self.varint()?.into()),
            K::Sint32 => {
                let n = self.varint()? as u32;
                Captured::Number((((n >> 1) as i32) ^ -((n & 1) as i32)).into())
            }
            K::Sint64 => {
                let n = self.varint()?;
                Captured::Number((((n >> 1) as i64) ^ -((n & 1) as i64)).into())
            }
            K::Bool => Captured::Bool(self.varint()? != 0),
            K::Fixed32 => Captured::Number(u32::from_le_bytes(self.fixed(end)?).into()),
            K::Sfixed32 => Captured::Number(i32::from_le_bytes(self.fixed(end)?).into()),
            K::Fixed64 => Captured::Number(u64::from_le_bytes(self.fixed(end)?).into()),
            K::Sfixed64 => Captured::Number(i64::from_le_bytes(self.fixed(end)?).into()),
            K::Float => {
                let x = f64::from(f32::from_le_bytes(self.fixed(end)?));
                Captured::Number(Number::from_f64(x).ok_or(GiveUp)?)
            }
            K::Double => {
                let x = f64::from_le_bytes(self.fixed(end)?);
                Captured::Number(Number::from_f64(x).ok_or(GiveUp)?)
            }
            K::Str => {
                let n = self.len(end)?;
                let b = self.take(n, end)?;
                if slot.is_none() {
                    // No rule reads it: only whether it is text matters.
                    return if is_utf8(b) { Ok(()) } else { Err(GiveUp) };
                }
                let s = simdutf8::basic::from_utf8(b).map_err(|_| GiveUp)?;
                Captured::Str(s)
            }
            K::Bytes => {
                let n = self.len(end)?;
                let b = self.take(n, end)?;
                // Base64 text, as the full path shows bytes to rules.
                if let Some(s) = slot {
                    self.caps.set_owned(s, BASE64.encode(b));
                }
                return Ok(());
            }
            K::Enum(names) => {
                let n = self.varint()? as i32;
                match enum_name(names, n) {
                    Some(name) => Captured::Str(name),
                    None => Captured::Number(n.into()),
                }
            }
            K::Message(m) => {
                if slot.is_some() || depth >= MAX_DEPTH {
                    return Err(GiveUp);
                }
                let n = self.len(end)?;
                let stop = self.i + n;
                return self.message(*m, child, stop, depth + 1);
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
