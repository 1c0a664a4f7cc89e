//! Policies: which topics are validated, how a record's bytes are decoded
//! and which rules it must pass. Pure: bytes in, verdict out, no I/O except
//! reading policy and schema files at load time.
//!
//! Layout:
//! - [`load`]: YAML shape, file/directory walking, compiling a policy, and
//!   load errors that name `file:line:column` and the offending key.
//! - [`glob`]: topic patterns (`*`, `?`) and the topic → policy index.
//! - [`json`], [`avro`], [`protobuf`]: decode a value's bytes into a
//!   [`serde_json::Value`]; except that a JSON policy without a JSON Schema
//!   takes [`json`]'s fast path, which validates the whole document but
//!   keeps only the fields its rules name (no `Value` is built).
//! - [`rules`]: JSON pointers, field rules, coordinates, staleness; one
//!   mechanism over both representations (`rules::Doc`).
//! - [`deadletter`]: dead-letter topic templates (`{topic}`, `{class}`).
//!
//! Judging order (first failure wins): `headers.required`, `allow_null`,
//! `max_bytes`, `decode` (and `schema_id`), `schema`, rules in file order,
//! `cel` conditions in file order, then `max_age` rules last, so a record
//! that is both broken and old is `poison`, not `stale`.
//!
//! Topic matching: an exact topic name beats any glob; among globs the first
//! policy in load order wins. The same exact topic named by two policies is a
//! load error (reported at the second occurrence). Note that a glob such as
//! `geo.*` also matches its own dead-letter topics (`geo.x.dlt`); the proxy
//! can ask [`PolicySet::is_dead_letter_topic`] to skip them.
//!
//! # Policy keys
//!
//! ```yaml
//! policies:
//!   - name: geofence-triggers          # unique across all files
//!     topics: ["geofence.triggers", "geo.*"]   # exact names or globs (* ?)
//!     value:                           # absent: format bytes
//!       format: json                   # json | avro | protobuf | bytes
//!       schema: schemas/x.schema.json  # .json (JSON Schema), .avsc, .proto; relative to this file
//!       wire: raw                      # avro/protobuf: raw (default) | confluent
//!       schema_ids: {1: schemas/x.avsc}  # confluent: writer schema per registry id
//!       message: pkg.Type              # protobuf: required for raw; for confluent, the type every record must be
//!       max_bytes: 65536               # default: no limit
//!       allow_null: true               # tombstones pass (default true)
//!       max_depth: 64                  # json nesting limit, 1..=127 (default 64)
//!       registry: true                 # schema by the confluent id, from the registry cache (`registry`)
//!       subject: "{topic}-value"       # with registry: the id must be registered under it
//!     key: { format: avro, wire: confluent, registry: true }   # keys decoded and checked too (rules: values only)
//!     rules:                           # judged in order on the decoded value
//!       - coordinates: {lat: /lat, lon: /lon, reject_null_island: true, bbox: [min_lat, min_lon, max_lat, max_lon]}
//!       - field: /transition           # an RFC 6901 JSON pointer
//!         one_of: [ENTER, EXIT, DWELL]
//!       - field: /speed_mps
//!         min: 0
//!         max: 150
//!         optional: true               # missing or null passes one_of/min/max (default false)
//!       - field: /event_time_ms
//!         max_age: 15m                 # ms s m h d; older: class stale (judged last)
//!         unit: ms                     # s | ms (default) | us | ns
//!       - field: /ssn
//!         absent: true                 # missing or null, or the rule fails
//!         class: redact                # any rule: poison | stale | unknown | redact
//!       - cel: "message.exit_time > message.enter_time"   # a CEL condition (`cel`): message, key, headers, timestamp
//!         name: exit-after-enter       # optional: the rule is `cel:exit-after-enter`
//!     headers:
//!       required: [idempotency-key]    # present with a non-null value
//!     on_invalid: divert               # divert (default) | drop | pass
//!     on_undecodable: hold             # hold (default) | divert: a batch that cannot be read
//!     on_produce: pass                 # pass (default: judged on fetch only) | reject: refuse invalid batches at Produce
//!     ordering: none                   # none (default) | per_key: a diverted record blocks its key's later records
//!     breaker: { max_ratio: 0.05, over: 1000, min_diverted: 50 }   # optional: hold instead of diverting past this share
//!     dead_letter:
//!       topic: "{topic}.dlt"           # default; placeholders {topic} and {class}
//! ```
//!
//! With Avro `wire: confluent`, `schema` (optional) is the reader schema the
//! writer's datum is resolved to. Protobuf values become JSON keyed by proto
//! field names with int64 as numbers and enums as names.

