//! Confluent data-contract rules: the `ruleSet` a schema registry returns
//! with a schema, its `CONDITION` rules of type `CEL` and `CEL_FIELD`
//! compiled by antidote's own CEL compiler ([`CelRule`]) and judged on a
//! decoded value on the side they name (`READ` on fetch, `WRITE` at the
//! door). Pure: the registry client compiles a contract when it stores a
//! schema, the policy's judge runs it.
//!
//! Must never skip a rule it cannot honour: a `TRANSFORM`, a `JSONATA` or
//! `ENCRYPT` rule, an unknown action or a `CEL_FIELD` form the compiler
//! cannot express is a compile error naming the subject and the rule (the
//! schema is then unusable, class `unknown`, as any schema that does not
//! compile). Disabled rules, and rules of the migration modes (`UPGRADE`,
//! `DOWNGRADE`, `UPDOWN`: a record is read with its writer's schema, never
//! migrated), never run, as in Confluent's own clients.

mod fields;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::Value;

use super::cel::{CelRule, FieldScope};
use super::rules::{assign_more, Doc, Pointer};
use super::{Class, Invalid};
use crate::kafka::record::Record;

/// Which side a record is judged on: fetched (`READ` rules) or produced
/// through the door (`WRITE` rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Side {
    #[default]
    Read,
    Write,
}

impl Side {
    /// The rule mode Confluent's clients name this side by.
    pub fn mode(self) -> &'static str {
        match self {
            Side::Read => "READ",
            Side::Write => "WRITE",
        }
    }
}

/// What a failed rule does on one side (`onFailure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// `ERROR` and `DLQ`: the record is invalid (diverted on fetch,
    /// refused at the door): a proxy cannot throw inside a client.
    Refuse,
    /// `NONE`: counted only ([`none_counts`]); the record goes on.
    Count,
}

/// A failed data-contract rule, as the DLT's `__rule.*` headers name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFailure {
    pub name: String,
    /// `READ` or `WRITE`.
    pub mode: &'static str,
    pub subject: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RuleSetDoc {
    #[serde(default)]
    domain_rules: Vec<RuleDoc>,
    #[serde(default)]
    encoding_rules: Vec<RuleDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleDoc {
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(rename = "type", default)]
    rule_type: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, String>,
    #[serde(default)]
    expr: Option<String>,
    #[serde(default)]
    on_success: Option<String>,
    #[serde(default)]
    on_failure: Option<String>,
    #[serde(default)]
    disabled: bool,
}

/// One compiled rule.
#[derive(Debug)]
struct ContractRule {
    name: String,
    read: Option<Action>,
    write: Option<Action>,
    /// `params.dlq.topic`: must be the policy's DLT ([`Contract::dlq_mismatch`]).
    dlq_topic: Option<String>,
    /// One check (`CEL`), or one per field its guard selects (`CEL_FIELD`).
    /// CEL_FIELD's checks name their field.
    checks: Vec<(Option<String>, CelRule)>,
}

/// The rules of one registered schema that run on reads or writes.
#[derive(Debug)]
pub struct Contract {
    subject: String,
    rules: Vec<ContractRule>,
    /// The fields the rules read, one per slot of the contract's own (the
    /// fast path captures them with the policy's: `registered.rs`).
    pointers: Vec<Pointer>,
    /// Per side, the rules that run on it ([`Runs`]).
    reads: Runs,
    writes: Runs,
}

/// The rules of one side, found once when the contract is compiled rather
/// than per record: their index in `Contract::rules` and their action, in
/// the order they run (Confluent's, reversed on reads).
type Runs = Box<[(usize, Action)]>;

/// A check ordering two fields, by their slots, and the orderings (less,
/// equal, greater) for which it holds ([`Contract::pairs`]).
pub(crate) type Pair = (usize, usize, [bool; 3]);

