//! Protobuf values: `.proto` files compiled in-process with `protox` at load
//! (no protoc), decoded with `prost-reflect`, then turned into a
//! `serde_json::Value` keyed by proto field names (not lowerCamelCase), with
//! 64-bit integers as numbers, enums as their names (the number when
//! unknown), bytes as base64 text. Fields without presence (proto3
//! scalars) appear with their default value, so `lat: 0` is not "missing".
//!
//! Wire: `raw` (the message alone, type from `message`) or `confluent`
//! (magic 0, schema id, zigzag varint message-index array — a single 0 for
//! the first message — then the message).

use std::collections::HashMap;
use std::path::Path;

use base64::{engine::general_purpose::STANDARD as BASE64, Engine};
use prost_reflect::{
    DescriptorPool, DynamicMessage, FileDescriptor, Kind, MessageDescriptor, ReflectMessage,
};
use serde_json::{Map, Number, Value};

use super::json::{Captures, Plan};
use super::wire::{confluent_header, unknown_id, Wire};
use super::Invalid;

mod bound;
mod capture;
mod format;
mod indexes;

pub(crate) use capture::Links;
pub use capture::Tables;
pub use indexes::IndexedFile;

#[derive(Debug)]
pub(crate) struct ProtoDecoder {
    pub(crate) wire: Wire,
    /// The message type for `raw`; for `confluent`, the type every record must have (if set).
    pub(crate) message: Option<MessageDescriptor>,
    /// The full name of the type every Confluent-framed record must have
    /// (`message`'s, or with `registry: true` the name `message` gives).
    pub(crate) expected: Option<String>,
    /// For `confluent`, the file of each schema id, with its own tables (ids
    /// are separate schema versions, which may reuse type names), and the
    /// fast path's trie nodes for it once there is a plan. Looked up per
    /// record: sorted by id and binary-searched, as Avro's are (a policy
    /// lists a few; a hash map's lookup, out of line, cost ~36
    /// instructions per record, SipHash 5 % of a record's CPU).
    ids: Vec<(u32, IndexedFile, Links)>,
    /// The fast path ([`Self::capture`]), set at load with the rules'
    /// pointers: the plan, and for `raw` the tables of `message`.
    fast: Option<Fast>,
}

#[derive(Debug)]
struct Fast {
    plan: Plan,
    raw: Tables,
    /// `plan`'s nodes for `raw`.
    raw_links: Links,
}

/// Compile a `.proto` file (imports resolved from its own folder).
pub(crate) fn load_file(path: &Path) -> Result<(DescriptorPool, FileDescriptor), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: not a file name", path.display()))?;
    let mut compiler =
        protox::Compiler::new([dir]).map_err(|e| format!("{}: {e}", path.display()))?;
    compiler.include_imports(true);
    compiler
        .open_file(name)
        .map_err(|e| compile_error(path, name, &e))?;
    let pool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(name)
        .ok_or_else(|| format!("{}: compiled, but the file is missing", path.display()))?;
    Ok((pool, file))
}

/// `file.proto:3:7: does not compile: name 'strin' is not defined`, with the
/// position inside the .proto file when protox gives one.
fn compile_error(path: &Path, name: &str, e: &protox::Error) -> String {
    use miette::Diagnostic;
    let offset = e.labels().and_then(|mut l| l.next()).map(|l| l.offset());
    let pos = match (e.file(), offset) {
        (Some(f), Some(off)) if f == name => std::fs::read_to_string(path)
            .ok()
            .map(|text| {
                let before = &text.as_bytes()[..off.min(text.len())];
                let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
                let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
                format!(":{line}:{col}")
            })
            .unwrap_or_default(),
        _ => String::new(),
    };
    format!("{}{pos}: does not compile: {e}", path.display())
}

impl ProtoDecoder {
    pub(crate) fn new(
        wire: Wire,
        message: Option<MessageDescriptor>,
        ids: HashMap<u32, IndexedFile>,
    ) -> ProtoDecoder {
        ProtoDecoder {
            wire,
            expected: message.as_ref().map(|m| m.full_name().to_string()),
            message,
            ids: {
                let mut ids: Vec<_> = (ids.into_iter())
                    .map(|(id, file)| (id, file, Links::default()))
                    .collect();
                ids.sort_unstable_by_key(|(id, ..)| *id);
                ids
            },
            fast: None,
        }
    }

    /// The file of schema id `id` and its fast path's nodes.
    #[inline(always)]
    fn file(&self, id: u32) -> Option<(&IndexedFile, &Links)> {
        let i = self.ids.binary_search_by_key(&id, |(k, ..)| *k).ok()?;
        self.ids.get(i).map(|(_, file, links)| (file, links))
    }

    /// Compile the fast path for the rules' pointers.
    pub(crate) fn set_plan(&mut self, plan: Plan) {
        let raw = match (self.wire, &self.message) {
            (Wire::Raw, Some(m)) => Tables::compile([m.clone()]),
            _ => Tables::default(),
        };
        let raw_links = Links::new(&raw, &plan);
        for (_, file, links) in self.ids.iter_mut() {
            *links = file.links(&plan, self.expected.as_deref());
        }
        self.fast = Some(Fast {
            plan,
            raw,
            raw_links,
        });
    }

    #[cfg(test)]
    pub(crate) fn plan(&self) -> Option<&Plan> {
        self.fast.as_ref().map(|f| &f.plan)
    }

