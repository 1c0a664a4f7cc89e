//! Schemas from a schema registry, as the judge sees them: a cache of
//! compiled schemas by id and of the subjects each id is registered under,
//! filled by the binary crate's registry client. Pure: this module never
//! fetches anything. A judge that finds an id missing records what it
//! needs ([`Want`]) and answers `transient`; the client drains the wants,
//! fetches, and stores the answers here, and the record is judged again.
//!
//! What it owns: compiling a registry answer (Avro with named references,
//! Protobuf with imports, JSON Schema) with the same limits as schema
//! files, and the bounds of the cache. Must never cache a `transient`
//! outcome: only answers the registry actually gave are stored.
//!
//! Ids are immutable in a registry, so a compiled schema is kept for the
//! life of the process (bounded by [`MAX_SCHEMAS`]: when full it is
//! cleared, costing only refetches). "No such id" and subject lists may
//! change (an id can be registered later, under more subjects), so they
//! are kept for a bounded time (`ttl_ms`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dashmap::DashMap;

use super::contract::Contract;
pub use super::wire::ApicurioId;
use super::wire::SchemaKey;

/// Most compiled schemas kept at once.
pub const MAX_SCHEMAS: usize = 10_000;
/// Most subject lists kept at once.
pub const MAX_SUBJECT_LISTS: usize = 10_000;
/// Most wants queued at once (a flood of records with random ids must not
/// grow this without bound; a want dropped is asked for again next fetch).
pub const MAX_WANTS: usize = 1_024;
/// Default time a "no such id" answer and a subject list are trusted.
pub const DEFAULT_TTL_MS: i64 = 60_000;

/// A schema as registered, compiled.
#[derive(Debug)]
pub enum Registered {
    /// The writer schema and the named types its references define.
    Avro(apache_avro::Schema, Vec<apache_avro::Schema>),
    /// The file, its top-level messages and the fast path's tables.
    Protobuf(super::protobuf::IndexedFile),
    Json(jsonschema::Validator),
    /// Registered, but it does not compile here (a JSON Schema `$ref` to
    /// another subject, a recursive Avro record): records under it cannot be
    /// judged, class `unknown`. Kept, as the id's schema never changes.
    Unusable(String),
}

impl Registered {
    /// The registry's name of the schema's type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Registered::Avro(..) => "AVRO",
            Registered::Protobuf(..) => "PROTOBUF",
            Registered::Json(_) => "JSON",
            Registered::Unusable(_) => "unusable",
        }
    }
}

/// What the judge asks the registry client for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Want {
    /// `GET /schemas/ids/{id}` (and its references).
    Schema(u32),
    /// `GET /schemas/ids/{id}/versions`: the subjects the id is under.
    Subjects(u32),
    /// Apicurio's native API: `GET /ids/globalIds/{id}` or
    /// `/ids/contentIds/{id}`, its type and references.
    Apicurio(ApicurioId, u64),
}

/// What the cache knows of one id.
#[derive(Debug, Clone)]
pub enum Known<T> {
    /// The registry answered with this.
    Found(T),
    /// The registry said there is no such id (404, error 40403).
    NotFound,
    /// Not asked yet, or the answer expired: judge `transient`.
    Missing,
}

#[derive(Debug, Clone)]
enum SchemaEntry {
    Found(Arc<Registered>),
    NotFound { at_ms: i64 },
}

/// A map by schema id, looked up for every registered record judged:
/// foldhash (seeded per map) rather than SipHash, which cost more than
/// the lookup itself.
type ById<V> = DashMap<u32, V, foldhash::quality::RandomState>;