/// Most checks one rule set compiles to (each `CEL` rule is one, a
/// `CEL_FIELD` rule one per field it selects): a registry answer is input
/// (up to `MAX_BODY`), and every check runs on every record of the schema.
pub(super) const MAX_CHECKS: usize = 256;

/// The error of a rule set past [`MAX_CHECKS`].
pub(super) fn too_many() -> String {
    format!("more than {MAX_CHECKS} checks in the rule set (a CEL rule is one, a CEL_FIELD rule one per field it selects)")
}

/// A rule's error, naming the subject and the rule.
fn named(subject: &str, rule: &str, what: impl std::fmt::Display) -> String {
    format!("subject {subject}, data-contract rule {rule}: {what}")
}

/// Compile the `ruleSet` of a schema registered under `subject`, of
/// `schema_type` (`AVRO`, `JSON`, `PROTOBUF`) with text `schema` (the
/// fields of `CEL_FIELD` rules). `None` when no rule runs on reads or
/// writes; `Err` naming the subject and the first rule antidote cannot
/// honour.
pub fn compile_contract(
    subject: &str,
    rule_set: &Value,
    schema_type: &str,
    schema: &str,
) -> Result<Option<Contract>, String> {
    let doc = RuleSetDoc::deserialize(rule_set)
        .map_err(|e| format!("subject {subject}: the ruleSet does not read: {e}"))?;
    if let Some(r) = doc.encoding_rules.iter().find(|r| !r.disabled) {
        return Err(named(
            subject,
            &r.name,
            "encoding rules (payload encryption) are not supported: the value could not be read",
        ));
    }
    let (mut rules, mut left) = (Vec::new(), MAX_CHECKS);
    for r in doc.domain_rules.iter().filter(|r| !r.disabled) {
        if let Some(rule) =
            compile_rule(r, schema_type, schema, left).map_err(|e| named(subject, &r.name, e))?
        {
            left -= rule.checks.len();
            rules.push(rule);
        }
    }
    let mut pointers = Vec::new();
    for r in &mut rules {
        for (_, c) in &mut r.checks {
            assign_more(&mut pointers, c.pointers_mut());
        }
    }
    let runs = |act: fn(&ContractRule) -> Option<Action>| -> Runs {
        (rules.iter().enumerate())
            .filter_map(|(i, r)| Some((i, act(r)?)))
            .collect()
    };
    let writes = runs(|r| r.write);
    let mut reads = runs(|r| r.read);
    reads.reverse();
    Ok((!rules.is_empty()).then(|| Contract {
        subject: subject.to_string(),
        rules,
        pointers,
        reads,
        writes,
    }))
}

/// One domain rule; `None` for a rule of a migration mode.
fn compile_rule(
    r: &RuleDoc,
    schema_type: &str,
    schema: &str,
    left: usize,
) -> Result<Option<ContractRule>, String> {
    let (read, write) = match r.mode.as_deref().unwrap_or("") {
        "READ" => (true, false),
        "WRITE" => (false, true),
        "WRITEREAD" => (true, true),
        "UPGRADE" | "DOWNGRADE" | "UPDOWN" => return Ok(None),
        m => {
            return Err(format!(
                "mode `{m}` is not one of WRITE, READ, WRITEREAD, UPGRADE, DOWNGRADE, UPDOWN"
            ))
        }
    };
    match r.kind.as_deref().unwrap_or("") {
        "CONDITION" => {}
        "TRANSFORM" => {
            return Err(
                "TRANSFORM rules are not supported: a proxy does not rewrite records".into(),
            )
        }
        k => return Err(format!("kind `{k}` is not CONDITION")),
    }
    if let Some(s) = r
        .on_success
        .as_deref()
        .filter(|s| !s.split(',').all(|a| matches!(a.trim(), "NONE" | "")))
    {
        return Err(format!("onSuccess `{s}` is not supported (only NONE)"));
    }
    let expr = r.expr.as_deref().unwrap_or("");
    let id = format!("rule:{}", r.name);
    let checks = match r.rule_type.as_deref().unwrap_or("") {
        "CEL" if left == 0 => return Err(too_many()),
        "CEL" => vec![(
            None,
            CelRule::named(id, expr, None).map_err(|e| format!("`{expr}`: {e}"))?,
        )],
        "CEL_FIELD" => fields::checks(&id, expr, schema_type, schema, left)?,
        t @ ("JSONATA" | "ENCRYPT" | "ENCRYPT_PAYLOAD") => {
            return Err(format!("rules of type {t} are not supported"))
        }
        t => {
            return Err(format!(
                "rules of type `{t}` are not supported (CEL and CEL_FIELD are)"
            ))
        }
    };
    let on_failure = (r.on_failure.as_deref())
        .filter(|f| !f.is_empty())
        .unwrap_or("ERROR");
    Ok(Some(ContractRule {
        name: r.name.clone(),
        read: read.then(|| action(on_failure, Side::Read)).transpose()?,
        write: write.then(|| action(on_failure, Side::Write)).transpose()?,
        dlq_topic: r.params.get("dlq.topic").cloned(),
        checks,
    }))
}