mod action;
#[cfg(test)]
mod apicurio_tests;
mod avro;
#[cfg(test)]
mod avro_proptests;
#[cfg(test)]
mod byte_edits;
mod cel;
mod checks;
mod compile;
pub mod contract;
mod dlt_topic;
mod document;
mod format;
pub mod formats;
mod glob;
mod json;
#[cfg(test)]
mod json_proptests;
mod judge;
mod load;
mod located;
mod protobuf;
#[cfg(test)]
mod protobuf_proptests;
mod registered;
pub mod registry;
#[cfg(test)]
mod registry_tests;
mod rules;
#[cfg(test)]
mod rules_testutil;
mod shape;
#[cfg(test)]
mod tests;
mod wire;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::kafka::record::Record;

pub use action::Action;
pub use dlt_topic::DeadLetterTemplate;
pub use registry::{Registered, SchemaCache, Want};

/// What went wrong loading policies. Displayed as `file:line:column: message`;
/// the message names the offending key (e.g. `value.schema: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", file.display())]
pub struct PolicyError {
    pub file: PathBuf,
    /// 1-based; 1 when the error concerns the file as a whole.
    pub line: usize,
    /// 1-based; 1 when the error concerns the file as a whole.
    pub column: usize,
    pub message: String,
}

impl PolicyError {
    pub(crate) fn whole_file(file: &Path, message: impl Into<String>) -> Self {
        PolicyError {
            file: file.to_path_buf(),
            line: 1,
            column: 1,
            message: message.into(),
        }
    }
}

/// Why a record was judged invalid, classified by remedy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Will never become valid: undecodable, schema or rule violation.
    Poison,
    /// Valid, but older than its policy's `max_age`.
    Stale,
    /// The validator cannot decide (e.g. an unknown schema id).
    Unknown,
    /// Not decidable now, but later: a schema the registry has not answered
    /// for yet. Never cached, never dead-lettered: the partition is held at
    /// the record until the verdict can be reached.
    Transient,
    /// Must be deleted rather than archived (data protection): removed from
    /// the stream, and its DLT record carries only context headers.
    Redact,
    /// A later record of a key whose earlier record was diverted
    /// (`ordering: per_key`): parked behind it, whatever its own verdict.
    Blocked,
}

impl Class {
    /// Every class that can reach a dead-letter topic (not `transient`).
    pub const ALL: [Class; 5] = [
        Class::Poison,
        Class::Stale,
        Class::Unknown,
        Class::Redact,
        Class::Blocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Poison => "poison",
            Class::Stale => "stale",
            Class::Unknown => "unknown",
            Class::Transient => "transient",
            Class::Redact => "redact",
            Class::Blocked => "blocked",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with a batch whose records cannot be read at all (corrupt,
/// unknown codec, over the decompression cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecodable {
    /// Hold the partition at the batch until an operator acts (default:
    /// the proxy cannot tell corruption from a transient fault, and a hold
    /// loses nothing).
    Hold,
    /// Write the batch's raw bytes to the DLT as one record (class poison,
    /// rule `batch`) and deliver an empty batch in its place.
    Divert,
}

/// Whether diverting a record parks the later records of its key
/// (`ordering`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyOrdering {
    /// Records are judged one by one (the default): a diverted record's
    /// later same-key records may be delivered before it is replayed.
    #[default]
    None,
    /// Once a record of key K is diverted, every later record of K in the
    /// same partition is diverted too (class `blocked`) until K is released.
    PerKey,
}

/// What the proxy does with a client's Produce to a topic of this policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnProduce {
    /// Relay it; its records are judged when fetched (the default).
    Pass,
    /// Judge every record of each partition's batch at the door and refuse
    /// a batch holding any record invalid for a reason other than `stale`
    /// (INVALID_RECORD), so poison never lands in the log.
    Reject,
}

/// A judgement on one invalid record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub class: Class,
    /// Which rule failed, e.g. `schema`, `coordinates`, `headers.required`.
    pub rule: String,
    /// A reason a human can act on, e.g. `/lat: 91.5 is outside [-90, 90]`.
    pub reason: String,
    /// The registry's data-contract rule that failed, when one did (the
    /// DLT record's `__rule.*` headers).
    pub contract: Option<Box<contract::RuleFailure>>,
}