/// Compiled schemas and subject lists by id, shared by every policy that
/// sets `registry: true` and by the registry client that fills it.
#[derive(Debug)]
pub struct SchemaCache {
    schemas: ById<SchemaEntry>,
    /// Apicurio's ids, by namespace (a global id 5 is not content id 5,
    /// nor Confluent id 5).
    apicurio: DashMap<(ApicurioId, u64), SchemaEntry, foldhash::quality::RandomState>,
    subjects: ById<(Arc<[String]>, i64)>,
    /// The data-contract rules of Confluent ids whose schema carries any,
    /// stored before the schema itself (a judge that finds the schema
    /// finds its rules).
    contracts: ById<Arc<Contract>>,
    /// Whether any contract was ever stored: the fast path looks for one
    /// only then.
    any_contracts: AtomicBool,
    wants: Mutex<BTreeSet<Want>>,
    ttl_ms: AtomicI64,
}

impl Default for SchemaCache {
    fn default() -> Self {
        SchemaCache {
            schemas: ById::default(),
            apicurio: DashMap::default(),
            subjects: ById::default(),
            contracts: ById::default(),
            any_contracts: AtomicBool::new(false),
            wants: Mutex::new(BTreeSet::new()),
            ttl_ms: AtomicI64::new(DEFAULT_TTL_MS),
        }
    }
}

impl SchemaCache {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The cache policies use when loaded without one of their own: one per
    /// process, as the process talks to one registry (`schema_registry`).
    pub fn shared() -> Arc<SchemaCache> {
        static SHARED: OnceLock<Arc<SchemaCache>> = OnceLock::new();
        SHARED.get_or_init(SchemaCache::new).clone()
    }

    /// How long "no such id" and subject lists are trusted.
    pub fn set_ttl_ms(&self, ttl_ms: i64) {
        self.ttl_ms.store(ttl_ms.max(0), Ordering::Relaxed);
    }

    fn fresh(&self, at_ms: i64, now_ms: i64) -> bool {
        now_ms.saturating_sub(at_ms) < self.ttl_ms.load(Ordering::Relaxed)
    }

    /// The schema of `id`; queues a want when it is missing or expired.
    pub fn schema(&self, id: u32, now_ms: i64) -> Known<Arc<Registered>> {
        match self.schemas.get(&id).map(|e| e.clone()) {
            Some(SchemaEntry::Found(s)) => Known::Found(s),
            Some(SchemaEntry::NotFound { at_ms }) if self.fresh(at_ms, now_ms) => Known::NotFound,
            _ => {
                self.want(Want::Schema(id));
                Known::Missing
            }
        }
    }

    /// The schema of `key`, in its namespace; queues a want when missing.
    pub(crate) fn schema_of(&self, key: SchemaKey, now_ms: i64) -> Known<Arc<Registered>> {
        match key {
            SchemaKey::Confluent(id) => self.schema(id, now_ms),
            SchemaKey::Apicurio(kind, id) => self.apicurio_schema(kind, id, now_ms),
        }
    }

    /// The schema of Apicurio's `kind` id `id`; queues a want when missing.
    pub fn apicurio_schema(
        &self,
        kind: ApicurioId,
        id: u64,
        now_ms: i64,
    ) -> Known<Arc<Registered>> {
        match self.apicurio.get(&(kind, id)).map(|e| e.clone()) {
            Some(SchemaEntry::Found(s)) => Known::Found(s),
            Some(SchemaEntry::NotFound { at_ms }) if self.fresh(at_ms, now_ms) => Known::NotFound,
            _ => {
                self.want(Want::Apicurio(kind, id));
                Known::Missing
            }
        }
    }

    /// Store Apicurio's answer for `id` of `kind`: its schema, or (`None`)
    /// "no such id", trusted for the TTL.
    pub fn put_apicurio(&self, kind: ApicurioId, id: u64, schema: Option<Registered>, now_ms: i64) {
        if self.apicurio.len() >= MAX_SCHEMAS {
            self.apicurio.clear();
        }
        let entry = match schema {
            Some(s) => SchemaEntry::Found(Arc::new(s)),
            None => SchemaEntry::NotFound { at_ms: now_ms },
        };
        self.apicurio.insert((kind, id), entry);
    }

