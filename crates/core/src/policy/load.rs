//! Loading policies: walking files and directories, compiling each policy
//! (schemas, pointers, globs, durations) once, and load errors that name
//! `file:line:column` and the key. Positions: `located`; the document
//! types: `document`; compiling values and rules: `compile`; the compiled
//! form and the judge: `judge`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::cel::CelRule;
use super::checks::Checks;
use super::compile::{compile_rule, compile_value};
use super::dlt_topic::DeadLetterTemplate;
use super::document::*;
use super::format::Bytes;
use super::formats::{default_max_bytes, Decoder};
use super::glob;
use super::judge::{Compiled, KeyCheck};
use super::located::{at, from_yaml, parse_doc, place, At};
use super::registry::SchemaCache;
use super::rules;
use super::{Breaker, KeyOrdering, OnProduce, Policy, PolicyError, Undecodable};
use std::sync::Arc;

/// Load every file named (directories: their `*.yaml`/`*.yml`, sorted).
pub(crate) fn load_all(
    paths: &[PathBuf],
    cache: &Arc<SchemaCache>,
) -> Result<Vec<Policy>, Vec<PolicyError>> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in paths {
        if p.is_dir() {
            match std::fs::read_dir(p) {
                Ok(rd) => {
                    let mut found: Vec<PathBuf> = rd
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|f| {
                            f.is_file()
                                && matches!(
                                    f.extension().and_then(|x| x.to_str()),
                                    Some("yaml" | "yml")
                                )
                        })
                        .collect();
                    found.sort();
                    if found.is_empty() {
                        errors.push(PolicyError::whole_file(
                            p,
                            "no *.yaml or *.yml policy files in this directory",
                        ));
                    }
                    files.extend(found);
                }
                Err(e) => errors.push(PolicyError::whole_file(p, format!("cannot read: {e}"))),
            }
        } else {
            files.push(p.clone());
        }
    }
    let mut state = LoadState::new(cache);
    for f in &files {
        match std::fs::read_to_string(f) {
            Ok(text) => state.load_text(&text, f),
            Err(e) => state
                .errors
                .push(PolicyError::whole_file(f, format!("cannot read: {e}"))),
        }
    }
    errors.append(&mut state.errors);
    if errors.is_empty() {
        Ok(state.policies)
    } else {
        Err(errors)
    }
}

/// Load one file's text as if read from `path`.
pub(crate) fn load_text(
    text: &str,
    path: &Path,
    cache: &Arc<SchemaCache>,
) -> Result<Vec<Policy>, Vec<PolicyError>> {
    let mut state = LoadState::new(cache);
    state.load_text(text, path);
    if state.errors.is_empty() {
        Ok(state.policies)
    } else {
        Err(state.errors)
    }
}

struct LoadState {
    /// Where `registry: true` policies read registered schemas.
    cache: Arc<SchemaCache>,
    policies: Vec<Policy>,
    errors: Vec<PolicyError>,
    /// Exact topic → (policy name, file) that claimed it first.
    topics: HashMap<String, (String, PathBuf)>,
    names: HashMap<String, PathBuf>,
}

impl LoadState {
    fn new(cache: &Arc<SchemaCache>) -> Self {
        LoadState {
            cache: cache.clone(),
            policies: Vec::new(),
            errors: Vec::new(),
            topics: HashMap::new(),
            names: HashMap::new(),
        }
    }

    /// The `key:` section, compiled like a value; messages say `key.`.
    fn compile_key(&self, k: &ValueDoc, base: &Path) -> Result<KeyCheck, Vec<At>> {
        let k = &ValueDoc {
            is_key: true,
            ..k.clone()
        };
        let (decoder, schema) = compile_value(k, base, &self.cache).map_err(|errs| {
            errs.into_iter()
                .map(|mut e| {
                    if let Some(rest) = e.msg.strip_prefix("value.") {
                        e.msg = format!("key.{rest}");
                    }
                    e
                })
                .collect::<Vec<_>>()
        })?;
        Ok(KeyCheck {
            decoder,
            schema,
            allow_null: k.allow_null,
            max_bytes: k.max_bytes.or(default_max_bytes(&k.format.v)),
        })
    }

