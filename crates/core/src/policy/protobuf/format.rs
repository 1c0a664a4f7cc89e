//! The `protobuf` record format: its policy keys (`schema`: a `.proto`
//! compiled in-process; `message`: the type; `schema_ids` for
//! `confluent`), its fast path (the rules' fields read by field number
//! through tables compiled per file) and its registered schemas (`.proto`
//! text or a base64 `FileDescriptorProto`, with imports as references).

use std::collections::HashMap;
use std::path::Path;

use prost_reflect::FileDescriptor;
use serde_json::Value;

use super::{check_type_name, decode_message, load_file, IndexedFile, Links, ProtoDecoder};
use crate::policy::compile::schema_path;
use crate::policy::document::ValueDoc;
use crate::policy::format::{Format, OwnSchema, Verdict};
use crate::policy::json::{Captures, Plan};
use crate::policy::located::{at, At};
use crate::policy::located::{errors_or, not_for};
use crate::policy::registry::{Reference, Registered};
use crate::policy::rules::Pointer;
use crate::policy::wire::{check_file_wire, varint_at, Tenth, Wire};
use crate::policy::Invalid;

impl Format for ProtoDecoder {
    const SCHEMA_TYPE: Option<&'static str> = Some("PROTOBUF");
    const CAPTURES_REGISTERED: bool = true;
    const APICURIO_SAME_DATUM: bool = false;
    type Program = Links;

