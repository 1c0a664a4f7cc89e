//! Values (or keys) whose schema comes from a schema registry
//! (`registry: true`): the Confluent framing's schema id is looked up in
//! the [`SchemaCache`] the binary crate fills, the id's subjects are
//! checked against `subject`, and the datum is decoded with the registered
//! Avro, Protobuf or JSON schema.
//!
//! Never waits and never fetches: an id or subject list the cache does not
//! hold yet is a `transient` verdict (rule `schema-registry`), and the
//! cache has queued what is needed. "No such id" is `unknown` (rule
//! `schema-id`); an id not registered under the subject is `poison` (rule
//! `subject`); a datum that does not decode under its schema is `poison`.

use std::sync::{Arc, Weak};

use dashmap::DashMap;
use serde_json::Value;

use super::registry::{Known, Registered, SchemaCache};
use super::wire::confluent_header;
use super::{avro, json, protobuf, Class, Invalid};

/// The format a registry-backed value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegFormat {
    Avro,
    Protobuf,
    Json,
}

impl RegFormat {
    fn name(self) -> &'static str {
        match self {
            RegFormat::Avro => "AVRO",
            RegFormat::Protobuf => "PROTOBUF",
            RegFormat::Json => "JSON",
        }
    }
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

#[derive(Debug)]
pub(crate) struct RegistryDecoder {
    pub(crate) cache: Arc<SchemaCache>,
    pub(crate) format: RegFormat,
    pub(crate) subject: Option<Subject>,
    /// Avro: the policy's `schema`, as the reader schema.
    pub(crate) reader: Option<apache_avro::Schema>,
    /// Protobuf: the full name of the type every record must be.
    pub(crate) message: Option<String>,
    /// JSON: nesting limit.
    pub(crate) max_depth: usize,
    /// The rules' pointers, set at load: the Avro and Protobuf fast paths
    /// ([`Self::judge_fast`]).
    pub(crate) plan: Option<json::Plan>,
    /// Per schema id, the fast path's program for its schema and `plan`,
    /// made on first use.
    pub(crate) compiled: DashMap<u32, Compiled, foldhash::quality::RandomState>,
}

/// Programs kept at most (then all are dropped and made again as needed):
/// ids are the registry's, so their number is not this process's to bound.
const MAX_COMPILED: usize = 4096;

/// A registered schema compiled against a policy's plan.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// The schema it was made from: a cached schema that was replaced (the
    /// cache started afresh) is compiled again.
    from: Weak<Registered>,
    program: Program,
}

#[derive(Debug)]
enum Program {
    Avro(avro::Prog),
    Protobuf(protobuf::Links),
    /// The fast path does not read this schema.
    None,
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

impl RegistryDecoder {
    /// The fast path for Avro (without a reader schema) and Protobuf: when
    /// the id's schema and subjects are cached and the value is read
    /// straight into the rules' captures, `check`'s verdict on them; `None`
    /// when [`Self::decode`] must judge (and word) it.
    pub(crate) fn judge_fast(
        &self,
        bytes: &[u8],
        topic: &str,
        now_ms: i64,
        check: impl FnOnce(&json::Captures<'_>) -> Result<(), Invalid>,
    ) -> Option<Result<(), Invalid>> {
        let plan = self.plan.as_ref()?;
        if self.format == RegFormat::Json {
            return None;
        }
        let (id, rest) = confluent_header(bytes).ok()?;
        let Known::Found(schema) = self.cache.schema(id, now_ms) else {
            return None;
        };
        if let Some(subject) = &self.subject {
            match self.cache.subjects(id, now_ms) {
                Known::Found(list) if list.iter().any(|s| subject.is(s, topic)) => {}
                _ => return None,
            }
        }
        let compiled = self.compiled(id, &schema, plan);
        let mut caps = json::Captures::new(plan.slots());
        let read = match (&*schema, self.format, &compiled.program) {
            (Registered::Avro(..), RegFormat::Avro, Program::Avro(prog)) => {
                avro::capture_with(prog, rest, plan, &mut caps)
            }
            (Registered::Protobuf(file), RegFormat::Protobuf, Program::Protobuf(links)) => {
                file.capture(rest, self.message.as_deref(), links, &mut caps)
            }
            _ => return None,
        };
        read.then(|| check(&caps))
    }

    /// Id `id`'s program for `schema`, made now if there is none or it was
    /// made from another schema.
    fn compiled(
        &self,
        id: u32,
        schema: &Arc<Registered>,
        plan: &json::Plan,
    ) -> dashmap::mapref::one::Ref<'_, u32, Compiled> {
        if let Some(c) = self.compiled.get(&id) {
            // The weak reference keeps the allocation: its address is not
            // reused while the entry exists.
            if std::ptr::eq(c.from.as_ptr(), Arc::as_ptr(schema)) {
                return c;
            }
        }
        let program = match (&**schema, self.format) {
            (Registered::Avro(writer, named), RegFormat::Avro) if self.reader.is_none() => {
                avro::compile_registered(writer, named, plan).map_or(Program::None, Program::Avro)
            }
            (Registered::Protobuf(file), RegFormat::Protobuf) => {
                Program::Protobuf(file.links(plan, self.message.as_deref()))
            }
            _ => Program::None,
        };
        if self.compiled.len() >= MAX_COMPILED {
            self.compiled.clear();
        }
        let from = Arc::downgrade(schema);
        self.compiled
            .entry(id)
            .insert(Compiled { from, program })
            .downgrade()
    }

    pub(crate) fn decode(&self, bytes: &[u8], topic: &str, now_ms: i64) -> Result<Value, Invalid> {
        let (id, rest) = confluent_header(bytes)?;
        // Both asked at once, so a new id costs one round of fetches.
        let schema = self.cache.schema(id, now_ms);
        let subjects = self
            .subject
            .as_ref()
            .map(|_| self.cache.subjects(id, now_ms));
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
                Known::Found(l) if l.iter().any(|s| subject.is(s, topic)) => {}
                Known::Found(_) | Known::NotFound => {
                    return Err(Invalid::poison(
                        "subject",
                        format!(
                            "schema id {id} is not registered under subject {}",
                            subject.render(topic)
                        ),
                    ))
                }
                Known::Missing => return Err(transient(format!("subjects of schema id {id}"))),
            }
        }
        self.decode_with(id, &schema, rest)
    }

    fn decode_with(&self, id: u32, schema: &Registered, rest: &[u8]) -> Result<Value, Invalid> {
        match (schema, self.format) {
            (Registered::Avro(w, named), RegFormat::Avro) => {
                avro::decode_datum_with(w, named, self.reader.as_ref(), rest)
            }
            (Registered::Protobuf(file), RegFormat::Protobuf) => {
                file.decode(rest, self.message.as_deref())
            }
            (Registered::Json(v), RegFormat::Json) => {
                let value =
                    json::decode(rest, self.max_depth).map_err(|r| Invalid::poison("decode", r))?;
                if !v.is_valid(&value) {
                    let reason = match v.validate(&value) {
                        Err(e) => format!("{}: {e}", e.instance_path()),
                        Ok(()) => "value does not match its registered JSON Schema".into(),
                    };
                    return Err(Invalid::poison("schema", reason));
                }
                Ok(value)
            }
            (Registered::Unusable(why), _) => Err(unknown(format!(
                "registered schema {id} cannot be used: {why}"
            ))),
            (other, want) => Err(Invalid::poison(
                "schema",
                format!(
                    "schema id {id} is a {} schema, this policy expects {}",
                    other.type_name(),
                    want.name()
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
