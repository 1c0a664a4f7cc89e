//! Share consumers (KIP-932), the request side: the acknowledgements the
//! proxy owes the broker for records it removed from share consumers'
//! responses (`acks`), and merging them into the clients' own requests
//! (`wire`). The responses are judged by the Fetch filter's planner
//! (`intercept::fetch::share`): one policy engine for both.
//!
//! How a share consumer is served (docs/policies.md, "Share groups"): the
//! records of a ShareFetch response are judged as a Fetch's; an invalid
//! record is diverted (and its acknowledgement awaited) before the
//! response is released, removed from the records and from the member's
//! acquired ranges, and acknowledged by the proxy (REJECT, or ACCEPT with
//! `share_groups.removed_ack: accept`) in the client's next request of the
//! session. What cannot be decided now (a DLT write not acknowledged, a
//! registry that does not answer, a batch that cannot be judged) is
//! withheld without an acknowledgement. On a broker with ShareAcknowledge
//! v2 (KIP-1222) the proxy keeps it acquired by renewing its lock in the
//! member's own session (`withheld`, `renew`) and releases it once the
//! reason clears, so it is delivered and judged again: one delivery more
//! per outage. Elsewhere (and in every fallback, counted) the broker
//! delivers it again when its acquisition lock expires, and it is judged
//! again then. Share groups promise no order, so nothing valid waits
//! behind a withheld record.

pub mod acks;
pub mod renew;
pub mod wire;
pub mod withheld;

pub use acks::ShareAcks;

/// One share session, as the proxy can tell it: the broker the connection
/// leads to (its node id; -1 for a bootstrap connection), the group and the
/// member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    pub node: i32,
    pub group: String,
    pub member: String,
}
