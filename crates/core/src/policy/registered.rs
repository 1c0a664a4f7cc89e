//! Values (or keys) whose schema comes from a schema registry
//! (`registry: true`): the Confluent framing's schema id is looked up in
//! the [`SchemaCache`] the binary crate fills, the id's subjects are
//! checked against `subject`, and the datum is read by its format
//! ([`Format`]'s registered-schema methods).
//!
//! Never waits and never fetches: an id or subject list the cache does not
//! hold yet is a `transient` verdict (rule `schema-registry`), and the
//! cache has queued what is needed. "No such id" is `unknown` (rule
//! `schema-id`); an id not registered under the subject is `poison` (rule
//! `subject`); a datum that does not decode under its schema is `poison`.

use std::path::Path;
use std::sync::{Arc, Weak};

use dashmap::DashMap;
use serde_json::Value;

use super::cel::ordered;
use super::contract::{Contract, Pair, Side};
use super::document::IdKindDoc;
use super::document::ValueDoc;
use super::format::{Cx, Format, OwnSchema, Verdict};
use super::json::{Captures, Plan};
use super::located::{at, At};
use super::located::{errors_or, not_for};
use super::registry::{Known, Registered, SchemaCache};
use super::rules::{Doc, Field, Pointer};
use super::wire::{ApicurioId, Framing, SchemaKey, Wire};
use super::{Class, Invalid};

/// The registry's answer for `key`: its schema, `unknown` when there is no
/// such id, `transient` while the registry has not answered.
fn found(known: Known<Arc<Registered>>, key: SchemaKey) -> Result<Arc<Registered>, Invalid> {
    match known {
        Known::Found(s) => Ok(s),
        Known::NotFound => Err(unknown(format!("{key} is not in the schema registry"))),
        Known::Missing => Err(transient(key.to_string())),
    }
}

/// `wire` (with `id`, `id_header`) of a `registry: true` value: Confluent's
/// framing (the default) or one of Apicurio's.
fn framing(v: &ValueDoc, errs: &mut Vec<At>) -> Framing {
    let wire = v.wire.as_ref().map_or(Wire::Confluent, |w| w.v);
    let kind = |default| match v.id.as_ref().map(|i| i.v) {
        Some(IdKindDoc::Global) => ApicurioId::Global,
        Some(IdKindDoc::Content) => ApicurioId::Content,
        None => default,
    };
    if wire != Wire::ApicurioHeaders {
        not_for(
            errs,
            &v.id_header,
            "value.id_header: applies to `wire: apicurio-headers`",
        );
    }
    match wire {
        Wire::Raw => {
            if let Some(w) = &v.wire {
                errs.push(at(w, "value.wire: `registry: true` reads a schema id: `confluent`, `apicurio-headers`, `apicurio-8byte` or `apicurio-4byte`"));
            }
            Framing::Confluent
        }
        Wire::Confluent => {
            not_for(errs, &v.id, "value.id: applies to Apicurio's wires");
            Framing::Confluent
        }
        Wire::ApicurioHeaders => {
            // Apicurio's serializers write the content id by default.
            let id = kind(ApicurioId::Content);
            let header = v
                .id_header
                .as_ref()
                .map_or_else(|| default_header(v.is_key, id), |h| h.v.clone());
            if header.is_empty() {
                not_for(
                    errs,
                    &v.id_header,
                    "value.id_header: a header name cannot be empty",
                );
            }
            not_for(
                errs,
                &v.subject,
                "value.subject: applies to `wire: confluent` (Apicurio's ids are not a subject's)",
            );
            Framing::Headers { header, id }
        }
        Wire::Apicurio8Byte => {
            not_for(
                errs,
                &v.subject,
                "value.subject: applies to `wire: confluent` (Apicurio's ids are not a subject's)",
            );
            // 2.x serializers wrote the global id.
            Framing::Long {
                id: kind(ApicurioId::Global),
            }
        }
        Wire::Apicurio4Byte => {
            not_for(
                errs,
                &v.subject,
                "value.subject: applies to `wire: confluent` (Apicurio's ids are not a subject's)",
            );
            // 3.x serializers write the content id by default.
            Framing::Int {
                id: kind(ApicurioId::Content),
            }
        }
    }
}

