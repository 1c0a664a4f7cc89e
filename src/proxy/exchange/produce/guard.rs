//! Produce requests as the current policies see them at the door: which
//! topics are dead-letter topics (when client writes to them are refused),
//! which batches the door refuses, and topic ids (Produce v13+) resolved
//! through the proxy's metadata first.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use crate::intercept::produce::{self as door, wire as produce};
use crate::policy::PolicySet;
use crate::proxy::Shared;
use crate::transport::frame::RequestHead;

/// Produce requests as the current policies see them: dead-letter topics
/// (when client writes to them are refused) and the door; topic ids are
/// resolved through the proxy's metadata.
pub(in crate::proxy) struct ProduceGuard<'a> {
    pub shared: &'a Shared,
    pub policies: &'a PolicySet,
    pub refuse_dead_letters: bool,
    /// The connection's partitions answered retriably.
    pub marks: Option<&'a door::Marks>,
    /// What judging left to do (filled while the request is checked).
    pub notes: std::cell::RefCell<door::Notes>,
}

impl produce::Topics for ProduceGuard<'_> {
    fn is_dead_letter(&self, name: &str) -> bool {
        self.refuse_dead_letters && self.policies.is_dead_letter_topic(name)
    }
    fn name_of(&self, id: &uuid::Uuid) -> Option<String> {
        self.shared.topic_names.get(id).map(|n| n.to_string())
    }
    fn at_door(
        &self,
        topic: Option<&str>,
        partition: i32,
        records: &Bytes,
    ) -> Option<produce::Refusal> {
        match door::gate(self.policies, topic) {
            door::Gate::Open => None,
            door::Gate::UnknownTopic => Some(door::unknown_topic_id()),
            door::Gate::Judge(policy) => {
                let topic = topic.unwrap_or_default();
                let budget = &self.shared.engine.budget;
                if let Some(r) = self
                    .marks
                    .and_then(|m| m.still_refused(topic, partition, records))
                {
                    return Some(r);
                }
                let mut notes = self.notes.borrow_mut();
                door::judge(policy, topic, partition, records, budget, &mut notes)
            }
        }
    }
}

/// Produce v13+ names topics by id: before checking it for dead-letter
/// topics and at the door, look up ids the proxy has not seen (a topic
/// created since the last metadata refresh). Ids still unknown are not
/// dead-letter topics the proxy knows of (the broker answers for them);
/// the door refuses them retriably (UNKNOWN_TOPIC_ID).
pub(in crate::proxy) async fn learn_topic_ids(
    shared: &Arc<Shared>,
    policies: &PolicySet,
    head: RequestHead,
    frame: &Bytes,
) {
    let checked = !shared.config.dead_letter.allow_client_produce || policies.rejects_at_produce();
    let produce_by_id = head.api_key == ApiKey::Produce as i16 && head.api_version >= 13;
    if !produce_by_id || !checked || policies.is_empty() {
        return;
    }
    let ids = produce::topic_ids(frame, head.api_version);
    if ids.iter().any(|id| !shared.topic_names.contains_key(id)) {
        shared.resolve_topic_ids(&ids).await;
    }
}