/// `onFailure` on `side`: `"DLQ,ERROR"` is DLQ on writes, ERROR on reads
/// (as Confluent's clients split it); a single action is both.
fn action(on_failure: &str, side: Side) -> Result<Action, String> {
    let one = match on_failure.split_once(',') {
        Some((w, r)) => match side {
            Side::Write => w,
            Side::Read => r,
        },
        None => on_failure,
    };
    match one.trim() {
        "ERROR" | "DLQ" => Ok(Action::Refuse),
        "NONE" => Ok(Action::Count),
        a => Err(format!(
            "onFailure `{a}` is not supported (ERROR, DLQ or NONE)"
        )),
    }
}

impl Contract {
    /// The subject the schema was found under.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// A rule whose `dlq.topic` is not `dlt` (the policy's dead-letter
    /// topic for this record's poison): the schema cannot be used with
    /// this policy, class `unknown`, as a schema that does not compile.
    pub(crate) fn dlq_mismatch(&self, dlt: &str) -> Option<Invalid> {
        let r = self
            .rules
            .iter()
            .find(|r| r.dlq_topic.as_deref().is_some_and(|t| t != dlt))?;
        Some(Invalid {
            class: Class::Unknown,
            rule: "schema-id".into(),
            reason: named(
                &self.subject,
                &r.name,
                format!(
                    "dlq.topic {} is not a dead-letter topic of this policy (its DLT here is {dlt})",
                    r.dlq_topic.as_deref().unwrap_or_default()
                ),
            ),
            contract: None,
        })
    }

    /// The fields the rules read, in the order of their slots.
    pub(crate) fn pointers(&self) -> &[Pointer] {
        &self.pointers
    }

    /// The checks of the rules that run on `side`, when every one orders
    /// two fields (`message.a > message.b`, [`CelRule::two`]): each as
    /// the slots of its fields (the contract's) and the orderings that
    /// hold, so that a fast path can find them all holding on two numbers
    /// without judging ([`Self::check`] would then pass the record and
    /// count nothing). `None` when a check is of another form.
    pub(crate) fn pairs(&self, side: Side) -> Option<Vec<Pair>> {
        let runs = match side {
            Side::Read => &self.reads,
            Side::Write => &self.writes,
        };
        let mut out = Vec::new();
        for &(i, _) in runs.iter() {
            for (_, c) in &self.rules.get(i)?.checks {
                let (a, b, holds) = c.two()?;
                out.push((a.slot(), b.slot(), holds));
            }
        }
        Some(out)
    }

    /// Whether any rule has a `dlq.topic` (so [`Self::dlq_mismatch`] needs
    /// the policy's DLT).
    pub(crate) fn names_dlq(&self) -> bool {
        self.rules.iter().any(|r| r.dlq_topic.is_some())
    }

