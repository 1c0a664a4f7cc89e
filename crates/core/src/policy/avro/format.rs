//! The `avro` record format: its policy keys (`schema`: an `.avsc`, the
//! writer schema for `raw` and the reader schema otherwise; `schema_ids`
//! for `confluent`), its fast path (the rules' fields read from the datum
//! by a program compiled per writer schema) and its registered schemas
//! (with named references).

use std::collections::HashMap;
use std::path::Path;

use apache_avro::Schema;
use serde_json::Value;

use super::{
    capture_with, check_not_recursive, compile_registered, decode_datum_with, limit_allocations,
    load_schema, AvroDecoder, Prog,
};
use crate::policy::compile::schema_path;
use crate::policy::document::ValueDoc;
use crate::policy::format::{Format, OwnSchema, Verdict};
use crate::policy::json::{Captures, Plan};
use crate::policy::located::{at, At};
use crate::policy::located::{errors_or, not_for};
use crate::policy::registry::{Reference, Registered};
use crate::policy::rules::Pointer;
use crate::policy::wire::{check_file_wire, Wire};
use crate::policy::Invalid;

impl Format for AvroDecoder {
    const SCHEMA_TYPE: Option<&'static str> = Some("AVRO");
    const CAPTURES_REGISTERED: bool = true;
    type Program = Prog;

    fn compile(v: &ValueDoc, base: &Path, registry: bool) -> Result<(Self, OwnSchema), Vec<At>> {
        let mut errs = Vec::new();
        not_for(
            &mut errs,
            &v.max_depth,
            "value.max_depth: applies to format json only",
        );
        not_for(
            &mut errs,
            &v.message,
            "value.message: applies to format protobuf only",
        );
        let wire = if registry {
            Wire::Confluent
        } else {
            check_file_wire(v, &mut errs)
        };
        let schema = match &v.schema {
            None if wire == Wire::Raw => {
                errs.push(at(
                    &v.format,
                    "value.schema: format avro with `wire: raw` needs an .avsc schema",
                ));
                None
            }
            None => None,
            Some(s) => match schema_path(base, s, "value.schema", "avsc")
                .and_then(|p| load_schema(&p).map_err(|m| at(s, format!("value.schema: {m}"))))
            {
                Ok(schema) => Some(schema),
                Err(e) => {
                    errs.push(e);
                    None
                }
            },
        };
        let mut ids = HashMap::new();
        for (id, f) in v.schema_ids.iter().flat_map(|m| &m.v) {
            let key = format!("value.schema_ids.{id}");
            match schema_path(base, f, &key, "avsc")
                .and_then(|p| load_schema(&p).map_err(|m| at(f, format!("{key}: {m}"))))
            {
                Ok(s) => {
                    ids.insert(*id, s);
                }
                Err(e) => errs.push(e),
            }
        }
        errors_or(errs, (AvroDecoder::new(wire, schema, ids), None))
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
        AvroDecoder::capture(self, bytes, &mut caps).then(|| check(&caps))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Option<Value>, Invalid> {
        AvroDecoder::decode(self, bytes).map(Some)
    }

    fn compile_registered(text: &str, refs: &[Reference]) -> Result<Registered, String> {
        limit_allocations();
        let (schema, named) = if refs.is_empty() {
            let s = Schema::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
            (s, Vec::new())
        } else {
            let list: Vec<&str> = refs.iter().map(|r| r.schema.as_str()).collect();
            Schema::parse_str_with_list(text, list)
                .map_err(|e| format!("not an Avro schema with its references: {e}"))?
        };
        check_not_recursive(&schema)?;
        for n in &named {
            check_not_recursive(n)?;
        }
        Ok(Registered::Avro(schema, named))
    }

    /// Read without a reader schema only (resolution takes the full path).
    fn program(&self, schema: &Registered, plan: &Plan) -> Option<Prog> {
        match schema {
            Registered::Avro(writer, named) if self.schema.is_none() => {
                compile_registered(writer, named, plan)
            }
            _ => None,
        }
    }

    #[inline(always)]
    fn capture_registered<'a>(
        &'a self,
        _schema: &'a Registered,
        prog: &'a Prog,
        datum: &'a [u8],
        plan: &Plan,
        caps: &mut Captures<'a>,
    ) -> bool {
        capture_with(prog, datum, plan, caps)
    }

    fn decode_registered(&self, schema: &Registered, datum: &[u8]) -> Result<Value, Invalid> {
        let Registered::Avro(writer, named) = schema else {
            return Err(Invalid::poison("schema", "not an Avro schema"));
        };
        decode_datum_with(writer, named, self.schema.as_ref(), datum)
    }
}
