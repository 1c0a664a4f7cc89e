//! The policy file's YAML shape, as written: every key a policy may have
//! (unknown keys are errors), with the positions of the values that are
//! checked after parsing (`Located`). Compiling turns it into a `Policy`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::located::Located;
use super::rules::TimeUnit;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileDoc {
    pub(super) policies: Vec<PolicyDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyDoc {
    pub(super) name: Located<String>,
    pub(super) topics: Located<Vec<Located<String>>>,
    #[serde(default)]
    pub(super) value: Option<ValueDoc>,
    /// Keys are validated too (decoded and checked against their schema;
    /// rules apply to the value only).
    #[serde(default)]
    pub(super) key: Option<Located<ValueDoc>>,
    #[serde(default)]
    pub(super) rules: Option<Located<Vec<Located<RuleDoc>>>>,
    #[serde(default)]
    pub(super) headers: HeadersDoc,
    #[serde(default)]
    pub(super) on_invalid: super::Action,
    #[serde(default)]
    pub(super) on_undecodable: UndecodableDoc,
    #[serde(default)]
    pub(super) on_produce: OnProduceDoc,
    #[serde(default)]
    pub(super) ordering: OrderingDoc,
    #[serde(default)]
    pub(super) dead_letter: DeadLetterDoc,
    /// The diversion circuit breaker (off when absent).
    #[serde(default)]
    pub(super) breaker: Option<Located<BreakerDoc>>,
}

/// `breaker: { max_ratio, over, min_diverted }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BreakerDoc {
    pub(super) max_ratio: f64,
    pub(super) over: u32,
    pub(super) min_diverted: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ValueDoc {
    /// A name in the format table (`format.rs`).
    pub(super) format: Located<String>,
    #[serde(default)]
    pub(super) schema: Option<Located<PathBuf>>,
    #[serde(default)]
    pub(super) schema_ids: Option<Located<BTreeMap<u32, Located<PathBuf>>>>,
    #[serde(default)]
    pub(super) message: Option<Located<String>>,
    #[serde(default)]
    pub(super) wire: Option<Located<Wire>>,
    #[serde(default)]
    pub(super) max_bytes: Option<usize>,
    #[serde(default = "yes")]
    pub(super) allow_null: bool,
    #[serde(default)]
    pub(super) max_depth: Option<Located<usize>>,
    /// Resolve the Confluent framing's schema id through `schema_registry`.
    #[serde(default)]
    pub(super) registry: Option<Located<bool>>,
    /// With `registry`: the id must be registered under this subject.
    #[serde(default)]
    pub(super) subject: Option<Located<String>>,
    /// Apicurio wires: which id the record carries (`global`, `content`).
    #[serde(default)]
    pub(super) id: Option<Located<IdKindDoc>>,
    /// `wire: apicurio-headers`: the header holding the id (default
    /// Apicurio's own, `apicurio.value.contentId` and the like).
    #[serde(default)]
    pub(super) id_header: Option<Located<String>>,
    /// Set by the loader for the `key:` section (Apicurio's key headers).
    #[serde(skip)]
    pub(super) is_key: bool,
}

/// `id:` of an Apicurio wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum IdKindDoc {
    Global,
    Content,
}

pub(super) fn yes() -> bool {
    true
}

/// Largest value a decoding policy judges when `max_bytes` is not set: four
/// times Kafka's default `max.message.bytes` (1 MiB). Decoding costs a few
/// times the value's size in memory, so a policy that decodes is always
/// bounded; a larger value is poison (rule `max_bytes`) unless the policy
/// raises the limit. `bytes` policies do not decode, so they have none.
pub(crate) const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;

/// How a value's bytes are framed (`value.wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Wire {
    #[default]
    Raw,
    Confluent,
    #[serde(rename = "apicurio-headers")]
    ApicurioHeaders,
    #[serde(rename = "apicurio-8byte")]
    Apicurio8Byte,
    #[serde(rename = "apicurio-4byte")]
    Apicurio4Byte,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleDoc {
    #[serde(default)]
    pub(super) coordinates: Option<Located<CoordDoc>>,
    #[serde(default)]
    pub(super) field: Option<Located<String>>,
    #[serde(default)]
    pub(super) one_of: Option<Located<Vec<serde_json::Value>>>,
    #[serde(default)]
    pub(super) min: Option<Located<f64>>,
    #[serde(default)]
    pub(super) max: Option<Located<f64>>,
    #[serde(default)]
    pub(super) max_age: Option<Located<serde_yaml::Value>>,
    #[serde(default)]
    pub(super) unit: Option<Located<TimeUnit>>,
    /// A missing or null field passes `one_of` and `min`/`max` (default false).
    #[serde(default)]
    pub(super) optional: bool,
    /// The field must be missing (or null).
    #[serde(default)]
    pub(super) absent: Option<Located<bool>>,
    /// The class a failure of this rule gets (default: the rule's own).
    #[serde(default)]
    pub(super) class: Option<Located<ClassDoc>>,
    /// A CEL condition over `message`, `key`, `headers`, `timestamp`.
    #[serde(default)]
    pub(super) cel: Option<Located<String>>,
    /// A `cel` rule's name (`cel:<name>` in verdicts).
    #[serde(default)]
    pub(super) name: Option<Located<String>>,
}

/// The classes a rule may be given (`transient` is the registry's alone).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum ClassDoc {
    Poison,
    Stale,
    Unknown,
    Redact,
}

impl ClassDoc {
    pub(super) fn class(self) -> super::Class {
        match self {
            ClassDoc::Poison => super::Class::Poison,
            ClassDoc::Stale => super::Class::Stale,
            ClassDoc::Unknown => super::Class::Unknown,
            ClassDoc::Redact => super::Class::Redact,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CoordDoc {
    pub(super) lat: Located<String>,
    pub(super) lon: Located<String>,
    #[serde(default)]
    pub(super) reject_null_island: bool,
    #[serde(default)]
    pub(super) bbox: Option<Located<Vec<f64>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HeadersDoc {
    #[serde(default)]
    pub(super) required: Vec<Located<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum UndecodableDoc {
    #[default]
    Hold,
    Divert,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum OnProduceDoc {
    #[default]
    Pass,
    Reject,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum OrderingDoc {
    #[default]
    None,
    PerKey,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeadLetterDoc {
    #[serde(default)]
    pub(super) topic: Option<Located<String>>,
}