/// Whether logs may quote record contents (`logging.record_contents`).
static LOG_RECORD_CONTENTS: AtomicBool = AtomicBool::new(false);

/// Allow (or forbid, the default) reasons in logs; set once at start.
pub fn set_log_record_contents(on: bool) {
    LOG_RECORD_CONTENTS.store(on, Ordering::Relaxed);
}

impl Invalid {
    /// The reason as logs may show it: the reason itself only when the
    /// operator opted in, since reasons quote field values.
    pub fn log_reason(&self) -> &str {
        if self.class == Class::Redact {
            // Never, whatever the operator opted into: that is the point.
            "(withheld: class redact)"
        } else if LOG_RECORD_CONTENTS.load(Ordering::Relaxed) {
            &self.reason
        } else {
            "(withheld: logging.record_contents is off)"
        }
    }

    pub(crate) fn poison(rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Invalid {
            class: Class::Poison,
            rule: rule.into(),
            reason: reason.into(),
            contract: None,
        }
    }
}

/// The outcome of judging one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    Invalid(Invalid),
}

impl Verdict {
    pub fn is_valid(&self) -> bool {
        matches!(self, Verdict::Valid)
    }
}

/// `breaker:` of a policy: a partition holds at the record that would be
/// diverted once more than `max_ratio` of its last `over` judged offsets
/// were diverted, with at least `min_diverted` of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Breaker {
    pub max_ratio: f64,
    pub over: u32,
    pub min_diverted: u32,
}

/// One compiled policy.
#[derive(Debug)]
pub struct Policy {
    pub name: String,
    pub on_invalid: Action,
    pub on_undecodable: Undecodable,
    pub on_produce: OnProduce,
    pub ordering: KeyOrdering,
    /// The diversion circuit breaker, when the policy sets one.
    pub breaker: Option<Breaker>,
    /// A hash of the text the policy was compiled from: a reload that
    /// leaves it unchanged leaves the policy's breakers as they are.
    pub revision: u64,
    /// The `topics` patterns as written (exact names and globs).
    pub topics: Vec<String>,
    /// The file this policy was loaded from.
    pub source: PathBuf,
    pub(crate) inner: judge::Compiled,
}

impl Policy {
    /// Whether the value or the key reads schemas from the registry.
    pub fn uses_registry(&self) -> bool {
        self.inner.uses_registry()
    }

    /// Judge one record. `now_ms` is wall-clock milliseconds since the epoch,
    /// used by `max_age` rules only.
    pub fn judge(&self, record: &Record<'_>, now_ms: i64) -> Verdict {
        self.judge_in("", record, now_ms)
    }

