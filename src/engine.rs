//! The policy engine: what judging a record needs, built once at start-up
//! and shared by the two handlers that judge, as peers: Fetch interception
//! (`intercept::fetch`) and the Produce door (`intercept::produce`). It owns the running
//! policy snapshot, the verdict cache, the decode budget every decode of
//! either handler draws from, and the schema registry client.
//!
//! A reload swaps the snapshot whole ([`Engine::swap`]); a request is
//! handled under the snapshot it started with. What else a reload touches
//! (the dead-letter side, blocked keys, breakers) is the Fetch filter's.

use std::sync::{Arc, RwLock};

use crate::plan::budget::DecodeBudget;
use crate::plan::verdicts::VerdictCache;
use crate::policy::PolicySet;
use crate::registry::Registry;

/// Verdicts kept for batches judged before (bounded by count).
const VERDICTS: usize = 100_000;

pub struct Engine {
    policies: RwLock<Arc<PolicySet>>,
    /// Verdicts reached on batches before, by batch (Fetch side only: the
    /// door's batches have no offsets yet).
    pub verdicts: Arc<VerdictCache>,
    /// Decompressed bytes all requests and responses in flight may hold.
    pub budget: Arc<DecodeBudget>,
    /// Where `registry: true` policies' schema ids are resolved.
    registry: Option<Arc<Registry>>,
}

impl Engine {
    pub fn new(
        policies: Arc<PolicySet>,
        decode_budget: usize,
        registry: Option<Arc<Registry>>,
    ) -> Arc<Self> {
        Arc::new(Engine {
            policies: RwLock::new(policies),
            verdicts: Arc::new(VerdictCache::new(VERDICTS)),
            budget: DecodeBudget::new(decode_budget),
            registry,
        })
    }

    /// The current policies.
    pub fn policies(&self) -> Arc<PolicySet> {
        match self.policies.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The schema registry client, when `schema_registry` is configured.
    pub fn registry(&self) -> Option<&Arc<Registry>> {
        self.registry.as_ref()
    }

    /// Swap in a new, fully compiled policy set; the old one. Verdicts
    /// reached under the old one are never reused (the cache keys on the
    /// policy itself) and are dropped now to free memory.
    pub fn swap(&self, new: Arc<PolicySet>) -> Arc<PolicySet> {
        let old = match self.policies.write() {
            Ok(mut p) => std::mem::replace(&mut *p, new),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), new),
        };
        self.verdicts.clear();
        old
    }
}
