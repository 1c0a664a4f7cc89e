//! A `CEL_FIELD` rule made checks: the top-level fields of the schema
//! with Confluent's type names (`STRING`, `INT`, `RECORD`, ...), the
//! rule's guard (`guard ; expr`) decided per field when the schema is
//! compiled, and the expression compiled once per field it selects, with
//! `value` the field, `name` and `typeName` constants.
//!
//! What it cannot express is refused, never guessed: a guard that reads
//! the record (`value`, `message`), `tags`, a schema that is not an Avro
//! record or a JSON Schema object, Protobuf schemas.

use serde_json::Value;

use super::{field_rule, too_many};
use crate::policy::cel::CelRule;

/// The checks of CEL_FIELD rule `id` with text `expr` on a schema of
/// `schema_type` with text `schema`; more than `left` is an error.
pub(super) fn checks(
    id: &str,
    expr: &str,
    schema_type: &str,
    schema: &str,
    left: usize,
) -> Result<Vec<(Option<String>, CelRule)>, String> {
    let (guard, body) = match expr.split_once(';') {
        Some((g, b)) => (Some(g.trim()), b.trim()),
        None => (None, expr.trim()),
    };
    let mut out = Vec::new();
    for (name, type_name) in fields(schema_type, schema)? {
        if let Some(g) = guard {
            let guard = field_rule(id, g, &name, type_name)?;
            if !guard.is_constant() {
                return Err(format!(
                    "the guard `{g}` of a CEL_FIELD rule may read name and typeName only"
                ));
            }
            if !guard.constant()? {
                continue;
            }
        }
        if out.len() >= left {
            return Err(too_many());
        }
        let check = field_rule(id, body, &name, type_name)?;
        out.push((Some(name), check));
    }
    Ok(out)
}

/// The top-level fields of a record schema and their type names.
fn fields(schema_type: &str, schema: &str) -> Result<Vec<(String, &'static str)>, String> {
    let text: Value = serde_json::from_str(schema).map_err(|_| {
        format!(
            "CEL_FIELD rules are supported on Avro and JSON Schema schemas, not on {schema_type}"
        )
    })?;
    match schema_type {
        "AVRO" => {
            let fields = (text.get("type") == Some(&Value::from("record")))
                .then(|| text.get("fields").and_then(Value::as_array))
                .flatten()
                .ok_or("CEL_FIELD rules need an Avro record schema")?;
            Ok(fields
                .iter()
                .filter_map(|f| {
                    Some((
                        f.get("name")?.as_str()?.to_string(),
                        avro_type(f.get("type")?),
                    ))
                })
                .collect())
        }
        "JSON" => {
            let props = text
                .get("properties")
                .and_then(Value::as_object)
                .ok_or("CEL_FIELD rules need a JSON Schema with properties")?;
            Ok(props
                .iter()
                .map(|(k, v)| (k.clone(), json_type(v)))
                .collect())
        }
        t => Err(format!(
            "CEL_FIELD rules are supported on Avro and JSON Schema schemas, not on {t}"
        )),
    }
}

/// An Avro type's name as Confluent's clients give it (`get_type`).
fn avro_type(t: &Value) -> &'static str {
    let name = match t {
        Value::Array(_) => return "COMBINED",
        Value::Object(o) => o.get("type").and_then(Value::as_str).unwrap_or(""),
        Value::String(s) => s.as_str(),
        _ => "",
    };
    match name {
        "record" => "RECORD",
        "enum" => "ENUM",
        "array" => "ARRAY",
        "map" => "MAP",
        "fixed" => "FIXED",
        "string" => "STRING",
        "bytes" => "BYTES",
        "int" => "INT",
        "long" => "LONG",
        "float" => "FLOAT",
        "double" => "DOUBLE",
        "boolean" => "BOOLEAN",
        "null" => "NULL",
        // A named type defined elsewhere (a reference): a record, an enum
        // or a fixed; Confluent's Python client answers NULL.
        _ => "NULL",
    }
}

/// A JSON Schema's type name as Confluent's clients give it (`get_type`).
fn json_type(s: &Value) -> &'static str {
    let Some(o) = s.as_object() else {
        return "COMBINED";
    };
    if o.get("const").is_some_and(|v| !v.is_null()) || o.get("enum").is_some_and(|v| !v.is_null()) {
        return "ENUM";
    }
    match o.get("type").and_then(Value::as_str) {
        Some("object")
            if o.get("properties")
                .is_none_or(|p| p.as_object().is_none_or(|m| m.is_empty())) =>
        {
            "MAP"
        }
        Some("object") => "RECORD",
        Some("array") => "ARRAY",
        Some("string") => "STRING",
        Some("integer") => "INT",
        Some("number") => "DOUBLE",
        Some("boolean") => "BOOLEAN",
        Some("null") => "NULL",
        _ if o.contains_key("properties") => "RECORD",
        _ => "NULL",
    }
}