    /// The rules' values read straight from the message, or `None` when
    /// the full decoder ([`Self::decode`]) must judge it.
    /// Filled into `caps` (sized by [`Self::slot_count`]); false: decode it.
    #[inline(always)]
    pub(crate) fn capture<'a>(&'a self, bytes: &'a [u8], caps: &mut Captures<'a>) -> bool {
        let Some(fast) = self.fast.as_ref() else {
            return false;
        };
        match self.wire {
            Wire::Raw => match self.message.as_ref() {
                Some(m) => (fast.raw).capture(m, bytes, &fast.raw_links, caps),
                None => false,
            },
            Wire::Confluent | Wire::ApicurioHeaders | Wire::Apicurio8Byte | Wire::Apicurio4Byte => {
                let Ok((id, rest)) = confluent_header(bytes) else {
                    return false;
                };
                match self.file(id) {
                    Some((file, links)) => file.capture(rest, self.expected(), links, caps),
                    None => false,
                }
            }
        }
    }

    /// The capture slots [`Self::capture`] fills (0 without a fast path).
    pub(crate) fn slot_count(&self) -> usize {
        self.fast.as_ref().map_or(0, |f| f.plan.slots())
    }

    /// The full name of the type every Confluent-framed record must have.
    pub(crate) fn expected(&self) -> Option<&str> {
        self.expected.as_deref()
    }

    pub(crate) fn decode(&self, bytes: &[u8]) -> Result<Value, Invalid> {
        match self.wire {
            Wire::Raw => match &self.message {
                Some(m) => decode_message(m.clone(), bytes),
                None => Err(Invalid::poison("decode", "no Protobuf message type")),
            },
            // Apicurio's wires are registry-only: never a file decoder's.
            Wire::Confluent | Wire::ApicurioHeaders | Wire::Apicurio8Byte | Wire::Apicurio4Byte => {
                let (id, rest) = confluent_header(bytes)?;
                let (file, _) = self.file(id).ok_or_else(|| unknown_id(id))?;
                file.decode(rest, self.expected())
            }
        }
    }
}

/// A Confluent-framed message's type must be the one the policy expects.
pub(crate) fn check_type_name(
    desc: &MessageDescriptor,
    expected: Option<&str>,
) -> Result<(), Invalid> {
    if let Some(expected) = expected {
        if expected != desc.full_name() {
            return Err(Invalid::poison(
                "schema",
                format!(
                    "value is a {}, this topic expects {expected}",
                    desc.full_name(),
                ),
            ));
        }
    }
    Ok(())
}

/// Decode `payload` as a `desc` message, as JSON.
pub(crate) fn decode_message(desc: MessageDescriptor, payload: &[u8]) -> Result<Value, Invalid> {
    let msg = DynamicMessage::decode(desc, payload)
        .map_err(|e| Invalid::poison("decode", format!("value is not valid Protobuf: {e}")))?;
    // Unset fields become defaults: bounded by the message's bytes first.
    bound::check(&msg, payload.len())?;
    message_to_json(&msg).map_err(|r| Invalid::poison("decode", r))
}

/// Convert a decoded message. Errors name the field path (`/a/b: ...`),
/// built only on the error path so valid records allocate no paths.
fn message_to_json(msg: &DynamicMessage) -> Result<Value, String> {
    let desc = msg.descriptor();
    let mut out = Map::new();
    for field in desc.fields() {
        if field.supports_presence() && !msg.has_field(&field) {
            continue;
        }
        let v = msg.get_field(&field);
        let kind = field.kind();
        let json = if field.is_map() {
            let value_kind = match &kind {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                _ => kind.clone(),
            };
            value_to_json(v.as_ref(), &value_kind)
        } else {
            value_to_json(v.as_ref(), &kind)
        }
        .map_err(|e| format!("/{}{e}", field.name()))?;
        out.insert(field.name().to_string(), json);
    }
    Ok(Value::Object(out))
}

fn map_key(k: &prost_reflect::MapKey) -> String {
    use prost_reflect::MapKey as K;
    match k {
        K::Bool(b) => b.to_string(),
        K::I32(i) => i.to_string(),
        K::I64(i) => i.to_string(),
        K::U32(i) => i.to_string(),
        K::U64(i) => i.to_string(),
        K::String(s) => s.clone(),
    }
}

fn float(x: f64) -> Result<Value, String> {
    Number::from_f64(x)
        .map(Value::Number)
        .ok_or_else(|| format!(": {x} is not a finite number"))
}

/// Convert one value of `kind` (for maps: the value kind).
fn value_to_json(v: &prost_reflect::Value, kind: &Kind) -> Result<Value, String> {
    use prost_reflect::Value as P;
    Ok(match v {
        P::Bool(b) => Value::Bool(*b),
        P::I32(i) => Value::from(*i),
        P::I64(i) => Value::from(*i),
        P::U32(i) => Value::from(*i),
        P::U64(i) => Value::from(*i),
        P::F32(x) => float(f64::from(*x))?,
        P::F64(x) => float(*x)?,
        P::String(s) => Value::String(s.clone()),
        // As base64 text, one byte of JSON per 0.75 input bytes; an array of
        // numbers cost ~32 bytes per input byte.
        P::Bytes(b) => Value::String(BASE64.encode(b)),
        P::EnumNumber(n) => match kind.as_enum().and_then(|e| e.get_value(*n)) {
            Some(ev) => Value::String(ev.name().to_string()),
            None => Value::from(*n),
        },
        P::Message(m) => message_to_json(m)?,
        P::List(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| value_to_json(x, kind).map_err(|e| format!("/{i}{e}")))
                .collect::<Result<_, _>>()?,
        ),
        P::Map(m) => {
            let mut obj = Map::new();
            for (k, val) in m {
                let key = map_key(k);
                let json = value_to_json(val, kind).map_err(|e| format!("/{key}{e}"))?;
                obj.insert(key, json);
            }
            Value::Object(obj)
        }
    })
}
