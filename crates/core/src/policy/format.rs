//! Record formats, one module each behind [`Format`]: how a format
//! compiles its `value:` (or `key:`) section, resolves the rules' field
//! slots against its schema, captures a value's fields, decodes its bytes,
//! and reads the schemas a registry serves. The [`formats!`] table at the
//! end registers them by name: a new format is its own module and one line
//! there. The judge, the compiler and the registry decoder dispatch through
//! the enum the table makes, which only forwards (static dispatch: judging
//! is the hot path).

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::document::ValueDoc;
use super::json::{Captures, Plan};
use super::located::{at, At, Located};
use super::registered::RegistryDecoder;
use super::registry::{Reference, Registered, SchemaCache};
use super::rules::Pointer;
use super::{avro, json, protobuf, Invalid};
use crate::kafka::record::Header;

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
        check: impl FnOnce(&Captures<'_>) -> Result<(), Invalid>,
    ) -> Option<Result<(), Invalid>>;

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

    fn capture(
        &self,
        _: &[u8],
        _: impl FnOnce(&Captures<'_>) -> Result<(), Invalid>,
    ) -> Option<Result<(), Invalid>> {
        Some(Ok(()))
    }

    fn decode(&self, _: &[u8]) -> Result<Option<Value>, Invalid> {
        Ok(None)
    }
}

/// A key this format does not take, if written.
pub(super) fn not_for<T>(errs: &mut Vec<At>, l: &Option<Located<T>>, msg: &str) {
    if let Some(l) = l {
        errs.push(at(l, msg));
    }
}

/// `ok` when no error was found.
pub(super) fn errors_or<T>(errs: Vec<At>, ok: T) -> Result<T, Vec<At>> {
    if errs.is_empty() {
        Ok(ok)
    } else {
        Err(errs)
    }
}

/// Registers formats by name: `"name" => Variant(Type)`. Makes
/// [`Decoder`] (a value read with a schema of the policy's own, or with
/// one from the registry: [`Registry`]), its forwarding methods, the
/// names, and the compilers by name and by registry schema type.
macro_rules! formats {
    ($($name:literal => $v:ident($t:ty)),* $(,)?) => {
        /// How a value's bytes are read. One per policy, built at load and
        /// never moved after: its size does not matter.
        #[derive(Debug)]
        #[allow(clippy::large_enum_variant)]
        pub(super) enum Decoder {
            $($v($t),)*
            Registry(Registry),
        }

        /// A value whose schema the registry names by id.
        #[derive(Debug)]
        pub(super) enum Registry {
            $($v(RegistryDecoder<$t>),)*
        }

        /// Every format's name, in table order.
        pub(super) const NAMES: &[&str] = &[$($name),*];

        /// Compile `v` as format `name` (`None`: no such format).
        pub(super) fn compile(
            name: &str,
            v: &ValueDoc,
            base: &Path,
            cache: &Arc<SchemaCache>,
        ) -> Option<Result<(Decoder, OwnSchema), Vec<At>>> {
            let registry = v.registry.as_ref().is_some_and(|r| r.v);
            Some(match name {
                $($name if registry => RegistryDecoder::<$t>::compile(v, base, cache)
                    .map(|(d, s)| (Decoder::Registry(Registry::$v(d)), s)),
                $name => <$t>::compile(v, base, false).map(|(d, s)| (Decoder::$v(d), s)),)*
                _ => return None,
            })
        }

        /// The formats a registry serves, for `registry: true`'s error.
        pub(super) fn registry_names() -> Vec<&'static str> {
            let mut out = Vec::new();
            $(if <$t as Format>::SCHEMA_TYPE.is_some() {
                out.push($name);
            })*
            out
        }

        /// Whether format `name` decodes its values.
        pub(super) fn decodes(name: &str) -> bool {
            match name {
                $($name => <$t as Format>::DECODES,)*
                _ => false,
            }
        }

        /// A registry answer of type `schema_type` compiled.
        pub(super) fn compile_registered(
            schema_type: &str,
            text: &str,
            refs: &[Reference],
        ) -> Result<Registered, String> {
            $(if <$t as Format>::SCHEMA_TYPE == Some(schema_type) {
                return <$t>::compile_registered(text, refs);
            })*
            Err(format!("schema type {schema_type} is not supported"))
        }

        impl Decoder {
            pub(super) fn decodes(&self) -> bool {
                match self {
                    $(Decoder::$v(_) => <$t as Format>::DECODES,)*
                    Decoder::Registry(_) => true,
                }
            }

            pub(super) fn slots(&mut self, pointers: Vec<Pointer>, checked: bool) {
                match self {
                    $(Decoder::$v(f) => Format::slots(f, pointers, checked),)*
                    $(Decoder::Registry(Registry::$v(r)) => r.slots(pointers, checked),)*
                }
            }

            #[inline(always)]
            pub(super) fn capture(
                &self,
                bytes: &[u8],
                cx: &Cx<'_>,
                check: impl FnOnce(&Captures<'_>) -> Result<(), Invalid>,
            ) -> Option<Result<(), Invalid>> {
                match self {
                    $(Decoder::$v(f) => Format::capture(f, bytes, check),)*
                    $(Decoder::Registry(Registry::$v(r)) => r.capture(bytes, cx, check),)*
                }
            }

            pub(super) fn decode(
                &self,
                bytes: &[u8],
                cx: &Cx<'_>,
            ) -> Result<Option<Value>, Invalid> {
                match self {
                    $(Decoder::$v(f) => Format::decode(f, bytes),)*
                    $(Decoder::Registry(Registry::$v(r)) => r.decode(bytes, cx).map(Some),)*
                }
            }
        }
    };
}

formats! {
    "json" => Json(json::JsonFormat),
    "avro" => Avro(avro::AvroDecoder),
    "protobuf" => Protobuf(protobuf::ProtoDecoder),
    "bytes" => Bytes(Bytes),
}
