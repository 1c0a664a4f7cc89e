//! Compiling the parts of a policy document: the value's decoder and schema
//! (JSON Schema, Avro, Protobuf, with or without the Confluent wire format)
//! and the field rules. Errors carry the position of the value at fault.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::avro::{self, AvroDecoder};
use super::document::*;
use super::json;
use super::judge::Decoder;
use super::located::{at, At, Located};
use super::protobuf::{self, ProtoDecoder};
use super::registered::{RegFormat, RegistryDecoder, Subject};
use super::registry::SchemaCache;
use super::rules::Pointer;
use super::shape::Shape;
use super::wire::Wire;

pub(super) fn ext(p: &Path) -> &str {
    p.extension().and_then(|e| e.to_str()).unwrap_or("")
}

/// Check a schema file's extension against the format, then resolve it.
pub(super) fn schema_path(
    base: &Path,
    l: &Located<PathBuf>,
    key: &str,
    want: &str,
) -> Result<PathBuf, At> {
    let full = base.join(&l.v);
    if ext(&l.v) != want {
        return Err(at(
            l,
            format!(
                "{key}: `{}` should be a .{want} file for this format",
                l.v.display()
            ),
        ));
    }
    if !full.is_file() {
        return Err(at(
            l,
            format!("{key}: schema file {} does not exist", full.display()),
        ));
    }
    Ok(full)
}

pub(super) fn no_key<T>(errs: &mut Vec<At>, l: &Option<Located<T>>, msg: &str) {
    if let Some(l) = l {
        errs.push(at(l, msg));
    }
}

pub(super) fn compile_value(
    v: &ValueDoc,
    base: &Path,
    cache: &Arc<SchemaCache>,
) -> Result<(Decoder, Option<jsonschema::Validator>), Vec<At>> {
    if v.registry.as_ref().is_some_and(|r| r.v) {
        return compile_registry(v, base, cache);
    }
    no_key_errs(&v.subject, "value.subject: needs `registry: true`")?;
    check_value_keys(v)?;
    let wire = v.wire.as_ref().map_or(Wire::Raw, |w| w.v);
    match v.format.v {
        Format::Bytes => Ok((Decoder::Bytes, None)),
        Format::Json => compile_json(v, base),
        Format::Avro => compile_avro(v, base, wire),
        Format::Protobuf => compile_protobuf(v, base, wire),
    }
}