/// Apicurio's own header names (`KafkaSerdeHeaders`).
fn default_header(key: bool, id: ApicurioId) -> String {
    let side = if key { "key" } else { "value" };
    let name = match id {
        ApicurioId::Global => "globalId",
        ApicurioId::Content => "contentId",
    };
    format!("apicurio.{side}.{name}")
}

/// A subject template with at most one `{topic}`, split around it, so a
/// subject is compared without building the string for every record.
#[derive(Debug, Clone)]
pub(crate) struct Subject {
    prefix: String,
    /// `None` when the template has no `{topic}`.
    suffix: Option<String>,
}

impl Subject {
    pub(crate) fn parse(text: &str) -> Result<Subject, String> {
        if text.is_empty() {
            return Err("a subject cannot be empty".into());
        }
        match text.split_once("{topic}") {
            None if text.contains('{') || text.contains('}') => {
                Err(format!("`{text}`: the only placeholder is {{topic}}"))
            }
            None => Ok(Subject {
                prefix: text.into(),
                suffix: None,
            }),
            Some((_, rest)) if rest.contains('{') || rest.contains('}') => Err(format!(
                "`{text}`: {{topic}} may appear once, and no other placeholder"
            )),
            Some((pre, _)) if pre.contains('{') || pre.contains('}') => {
                Err(format!("`{text}`: the only placeholder is {{topic}}"))
            }
            Some((pre, post)) => Ok(Subject {
                prefix: pre.into(),
                suffix: Some(post.into()),
            }),
        }
    }

    /// Whether `s` is this template with `{topic}` = `topic`.
    fn is(&self, s: &str, topic: &str) -> bool {
        match &self.suffix {
            None => s == self.prefix,
            Some(suffix) => {
                s.len() == self.prefix.len() + topic.len() + suffix.len()
                    && s.starts_with(&self.prefix)
                    && s.ends_with(suffix.as_str())
                    && s.get(self.prefix.len()..s.len() - suffix.len()) == Some(topic)
            }
        }
    }

    fn render(&self, topic: &str) -> String {
        match &self.suffix {
            None => self.prefix.clone(),
            Some(s) => format!("{}{topic}{s}", self.prefix),
        }
    }
}

/// A value of format `F` whose schema the registry names by id.
#[derive(Debug)]
pub(crate) struct RegistryDecoder<F: Format> {
    pub(crate) cache: Arc<SchemaCache>,
    /// Where the schema's id is: Confluent's framing or Apicurio's.
    pub(crate) framing: Framing,
    pub(crate) subject: Option<Subject>,
    /// How a registered schema is read: the format compiled from the
    /// policy's keys (an Avro reader schema, a Protobuf type, a JSON
    /// nesting limit).
    pub(crate) format: F,
    /// The rules' pointers, set at load: the fast path ([`Self::capture`]).
    pub(crate) plan: Option<Plan>,
    /// Those pointers, in slot order (a schema's data-contract rules add
    /// theirs after them: [`Ext`]).
    pointers: Vec<Pointer>,
    /// Per schema id (of `framing`'s one namespace), the fast path's
    /// program for its schema and `plan`, made on first use.
    compiled: DashMap<u64, Compiled<F::Program>, foldhash::quality::RandomState>,
}

/// Programs kept at most (then all are dropped and made again as needed):
/// ids are the registry's, so their number is not this process's to bound.
const MAX_COMPILED: usize = 4096;

