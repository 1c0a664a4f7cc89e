//! antidote: a Kafka-protocol proxy that keeps poison records away from consumers.
//!
//! Two crates. `antidote-core` (`crates/core`) decides: record batches,
//! policies, the Fetch-partition plan, the DLT record format; it does no
//! I/O. This crate moves bytes: sockets, the Fetch filter around the plan,
//! the dead-letter side, operations. Each module depends only on modules
//! below it in this picture (checked by `scripts/check-layers.py` in CI):
//!
//! ```text
//! main.rs      CLI: run | check | dlt ...
//! proxy        listeners, request pumps, classification, broker addresses, reload
//!   cli        `antidote dlt` commands: inspect, replay, discard, breaker close
//! filter       Fetch responses: plan every partition, await diversions, re-encode
//!   admin      /metrics /healthz /readyz, and /console when enabled
//! console      the DLT console's JSON API and page (served by admin)
//! service      DLT operations behind the commands and the console: browse,
//!              decode, replay, breaker close
//! dlt          the dead-letter side: writer (once only), ledger, the DLT
//!              follower (blocked keys, breakers, re-drive), trust
//! engine       policies, verdict cache, decode budget, registry: judging's state
//! registry     the schema registry client (fills the core's schema cache)
//! client       the proxy's own Kafka connections (metadata, produce, fetch)
//! metrics      counters and histograms the admin listener renders
//! transport    frames, TCP/TLS streams, SASL
//! config       the config file (envsubst: ${VAR} in it)
//! ---------------------------------- antidote-core (no I/O)
//! plan, replay -> policy -> kafka, dlt_record, text, clock
//! ```
//!
//! Clean batches pass as their original bytes; only batches that lose
//! records are rebuilt.

pub mod admin;
pub mod cli;
pub mod client;
pub mod config;
pub mod console;
pub mod dlt;
pub mod engine;
pub mod envsubst;
pub mod intercept;
pub mod metrics;
pub mod proxy;
pub mod registry;
pub mod sasl;
pub mod service;
pub mod transport;

pub use antidote_core::{
    clock, dlt_context, dlt_marker, dlt_record, kafka, plan, policy, replay, text,
};
