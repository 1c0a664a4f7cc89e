//! Loading policies: the YAML shape (unknown keys are errors), walking files
//! and directories, compiling each policy (schemas, pointers, globs,
//! durations) once, and load errors that name `file:line:column` and the key.
//!
//! Positions: serde_yaml reports `file:line:column` for shape errors (unknown
//! key, wrong type). Semantic errors (a schema that does not compile, a bad
//! glob, `min > max`, ...) are found after parsing, on plain values; each such
//! value is a [`Located`] that got a pre-order ordinal while parsing. To place
//! an error, the file is parsed again with "fail at ordinal N" set, so serde_yaml
//! itself reports the position of exactly that node. Only the error path
//! parses twice; every semantic error in a file is reported, not just the first.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::avro::{self, AvroDecoder};
use super::deadletter::DeadLetterTemplate;
use super::glob;
use super::json;
use super::protobuf::{self, ProtoDecoder};
use super::rules::{self, fmt_num, Coordinates, Doc, MaxAge, Pointer, Rule, TimeUnit};
use super::shape::Shape;
use super::wire::Wire;
use super::{Action, Invalid, Policy, PolicyError, Undecodable};
use crate::kafka::record::Record;

// ---------------------------------------------------------------- positions

thread_local! {
    static NEXT_ID: Cell<u32> = const { Cell::new(0) };
    static FAIL_AT: Cell<Option<u32>> = const { Cell::new(None) };
    static FAIL_MSG: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A value whose position in the YAML file can be recovered for an error.
#[derive(Debug, Clone)]
struct Located<T> {
    v: T,
    id: u32,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let id = NEXT_ID.with(|n| {
            let i = n.get();
            n.set(i.wrapping_add(1));
            i
        });
        if FAIL_AT.with(Cell::get) == Some(id) {
            let msg = FAIL_MSG.with(|m| m.borrow().clone());
            // Fail *inside* this node's deserialize call, so serde_yaml marks
            // the error with this node's own position.
            return Err(d
                .deserialize_any(Fail(msg))
                .err()
                .unwrap_or_else(|| de::Error::custom("internal: position probe did not fail")));
        }
        Ok(Located {
            v: T::deserialize(d)?,
            id,
        })
    }
}

/// A visitor that fails on whatever it is shown.
struct Fail(String);

impl<'de> Visitor<'de> for Fail {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("anything")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(self.0))
    }
    fn visit_some<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(self.0))
    }
}

/// A semantic error at a [`Located`] node.
struct At {
    id: u32,
    msg: String,
}

fn at<T>(l: &Located<T>, msg: impl Into<String>) -> At {
    At {
        id: l.id,
        msg: msg.into(),
    }
}

fn parse_doc(text: &str, fail: Option<(u32, &str)>) -> Result<FileDoc, serde_yaml::Error> {
    NEXT_ID.with(|n| n.set(0));
    FAIL_AT.with(|f| f.set(fail.map(|(id, _)| id)));
    FAIL_MSG.with(|m| *m.borrow_mut() = fail.map(|(_, s)| s.to_string()).unwrap_or_default());
    let out = serde_yaml::from_str(text);
    FAIL_AT.with(|f| f.set(None));
    out
}

fn from_yaml(path: &Path, e: &serde_yaml::Error) -> PolicyError {
    let full = crate::text::yaml_error(path, e);
    match e.location() {
        Some(loc) => {
            let prefix = format!("{}:{}:{}: ", path.display(), loc.line(), loc.column());
            PolicyError {
                file: path.to_path_buf(),
                line: loc.line(),
                column: loc.column(),
                message: full.strip_prefix(&prefix).unwrap_or(&full).to_string(),
            }
        }
        None => PolicyError::whole_file(path, e.to_string()),
    }
}

/// Place a semantic error by re-parsing with a probe at its node.
fn place(text: &str, path: &Path, err: At) -> PolicyError {
    match parse_doc(text, Some((err.id, &err.msg))) {
        Err(e) if e.location().is_some() => {
            let mut pe = from_yaml(path, &e);
            // serde_yaml prefixes the full key path (`policies[0].value.schema: `);
            // drop our own shorter key (`value.schema: `) when it is a suffix of it.
            if let Some(yaml_path) = pe
                .message
                .strip_suffix(err.msg.as_str())
                .and_then(|p| p.strip_suffix(": "))
            {
                if let Some((key, rest)) = err.msg.split_once(": ") {
                    if yaml_path.ends_with(key) {
                        pe.message = format!("{yaml_path}: {rest}");
                    }
                }
            }
            pe
        }
        _ => PolicyError::whole_file(path, err.msg),
    }
}