/// A registered schema compiled against a policy's plan.
#[derive(Debug)]
struct Compiled<P> {
    /// The schema it was made from: a cached schema that was replaced (the
    /// cache started afresh) is compiled again.
    from: Weak<Registered>,
    /// `None`: the fast path does not read this schema.
    program: Option<P>,
    /// The schema's data-contract rules and the plan the program was made
    /// for, when the fast path judges them.
    ext: Option<Ext>,
}

/// A schema's data-contract rules, with the policy's plan and their
/// fields after its own: `map[i]` is the slot of the contract's `i`th field.
#[derive(Debug)]
struct Ext {
    contract: Arc<Contract>,
    plan: Plan,
    map: Vec<usize>,
    /// On reads and on writes, [`Contract::pairs`] by the plan's slots.
    reads: Option<Box<[Pair]>>,
    writes: Option<Box<[Pair]>>,
}

impl Ext {
    /// `None` when the rules are judged on the decoded value: one reads
    /// the whole message (not a field the fast path captures), or names a
    /// `dlq.topic` (the judge checks it against the policy's DLT).
    fn of(policy: &[Pointer], contract: Arc<Contract>) -> Option<Ext> {
        if contract.names_dlq() {
            return None;
        }
        let mut pointers = policy.to_vec();
        let mut map = Vec::with_capacity(contract.pointers().len());
        for p in contract.pointers() {
            if p.as_str().is_empty() {
                return None;
            }
            let at = pointers.iter().position(|q| q.as_str() == p.as_str());
            map.push(at.unwrap_or_else(|| {
                pointers.push(p.clone());
                pointers.len() - 1
            }));
        }
        let pairs = |side| {
            let by_plan = |(a, b, holds): Pair| Some((*map.get(a)?, *map.get(b)?, holds));
            contract.pairs(side)?.into_iter().map(by_plan).collect()
        };
        Some(Ext {
            reads: pairs(Side::Read),
            writes: pairs(Side::Write),
            contract,
            plan: Plan::new(pointers, None),
            map,
        })
    }

    /// Whether every check run on `side` orders two fields that `caps`
    /// holds as numbers, and holds: then the contract passes the record
    /// ([`Contract::pairs`]); `false` when it must judge.
    #[inline(always)]
    fn all_hold(&self, caps: &Captures<'_>, side: Side) -> bool {
        let pairs = match side {
            Side::Read => &self.reads,
            Side::Write => &self.writes,
        };
        let Some(pairs) = pairs else { return false };
        let f = caps.fields();
        for (a, b, holds) in pairs.iter() {
            let (Some(x), Some(y)) = (f.captured_number(*a), f.captured_number(*b)) else {
                return false;
            };
            if !ordered(x, y, holds) {
                return false;
            }
        }
        true
    }
}

/// A record's captures read by a contract's slots.
struct ByContract<'c, 'de> {
    caps: &'c Captures<'de>,
    map: &'c [usize],
}

impl Doc for ByContract<'_, '_> {
    #[inline]
    fn field(&self, ptr: &Pointer) -> Option<Field<'_>> {
        self.caps.field_at(*self.map.get(ptr.slot())?)
    }
}

/// The verdict while the registry has not answered for `what`.
fn transient(what: String) -> Invalid {
    Invalid {
        class: Class::Transient,
        rule: "schema-registry".into(),
        reason: format!("{what}: waiting for the schema registry"),
        contract: None,
    }
}

fn unknown(reason: String) -> Invalid {
    Invalid {
        class: Class::Unknown,
        rule: "schema-id".into(),
        reason,
        contract: None,
    }
}

