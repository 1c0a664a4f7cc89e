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

use super::document::ValueDoc;
use super::format::{self, errors_or, not_for, Cx, Format, OwnSchema};
use super::json::{Captures, Plan};
use super::located::{at, At};
use super::registry::{Known, Registered, SchemaCache};
use super::rules::Pointer;
use super::wire::{confluent_header, Wire};
use super::{Class, Invalid};

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
    pub(crate) subject: Option<Subject>,
    /// How a registered schema is read: the format compiled from the
    /// policy's keys (an Avro reader schema, a Protobuf type, a JSON
    /// nesting limit).
    pub(crate) format: F,
    /// The rules' pointers, set at load: the fast path ([`Self::capture`]).
    pub(crate) plan: Option<Plan>,
    /// Per schema id, the fast path's program for its schema and `plan`,
    /// made on first use.
    compiled: DashMap<u32, Compiled<F::Program>, foldhash::quality::RandomState>,
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
}

/// The verdict while the registry has not answered for `what`.
fn transient(what: String) -> Invalid {
    Invalid {
        class: Class::Transient,
        rule: "schema-registry".into(),
        reason: format!("{what}: waiting for the schema registry"),
    }
}

fn unknown(reason: String) -> Invalid {
    Invalid {
        class: Class::Unknown,
        rule: "schema-id".into(),
        reason,
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
        if F::SCHEMA_TYPE.is_none() {
            let names = format::registry_names();
            let (last, first) = names.split_last().map_or(("", &[][..]), |(l, f)| (*l, f));
            return Err(vec![at(
                &v.format,
                format!(
                    "value.registry: needs format {} or {last}",
                    first.join(", ")
                ),
            )]);
        }
        let mut errs = Vec::new();
        if let Some(w) = v.wire.as_ref().filter(|w| w.v != Wire::Confluent) {
            errs.push(at(
                w,
                "value.wire: `registry: true` reads the schema id of `wire: confluent`",
            ));
        }
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
            subject,
            format,
            plan: None,
            compiled: Default::default(),
        };
        errors_or(errs, (decoder, own))
    }

    /// The rules' pointers, for the fast path (not with a JSON Schema of
    /// the policy's own, which needs each value whole).
    pub(super) fn slots(&mut self, pointers: Vec<Pointer>, checked: bool) {
        if !checked && F::CAPTURES_REGISTERED {
            self.plan = Some(Plan::new(pointers, None));
        }
    }

    /// The fast path: when the id's schema and subjects are cached and the
    /// value is read straight into the rules' captures, `check`'s verdict
    /// on them; `None` when [`Self::decode`] must judge (and word) it.
    #[inline]
    pub(super) fn capture(
        &self,
        bytes: &[u8],
        cx: &Cx<'_>,
        check: impl FnOnce(&Captures<'_>) -> Result<(), Invalid>,
    ) -> Option<Result<(), Invalid>> {
        let plan = self.plan.as_ref()?;
        let (id, rest) = confluent_header(bytes).ok()?;
        let Known::Found(schema) = self.cache.schema(id, cx.now_ms) else {
            return None;
        };
        if let Some(subject) = &self.subject {
            match self.cache.subjects(id, cx.now_ms) {
                Known::Found(list) if list.iter().any(|s| subject.is(s, cx.topic)) => {}
                _ => return None,
            }
        }
        let compiled = self.compiled(id, &schema, plan);
        let prog = compiled.program.as_ref()?;
        let mut caps = Captures::new(plan.slots());
        (self.format)
            .capture_registered(&schema, prog, rest, plan, &mut caps)
            .then(|| check(&caps))
    }

    /// Id `id`'s program for `schema`, made now if there is none or it was
    /// made from another schema.
    fn compiled(
        &self,
        id: u32,
        schema: &Arc<Registered>,
        plan: &Plan,
    ) -> dashmap::mapref::one::Ref<'_, u32, Compiled<F::Program>> {
        if let Some(c) = self.compiled.get(&id) {
            // The weak reference keeps the allocation: its address is not
            // reused while the entry exists.
            if std::ptr::eq(c.from.as_ptr(), Arc::as_ptr(schema)) {
                return c;
            }
        }
        let program = self.format.program(schema, plan);
        if self.compiled.len() >= MAX_COMPILED {
            self.compiled.clear();
        }
        let from = Arc::downgrade(schema);
        self.compiled
            .entry(id)
            .insert(Compiled { from, program })
            .downgrade()
    }

    pub(super) fn decode(&self, bytes: &[u8], cx: &Cx<'_>) -> Result<Value, Invalid> {
        let (id, rest) = confluent_header(bytes)?;
        // Both asked at once, so a new id costs one round of fetches.
        let schema = self.cache.schema(id, cx.now_ms);
        let subjects = (self.subject.as_ref()).map(|_| self.cache.subjects(id, cx.now_ms));
        let schema = match schema {
            Known::Found(s) => s,
            Known::NotFound => {
                return Err(unknown(format!(
                    "schema id {id} is not in the schema registry"
                )))
            }
            Known::Missing => return Err(transient(format!("schema id {id}"))),
        };
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
        self.decode_with(id, &schema, rest)
    }

    fn decode_with(&self, id: u32, schema: &Registered, rest: &[u8]) -> Result<Value, Invalid> {
        match schema {
            Registered::Unusable(why) => Err(unknown(format!(
                "registered schema {id} cannot be used: {why}"
            ))),
            s if Some(s.type_name()) == F::SCHEMA_TYPE => self.format.decode_registered(s, rest),
            other => Err(Invalid::poison(
                "schema",
                format!(
                    "schema id {id} is a {} schema, this policy expects {}",
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