fn no_key_errs<T>(l: &Option<Located<T>>, msg: &str) -> Result<(), Vec<At>> {
    let mut errs = Vec::new();
    no_key(&mut errs, l, msg);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

/// `registry: true`: Confluent framing, the schema by id from the registry.
/// `schema` stays meaningful: Avro's reader schema, or a JSON Schema every
/// JSON value must also meet; Protobuf's `message` names the one type.
fn compile_registry(
    v: &ValueDoc,
    base: &Path,
    cache: &Arc<SchemaCache>,
) -> Result<(Decoder, Option<jsonschema::Validator>), Vec<At>> {
    let mut errs = Vec::new();
    let format = match v.format.v {
        Format::Avro => RegFormat::Avro,
        Format::Protobuf => RegFormat::Protobuf,
        Format::Json => RegFormat::Json,
        Format::Bytes => {
            return Err(vec![at(
                &v.format,
                "value.registry: needs format avro, protobuf or json",
            )])
        }
    };
    check_registry_keys(v, format, &mut errs);
    let subject = v.subject.as_ref().and_then(|s| match Subject::parse(&s.v) {
        Ok(x) => Some(x),
        Err(m) => {
            errs.push(at(s, format!("value.subject: {m}")));
            None
        }
    });
    let max_depth = v
        .max_depth
        .as_ref()
        .map_or(json::DEFAULT_MAX_DEPTH, |d| d.v);
    if !(1..=json::MAX_MAX_DEPTH).contains(&max_depth) {
        if let Some(d) = &v.max_depth {
            errs.push(at(
                d,
                format!(
                    "value.max_depth: {max_depth} is outside [1, {}]",
                    json::MAX_MAX_DEPTH
                ),
            ));
        }
    }
    let (reader, own_schema) = registry_own_schema(v, base, format, &mut errs);
    if !errs.is_empty() {
        return Err(errs);
    }
    let decoder = RegistryDecoder {
        cache: cache.clone(),
        format,
        subject,
        reader,
        message: v
            .message
            .as_ref()
            .map(|m| m.v.trim_start_matches('.').to_string()),
        max_depth,
        plan: None,
        compiled: Default::default(),
    };
    Ok((Decoder::Registry(decoder), own_schema))
}

/// Keys that do not go with `registry: true` (or with its format).
fn check_registry_keys(v: &ValueDoc, format: RegFormat, errs: &mut Vec<At>) {
    if let Some(w) = v.wire.as_ref().filter(|w| w.v != Wire::Confluent) {
        errs.push(at(
            w,
            "value.wire: `registry: true` reads the schema id of `wire: confluent`",
        ));
    }
    no_key(
        errs,
        &v.schema_ids,
        "value.schema_ids: not with `registry: true` (ids come from the registry)",
    );
    if format != RegFormat::Json {
        no_key(
            errs,
            &v.max_depth,
            "value.max_depth: applies to format json only",
        );
    }
    if format != RegFormat::Protobuf {
        no_key(
            errs,
            &v.message,
            "value.message: applies to format protobuf only",
        );
    }
}

/// A schema file of the policy's own beside the registry's: an Avro
/// reader schema, or a JSON Schema checked as well (never a .proto).
fn registry_own_schema(
    v: &ValueDoc,
    base: &Path,
    format: RegFormat,
    errs: &mut Vec<At>,
) -> (Option<apache_avro::Schema>, Option<jsonschema::Validator>) {
    let (mut reader, mut own_schema) = (None, None);
    match (&v.schema, format) {
        (Some(s), RegFormat::Avro) => match schema_path(base, s, "value.schema", "avsc")
            .and_then(|p| avro::load_schema(&p).map_err(|m| at(s, format!("value.schema: {m}"))))
        {
            Ok(r) => reader = Some(r),
            Err(e) => errs.push(e),
        },
        (Some(s), RegFormat::Json) => match load_json_schema(base, s) {
            Ok((validator, _)) => own_schema = Some(validator),
            Err(e) => errs.push(e),
        },
        (Some(s), RegFormat::Protobuf) => errs.push(at(
            s,
            "value.schema: with `registry: true` the .proto comes from the registry; name the type with `message`",
        )),
        (None, _) => {}
    }
    (reader, own_schema)
}

/// Keys that do not apply to the value's format or wire are errors.
fn check_value_keys(v: &ValueDoc) -> Result<(), Vec<At>> {
    let mut errs = Vec::new();
    let wire = v.wire.as_ref().map_or(Wire::Raw, |w| w.v);
    let format = v.format.v;
    if format != Format::Json {
        no_key(
            &mut errs,
            &v.max_depth,
            "value.max_depth: applies to format json only",
        );
    }
    if format == Format::Json {
        no_key(
            &mut errs,
            &v.wire,
            "value.wire: format json reads the confluent framing only with `registry: true`",
        );
    }
    if matches!(format, Format::Json | Format::Bytes) {
        if format == Format::Bytes {
            no_key(
                &mut errs,
                &v.wire,
                "value.wire: applies to formats avro, protobuf and json (with registry: true)",
            );
        }
        no_key(
            &mut errs,
            &v.schema_ids,
            "value.schema_ids: applies to formats avro and protobuf only",
        );
    }
    if format != Format::Protobuf {
        no_key(
            &mut errs,
            &v.message,
            "value.message: applies to format protobuf only",
        );
    }
    if format == Format::Bytes {
        no_key(
            &mut errs,
            &v.schema,
            "value.schema: format bytes is not decoded, so it has no schema",
        );
    }
    if wire == Wire::Raw {
        no_key(
            &mut errs,
            &v.schema_ids,
            "value.schema_ids: needs `wire: confluent` (raw values carry no schema id)",
        );
    }
    if wire == Wire::Confluent && v.schema_ids.as_ref().is_none_or(|m| m.v.is_empty()) {
        if let Some(w) = &v.wire {
            errs.push(at(
                w,
                "value.wire: `confluent` needs value.schema_ids (schema id: file) or `registry: true`",
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

fn compile_json(
    v: &ValueDoc,
    base: &Path,
) -> Result<(Decoder, Option<jsonschema::Validator>), Vec<At>> {
    let max_depth = match &v.max_depth {
        None => json::DEFAULT_MAX_DEPTH,
        Some(d) if (1..=json::MAX_MAX_DEPTH).contains(&d.v) => d.v,
        Some(d) => {
            return Err(vec![at(
                d,
                format!(
                    "value.max_depth: {} is outside [1, {}]",
                    d.v,
                    json::MAX_MAX_DEPTH
                ),
            )])
        }
    };
    let (schema, shape) = match &v.schema {
        None => (None, None),
        Some(s) => {
            let (validator, doc) = load_json_schema(base, s).map_err(|e| vec![e])?;
            (Some(validator), Shape::compile(&doc))
        }
    };
    Ok((
        Decoder::Json {
            max_depth,
            fast: None,
            shape,
        },
        schema,
    ))
}

fn compile_avro(
    v: &ValueDoc,
    base: &Path,
    wire: Wire,
) -> Result<(Decoder, Option<jsonschema::Validator>), Vec<At>> {
    let mut errs = Vec::new();
    let schema = match &v.schema {
        None if wire == Wire::Raw => {
            return Err(vec![at(
                &v.format,
                "value.schema: format avro with `wire: raw` needs an .avsc schema",
            )])
        }
        None => None,
        Some(s) => {
            let p = schema_path(base, s, "value.schema", "avsc").map_err(|e| vec![e])?;
            Some(avro::load_schema(&p).map_err(|m| vec![at(s, format!("value.schema: {m}"))])?)
        }
    };
    let mut ids = HashMap::new();
    if let Some(m) = &v.schema_ids {
        for (id, f) in &m.v {
            match schema_path(base, f, &format!("value.schema_ids.{id}"), "avsc").and_then(|p| {
                avro::load_schema(&p).map_err(|m| at(f, format!("value.schema_ids.{id}: {m}")))
            }) {
                Ok(s) => {
                    ids.insert(*id, s);
                }
                Err(e) => errs.push(e),
            }
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok((Decoder::Avro(AvroDecoder::new(wire, schema, ids)), None))
}

fn compile_protobuf(
    v: &ValueDoc,
    base: &Path,
    wire: Wire,
) -> Result<(Decoder, Option<jsonschema::Validator>), Vec<At>> {
    let mut errs = Vec::new();
    let mut pools = Vec::new();
    if let Some(s) = &v.schema {
        match schema_path(base, s, "value.schema", "proto")
            .and_then(|p| protobuf::load_file(&p).map_err(|m| at(s, format!("value.schema: {m}"))))
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
    if let Some(m) = &v.schema_ids {
        for (id, f) in &m.v {
            let key = format!("value.schema_ids.{id}");
            match schema_path(base, f, &key, "proto")
                .and_then(|p| protobuf::load_file(&p).map_err(|m| at(f, format!("{key}: {m}"))))
            {
                Ok((pool, file)) => {
                    ids.insert(*id, protobuf::IndexedFile::new(file.clone()));
                    pools.push((pool, file));
                }
                Err(e) => errs.push(e),
            }
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let message = match &v.message {
        None if wire == Wire::Raw => {
            return Err(vec![at(
                &v.format,
                "value.message: format protobuf with `wire: raw` needs the message type (e.g. `message: geo.Trigger`)",
            )])
        }
        None => None,
        Some(m) => {
            let name = m.v.trim_start_matches('.');
            match pools.iter().find_map(|(pool, _)| pool.get_message_by_name(name)) {
                Some(d) => Some(d),
                None => {
                    return Err(vec![at(
                        m,
                        format!(
                            "value.message: no message `{name}` in the schema (use the full name, package included)"
                        ),
                    )])
                }
            }
        }
    };
    Ok((
        Decoder::Protobuf(ProtoDecoder::new(wire, message, ids)),
        None,
    ))
}

/// The validator and the schema document it was built from.
fn load_json_schema(
    base: &Path,
    s: &Located<PathBuf>,
) -> Result<(jsonschema::Validator, serde_json::Value), At> {
    let p = schema_path(base, s, "value.schema", "json")?;
    let text =
        std::fs::read(&p).map_err(|e| at(s, format!("value.schema: {}: {e}", p.display())))?;
    let doc: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| at(s, format!("value.schema: {}: not JSON: {e}", p.display())))?;
    let validator = jsonschema::validator_for(&doc).map_err(|e| {
        at(
            s,
            format!(
                "value.schema: {}: not a valid JSON Schema at `{}`: {e}",
                p.display(),
                e.instance_path()
            ),
        )
    })?;
    Ok((validator, doc))
}

pub(super) fn pointer(l: &Located<String>, key: &str) -> Result<Pointer, At> {
    Pointer::parse(&l.v).map_err(|m| at(l, format!("{key}: {m}")))
}

mod rule;
pub(super) use rule::compile_rule;