impl<F: Format> RegistryDecoder<F> {
    /// `registry: true`: Confluent framing, the schema by id from the
    /// registry; `F` compiles the keys that shape how it is read.
    pub(super) fn compile(
        v: &ValueDoc,
        base: &Path,
        cache: &Arc<SchemaCache>,
    ) -> Result<(Self, OwnSchema), Vec<At>> {
        let mut errs = Vec::new();
        let framing = framing(v, &mut errs);
        not_for(
            &mut errs,
            &v.schema_ids,
            "value.schema_ids: not with `registry: true` (ids come from the registry)",
        );
        let subject = v.subject.as_ref().and_then(|s| match Subject::parse(&s.v) {
            Ok(x) => Some(x),
            Err(m) => {
                errs.push(at(s, format!("value.subject: {m}")));
                None
            }
        });
        let (format, own) = match F::compile(v, base, true) {
            Ok(f) => f,
            Err(mut e) => {
                errs.append(&mut e);
                return Err(errs);
            }
        };
        let decoder = RegistryDecoder {
            cache: cache.clone(),
            framing,
            subject,
            format,
            plan: None,
            pointers: Vec::new(),
            compiled: Default::default(),
        };
        errors_or(errs, (decoder, own))
    }

    /// The rules' pointers, for the fast path (not with a JSON Schema of
    /// the policy's own, which needs each value whole).
    pub(super) fn slots(&mut self, pointers: Vec<Pointer>, checked: bool) {
        let datum_as_confluent = self.framing == Framing::Confluent || F::APICURIO_SAME_DATUM;
        if !checked && F::CAPTURES_REGISTERED && datum_as_confluent {
            self.plan = Some(Plan::new(pointers.clone(), None));
            self.pointers = pointers;
        }
    }

    /// The fast path: when the id's schema and subjects are cached and the
    /// value is read straight into the rules' captures, `check`'s verdict
    /// on them, after the schema's data-contract rules' on theirs (read in
    /// the same pass); `None` when [`Self::decode`] must judge (and word) it.
    #[inline]
    pub(super) fn capture(
        &self,
        bytes: &[u8],
        cx: &Cx<'_>,
        check: impl FnOnce(&Captures<'_>) -> Verdict,
    ) -> Option<Verdict> {
        let plan = self.plan.as_ref()?;
        let (key, rest) = self.framing.split(bytes, cx.headers).ok()?;
        let Known::Found(schema) = self.cache.schema_of(key, cx.now_ms) else {
            return None;
        };
        let (id, confluent) = match key {
            SchemaKey::Confluent(id) => {
                if let Some(subject) = &self.subject {
                    match self.cache.subjects(id, cx.now_ms) {
                        Known::Found(list) if list.iter().any(|s| subject.is(s, cx.topic)) => {}
                        _ => return None,
                    }
                }
                (u64::from(id), Some(id))
            }
            SchemaKey::Apicurio(_, id) => (id, None),
        };
        let compiled = self.compiled(id, &schema, plan, confluent);
        let prog = compiled.program.as_ref()?;
        let plan = compiled.ext.as_ref().map_or(plan, |e| &e.plan);
        let mut caps = Captures::new(plan.slots());
        if !(self.format).capture_registered(&schema, prog, rest, plan, &mut caps) {
            return None;
        }
        if let Some(ext) = &compiled.ext {
            let record = cx.record?;
            if !ext.all_hold(&caps, cx.side) {
                let doc = ByContract {
                    caps: &caps,
                    map: &ext.map,
                };
                if let Err(e) = ext.contract.check(&doc, record, cx.side) {
                    return Some(Err(Box::new(e)));
                }
            }
        }
        Some(check(&caps))
    }

    /// Id `id`'s program for `schema`, made now if there is none or it was
    /// made from another schema.
    fn compiled(
        &self,
        id: u64,
        schema: &Arc<Registered>,
        plan: &Plan,
        confluent: Option<u32>,
    ) -> dashmap::mapref::one::Ref<'_, u64, Compiled<F::Program>> {
        if let Some(c) = self.compiled.get(&id) {
            // The weak reference keeps the allocation: its address is not
            // reused while the entry exists. The cache stores a schema's
            // rules before the schema, so they are its rules.
            if std::ptr::eq(c.from.as_ptr(), Arc::as_ptr(schema)) {
                return c;
            }
        }
        let contract = confluent.and_then(|id| self.cache.contract(id));
        let ext = contract.map(|c| Ext::of(&self.pointers, c));
        let program = match &ext {
            Some(None) => None,
            Some(Some(e)) => self.format.program(schema, &e.plan),
            None => self.format.program(schema, plan),
        };
        let ext = ext.flatten();
        if self.compiled.len() >= MAX_COMPILED {
            self.compiled.clear();
        }
        let from = Arc::downgrade(schema);
        self.compiled
            .entry(id)
            .insert(Compiled { from, program, ext })
            .downgrade()
    }