    fn load_text(&mut self, text: &str, path: &Path) {
        let doc = match parse_doc::<FileDoc>(text, None) {
            Ok(d) => d,
            Err(e) => {
                self.errors.push(from_yaml(path, &e));
                return;
            }
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let mut ats = Vec::new();
        // What a reload compares to tell a changed policy from one read
        // again unchanged (the whole file's text: an edit anywhere in it
        // counts as a change of each of its policies).
        let revision = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut h);
            h.finish()
        };
        for p in doc.policies {
            match self.compile(p, base, path) {
                Ok(mut policy) => {
                    policy.revision = revision;
                    self.policies.push(policy)
                }
                Err(mut e) => ats.append(&mut e),
            }
        }
        for a in ats {
            self.errors.push(place::<FileDoc>(text, path, a));
        }
    }

    fn compile(&mut self, p: PolicyDoc, base: &Path, file: &Path) -> Result<Policy, Vec<At>> {
        let mut errs = Vec::new();
        let name = self.check_name(&p, &mut errs);

        let topics = self.check_topics(&p, &mut errs);

        let (decoder, schema, allow_null, max_bytes) = self.value_of(&p, base, &mut errs);
        let key = (p.key.as_ref()).and_then(|k| match self.compile_key(&k.v, base) {
            Ok(k) => Some(k),
            Err(mut e) => {
                errs.append(&mut e);
                None
            }
        });
        let mut decoder = decoder;
        let mut rs = compile_rules(&p, &decoder, &mut errs);
        decoder.slots(rs.slots(), schema.is_some());

        let headers_required = headers_required(&p, &mut errs);
        let dead_letter = dead_letter_of(&p, &mut errs);
        let breaker = breaker_of(&p, &mut errs);
        if !errs.is_empty() {
            return Err(errs);
        }
        for t in &topics {
            if !glob::is_glob(t) {
                self.topics
                    .insert(t.clone(), (name.clone(), file.to_path_buf()));
            }
        }
        self.names.insert(name.clone(), file.to_path_buf());
        Ok(Policy {
            name,
            on_invalid: p.on_invalid,
            on_undecodable: match p.on_undecodable {
                UndecodableDoc::Hold => Undecodable::Hold,
                UndecodableDoc::Divert => Undecodable::Divert,
            },
            on_produce: match p.on_produce {
                OnProduceDoc::Pass => OnProduce::Pass,
                OnProduceDoc::Reject => OnProduce::Reject,
            },
            ordering: match p.ordering {
                OrderingDoc::None => KeyOrdering::None,
                OrderingDoc::PerKey => KeyOrdering::PerKey,
            },
            breaker,
            revision: 0,
            topics,
            source: file.to_path_buf(),
            inner: Compiled {
                dead_letter,
                headers_required,
                allow_null,
                max_bytes,
                decoder,
                schema,
                checks: Checks::new(&rs.rules, &rs.stale),
                rules: rs.rules,
                stale: rs.stale,
                rule_class: rs.rule_class,
                stale_class: rs.stale_class,
                cel: rs.cel,
                cel_class: rs.cel_class,
                key,
            },
        })
    }

    /// `value:`: its decoder and JSON Schema, whether null is allowed, and
    /// its size cap (bytes, with nothing to check, when absent or wrong).
    fn value_of(
        &self,
        p: &PolicyDoc,
        base: &Path,
        errs: &mut Vec<At>,
    ) -> (Decoder, Option<jsonschema::Validator>, bool, Option<usize>) {
        let Some(v) = &p.value else {
            return (Decoder::Bytes(Bytes), None, true, None);
        };
        match compile_value(v, base, &self.cache) {
            Ok((d, s)) => (
                d,
                s,
                v.allow_null,
                v.max_bytes.or(default_max_bytes(&v.format.v)),
            ),
            Err(mut e) => {
                errs.append(&mut e);
                (Decoder::Bytes(Bytes), None, true, None)
            }
        }
    }

    /// The policy's name: not empty, not loaded before.
    fn check_name(&self, p: &PolicyDoc, errs: &mut Vec<At>) -> String {
        let name = p.name.v.trim().to_string();
        if name.is_empty() {
            errs.push(at(&p.name, "name: a policy needs a name"));
        } else if let Some(prev) = self.names.get(&name) {
            errs.push(at(
                &p.name,
                format!(
                    "name: a policy named `{name}` was already loaded from {}",
                    prev.display()
                ),
            ));
        }
        name
    }

    /// Its topic names and globs: each valid, no exact name covered twice.
    fn check_topics(&self, p: &PolicyDoc, errs: &mut Vec<At>) -> Vec<String> {
        let mut topics = Vec::new();
        if p.topics.v.is_empty() {
            errs.push(at(
                &p.topics,
                "topics: at least one topic name or glob is needed",
            ));
        }
        for t in &p.topics.v {
            if let Err(m) = glob::check_pattern(&t.v) {
                errs.push(at(t, format!("topics: {m}")));
                continue;
            }
            if !glob::is_glob(&t.v) {
                if let Some((other, f)) = self.topics.get(&t.v) {
                    errs.push(at(
                        t,
                        format!(
                            "topics: `{}` is already covered by policy `{other}` ({}); a topic may have one policy",
                            t.v,
                            f.display()
                        ),
                    ));
                    continue;
                }
            }
            topics.push(t.v.clone());
        }
        topics
    }
}

