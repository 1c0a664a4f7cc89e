//! What the `dlt` commands need of the schema registry: the client (when
//! `schema_registry` is configured), and values decoded through their
//! policy's schema for `dlt inspect --decode`. A schema the registry has
//! not given yet is fetched once, then the decoding is tried again.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{Context, DltError, DltRecord};
use crate::policy::{Class, Invalid, SchemaCache};
use crate::registry::Registry;

/// The registry client of `ctx`'s config, if it names one.
pub fn registry(ctx: &Context) -> Result<Option<Arc<Registry>>, DltError> {
    ctx.config
        .schema_registry
        .as_ref()
        .map(|r| Registry::new(r, SchemaCache::shared()))
        .transpose()
        .map_err(|e| DltError::Config(e.to_string()))
}

/// Run `attempt`; when it is `transient` and a registry is configured,
/// fetch what it asked for and run it once more.
pub async fn with_registry<T>(
    registry: Option<&Arc<Registry>>,
    mut attempt: impl FnMut() -> Result<T, Invalid>,
) -> Result<T, Invalid> {
    match attempt() {
        Err(e) if e.class == Class::Transient => match registry {
            Some(r) => {
                r.resolve_wants(r.timeout()).await;
                attempt()
            }
            None => Err(e),
        },
        other => other,
    }
}

/// The record's value decoded by the policy of its original topic:
/// `{"value": ...}`, or `{"error": ...}` naming why it could not be.
pub async fn decoded(ctx: &Context, registry: Option<&Arc<Registry>>, r: &DltRecord) -> Value {
    let Some(topic) = r.origin_topic.as_deref() else {
        return json!({"error": "no original topic"});
    };
    let Some(policy) = ctx.policies.for_topic(topic) else {
        return json!({"error": format!("no policy covers {topic}")});
    };
    let Some(bytes) = r.value.as_deref() else {
        return json!({"value": null});
    };
    let now = crate::clock::now_ms();
    match with_registry(registry, || policy.decode_value(topic, bytes, now)).await {
        Ok(Some(v)) => json!({ "value": v }),
        Ok(None) => json!({"error": "the policy does not decode values (format bytes)"}),
        Err(e) => json!({"error": format!("{} ({}): {}", e.rule, e.class, e.reason)}),
    }
}