    /// The data-contract rules of the value's schema (Confluent ids only:
    /// Apicurio's native API has no rule sets).
    pub(super) fn contract(&self, bytes: &[u8], cx: &Cx<'_>) -> Option<Arc<Contract>> {
        match self.framing.split(bytes, cx.headers) {
            Ok((SchemaKey::Confluent(id), _)) => self.cache.contract(id),
            _ => None,
        }
    }

    pub(super) fn decode(&self, bytes: &[u8], cx: &Cx<'_>) -> Result<Value, Invalid> {
        let (key, rest) = self.framing.split(bytes, cx.headers)?;
        let id = match key {
            SchemaKey::Confluent(id) => id,
            SchemaKey::Apicurio(..) => return self.decode_apicurio(key, rest, cx),
        };
        // Both asked at once, so a new id costs one round of fetches.
        let schema = self.cache.schema(id, cx.now_ms);
        let subjects = (self.subject.as_ref()).map(|_| self.cache.subjects(id, cx.now_ms));
        let schema = found(schema, key)?;
        if let (Some(subject), Some(list)) = (&self.subject, subjects) {
            match list {
                Known::Found(l) if l.iter().any(|s| subject.is(s, cx.topic)) => {}
                Known::Found(_) | Known::NotFound => {
                    return Err(Invalid::poison(
                        "subject",
                        format!(
                            "schema id {id} is not registered under subject {}",
                            subject.render(cx.topic)
                        ),
                    ))
                }
                Known::Missing => return Err(transient(format!("subjects of schema id {id}"))),
            }
        }
        self.decode_with(key, &schema, rest)
    }

    /// [`Self::decode`] of a value framed the Apicurio way (no subjects).
    fn decode_apicurio(&self, key: SchemaKey, rest: &[u8], cx: &Cx<'_>) -> Result<Value, Invalid> {
        let schema = found(self.cache.schema_of(key, cx.now_ms), key)?;
        self.decode_with(key, &schema, rest)
    }

    fn decode_with(
        &self,
        key: SchemaKey,
        schema: &Registered,
        rest: &[u8],
    ) -> Result<Value, Invalid> {
        match schema {
            Registered::Unusable(why) => Err(unknown(format!(
                "registered schema of {key} cannot be used: {why}"
            ))),
            s if Some(s.type_name()) == F::SCHEMA_TYPE => match key {
                SchemaKey::Confluent(_) => self.format.decode_registered(s, rest),
                SchemaKey::Apicurio(..) => self.format.decode_apicurio(s, rest),
            },
            other => Err(Invalid::poison(
                "schema",
                format!(
                    "{key} is a {} schema, this policy expects {}",
                    other.type_name(),
                    F::SCHEMA_TYPE.unwrap_or("none")
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_without_allocating() {
        let s = Subject::parse("{topic}-value").expect("parses");
        assert!(s.is("geo.a-value", "geo.a"));
        assert!(!s.is("geo.b-value", "geo.a"));
        assert!(!s.is("geo.a-key", "geo.a"));
        let fixed = Subject::parse("triggers").expect("parses");
        assert!(fixed.is("triggers", "anything"));
        assert!(Subject::parse("{topic}-{x}").is_err());
        assert!(Subject::parse("{name}").is_err());
        assert!(Subject::parse("").is_err());
    }
}
