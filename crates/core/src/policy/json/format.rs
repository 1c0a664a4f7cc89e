//! The `json` record format: its policy keys (`schema`: a JSON Schema,
//! `max_depth`), its fast paths (the rules' fields captured while the
//! document is validated; with a schema in the fast subset, its
//! [`Shape`] checked in the same pass) and its registered schemas (JSON
//! Schema documents).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{capture, capture_shaped, decode, Captures, Plan, DEFAULT_MAX_DEPTH, MAX_MAX_DEPTH};
use crate::policy::compile::schema_path;
use crate::policy::document::ValueDoc;
use crate::policy::format::{Format, OwnSchema, Verdict};
use crate::policy::located::{at, At, Located};
use crate::policy::located::{errors_or, not_for};
use crate::policy::registry::{Reference, Registered};
use crate::policy::rules::Pointer;
use crate::policy::shape::Shape;
use crate::policy::Invalid;

/// A JSON value's reading: `fast` is set when the policy has no JSON
/// Schema or its schema compiles to a [`Shape`] (`shape`, moved into the
/// plan when it is built), so no `serde_json::Value` is built for a valid
/// record.
#[derive(Debug)]
pub(crate) struct JsonFormat {
    pub(crate) max_depth: usize,
    pub(crate) fast: Option<Plan>,
    shape: Option<Shape>,
    /// No JSON Schema: the fast path's verdict is final (a document it
    /// refuses is poison); with a shape, a refusal is judged in full.
    strict: bool,
}

impl Format for JsonFormat {
    const SCHEMA_TYPE: Option<&'static str> = Some("JSON");
    type Program = ();

    fn compile(v: &ValueDoc, base: &Path, registry: bool) -> Result<(Self, OwnSchema), Vec<At>> {
        let mut errs = Vec::new();
        if !registry {
            not_for(
                &mut errs,
                &v.wire,
                "value.wire: format json reads the confluent framing only with `registry: true`",
            );
            not_for(
                &mut errs,
                &v.schema_ids,
                "value.schema_ids: applies to formats avro and protobuf only",
            );
        }
        not_for(
            &mut errs,
            &v.message,
            "value.message: applies to format protobuf only",
        );
        let max_depth = v.max_depth.as_ref().map_or(DEFAULT_MAX_DEPTH, |d| d.v);
        if let Some(d) = v
            .max_depth
            .as_ref()
            .filter(|d| !(1..=MAX_MAX_DEPTH).contains(&d.v))
        {
            errs.push(at(
                d,
                format!("value.max_depth: {} is outside [1, {MAX_MAX_DEPTH}]", d.v),
            ));
        }
        let (schema, shape) = match &v.schema {
            None => (None, None),
            Some(s) => match load_json_schema(base, s) {
                Ok((validator, doc)) => (Some(validator), Shape::compile(&doc)),
                Err(e) => {
                    errs.push(e);
                    (None, None)
                }
            },
        };
        let format = JsonFormat {
            max_depth,
            fast: None,
            shape,
            strict: false,
        };
        errors_or(errs, (format, schema))
    }

    fn slots(&mut self, pointers: Vec<Pointer>, checked: bool) {
        // A schema without a shape keeps the schema's own reading.
        if !checked || self.shape.is_some() {
            self.strict = !checked;
            self.fast = Some(Plan::new(pointers, self.shape.take()));
        }
    }

    #[inline(always)]
    fn capture(
        &self,
        bytes: &[u8],
        check: impl FnOnce(&Captures<'_>) -> Verdict,
    ) -> Option<Verdict> {
        let plan = self.fast.as_ref()?;
        let mut caps = Captures::new(plan.slots());
        if self.strict {
            return Some(match capture(bytes, self.max_depth, plan, &mut caps) {
                Ok(()) => check(&caps),
                Err(r) => Err(Box::new(Invalid::poison("decode", r))),
            });
        }
        // A schema in the fast subset: a record that surely meets it
        // skips the `Value`; any other is judged in full.
        capture_shaped(bytes, self.max_depth, plan, &mut caps).then(|| check(&caps))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Option<Value>, Invalid> {
        decode(bytes, self.max_depth)
            .map(Some)
            .map_err(|r| Invalid::poison("decode", r))
    }

    fn compile_registered(text: &str, _refs: &[Reference]) -> Result<Registered, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        jsonschema::validator_for(&doc)
            .map(Registered::Json)
            .map_err(|e| format!("not a usable JSON Schema: {e}"))
    }

    fn decode_registered(&self, schema: &Registered, datum: &[u8]) -> Result<Value, Invalid> {
        let value = self.decode(datum)?.unwrap_or(Value::Null);
        let Registered::Json(v) = schema else {
            return Err(Invalid::poison("schema", "not a JSON schema"));
        };
        if !v.is_valid(&value) {
            let reason = match v.validate(&value) {
                Err(e) => format!("{}: {e}", e.instance_path()),
                Ok(()) => "value does not match its registered JSON Schema".into(),
            };
            return Err(Invalid::poison("schema", reason));
        }
        Ok(value)
    }
}

/// The validator and the schema document it was built from.
pub(crate) fn load_json_schema(
    base: &Path,
    s: &Located<PathBuf>,
) -> Result<(jsonschema::Validator, Value), At> {
    let p = schema_path(base, s, "value.schema", "json")?;
    let text =
        std::fs::read(&p).map_err(|e| at(s, format!("value.schema: {}: {e}", p.display())))?;
    let doc: Value = serde_json::from_slice(&text)
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
