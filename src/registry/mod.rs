//! The schema registry client: fetches what `registry: true` policies
//! asked for ([`Want`]s queued in the core's [`SchemaCache`]), compiles it
//! with the core's compilers and stores it in that cache. Speaks the
//! Confluent REST API (Confluent Schema Registry, Apicurio's ccompat API,
//! Karapace and Redpanda serve it):
//!
//! - `GET /schemas/ids/{id}`: the schema, its `schemaType` (Avro when
//!   absent) and `references`, each resolved through
//!   `GET /subjects/{subject}/versions/{version}`, recursively and bounded
//!   ([`MAX_REFERENCES`], [`MAX_DEPTH`]);
//! - `GET /schemas/ids/{id}/versions`: the subjects an id is registered under
//!   (also asked for a schema that carries data-contract rules, which are
//!   named by subject).
//!
//! Owns: URLs tried in order, the single flight per want (concurrent misses
//! for one id share one request), the registry's up/down state (logged
//! once per change) and the request metric. Must never store anything but
//! an answer the registry gave: a failure leaves the cache as it was, so the
//! record stays `transient` (held) and is asked for again on the next fetch.

mod apicurio;
mod http;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::clock::now_ms;
use crate::config::{RegistryConfig, RegistryUrl};
use crate::metrics;
use crate::policy::contract::{compile_contract, Contract};
use crate::policy::formats::compile_schema as compile;
use crate::policy::registry::{Reference, Registered};
use crate::policy::{SchemaCache, Want};
pub use http::{HttpError, MAX_BODY};

/// Most references one schema may pull in, transitively.
pub const MAX_REFERENCES: usize = 64;
/// Deepest chain of references followed.
pub const MAX_DEPTH: usize = 8;
/// Longest a Fetch response waits while the registry is known to be down.
pub const DOWN_WAIT: Duration = Duration::from_millis(200);

/// Why a registry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("schema_registry.tls: {0}")]
    Tls(String),
    #[error("schema_registry.basic_auth: {0}")]
    Auth(String),
    #[error("{url}: {source}")]
    Request { url: String, source: HttpError },
    #[error("{url}: answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{0}: the answer is not the registry's JSON")]
    BadAnswer(String),
    #[error(
        "references of schema {0}: more than {MAX_REFERENCES}, or nested deeper than {MAX_DEPTH}"
    )]
    TooManyReferences(u32),
}

/// What one GET found.
enum Answer {
    Found(Bytes),
    NotFound,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<RefAnswer>,
    /// Confluent's data-contract rules (`domainRules`, ...), if any.
    #[serde(rename = "ruleSet", default)]
    rule_set: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RefAnswer {
    name: String,
    subject: String,
    version: i64,
}

#[derive(Deserialize)]
struct SubjectVersion {
    subject: String,
}

/// The client, shared by every connection (and by the `dlt` commands).
pub struct Registry {
    urls: Vec<RegistryUrl>,
    /// Apicurio's native API, for Apicurio-framed values.
    apicurio_urls: Vec<RegistryUrl>,
    client: http::Client,
    cache: Arc<SchemaCache>,
    inflight: Mutex<HashMap<Want, watch::Receiver<Option<bool>>>>,
    down: AtomicBool,
    /// Outages begun so far (the door logs each once).
    outages: AtomicU64,
}

impl Registry {
    pub fn new(cfg: &RegistryConfig, cache: Arc<SchemaCache>) -> Result<Arc<Self>, RegistryError> {
        let tls = cfg
            .tls
            .as_ref()
            .map(crate::transport::tls::connector)
            .transpose()
            .map_err(|e| RegistryError::Tls(e.to_string()))?;
        let password = cfg
            .basic_auth
            .as_ref()
            .map(|a| a.password().map(|p| (a.username.clone(), p)))
            .transpose()
            .map_err(RegistryError::Auth)?;
        let basic = password.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
        cache.set_ttl_ms(i64::try_from(cfg.cache_ttl.as_millis()).unwrap_or(i64::MAX));
        Ok(Arc::new(Registry {
            urls: cfg.url.clone(),
            apicurio_urls: cfg.apicurio_urls(),
            client: http::Client::new(tls, basic, cfg.timeout),
            cache,
            inflight: Mutex::new(HashMap::new()),
            down: AtomicBool::new(false),
            outages: AtomicU64::new(0),
        }))
    }

    pub fn cache(&self) -> &Arc<SchemaCache> {
        &self.cache
    }

    /// Outages begun so far: a number that changes when the registry
    /// stops answering.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// How long one request may take.
    pub fn timeout(&self) -> Duration {
        self.client.timeout
    }

