//! `share_groups`: how antidote treats share consumers (KIP-932). Their
//! records are judged like a consumer's; what differs is how a removed
//! record is settled with the broker, which the proxy does itself.

use serde::Deserialize;

/// `share_groups.owed_acks_budget` unless set: 4 MiB, about 65,000 ranges.
pub const DEFAULT_OWED_ACKS_BUDGET: usize = 4 << 20;

/// `share_groups.withheld_budget` unless set: 1 MiB, about 8,000 ranges.
pub const DEFAULT_WITHHELD_BUDGET: usize = 1 << 20;

/// `share_groups.max_renewals` unless set.
pub const DEFAULT_MAX_RENEWALS: u32 = 20;

/// `share_groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShareGroups {
    /// Offer the share-group APIs to clients (ShareGroupHeartbeat,
    /// ShareFetch, ShareAcknowledge and the share-group admin APIs). Off:
    /// a share consumer fails at its first poll, as with no proxy support.
    pub enabled: bool,
    /// How the proxy acknowledges a record it removed for good (diverted
    /// and in its DLT, or dropped), for the member that acquired it.
    pub removed_ack: RemovedAck,
    /// Bytes the proxy's own acknowledgements may take while they wait for
    /// their members' next requests, over all sessions (each is a range,
    /// about 64 bytes). Past it, a removed record is not acknowledged by
    /// the proxy: it comes back when its lock expires and is settled then.
    pub owed_acks_budget: usize,
    /// The delivery count of a record's last delivery before the broker
    /// archives it (the groups' `share.delivery.count.limit`; Kafka's
    /// minimum, 2, unless set). While a topic's DLTs are not read back, its
    /// records are withheld (one of them might be in its DLT already), save
    /// valid ones at this delivery: given rather than archived. Set it to
    /// the lowest limit of the groups served to hold longer; higher than a
    /// group's limit, that group's valid records are archived instead.
    pub last_delivery: i16,
    /// Keep what the proxy withholds acquired (KIP-1222 RENEW, brokers
    /// with ShareAcknowledge v2): the proxy renews the member's locks in the
    /// member's own session instead of letting each lock expire (every
    /// expiry costs a delivery), and releases the records once the reason
    /// clears (`intercept::share::withheld`). Off: withheld records come
    /// back when their locks expire.
    pub renew_withheld: bool,
    /// Bytes the withheld ranges being renewed may take, over all
    /// sessions (each about 100 bytes). Past it, a withheld range is not
    /// renewed: it comes back when its lock expires.
    pub withheld_budget: usize,
    /// Renewals of one withheld range before the proxy releases it all
    /// the same (for reasons it cannot tell have cleared: a DLT write not
    /// acknowledged, a registry, a breaker, a batch that cannot be judged):
    /// the record is delivered again and judged again. About
    /// `max_renewals` half lock durations per delivery.
    pub max_renewals: u32,
}

impl Default for ShareGroups {
    fn default() -> Self {
        ShareGroups {
            enabled: true,
            removed_ack: RemovedAck::Reject,
            owed_acks_budget: DEFAULT_OWED_ACKS_BUDGET,
            last_delivery: 2,
            renew_withheld: true,
            withheld_budget: DEFAULT_WITHHELD_BUDGET,
            max_renewals: DEFAULT_MAX_RENEWALS,
        }
    }
}

/// `share_groups.removed_ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovedAck {
    /// REJECT: archived as unprocessable. A group with a broker DLQ
    /// (KIP-1191, `errors.deadletterqueue.topic.name`) also gets it there:
    /// the record is in both dead-letter topics.
    Reject,
    /// ACCEPT: archived as processed. Only antidote's DLT holds it, and
    /// the broker's DLQ never sees it.
    Accept,
}

impl RemovedAck {
    /// The acknowledge type (ShareAcknowledge `AcknowledgeTypes`).
    pub fn ack_type(self) -> i8 {
        match self {
            RemovedAck::Reject => crate::plan::share::REJECT,
            RemovedAck::Accept => crate::plan::share::ACCEPT,
        }
    }
}
