//! What a record format is: the [`Format`] trait every format implements
//! (how it compiles its `value:` (or `key:`) section, resolves the rules'
//! field slots against its schema, captures a value's fields, decodes its
//! bytes, and reads the schemas a registry serves), the judging context
//! [`Cx`], and `bytes`, the format that does not decode. The formats are
//! registered by name in `formats`.

use std::path::Path;

use serde_json::Value;

use super::document::ValueDoc;
use super::json::{Captures, Plan};
use super::located::{errors_or, not_for, At};
use super::registry::{Reference, Registered};
use super::rules::Pointer;
use super::Invalid;
use crate::kafka::record::Header;

/// A fast path's verdict on a record. Invalid records are rare: the reason
/// is boxed so a valid record's verdict is one word, not the 64 bytes of an
/// [`Invalid`] moved through every layer (about 13 instructions a JSON
/// record, issue 55).
pub(crate) type Verdict = Result<(), Box<Invalid>>;

/// The policy's own JSON Schema, checked on every decoded value.
pub(super) type OwnSchema = Option<jsonschema::Validator>;

/// What a format is judged in besides a value's bytes: the record's topic
/// (a registry subject's `{topic}`), the clock (registry answers expire)
/// and its headers (Apicurio's framing may carry the schema id there).
#[derive(Clone, Copy)]
pub(super) struct Cx<'r> {
    pub(super) topic: &'r str,
    pub(super) now_ms: i64,
    pub(super) headers: &'r [Header<'r>],
    /// Fetched or produced: which data-contract rules run.
    pub(super) side: super::contract::Side,
    /// The record judged (its key, headers and timestamp for data-contract
    /// rules on the fast path); `None` when a value is only decoded.
    pub(super) record: Option<&'r crate::kafka::record::Record<'r>>,
}

impl<'r> Cx<'r> {
    /// The context of judging record `r` of `topic` on `side`.
    #[inline(always)]
    pub(super) fn of_record(
        topic: &'r str,
        r: &'r crate::kafka::record::Record<'r>,
        now_ms: i64,
        side: super::contract::Side,
    ) -> Self {
        Cx {
            topic,
            now_ms,
            headers: &r.headers,
            side,
            record: Some(r),
        }
    }
}

/// One record format.
pub(super) trait Format: Sized + std::fmt::Debug {
    /// The registry's `schemaType` of this format's schemas; `None` when
    /// no registry serves them (then `registry: true` is a load error).
    const SCHEMA_TYPE: Option<&'static str> = None;
    /// Whether values are decoded: rules apply to them and `max_bytes`
    /// defaults to [`super::document::DEFAULT_MAX_BYTES`].
    const DECODES: bool = true;
    /// Whether [`Format::capture_registered`] reads registered datums.
    const CAPTURES_REGISTERED: bool = false;
    /// Whether a datum framed Apicurio's way is what follows Confluent's
    /// header too (so the fast path reads it); not for Protobuf.
    const APICURIO_SAME_DATUM: bool = true;
    /// A registered schema compiled against a policy's plan (the registry
    /// fast path's program).
    type Program: std::fmt::Debug + Send + Sync;

    /// Compile this format's keys of `v` (messages say `value.`). With
    /// `registry`, schemas come by id from the registry: the keys left are
    /// those that shape how a registered schema is read (a reader schema,
    /// an expected message type, a nesting limit).
    fn compile(v: &ValueDoc, base: &Path, registry: bool) -> Result<(Self, OwnSchema), Vec<At>>;

    /// Slots: resolve the rules' pointers (a slot each, in order) against
    /// the format's schemas, so [`Format::capture`] fills them. `checked`:
    /// the policy's own JSON Schema must see every value.
    fn slots(&mut self, pointers: Vec<Pointer>, checked: bool);

    /// Capture: read the rules' fields straight from `bytes` and return
    /// `check`'s verdict on them; `None` when [`Format::decode`] must judge.
    fn capture(
        &self,
        bytes: &[u8],
        check: impl FnOnce(&Captures<'_>) -> Verdict,
    ) -> Option<Verdict>;

    /// Decode: the value as JSON (`None`: the format has no value to judge).
    fn decode(&self, bytes: &[u8]) -> Result<Option<Value>, Invalid>;

    /// A registry answer of [`Format::SCHEMA_TYPE`] compiled (`refs`:
    /// its references, dependencies first).
    fn compile_registered(_text: &str, _refs: &[Reference]) -> Result<Registered, String> {
        Err("not a registry schema type".into())
    }

    /// The registry fast path's program for `schema` (`None`: decode).
    fn program(&self, _schema: &Registered, _plan: &Plan) -> Option<Self::Program> {
        None
    }

    /// [`Format::capture`] of a registered datum with `prog`.
    fn capture_registered<'a>(
        &'a self,
        _schema: &'a Registered,
        _prog: &'a Self::Program,
        _datum: &'a [u8],
        _plan: &Plan,
        _caps: &mut Captures<'a>,
    ) -> bool {
        false
    }

    /// [`Format::decode_registered`] of a datum framed Apicurio's way.
    fn decode_apicurio(&self, schema: &Registered, datum: &[u8]) -> Result<Value, Invalid> {
        self.decode_registered(schema, datum)
    }

    /// [`Format::decode`] of a registered datum (`schema` is of
    /// [`Format::SCHEMA_TYPE`]: the caller checked).
    fn decode_registered(&self, schema: &Registered, _datum: &[u8]) -> Result<Value, Invalid> {
        Err(Invalid::poison(
            "schema",
            format!("a {} schema cannot be read here", schema.type_name()),
        ))
    }
}

/// `bytes`: values are not decoded (only size, null and headers apply).
#[derive(Debug)]
pub(super) struct Bytes;

impl Format for Bytes {
    const DECODES: bool = false;
    type Program = ();

    fn compile(v: &ValueDoc, _: &Path, _: bool) -> Result<(Self, OwnSchema), Vec<At>> {
        let mut errs = Vec::new();
        not_for(
            &mut errs,
            &v.wire,
            "value.wire: applies to formats avro, protobuf and json (with registry: true)",
        );
        not_for(
            &mut errs,
            &v.schema_ids,
            "value.schema_ids: applies to formats avro and protobuf only",
        );
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
        not_for(
            &mut errs,
            &v.schema,
            "value.schema: format bytes is not decoded, so it has no schema",
        );
        errors_or(errs, (Bytes, None))
    }

    fn slots(&mut self, _: Vec<Pointer>, _: bool) {}

    fn capture(&self, _: &[u8], _: impl FnOnce(&Captures<'_>) -> Verdict) -> Option<Verdict> {
        Some(Ok(()))
    }

    fn decode(&self, _: &[u8]) -> Result<Option<Value>, Invalid> {
        Ok(None)
    }
}