    /// How long a Fetch response waits for the registry: its `timeout`,
    /// or at most [`DOWN_WAIT`] while the last request failed, so that the
    /// other partitions of held responses are not delayed by every fetch
    /// (the fetch itself goes on in the background).
    pub fn wait(&self) -> Duration {
        if self.down.load(Ordering::Relaxed) {
            self.client.timeout.min(DOWN_WAIT)
        } else {
            self.client.timeout
        }
    }

    /// Fetch everything judges asked for since the last call, waiting at
    /// most `wait`; whether it all arrived. Fetches that outlive the wait go
    /// on in the background and fill the cache for the next fetch.
    pub async fn resolve_wants(self: &Arc<Self>, wait: Duration) -> bool {
        let wants = self.cache.take_wants();
        if wants.is_empty() {
            return true;
        }
        let tasks: Vec<_> = wants
            .into_iter()
            .map(|w| {
                let me = self.clone();
                tokio::spawn(async move { me.fetch_once(w).await })
            })
            .collect();
        let all = async {
            let mut ok = true;
            for t in tasks {
                ok &= t.await.unwrap_or(false);
            }
            ok
        };
        tokio::time::timeout(wait, all).await.unwrap_or(false)
    }

    /// Fetch `want` unless another task is already fetching it; then share
    /// its outcome.
    pub async fn fetch_once(&self, want: Want) -> bool {
        if self.cache.has(want, now_ms()) {
            return true;
        }
        let (mut rx, leader) = {
            let Ok(mut map) = self.inflight.lock() else {
                return false;
            };
            match map.get(&want) {
                Some(rx) => (rx.clone(), None),
                None => {
                    let (tx, rx) = watch::channel(None);
                    map.insert(want, rx.clone());
                    (rx, Some(tx))
                }
            }
        };
        if let Some(tx) = leader {
            let ok = self.fetch(want).await;
            if let Ok(mut map) = self.inflight.lock() {
                map.remove(&want);
            }
            let _ = tx.send(Some(ok));
            return ok;
        }
        loop {
            if let Some(ok) = *rx.borrow_and_update() {
                return ok;
            }
            if rx.changed().await.is_err() {
                return false;
            }
        }
    }

    /// One fetch of `want` into the cache; whether the registry answered.
    async fn fetch(&self, want: Want) -> bool {
        let result = match want {
            Want::Schema(id) => self.fetch_schema(id).await,
            Want::Subjects(id) => self.fetch_subjects(id).await,
            Want::Apicurio(kind, id) => self.fetch_apicurio(kind, id).await,
        };
        match result {
            Ok(()) => {
                if self.down.swap(false, Ordering::Relaxed) {
                    info!("schema registry answers again: held partitions resume");
                }
                true
            }
            Err(e) => {
                if !self.down.swap(true, Ordering::Relaxed) {
                    self.outages.fetch_add(1, Ordering::Relaxed);
                    warn!(error = %e, "schema registry cannot be used: records that need it are held");
                } else {
                    debug!(error = %e, "schema registry still cannot be used");
                }
                false
            }
        }
    }

    async fn fetch_schema(&self, id: u32) -> Result<(), RegistryError> {
        let path = format!("/schemas/ids/{id}");
        let body = match self.get(&path).await? {
            Answer::NotFound => {
                self.cache.put_not_found(id, now_ms());
                return Ok(());
            }
            Answer::Found(b) => b,
        };
        let answer: SchemaAnswer =
            serde_json::from_slice(&body).map_err(|_| RegistryError::BadAnswer(path))?;
        let mut refs = Vec::new();
        let registered = match self
            .references(id, &answer.references, 0, &mut refs)
            .await?
        {
            Ok(()) => compile(answer.schema_type.as_deref(), &answer.schema, &refs),
            Err(missing) => Registered::Unusable(missing),
        };
        let (registered, contract) = match self.contract(id, &answer).await? {
            Ok(c) => (registered, c),
            // A rule antidote cannot honour: the schema is unusable (class
            // `unknown`), as one that does not compile.
            Err(why) => (Registered::Unusable(why), None),
        };
        debug!(
            id,
            schema_type = registered.type_name(),
            rules = contract.is_some(),
            "schema fetched from the registry"
        );
        self.cache.put_schema_with(id, registered, contract);
        Ok(())
    }

    /// The data-contract rules of schema `id`, compiled; the subject they
    /// are named by is the first the id is registered under (asked only
    /// when there are rules).
    async fn contract(
        &self,
        id: u32,
        answer: &SchemaAnswer,
    ) -> Result<Result<Option<Contract>, String>, RegistryError> {
        let Some(set) = answer.rule_set.as_ref().filter(|s| has_rules(s)) else {
            return Ok(Ok(None));
        };
        let subjects = self.subjects_of(id).await?;
        let subject = subjects
            .first()
            .cloned()
            .unwrap_or_else(|| format!("(schema id {id})"));
        self.cache.put_subjects(id, subjects, now_ms());
        let schema_type = answer.schema_type.as_deref().unwrap_or("AVRO");
        Ok(compile_contract(&subject, set, schema_type, &answer.schema))
    }