// ---------------------------------------------------------------- YAML shape

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    policies: Vec<PolicyDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyDoc {
    name: Located<String>,
    topics: Located<Vec<Located<String>>>,
    #[serde(default)]
    value: Option<ValueDoc>,
    #[serde(default)]
    rules: Option<Located<Vec<Located<RuleDoc>>>>,
    #[serde(default)]
    headers: HeadersDoc,
    #[serde(default)]
    on_invalid: ActionDoc,
    #[serde(default)]
    on_undecodable: UndecodableDoc,
    #[serde(default)]
    dead_letter: DeadLetterDoc,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Format {
    Json,
    Avro,
    Protobuf,
    Bytes,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ValueDoc {
    format: Located<Format>,
    #[serde(default)]
    schema: Option<Located<PathBuf>>,
    #[serde(default)]
    schema_ids: Option<Located<BTreeMap<u32, Located<PathBuf>>>>,
    #[serde(default)]
    message: Option<Located<String>>,
    #[serde(default)]
    wire: Option<Located<Wire>>,
    #[serde(default)]
    max_bytes: Option<usize>,
    #[serde(default = "yes")]
    allow_null: bool,
    #[serde(default)]
    max_depth: Option<Located<usize>>,
}

fn yes() -> bool {
    true
}

/// Largest value a decoding policy judges when `max_bytes` is not set: four
/// times Kafka's default `max.message.bytes` (1 MiB). Decoding costs a few
/// times the value's size in memory, so a policy that decodes is always
/// bounded; a larger value is poison (rule `max_bytes`) unless the policy
/// raises the limit. `bytes` policies do not decode, so they have none.
pub(crate) const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;

fn default_max_bytes(format: &Format) -> Option<usize> {
    match format {
        Format::Bytes => None,
        Format::Json | Format::Avro | Format::Protobuf => Some(DEFAULT_MAX_BYTES),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDoc {
    #[serde(default)]
    coordinates: Option<Located<CoordDoc>>,
    #[serde(default)]
    field: Option<Located<String>>,
    #[serde(default)]
    one_of: Option<Located<Vec<serde_json::Value>>>,
    #[serde(default)]
    min: Option<Located<f64>>,
    #[serde(default)]
    max: Option<Located<f64>>,
    #[serde(default)]
    max_age: Option<Located<serde_yaml::Value>>,
    #[serde(default)]
    unit: Option<Located<TimeUnit>>,
    /// A missing or null field passes `one_of` and `min`/`max` (default false).
    #[serde(default)]
    optional: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CoordDoc {
    lat: Located<String>,
    lon: Located<String>,
    #[serde(default)]
    reject_null_island: bool,
    #[serde(default)]
    bbox: Option<Located<Vec<f64>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeadersDoc {
    #[serde(default)]
    required: Vec<Located<String>>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ActionDoc {
    #[default]
    Divert,
    Drop,
    Pass,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum UndecodableDoc {
    #[default]
    Hold,
    Divert,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterDoc {
    #[serde(default)]
    topic: Option<Located<String>>,
}

// ---------------------------------------------------------------- compiled form

/// How a value's bytes are decoded for the schema and the rules.
#[derive(Debug)]
enum Decoder {
    Bytes,
    /// `fast`: set when the policy has no JSON Schema or its schema
    /// compiles to a [`Shape`] (`shape`, moved into the plan when it is
    /// built), so no `serde_json::Value` is built for a valid record (see
    /// [`json::capture`], [`json::capture_shaped`]).
    Json {
        max_depth: usize,
        fast: Option<json::Plan>,
        shape: Option<Shape>,
    },
    Avro(AvroDecoder),
    Protobuf(ProtoDecoder),
}

/// Everything a policy needs to judge a record, compiled at load.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) dead_letter: DeadLetterTemplate,
    headers_required: Vec<String>,
    allow_null: bool,
    max_bytes: Option<usize>,
    decoder: Decoder,
    schema: Option<jsonschema::Validator>,
    rules: Vec<Rule>,
    stale: Vec<MaxAge>,
}

impl Compiled {
    pub(crate) fn judge(&self, r: &Record<'_>, now_ms: i64) -> Result<(), Invalid> {
        let Some(bytes) = self.before_decode(r)? else {
            return Ok(());
        };
        let value = match &self.decoder {
            Decoder::Bytes => return Ok(()),
            Decoder::Json {
                max_depth,
                fast: Some(plan),
                ..
            } if self.schema.is_none() => {
                let caps = json::capture(bytes, *max_depth, plan)
                    .map_err(|r| Invalid::poison("decode", r))?;
                return self.check_rules(&caps, now_ms);
            }
            Decoder::Json {
                max_depth, fast, ..
            } => {
                // A schema in the fast subset: a record that surely meets
                // it skips the `Value`; any other is judged in full below.
                if let Some(caps) = fast
                    .as_ref()
                    .and_then(|plan| json::capture_shaped(bytes, *max_depth, plan))
                {
                    return self.check_rules(&caps, now_ms);
                }
                json::decode(bytes, *max_depth).map_err(|r| Invalid::poison("decode", r))?
            }
            Decoder::Avro(d) => d.decode(bytes)?,
            Decoder::Protobuf(d) => d.decode(bytes)?,
        };
        self.check_value(&value, now_ms)
    }

    /// Headers, null and size: the value's bytes when they need decoding,
    /// `None` for a tombstone that passes.
    fn before_decode<'r>(&self, r: &Record<'r>) -> Result<Option<&'r [u8]>, Invalid> {
        for h in &self.headers_required {
            match r.header(h) {
                Some(Some(_)) => {}
                Some(None) => {
                    return Err(Invalid::poison(
                        "headers.required",
                        format!("required header {h} is present but null"),
                    ))
                }
                None => {
                    return Err(Invalid::poison(
                        "headers.required",
                        format!("missing required header {h}"),
                    ))
                }
            }
        }
        let Some(bytes) = r.value else {
            return if self.allow_null {
                Ok(None)
            } else {
                Err(Invalid::poison(
                    "allow_null",
                    "value is null (a tombstone) and this policy sets allow_null: false",
                ))
            };
        };
        if let Some(max) = self.max_bytes {
            if bytes.len() > max {
                return Err(Invalid::poison(
                    "max_bytes",
                    format!("value is {} bytes, over max_bytes {max}", bytes.len()),
                ));
            }
        }
        Ok(Some(bytes))
    }

    /// JSON Schema, then the rules.
    fn check_value(&self, value: &serde_json::Value, now_ms: i64) -> Result<(), Invalid> {
        if let Some(schema) = &self.schema {
            if !schema.is_valid(value) {
                let reason = match schema.validate(value) {
                    Err(e) => {
                        let at = e.instance_path().to_string();
                        let at = if at.is_empty() {
                            "value".to_string()
                        } else {
                            at
                        };
                        format!("{at}: {e}")
                    }
                    Ok(()) => "value does not match the JSON Schema".to_string(),
                };
                return Err(Invalid::poison("schema", reason));
            }
        }
        self.check_rules(value, now_ms)
    }

    /// Rules in file order, then `max_age` rules.
    fn check_rules<D: Doc + ?Sized>(&self, value: &D, now_ms: i64) -> Result<(), Invalid> {
        for rule in &self.rules {
            rule.check(value)?;
        }
        for s in &self.stale {
            s.check(value, now_ms)?;
        }
        Ok(())
    }

    /// Whether records are judged without building a `serde_json::Value`.
    #[cfg(test)]
    pub(crate) fn uses_fast_path(&self) -> bool {
        matches!(self.decoder, Decoder::Json { fast: Some(_), .. })
    }

    /// Whether the fast path's shape alone accepts `bytes` (for tests that
    /// valid records do not fall back to the full path).
    #[cfg(test)]
    pub(crate) fn shape_accepts(&self, bytes: &[u8]) -> bool {
        match &self.decoder {
            Decoder::Json {
                max_depth,
                fast: Some(plan),
                ..
            } => json::capture_shaped(bytes, *max_depth, plan).is_some(),
            _ => false,
        }
    }

    /// Judge as the code before the fast path did: a `serde_json::Value`
    /// from the scan-then-parse decoder, then the rules on it. For tests
    /// that the fast path agrees with it.
    #[cfg(test)]
    pub(crate) fn judge_reference(&self, r: &Record<'_>, now_ms: i64) -> Result<(), Invalid> {
        let Some(bytes) = self.before_decode(r)? else {
            return Ok(());
        };
        match &self.decoder {
            Decoder::Json { max_depth, .. } => {
                let value = json::decode_reference(bytes, *max_depth)
                    .map_err(|r| Invalid::poison("decode", r))?;
                self.check_value(&value, now_ms)
            }
            _ => self.judge(r, now_ms),
        }
    }
}

// ---------------------------------------------------------------- loading

/// Load every file named (directories: their `*.yaml`/`*.yml`, sorted).
pub(crate) fn load_all(paths: &[PathBuf]) -> Result<Vec<Policy>, Vec<PolicyError>> {
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
    let mut state = LoadState::default();
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
pub(crate) fn load_text(text: &str, path: &Path) -> Result<Vec<Policy>, Vec<PolicyError>> {
    let mut state = LoadState::default();
    state.load_text(text, path);
    if state.errors.is_empty() {
        Ok(state.policies)
    } else {
        Err(state.errors)
    }
}

#[derive(Default)]
struct LoadState {
    policies: Vec<Policy>,
    errors: Vec<PolicyError>,
    /// Exact topic → (policy name, file) that claimed it first.
    topics: HashMap<String, (String, PathBuf)>,
    names: HashMap<String, PathBuf>,
}

impl LoadState {
    fn load_text(&mut self, text: &str, path: &Path) {
        let doc = match parse_doc(text, None) {
            Ok(d) => d,
            Err(e) => {
                self.errors.push(from_yaml(path, &e));
                return;
            }
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let mut ats = Vec::new();
        for p in doc.policies {
            match self.compile(p, base, path) {
                Ok(policy) => self.policies.push(policy),
                Err(mut e) => ats.append(&mut e),
            }
        }
        for a in ats {
            self.errors.push(place(text, path, a));
        }
    }

    fn compile(&mut self, p: PolicyDoc, base: &Path, file: &Path) -> Result<Policy, Vec<At>> {
        let mut errs = Vec::new();
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

        let (decoder, schema, allow_null, max_bytes) = match &p.value {
            None => (Decoder::Bytes, None, true, None),
            Some(v) => match compile_value(v, base) {
                Ok((d, s)) => (
                    d,
                    s,
                    v.allow_null,
                    v.max_bytes.or(default_max_bytes(&v.format.v)),
                ),
                Err(mut e) => {
                    errs.append(&mut e);
                    (Decoder::Bytes, None, true, None)
                }
            },
        };

        let mut rules = Vec::new();
        let mut stale = Vec::new();
        let mut decoder = decoder;
        if let Some(rs) = &p.rules {
            if matches!(decoder, Decoder::Bytes) && !rs.v.is_empty() && errs.is_empty() {
                errs.push(at(
                    rs,
                    "rules: rules need a decoded value; set value.format to json, avro or protobuf",
                ));
            }
            for r in &rs.v {
                if let Err(mut e) = compile_rule(r, &mut rules, &mut stale) {
                    errs.append(&mut e);
                }
            }
        }

        let pointers = rules::assign_slots(&mut rules, &mut stale);
        if let Decoder::Json { fast, shape, .. } = &mut decoder {
            if schema.is_none() || shape.is_some() {
                *fast = Some(json::Plan::new(pointers, shape.take()));
            }
        }

        let mut headers_required = Vec::new();
        for h in &p.headers.required {
            if h.v.is_empty() {
                errs.push(at(h, "headers.required: a header name cannot be empty"));
            } else {
                headers_required.push(h.v.clone());
            }
        }

        let dead_letter = match &p.dead_letter.topic {
            None => DeadLetterTemplate::default(),
            Some(t) => match DeadLetterTemplate::parse(&t.v) {
                Ok(d) => d,
                Err(m) => {
                    errs.push(at(t, format!("dead_letter.topic: {m}")));
                    DeadLetterTemplate::default()
                }
            },
        };

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
            on_invalid: match p.on_invalid {
                ActionDoc::Divert => Action::Divert,
                ActionDoc::Drop => Action::Drop,
                ActionDoc::Pass => Action::Pass,
            },
            on_undecodable: match p.on_undecodable {
                UndecodableDoc::Hold => Undecodable::Hold,
                UndecodableDoc::Divert => Undecodable::Divert,
            },
            topics,
            source: file.to_path_buf(),
            inner: Compiled {
                dead_letter,
                headers_required,
                allow_null,
                max_bytes,
                decoder,
                schema,
                rules,
                stale,
            },
        })
    }
}

fn ext(p: &Path) -> &str {
    p.extension().and_then(|e| e.to_str()).unwrap_or("")
}

/// Check a schema file's extension against the format, then resolve it.
fn schema_path(base: &Path, l: &Located<PathBuf>, key: &str, want: &str) -> Result<PathBuf, At> {
    let full = base.join(&l.v);
    if ext(&l.v) != want {
        return Err(at(
            l,
            format!(
                "{key}: `{}` should be a .{want} file for this format",
                l.v.display()
            ),
        ));
    }
    if !full.is_file() {
        return Err(at(
            l,
            format!("{key}: schema file {} does not exist", full.display()),
        ));
    }
    Ok(full)
}

fn no_key<T>(errs: &mut Vec<At>, l: &Option<Located<T>>, msg: &str) {
    if let Some(l) = l {
        errs.push(at(l, msg));
    }
}

fn compile_value(
    v: &ValueDoc,
    base: &Path,
) -> Result<(Decoder, Option<jsonschema::Validator>), Vec<At>> {
    let mut errs = Vec::new();
    let wire = v.wire.as_ref().map_or(Wire::Raw, |w| w.v);
    let format = v.format.v;
    if format != Format::Json {
        no_key(
            &mut errs,
            &v.max_depth,
            "value.max_depth: applies to format json only",
        );
    }
    if matches!(format, Format::Json | Format::Bytes) {
        no_key(
            &mut errs,
            &v.wire,
            "value.wire: applies to formats avro and protobuf only",
        );
        no_key(
            &mut errs,
            &v.schema_ids,
            "value.schema_ids: applies to formats avro and protobuf only",
        );
    }
    if format != Format::Protobuf {
        no_key(
            &mut errs,
            &v.message,
            "value.message: applies to format protobuf only",
        );
    }
    if format == Format::Bytes {
        no_key(
            &mut errs,
            &v.schema,
            "value.schema: format bytes is not decoded, so it has no schema",
        );
    }
    if wire == Wire::Raw {
        no_key(
            &mut errs,
            &v.schema_ids,
            "value.schema_ids: needs `wire: confluent` (raw values carry no schema id)",
        );
    }
    if wire == Wire::Confluent && v.schema_ids.as_ref().is_none_or(|m| m.v.is_empty()) {
        if let Some(w) = &v.wire {
            errs.push(at(
                w,
                "value.wire: `confluent` needs value.schema_ids (schema id: file)",
            ));
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }

    match format {
        Format::Bytes => Ok((Decoder::Bytes, None)),
        Format::Json => {
            let max_depth = match &v.max_depth {
                None => json::DEFAULT_MAX_DEPTH,
                Some(d) if (1..=json::MAX_MAX_DEPTH).contains(&d.v) => d.v,
                Some(d) => {
                    return Err(vec![at(
                        d,
                        format!(
                            "value.max_depth: {} is outside [1, {}]",
                            d.v,
                            json::MAX_MAX_DEPTH
                        ),
                    )])
                }
            };
            let (schema, shape) = match &v.schema {
                None => (None, None),
                Some(s) => {
                    let (validator, doc) = load_json_schema(base, s).map_err(|e| vec![e])?;
                    (Some(validator), Shape::compile(&doc))
                }
            };
            Ok((
                Decoder::Json {
                    max_depth,
                    fast: None,
                    shape,
                },
                schema,
            ))
        }
        Format::Avro => {
            let schema = match &v.schema {
                None if wire == Wire::Raw => {
                    return Err(vec![at(
                        &v.format,
                        "value.schema: format avro with `wire: raw` needs an .avsc schema",
                    )])
                }
                None => None,
                Some(s) => {
                    let p = schema_path(base, s, "value.schema", "avsc").map_err(|e| vec![e])?;
                    Some(
                        avro::load_schema(&p)
                            .map_err(|m| vec![at(s, format!("value.schema: {m}"))])?,
                    )
                }
            };
            let mut ids = HashMap::new();
            if let Some(m) = &v.schema_ids {
                for (id, f) in &m.v {
                    match schema_path(base, f, &format!("value.schema_ids.{id}"), "avsc").and_then(
                        |p| {
                            avro::load_schema(&p)
                                .map_err(|m| at(f, format!("value.schema_ids.{id}: {m}")))
                        },
                    ) {
                        Ok(s) => {
                            ids.insert(*id, s);
                        }
                        Err(e) => errs.push(e),
                    }
                }
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            Ok((Decoder::Avro(AvroDecoder { wire, schema, ids }), None))
        }
        Format::Protobuf => {
            let mut pools = Vec::new();
            if let Some(s) = &v.schema {
                match schema_path(base, s, "value.schema", "proto").and_then(|p| {
                    protobuf::load_file(&p).map_err(|m| at(s, format!("value.schema: {m}")))
                }) {
                    Ok(pf) => pools.push(pf),
                    Err(e) => errs.push(e),
                }
            } else if wire == Wire::Raw {
                errs.push(at(
                    &v.format,
                    "value.schema: format protobuf with `wire: raw` needs a .proto schema and a message",
                ));
            }
            let mut ids = HashMap::new();
            if let Some(m) = &v.schema_ids {
                for (id, f) in &m.v {
                    let key = format!("value.schema_ids.{id}");
                    match schema_path(base, f, &key, "proto").and_then(|p| {
                        protobuf::load_file(&p).map_err(|m| at(f, format!("{key}: {m}")))
                    }) {
                        Ok((pool, file)) => {
                            ids.insert(*id, file.clone());
                            pools.push((pool, file));
                        }
                        Err(e) => errs.push(e),
                    }
                }
            }
            if !errs.is_empty() {
                return Err(errs);
            }
            let message = match &v.message {
                None if wire == Wire::Raw => {
                    return Err(vec![at(
                        &v.format,
                        "value.message: format protobuf with `wire: raw` needs the message type (e.g. `message: geo.Trigger`)",
                    )])
                }
                None => None,
                Some(m) => {
                    let name = m.v.trim_start_matches('.');
                    match pools.iter().find_map(|(pool, _)| pool.get_message_by_name(name)) {
                        Some(d) => Some(d),
                        None => {
                            return Err(vec![at(
                                m,
                                format!(
                                    "value.message: no message `{name}` in the schema (use the full name, package included)"
                                ),
                            )])
                        }
                    }
                }
            };
            Ok((Decoder::Protobuf(ProtoDecoder { wire, message, ids }), None))
        }
    }
}

/// The validator and the schema document it was built from.
fn load_json_schema(
    base: &Path,
    s: &Located<PathBuf>,
) -> Result<(jsonschema::Validator, serde_json::Value), At> {
    let p = schema_path(base, s, "value.schema", "json")?;
    let text =
        std::fs::read(&p).map_err(|e| at(s, format!("value.schema: {}: {e}", p.display())))?;
    let doc: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| at(s, format!("value.schema: {}: not JSON: {e}", p.display())))?;
    let validator = jsonschema::validator_for(&doc).map_err(|e| {
        at(
            s,
            format!(
                "value.schema: {}: not a valid JSON Schema at `{}`: {e}",
                p.display(),
                e.instance_path()
            ),
        )
    })?;
    Ok((validator, doc))
}

fn pointer(l: &Located<String>, key: &str) -> Result<Pointer, At> {
    Pointer::parse(&l.v).map_err(|m| at(l, format!("{key}: {m}")))
}

fn compile_rule(
    r: &Located<RuleDoc>,
    rules: &mut Vec<Rule>,
    stale: &mut Vec<MaxAge>,
) -> Result<(), Vec<At>> {
    let d = &r.v;
    let mut errs = Vec::new();
    if let Some(c) = &d.coordinates {
        if d.field.is_some()
            || d.one_of.is_some()
            || d.min.is_some()
            || d.max.is_some()
            || d.max_age.is_some()
            || d.unit.is_some()
            || d.optional
        {
            return Err(vec![at(
                r,
                "rules: a `coordinates` rule takes no other keys; write field rules as separate list items",
            )]);
        }
        let lat = pointer(&c.v.lat, "coordinates.lat");
        let lon = pointer(&c.v.lon, "coordinates.lon");
        let bbox = match &c.v.bbox {
            None => None,
            Some(b) => match check_bbox(&b.v) {
                Ok(bb) => Some(bb),
                Err(m) => {
                    errs.push(at(b, format!("coordinates.bbox: {m}")));
                    None
                }
            },
        };
        match (lat, lon) {
            (Ok(lat), Ok(lon)) if errs.is_empty() => {
                rules.push(Rule::Coordinates(Box::new(Coordinates {
                    lat,
                    lon,
                    reject_null_island: c.v.reject_null_island,
                    bbox,
                })));
                return Ok(());
            }
            (a, b) => {
                errs.extend(a.err());
                errs.extend(b.err());
                return Err(errs);
            }
        }
    }
    let Some(field) = &d.field else {
        return Err(vec![at(
            r,
            "rules: a rule needs `coordinates` or `field` (with one_of, min/max or max_age)",
        )]);
    };
    let ptr = pointer(field, "field").map_err(|e| vec![e])?;
    if d.one_of.is_none() && d.min.is_none() && d.max.is_none() && d.max_age.is_none() {
        return Err(vec![at(
            field,
            format!(
                "field: `{}` has nothing to check; add one_of, min/max or max_age",
                field.v
            ),
        )]);
    }
    if let Some(o) = &d.one_of {
        if o.v.is_empty() {
            errs.push(at(o, "one_of: the list of allowed values is empty"));
        } else {
            rules.push(Rule::one_of(ptr.clone(), o.v.clone(), d.optional));
        }
    }
    if d.min.is_some() || d.max.is_some() {
        let lo = d.min.as_ref().map(|m| m.v);
        let hi = d.max.as_ref().map(|m| m.v);
        for l in [&d.min, &d.max].into_iter().flatten() {
            if !l.v.is_finite() {
                errs.push(at(l, "min/max: must be a finite number"));
            }
        }
        if let (Some(a), Some(b), Some(hl)) = (lo, hi, &d.max) {
            if a > b {
                errs.push(at(
                    hl,
                    format!("max: {} is below min {}", fmt_num(b), fmt_num(a)),
                ));
            }
        }
        rules.push(Rule::range(ptr.clone(), lo, hi, d.optional));
    }
    match (&d.max_age, &d.unit) {
        (Some(a), unit) => match max_age_ms(&a.v) {
            Ok(ms) => {
                let written = match &a.v {
                    serde_yaml::Value::String(s) => s.clone(),
                    other => format!("{}s", yaml_num(other)),
                };
                let unit = unit.as_ref().map_or(TimeUnit::Ms, |u| u.v);
                stale.push(MaxAge::new(ptr, ms, written, unit));
            }
            Err(m) => errs.push(at(a, format!("max_age: {m}"))),
        },
        (None, Some(u)) => errs.push(at(u, "unit: applies to max_age only")),
        (None, None) => {}
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

fn yaml_num(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn max_age_ms(v: &serde_yaml::Value) -> Result<f64, String> {
    let d = match v {
        serde_yaml::Value::String(s) => crate::text::parse_duration(s)?,
        serde_yaml::Value::Number(n) => crate::text::parse_duration(&n.to_string())?,
        _ => return Err("expected a duration like 30s, 15m or 1h".into()),
    };
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d.as_secs_f64() * 1000.0)
}

fn check_bbox(b: &[f64]) -> Result<[f64; 4], String> {
    let [min_lat, min_lon, max_lat, max_lon] = b else {
        return Err(format!(
            "expected [min_lat, min_lon, max_lat, max_lon], got {} numbers",
            b.len()
        ));
    };
    if !(-90.0..=90.0).contains(min_lat) || !(-90.0..=90.0).contains(max_lat) {
        return Err("latitudes must be within [-90, 90]".into());
    }
    if !(-180.0..=180.0).contains(min_lon) || !(-180.0..=180.0).contains(max_lon) {
        return Err("longitudes must be within [-180, 180]".into());
    }
    if min_lat > max_lat || min_lon > max_lon {
        return Err("min_lat must not exceed max_lat, nor min_lon max_lon".into());
    }
    Ok([*min_lat, *min_lon, *max_lat, *max_lon])
}