    /// The subjects `id` is registered under; queues a want when missing
    /// or expired.
    pub fn subjects(&self, id: u32, now_ms: i64) -> Known<Arc<[String]>> {
        match self.subjects.get(&id).map(|e| e.clone()) {
            Some((list, at_ms)) if self.fresh(at_ms, now_ms) => Known::Found(list),
            _ => {
                self.want(Want::Subjects(id));
                Known::Missing
            }
        }
    }

    fn want(&self, w: Want) {
        if let Ok(mut wants) = self.wants.lock() {
            if wants.len() < MAX_WANTS {
                wants.insert(w);
            }
        }
    }

    /// Everything judges asked for since the last call.
    pub fn take_wants(&self) -> Vec<Want> {
        match self.wants.lock() {
            Ok(mut w) => std::mem::take(&mut *w).into_iter().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Whether the registry's answer for `want` is in the cache and fresh.
    pub fn has(&self, want: Want, now_ms: i64) -> bool {
        match want {
            Want::Schema(id) => match self.schemas.get(&id).map(|e| e.clone()) {
                Some(SchemaEntry::Found(_)) => true,
                Some(SchemaEntry::NotFound { at_ms }) => self.fresh(at_ms, now_ms),
                None => false,
            },
            Want::Subjects(id) => self
                .subjects
                .get(&id)
                .is_some_and(|e| self.fresh(e.1, now_ms)),
            Want::Apicurio(kind, id) => match self.apicurio.get(&(kind, id)).map(|e| e.clone()) {
                Some(SchemaEntry::Found(_)) => true,
                Some(SchemaEntry::NotFound { at_ms }) => self.fresh(at_ms, now_ms),
                None => false,
            },
        }
    }

    /// Ask again about `id` past the negative cache (the door, before it
    /// refuses a record for an earlier answer): a "no such id" and a subject
    /// list at least `floor_ms` old are forgotten and asked for again.
    /// Compiled schemas are kept (an id's schema never changes). Whether
    /// anything was queued.
    pub fn recheck(&self, id: u32, now_ms: i64, floor_ms: i64) -> bool {
        let old = |at_ms: i64| now_ms.saturating_sub(at_ms) >= floor_ms;
        let mut queued = false;
        if self
            .schemas
            .remove_if(
                &id,
                |_, e| matches!(e, SchemaEntry::NotFound { at_ms } if old(*at_ms)),
            )
            .is_some()
        {
            self.want(Want::Schema(id));
            queued = true;
        }
        if self.subjects.remove_if(&id, |_, e| old(e.1)).is_some() {
            self.want(Want::Subjects(id));
            queued = true;
        }
        queued
    }

    /// Store the registry's schema for `id`.
    pub fn put_schema(&self, id: u32, schema: Registered) {
        self.put_schema_with(id, schema, None);
    }

    /// Store the registry's schema for `id` with its data-contract rules.
    pub fn put_schema_with(&self, id: u32, schema: Registered, contract: Option<Contract>) {
        if self.schemas.len() >= MAX_SCHEMAS {
            self.schemas.clear();
            self.contracts.clear();
        }
        match contract {
            Some(c) => {
                self.any_contracts.store(true, Ordering::Release);
                self.contracts.insert(id, Arc::new(c));
            }
            None => {
                self.contracts.remove(&id);
            }
        }
        self.schemas
            .insert(id, SchemaEntry::Found(Arc::new(schema)));
    }

    /// Store "no such id" for `id`, trusted for the TTL.
    pub fn put_not_found(&self, id: u32, now_ms: i64) {
        if self.schemas.len() >= MAX_SCHEMAS {
            self.schemas.clear();
        }
        self.schemas
            .insert(id, SchemaEntry::NotFound { at_ms: now_ms });
    }

    /// Store the subjects `id` is registered under (empty: none, or no
    /// such id), trusted for the TTL.
    pub fn put_subjects(&self, id: u32, subjects: Vec<String>, now_ms: i64) {
        if self.subjects.len() >= MAX_SUBJECT_LISTS {
            self.subjects.clear();
        }
        self.subjects.insert(id, (subjects.into(), now_ms));
    }

    /// The data-contract rules of Confluent id `id`, if its schema has any.
    pub fn contract(&self, id: u32) -> Option<Arc<Contract>> {
        if !self.any_contracts.load(Ordering::Acquire) {
            return None;
        }
        self.contracts.get(&id).map(|c| c.clone())
    }

    /// Compiled schemas held (for tests and the check command).
    pub fn len(&self) -> usize {
        self.schemas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.schemas.is_empty()
    }
}

/// One schema a registered schema refers to: its `name` (the import path
/// of a Protobuf reference, the full name of an Avro named type) and text.
#[derive(Debug, Clone)]
pub struct Reference {
    pub name: String,
    pub schema: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::formats::compile_schema as compile;

    #[test]
    fn a_missing_id_is_wanted_once_and_found_after_put() {
        let c = SchemaCache::default();
        assert!(matches!(c.schema(7, 0), Known::Missing));
        assert!(matches!(c.schema(7, 0), Known::Missing));
        assert_eq!(c.take_wants(), vec![Want::Schema(7)]);
        assert!(c.take_wants().is_empty());
        c.put_schema(7, compile(None, r#""string""#, &[]));
        assert!(matches!(c.schema(7, 0), Known::Found(_)));
        assert!(c.has(Want::Schema(7), i64::MAX));
    }

    #[test]
    fn not_found_and_subjects_expire_after_the_ttl() {
        let c = SchemaCache::default();
        c.set_ttl_ms(1000);
        c.put_not_found(3, 0);
        c.put_subjects(4, vec!["t-value".into()], 0);
        assert!(matches!(c.schema(3, 999), Known::NotFound));
        assert!(matches!(c.subjects(4, 999), Known::Found(_)));
        assert!(matches!(c.schema(3, 1000), Known::Missing));
        assert!(matches!(c.subjects(4, 1000), Known::Missing));
        assert_eq!(c.take_wants(), vec![Want::Schema(3), Want::Subjects(4)]);
    }

    #[test]
    fn wants_are_bounded() {
        let c = SchemaCache::default();
        for id in 0..(MAX_WANTS as u32 + 50) {
            let _ = c.schema(id, 0);
        }
        assert_eq!(c.take_wants().len(), MAX_WANTS);
    }

    #[test]
    fn avro_with_a_named_reference_compiles() {
        let loc = r#"{"type":"record","name":"Location","namespace":"geo","fields":[{"name":"lat","type":"double"}]}"#;
        let main = r#"{"type":"record","name":"T","namespace":"geo","fields":[{"name":"at","type":"geo.Location"}]}"#;
        let r = compile(
            Some("AVRO"),
            main,
            &[Reference {
                name: "geo.Location".into(),
                schema: loc.into(),
            }],
        );
        assert!(
            matches!(r, Registered::Avro(_, ref named) if named.len() == 1),
            "{r:?}"
        );
        // Without the reference it is unusable, not a panic.
        assert!(matches!(compile(None, main, &[]), Registered::Unusable(_)));
    }

    #[test]
    fn protobuf_with_an_import_compiles() {
        let loc = "syntax = \"proto3\"; package geo; message Location { double lat = 1; }";
        let main = "syntax = \"proto3\"; package geo; import \"location.proto\"; \
                    message T { Location at = 1; }";
        let r = compile(
            Some("PROTOBUF"),
            main,
            &[Reference {
                name: "location.proto".into(),
                schema: loc.into(),
            }],
        );
        let Registered::Protobuf(f) = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            f.first().map(|m| m.full_name().to_string()),
            Some("geo.T".into())
        );
    }

    #[test]
    fn json_and_unsupported_types() {
        assert!(matches!(
            compile(Some("JSON"), r#"{"type":"object"}"#, &[]),
            Registered::Json(_)
        ));
        assert!(matches!(
            compile(Some("JSON"), "{", &[]),
            Registered::Unusable(_)
        ));
        assert!(matches!(
            compile(Some("XML"), "<a/>", &[]),
            Registered::Unusable(_)
        ));
    }
}