    /// Judge `value` (the decoded value, or its captured fields by the
    /// contract's slots) of record `r` by the rules for `side`, in
    /// Confluent's order (reversed on reads). The first failing rule whose
    /// action refuses is the verdict; a failing `NONE` rule is counted.
    pub(crate) fn check<D: Doc>(
        &self,
        value: &D,
        r: &Record<'_>,
        side: Side,
    ) -> Result<(), Invalid> {
        let runs = match side {
            Side::Read => &self.reads,
            Side::Write => &self.writes,
        };
        if runs.is_empty() {
            return Ok(());
        }
        self.run(runs, value, r, side)
    }

    /// [`Self::check`] by the rules of `runs`: each rule's checks asked
    /// whether they hold, and only a failing one worded ([`Self::failed`]).
    /// Out of line, so that a side with no rule costs `check` one test.
    #[inline(never)]
    fn run<D: Doc>(
        &self,
        runs: &[(usize, Action)],
        value: &D,
        r: &Record<'_>,
        side: Side,
    ) -> Result<(), Invalid> {
        for &(i, act) in runs {
            let Some(rule) = self.rules.get(i) else {
                continue;
            };
            if let Some(k) = rule.checks.iter().position(|(_, c)| !c.holds(value, r)) {
                self.failed(rule, k, act, value, r, side)?;
            }
        }
        Ok(())
    }

    /// Rule `rule`, whose `k`th check does not hold: its check's verdict
    /// (`Ok` should the full evaluation disagree), named by the subject,
    /// the rule and the field; a `NONE` rule counted and passed.
    #[cold]
    #[inline(never)]
    fn failed(
        &self,
        rule: &ContractRule,
        k: usize,
        act: Action,
        value: &dyn Doc,
        r: &Record<'_>,
        side: Side,
    ) -> Result<(), Invalid> {
        let Some((field, c)) = rule.checks.get(k) else {
            return Ok(());
        };
        let Err(mut e) = c.check(value, r) else {
            return Ok(());
        };
        match act {
            Action::Count => {
                count_none(&self.subject, &rule.name, side);
                Ok(())
            }
            Action::Refuse => {
                e.reason = match field {
                    Some(f) => named(
                        &self.subject,
                        &rule.name,
                        format!("field {f}: {}", e.reason),
                    ),
                    None => named(&self.subject, &rule.name, &e.reason),
                };
                e.contract = Some(Box::new(RuleFailure {
                    name: rule.name.clone(),
                    mode: side.mode(),
                    subject: self.subject.clone(),
                }));
                Err(e)
            }
        }
    }
}

/// Most (subject, rule, side) series [`none_counts`] keeps.
const MAX_NONE_SERIES: usize = 1024;

type NoneKey = (String, String, Side);

static NONE_COUNTS: Mutex<BTreeMap<NoneKey, u64>> = Mutex::new(BTreeMap::new());

fn count_none(subject: &str, rule: &str, side: Side) {
    let Ok(mut m) = NONE_COUNTS.lock() else {
        return;
    };
    let key = (subject.to_string(), rule.to_string(), side);
    if let Some(n) = m.get_mut(&key) {
        *n += 1;
    } else if m.len() < MAX_NONE_SERIES {
        m.insert(key, 1);
    }
}

/// Failures of `onFailure: NONE` rules so far, by subject, rule and side
/// (records judged, not records delivered: a verdict cached is not
/// counted again). At most 1,024 series.
pub fn none_counts() -> Vec<(String, String, Side, u64)> {
    match NONE_COUNTS.lock() {
        Ok(m) => m
            .iter()
            .map(|((s, r, d), n)| (s.clone(), r.clone(), *d, *n))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// For [`fields`]: a CEL_FIELD rule's scope on one field.
fn field_rule(id: &str, text: &str, name: &str, type_name: &str) -> Result<CelRule, String> {
    let scope = FieldScope { name, type_name };
    CelRule::named(id.to_string(), text, Some(scope)).map_err(|e| format!("`{text}`: {e}"))
}
