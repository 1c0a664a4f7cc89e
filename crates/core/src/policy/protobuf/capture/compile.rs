//! Compiling the fast path's tables from descriptors, once per file: per
//! message type, its fields by number and by one-byte key, with their kind,
//! wire type, presence and default.

use base64::{engine::general_purpose::STANDARD as BASE64, Engine};
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor, Value as P};
use serde_json::Number;

use super::{enum_name, Def, Field, Msg, Tables, K};

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
            let Some((kind, exact)) = self.kind(&f) else {
                supported = false;
                continue;
            };
            supported &= exact;
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

    /// The tables' kind of field `f` and whether the fast path shows it as
    /// the full decoder does (an enum with aliases: not always); `None`
    /// for a message type the tables do not hold.
    fn kind(&self, f: &FieldDescriptor) -> Option<(K, bool)> {
        Some((
            match f.kind() {
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
                    // Aliases: which name the full path shows is the
                    // descriptor's binary search's choice.
                    let exact = names.len() == count;
                    return Some((K::Enum(names), exact));
                }
                Kind::Message(m) => K::Message(*self.by_name.get(m.full_name())?),
            },
            true,
        ))
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