    /// For the fuzzers: a JSON policy's fast readers (the layout's
    /// template, the flat reader, the byte scanner) agree with serde_json
    /// on `value`: whatever one accepts, the template's member loop and
    /// the serde_json visitor accept too, with the same captured values
    /// (`Err` naming both when not). `Ok` for other policies.
    #[cfg(feature = "fuzzing")]
    pub fn fast_paths_agree(&self, value: &[u8]) -> Result<(), String> {
        match self.inner.scanner_agrees(value) {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Judge one record of `topic` (the `{topic}` of a registry `subject`).
    pub fn judge_in(&self, topic: &str, record: &Record<'_>, now_ms: i64) -> Verdict {
        self.judge_at(topic, record, now_ms, contract::Side::Read)
    }

    /// [`Self::judge_in`] on `side`: a fetched record (`Read`) or one
    /// produced through the door (`Write`), for the registry's
    /// data-contract rules of that mode.
    pub fn judge_at(
        &self,
        topic: &str,
        record: &Record<'_>,
        now_ms: i64,
        side: contract::Side,
    ) -> Verdict {
        match self.inner.judge_on(topic, record, now_ms, side) {
            Ok(()) => Verdict::Valid,
            Err(invalid) => Verdict::Invalid(invalid),
        }
    }

    /// A value of `topic` decoded as the policy decodes it (its schema
    /// file or the registry), as JSON; `None` for `bytes` policies. A
    /// registry schema not cached yet is an `Err` of class `transient`.
    pub fn decode_value(
        &self,
        topic: &str,
        bytes: &[u8],
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, Invalid> {
        self.inner.decode_value(topic, bytes, now_ms)
    }

    /// The dead-letter topic for a record of `topic` judged `class`.
    pub fn dead_letter_topic(&self, topic: &str, class: Class) -> String {
        self.inner.dead_letter.render(topic, class)
    }

    /// The dead-letter template, e.g. `{topic}.dlt`.
    pub fn dead_letter_template(&self) -> &DeadLetterTemplate {
        &self.inner.dead_letter
    }
}

/// Every loaded policy, matched to topics by exact name or glob.
#[derive(Debug, Default)]
pub struct PolicySet {
    policies: Vec<Arc<Policy>>,
    index: glob::TopicIndex,
}

impl PolicySet {
    /// Load every policy file named (files, or directories whose `*.yaml` /
    /// `*.yml` files are read in name order). Collects every error found in
    /// every file; one YAML shape error (unknown key, wrong type) stops the
    /// reading of its own file only.
    pub fn load(paths: &[PathBuf]) -> Result<PolicySet, Vec<PolicyError>> {
        Self::load_with(paths, &SchemaCache::shared())
    }

    /// [`PolicySet::load`], with `registry: true` policies reading
    /// registered schemas from `cache`.
    pub fn load_with(
        paths: &[PathBuf],
        cache: &Arc<SchemaCache>,
    ) -> Result<PolicySet, Vec<PolicyError>> {
        let policies = load::load_all(paths, cache)?;
        Ok(PolicySet::from_policies(policies))
    }

    /// Parse one policy file's text as if read from `path` (schema paths are
    /// relative to `path`'s folder).
    pub fn parse(text: &str, path: &Path) -> Result<PolicySet, Vec<PolicyError>> {
        Self::parse_with(text, path, &SchemaCache::shared())
    }

    /// [`PolicySet::parse`] with its own schema cache.
    pub fn parse_with(
        text: &str,
        path: &Path,
        cache: &Arc<SchemaCache>,
    ) -> Result<PolicySet, Vec<PolicyError>> {
        let policies = load::load_text(text, path, cache)?;
        Ok(PolicySet::from_policies(policies))
    }

    /// Whether any policy reads schemas from the registry.
    pub fn uses_registry(&self) -> bool {
        self.policies.iter().any(|p| p.inner.uses_registry())
    }

    fn from_policies(policies: Vec<Policy>) -> PolicySet {
        let policies: Vec<Arc<Policy>> = policies.into_iter().map(Arc::new).collect();
        let index = glob::TopicIndex::new(policies.iter().map(|p| p.topics.as_slice()));
        PolicySet { policies, index }
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Every policy, in load order.
    pub fn policies(&self) -> &[Arc<Policy>] {
        &self.policies
    }

    /// The policy covering `topic`, if any: an exact name first, then the
    /// first glob in load order. Cheap: a hash lookup, globs are matched once
    /// per topic and cached.
    pub fn for_topic(&self, topic: &str) -> Option<&Arc<Policy>> {
        self.index.lookup(topic).and_then(|i| self.policies.get(i))
    }

    /// The policy that judges `topic`'s records: the one covering it, unless
    /// `topic` is a dead-letter topic (a glob may cover one too: its records
    /// are the proxy's own diversions, never judged again).
    pub fn policing(&self, topic: &str) -> Option<&Arc<Policy>> {
        let policy = self.for_topic(topic)?;
        (!self.is_dead_letter_topic(topic)).then_some(policy)
    }

    /// Every distinct dead-letter template, so the proxy can list DLT topics.
    pub fn dead_letter_templates(&self) -> Vec<&DeadLetterTemplate> {
        let mut out: Vec<&DeadLetterTemplate> = Vec::new();
        for p in &self.policies {
            let t = p.dead_letter_template();
            if !out.iter().any(|o| o.as_str() == t.as_str()) {
                out.push(t);
            }
        }
        out
    }

    /// Whether any policy judges Produce requests (`on_produce: reject`).
    pub fn rejects_at_produce(&self) -> bool {
        self.policies
            .iter()
            .any(|p| p.on_produce == OnProduce::Reject)
    }

    /// Whether `topic` looks like a dead-letter topic of some policy (so the
    /// proxy can avoid judging its own diversions again).
    pub fn is_dead_letter_topic(&self, topic: &str) -> bool {
        self.policies
            .iter()
            .any(|p| p.dead_letter_template().matches(topic))
    }
}
