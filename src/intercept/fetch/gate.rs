//! Whether a Fetch's or a ShareFetch's topic is judged at all, and under
//! which policy: the question both response paths ask first.

use std::sync::Arc;

use super::FetchFilter;
use crate::policy::{Policy, PolicySet};

/// Where a topic's records stand before judging (`FetchFilter::topic_gate`).
pub(super) enum TopicGate<'p> {
    /// No policy covers the topic, or it is a dead-letter topic: forwarded.
    Unpoliced,
    /// Its DLTs are not read back yet: held (a Fetch), or judged without
    /// writing to them (a ShareFetch), under this policy.
    Unloaded(&'p Arc<Policy>),
    /// Judged under this policy.
    Judge(&'p Arc<Policy>),
}

impl FetchFilter {
    /// Whether the records of topic `name` are judged, and under which
    /// policy. A glob may also cover a dead-letter topic: never police
    /// those. Until its DLTs are read back (given up to the DLT timeout),
    /// the ledger cannot say which records were diverted before.
    pub(super) async fn topic_gate<'p>(
        &self,
        policies: &'p PolicySet,
        name: &str,
    ) -> TopicGate<'p> {
        if policies.is_dead_letter_topic(name) {
            return TopicGate::Unpoliced;
        }
        let Some(policy) = policies.for_topic(name) else {
            return TopicGate::Unpoliced;
        };
        if self
            .dead_letter
            .wait_loaded_for(policy, name, self.timeout)
            .await
        {
            TopicGate::Judge(policy)
        } else {
            TopicGate::Unloaded(policy)
        }
    }
}
