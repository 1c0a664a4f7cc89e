//! The formats, registered by name: the [`formats!`] table at the end
//! makes [`Decoder`] (the enum the judge, the compiler and the registry
//! decoder dispatch through, which only forwards: static dispatch, judging
//! is the hot path), the compilers by name and by a registry's schema type,
//! and the names. A new format is its own module implementing
//! [`Format`] and one line in the table.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::contract::Contract;
use super::document::{ValueDoc, DEFAULT_MAX_BYTES};
use super::format::{Bytes, Cx, Format, OwnSchema, Verdict};
use super::json::Captures;
use super::located::{at, At};
use super::registered::RegistryDecoder;
use super::registry::{Reference, Registered, SchemaCache};
use super::rules::Pointer;
use super::{avro, json, protobuf, Invalid};

/// Compile a registry answer: `schema_type` as the registry names it
/// (`AVRO` when absent, `PROTOBUF`, `JSON`), the schema text, and the
/// texts of its references (already resolved, transitively, dependencies
/// first). A schema that does not compile is `Unusable`, not an error: the
/// id exists and will never change.
pub fn compile_schema(schema_type: Option<&str>, text: &str, refs: &[Reference]) -> Registered {
    compile_registered(schema_type.unwrap_or("AVRO"), text, refs)
        .unwrap_or_else(Registered::Unusable)
}

/// `max_bytes` when a policy does not set it: [`DEFAULT_MAX_BYTES`] for a
/// format that decodes, none for one that does not.
pub(super) fn default_max_bytes(format: &str) -> Option<usize> {
    decodes(format).then_some(DEFAULT_MAX_BYTES)
}

/// `registry: true` with a format no registry serves.
fn needs_registry_format(v: &ValueDoc) -> At {
    let names = registry_names();
    let (last, first) = names.split_last().map_or(("", &[][..]), |(l, f)| (*l, f));
    at(
        &v.format,
        format!(
            "value.registry: needs format {} or {last}",
            first.join(", ")
        ),
    )
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
                $($name if registry && <$t as Format>::SCHEMA_TYPE.is_none() => {
                    Err(vec![needs_registry_format(v)])
                }
                $name if registry => RegistryDecoder::<$t>::compile(v, base, cache)
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
                check: impl FnOnce(&Captures<'_>) -> Verdict,
            ) -> Option<Verdict> {
                match self {
                    $(Decoder::$v(f) => Format::capture(f, bytes, check),)*
                    $(Decoder::Registry(Registry::$v(r)) => r.capture(bytes, cx, check),)*
                }
            }

            /// The data-contract rules of the value's registered schema.
            pub(super) fn contract(&self, bytes: &[u8], cx: &Cx<'_>) -> Option<Arc<Contract>> {
                match self {
                    $(Decoder::$v(_) => None,)*
                    $(Decoder::Registry(Registry::$v(r)) => r.contract(bytes, cx),)*
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
