//! Policies: which topics are validated, how a record's bytes are decoded
//! and which rules it must pass. Pure: bytes in, verdict out, no I/O except
//! reading policy and schema files at load time.
//!
//! STUB: the real implementation is being written; the API below is the
//! contract the interception layer codes against.

use std::path::PathBuf;
use std::sync::Arc;

use crate::kafka::record::Record;

/// What went wrong loading policies; every error names file:line:column.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// Why a record was judged invalid, classified by remedy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Poison,
    Stale,
    Unknown,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Poison => "poison",
            Class::Stale => "stale",
            Class::Unknown => "unknown",
        }
    }
}

/// What to do with an invalid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Divert,
    Drop,
    Pass,
}

/// A judgement on one invalid record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub class: Class,
    /// Which rule failed, e.g. `schema`, `coordinates`, `headers.required`.
    pub rule: String,
    /// A reason a human can act on, e.g. `/lat: 91.5 is outside [-90, 90]`.
    pub reason: String,
}

/// The outcome of judging one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    Invalid(Invalid),
}

/// One compiled policy.
#[derive(Debug)]
pub struct Policy {
    pub name: String,
    pub on_invalid: Action,
}

impl Policy {
    pub fn judge(&self, _record: &Record<'_>, _now_ms: i64) -> Verdict {
        todo!()
    }
    /// The dead-letter topic for a record of `topic` judged `class`.
    pub fn dead_letter_topic(&self, _topic: &str, _class: Class) -> String {
        todo!()
    }
}

/// Every loaded policy, matched to topics by exact name or glob.
#[derive(Debug, Default)]
pub struct PolicySet {
    policies: Vec<Arc<Policy>>,
}

impl PolicySet {
    /// Load every policy file named (files or directories of `*.yaml`/`*.yml`).
    pub fn load(_paths: &[PathBuf]) -> Result<PolicySet, Vec<PolicyError>> {
        Ok(PolicySet::default())
    }
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
    /// The policy covering `topic`, if any (first match in load order).
    pub fn for_topic(&self, _topic: &str) -> Option<&Arc<Policy>> {
        None
    }
}