/// A policy's `rules:` compiled: field rules, staleness checks and CEL
/// conditions, each with the class its list item sets.
#[derive(Default)]
struct Rules {
    rules: Vec<super::rules::Rule>,
    stale: Vec<super::rules::MaxAge>,
    cel: Vec<CelRule>,
    rule_class: Vec<Option<super::Class>>,
    stale_class: Vec<Option<super::Class>>,
    cel_class: Vec<Option<super::Class>>,
}

impl Rules {
    /// A capture slot for every field the rules and conditions read: one
    /// pointer per slot, for the decoder.
    fn slots(&mut self) -> Vec<rules::Pointer> {
        let mut pointers = rules::assign_slots(&mut self.rules, &mut self.stale);
        rules::assign_more(
            &mut pointers,
            self.cel.iter_mut().flat_map(CelRule::pointers_mut),
        );
        pointers
    }
}

/// Its rules, compiled.
fn compile_rules(p: &PolicyDoc, decoder: &Decoder, errs: &mut Vec<At>) -> Rules {
    let mut out = Rules::default();
    if let Some(rs) = &p.rules {
        if !decoder.decodes() && !rs.v.is_empty() && errs.is_empty() {
            errs.push(at(
                rs,
                "rules: rules need a decoded value; set value.format to json, avro or protobuf",
            ));
        }
        for r in &rs.v {
            if let Err(mut e) = compile_rule(r, &mut out.rules, &mut out.stale, &mut out.cel) {
                errs.append(&mut e);
            }
            // Every rule this list item compiled to gets its class.
            let class = r.v.class.as_ref().map(|c| c.v.class());
            out.rule_class.resize(out.rules.len(), class);
            out.stale_class.resize(out.stale.len(), class);
            out.cel_class.resize(out.cel.len(), class);
        }
    }
    out
}

/// `headers.required`: names, none empty.
fn headers_required(p: &PolicyDoc, errs: &mut Vec<At>) -> Vec<String> {
    let mut headers_required = Vec::new();
    for h in &p.headers.required {
        if h.v.is_empty() {
            errs.push(at(h, "headers.required: a header name cannot be empty"));
        } else {
            headers_required.push(h.v.clone());
        }
    }
    headers_required
}

/// `dead_letter.topic`, parsed (the default when absent or wrong).
fn dead_letter_of(p: &PolicyDoc, errs: &mut Vec<At>) -> DeadLetterTemplate {
    match &p.dead_letter.topic {
        None => DeadLetterTemplate::default(),
        Some(t) => match DeadLetterTemplate::parse(&t.v) {
            Ok(d) => d,
            Err(m) => {
                errs.push(at(t, format!("dead_letter.topic: {m}")));
                DeadLetterTemplate::default()
            }
        },
    }
}

/// `breaker:`, checked.
fn breaker_of(p: &PolicyDoc, errs: &mut Vec<At>) -> Option<Breaker> {
    p.breaker.as_ref().and_then(|located| {
        let b = &located.v;
        let ok = b.max_ratio > 0.0
            && b.max_ratio < 1.0
            && b.over >= 1
            && b.min_diverted >= 1
            && b.min_diverted <= b.over;
        if !ok {
            errs.push(at(
                located,
                "breaker: max_ratio must be above 0 and below 1, over at least 1, and min_diverted from 1 to over",
            ));
        }
        ok.then_some(Breaker {
            max_ratio: b.max_ratio,
            over: b.over,
            min_diverted: b.min_diverted,
        })
    })
}