    /// Resolve `list` (and their own references, dependencies first) into
    /// `out`. The inner `Err` names a reference the registry does not have.
    async fn references(
        &self,
        id: u32,
        list: &[RefAnswer],
        depth: usize,
        out: &mut Vec<Reference>,
    ) -> Result<Result<(), String>, RegistryError> {
        if list.is_empty() {
            return Ok(Ok(()));
        }
        if depth >= MAX_DEPTH {
            return Err(RegistryError::TooManyReferences(id));
        }
        for r in list {
            if out.iter().any(|o| o.name == r.name) {
                continue;
            }
            if out.len() >= MAX_REFERENCES {
                return Err(RegistryError::TooManyReferences(id));
            }
            let path = format!("/subjects/{}/versions/{}", encode(&r.subject), r.version);
            let body = match self.get(&path).await? {
                Answer::NotFound => {
                    return Ok(Err(format!(
                        "reference {} (subject {} version {}) is not in the registry",
                        r.name, r.subject, r.version
                    )))
                }
                Answer::Found(b) => b,
            };
            let answer: SchemaAnswer =
                serde_json::from_slice(&body).map_err(|_| RegistryError::BadAnswer(path))?;
            if let Err(m) =
                Box::pin(self.references(id, &answer.references, depth + 1, out)).await?
            {
                return Ok(Err(m));
            }
            out.push(Reference {
                name: r.name.clone(),
                schema: answer.schema,
            });
        }
        Ok(Ok(()))
    }

    async fn fetch_subjects(&self, id: u32) -> Result<(), RegistryError> {
        let subjects = self.subjects_of(id).await?;
        self.cache.put_subjects(id, subjects, now_ms());
        Ok(())
    }

    /// `GET /schemas/ids/{id}/versions`: the subjects `id` is under.
    async fn subjects_of(&self, id: u32) -> Result<Vec<String>, RegistryError> {
        let path = format!("/schemas/ids/{id}/versions");
        Ok(match self.get(&path).await? {
            Answer::NotFound => Vec::new(),
            Answer::Found(body) => serde_json::from_slice::<Vec<SubjectVersion>>(&body)
                .map_err(|_| RegistryError::BadAnswer(path))?
                .into_iter()
                .map(|s| s.subject)
                .collect(),
        })
    }

    /// GET `path` from the first URL that answers (2xx or 404); the last
    /// error when none does.
    async fn get(&self, path: &str) -> Result<Answer, RegistryError> {
        self.get_from(&self.urls, path).await
    }

    /// [`Self::get`] from `urls`.
    async fn get_from(&self, urls: &[RegistryUrl], path: &str) -> Result<Answer, RegistryError> {
        let mut last = None;
        for url in urls {
            let m = metrics::global();
            match self.client.get(url, path).await {
                Ok((200..=299, body)) => {
                    m.registry_request("ok");
                    return Ok(Answer::Found(body));
                }
                Ok((404, _)) => {
                    m.registry_request("not_found");
                    return Ok(Answer::NotFound);
                }
                Ok((status, _)) => {
                    m.registry_request("error");
                    last = Some(RegistryError::Status {
                        url: format!("{url}{path}"),
                        status,
                    });
                }
                Err(source) => {
                    let kind = match source {
                        HttpError::Timeout(_) => "timeout",
                        _ => "error",
                    };
                    m.registry_request(kind);
                    last = Some(RegistryError::Request {
                        url: format!("{url}{path}"),
                        source,
                    });
                }
            }
        }
        Err(last.unwrap_or_else(|| RegistryError::BadAnswer("no registry URL".into())))
    }

    /// Check that every URL answers (`antidote check --connect`): one line
    /// per URL.
    pub async fn probe(&self) -> Vec<(String, Result<u16, String>)> {
        let mut out = Vec::new();
        for url in &self.urls {
            let r = self
                .client
                .get(url, "/subjects")
                .await
                .map(|(status, _)| status)
                .map_err(|e| e.to_string());
            out.push((url.to_string(), r));
        }
        out
    }
}

/// Whether a `ruleSet` holds any domain or encoding rule (migration
/// rules never run: a record is read with its writer's schema).
fn has_rules(set: &serde_json::Value) -> bool {
    ["domainRules", "encodingRules"].iter().any(|k| {
        set.get(k)
            .and_then(|r| r.as_array())
            .is_some_and(|r| !r.is_empty())
    })
}

/// Percent-encode a subject for a URL path (everything but RFC 3986
/// unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
