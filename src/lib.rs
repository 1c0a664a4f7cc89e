//! antidote: a Kafka-protocol proxy that keeps poison records away from consumers.
//!
//! The data path is visible from the module tree:
//!
//! ```text
//! client socket -> proxy (frames, routing, addresses, TLS) -> upstream broker
//! response      -> intercept (Fetch only, policy topics only)
//!                    -> kafka::batch (split / splice record batches: pure)
//!                    -> policy (bytes -> verdict: pure, no I/O)
//!                    -> deadletter (write + await acks, dedup)
//!               -> client socket
//! ```
//!
//! Pure cores (`kafka::batch`, `policy`) take bytes and return values; I/O lives
//! in `proxy` and `deadletter` only.

pub mod admin;
pub mod client;
pub mod config;
pub mod deadletter;
pub mod dlt;
pub mod envsubst;
pub mod intercept;
pub mod kafka;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod sasl;