    fn compile(v: &ValueDoc, base: &Path, registry: bool) -> Result<(Self, OwnSchema), Vec<At>> {
        let mut errs = Vec::new();
        not_for(
            &mut errs,
            &v.max_depth,
            "value.max_depth: applies to format json only",
        );
        if registry {
            not_for(&mut errs, &v.schema, "value.schema: with `registry: true` the .proto comes from the registry; name the type with `message`");
            let mut d = ProtoDecoder::new(Wire::Confluent, None, HashMap::new());
            d.expected = (v.message.as_ref()).map(|m| m.v.trim_start_matches('.').to_string());
            return errors_or(errs, (d, None));
        }
        let wire = check_file_wire(v, &mut errs);
        let mut pools = Vec::new();
        if let Some(s) = &v.schema {
            match schema_path(base, s, "value.schema", "proto")
                .and_then(|p| load_file(&p).map_err(|m| at(s, format!("value.schema: {m}"))))
            {
                Ok(pf) => pools.push(pf),
                Err(e) => errs.push(e),
            }
        } else if wire == Wire::Raw {
            errs.push(at(
                &v.format,
                "value.schema: format protobuf with `wire: raw` needs a .proto schema and a message",
            ));
        }
        let mut ids = HashMap::new();
        for (id, f) in v.schema_ids.iter().flat_map(|m| &m.v) {
            let key = format!("value.schema_ids.{id}");
            match schema_path(base, f, &key, "proto")
                .and_then(|p| load_file(&p).map_err(|m| at(f, format!("{key}: {m}"))))
            {
                Ok((pool, file)) => {
                    ids.insert(*id, IndexedFile::new(file.clone()));
                    pools.push((pool, file));
                }
                Err(e) => errs.push(e),
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        let message = match &v.message {
            None if wire == Wire::Raw => return Err(vec![at(
                &v.format,
                "value.message: format protobuf with `wire: raw` needs the message type (e.g. `message: geo.Trigger`)",
            )]),
            None => None,
            Some(m) => {
                let name = m.v.trim_start_matches('.');
                match pools.iter().find_map(|(pool, _)| pool.get_message_by_name(name)) {
                    Some(d) => Some(d),
                    None => return Err(vec![at(m, format!(
                        "value.message: no message `{name}` in the schema (use the full name, package included)"
                    ))]),
                }
            }
        };
        Ok((ProtoDecoder::new(wire, message, ids), None))
    }

    fn slots(&mut self, pointers: Vec<Pointer>, _checked: bool) {
        self.set_plan(Plan::new(pointers, None));
    }

    #[inline(always)]
    fn capture(
        &self,
        bytes: &[u8],
        check: impl FnOnce(&Captures<'_>) -> Verdict,
    ) -> Option<Verdict> {
        let mut caps = Captures::new(self.slot_count());
        ProtoDecoder::capture(self, bytes, &mut caps).then(|| check(&caps))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Option<Value>, Invalid> {
        ProtoDecoder::decode(self, bytes).map(Some)
    }

    fn compile_registered(text: &str, refs: &[Reference]) -> Result<Registered, String> {
        compile_file(text, refs).map(|f| Registered::Protobuf(IndexedFile::new(f)))
    }

    fn program(&self, schema: &Registered, plan: &Plan) -> Option<Links> {
        match schema {
            Registered::Protobuf(file) => Some(file.links(plan, self.expected())),
            _ => None,
        }
    }

    #[inline(always)]
    fn capture_registered<'a>(
        &'a self,
        schema: &'a Registered,
        links: &'a Links,
        datum: &'a [u8],
        _plan: &Plan,
        caps: &mut Captures<'a>,
    ) -> bool {
        match schema {
            Registered::Protobuf(file) => file.capture(datum, self.expected(), links, caps),
            _ => false,
        }
    }

    fn decode_registered(&self, schema: &Registered, datum: &[u8]) -> Result<Value, Invalid> {
        let Registered::Protobuf(file) = schema else {
            return Err(Invalid::poison("schema", "not a Protobuf schema"));
        };
        file.decode(datum, self.expected())
    }

    /// Apicurio's Protobuf serializers write a length-delimited `Ref`
    /// (field 1: the message type's name) before the message, not
    /// Confluent's index array.
    fn decode_apicurio(&self, schema: &Registered, datum: &[u8]) -> Result<Value, Invalid> {
        let Registered::Protobuf(file) = schema else {
            return Err(Invalid::poison("schema", "not a Protobuf schema"));
        };
        let (name, payload) = type_ref(datum).ok_or_else(|| {
            Invalid::poison(
                "decode",
                "value does not start with Apicurio's Protobuf type reference",
            )
        })?;
        let desc = (file.file().messages())
            .find(|m| m.name() == name || m.full_name() == name)
            .ok_or_else(|| {
                Invalid::poison(
                    "schema",
                    format!("the registered schema has no message `{name}`"),
                )
            })?;
        check_type_name(&desc, self.expected())?;
        decode_message(desc, payload)
    }
}

/// Apicurio's `Ref { string name = 1; }`, length-delimited, at the start
/// of `datum`: the name, and what follows the reference.
fn type_ref(datum: &[u8]) -> Option<(&str, &[u8])> {
    let mut i = 0;
    let len = usize::try_from(varint_at(datum, &mut i, Tenth::ZeroOrOne)?).ok()?;
    let end = i.checked_add(len).filter(|e| *e <= datum.len())?;
    let (mut r, rest) = (&datum[i..end], &datum[end..]);
    let mut name = "";
    while !r.is_empty() {
        let mut j = 0;
        let key = varint_at(r, &mut j, Tenth::ZeroOrOne)?;
        let n = usize::try_from(varint_at(r, &mut j, Tenth::ZeroOrOne)?).ok()?;
        // Only length-delimited fields are expected (field 1, the name).
        let field = r.get(j..j.checked_add(n)?).filter(|_| key & 7 == 2)?;
        if key >> 3 == 1 {
            name = std::str::from_utf8(field).ok()?;
        }
        r = &r[j + n..];
    }
    (!name.is_empty()).then_some((name, rest))
}

/// The name the registered schema's own file gets among its imports.
const MAIN_PROTO: &str = "antidote-registered.proto";

/// A registered `.proto` compiled with its references as imports.
fn compile_file(text: &str, refs: &[Reference]) -> Result<FileDescriptor, String> {
    let mut files = Vec::with_capacity(refs.len() + 1);
    for r in refs {
        files.push(
            proto_file(&r.name, &r.schema).map_err(|e| format!("reference {}: {e}", r.name))?,
        );
    }
    files.push(proto_file(MAIN_PROTO, text)?);
    let mut chain = protox::file::ChainFileResolver::new();
    chain.add(MemoryFiles(files));
    chain.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.include_imports(true);
    compiler
        .open_file(MAIN_PROTO)
        .map_err(|e| format!("does not compile: {e}"))?;
    compiler
        .descriptor_pool()
        .get_file_by_name(MAIN_PROTO)
        .ok_or_else(|| "compiled, but the file is missing".to_string())
}

/// A registered Protobuf schema as a file named `name`: `.proto` text, or
/// (as some registries store what serializers send) a base64
/// `FileDescriptorProto`.
fn proto_file(name: &str, text: &str) -> Result<protox::file::File, String> {
    use base64::Engine;
    use prost::Message;
    let source_err = match protox::file::File::from_source(name, text) {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|_| format!("does not compile: {source_err}"))?;
    let mut proto = prost_reflect::prost_types::FileDescriptorProto::decode(bytes.as_slice())
        .map_err(|_| format!("does not compile: {source_err}"))?;
    proto.name = Some(name.to_string());
    Ok(protox::file::File::from_file_descriptor_proto(proto))
}

/// Protobuf sources held in memory, by import name.
struct MemoryFiles(Vec<protox::file::File>);

impl protox::file::FileResolver for MemoryFiles {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        self.0
            .iter()
            .find(|f| f.name() == name)
            .cloned()
            .ok_or_else(|| protox::Error::file_not_found(name))
    }
}
