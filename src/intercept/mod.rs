//! Interception: the handlers that judge what passes through the proxy,
//! peers over the policy [`crate::engine`]:
//!
//! - [`fetch`]: Fetch responses. Every partition of a policy topic is
//!   planned by the core (keep, splice, divert, hold), its diversions are
//!   written to their DLTs and acknowledged, and only then is the response,
//!   re-encoded where a batch lost records, released to the client.
//! - [`produce`]: Produce requests at the door (`on_produce: reject`) and
//!   client writes to dead-letter topics: partitions refused are cut out of
//!   the request (`produce::wire`), answered by the proxy and merged back
//!   into the broker's answer.
//! - [`share`]: share consumers (KIP-932): the acknowledgements the proxy
//!   owes for records it removed from ShareFetch responses (which
//!   `fetch::share` judges with the Fetch planner), merged into the
//!   clients' next requests.
//!
//! The relay's pumps (`proxy::relay`) call these; neither knows about
//! sockets.

pub mod fetch;
pub mod produce;
pub mod share;
