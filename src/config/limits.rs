//! `limits:`, what protects the process from its peers: frame and
//! decoding budgets, connection counts and idleness, and the Fetch versions
//! offered to clients.

use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::de_duration;

/// Limits that protect the process from its peers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest frame accepted from a client or a broker.
    #[serde(default = "default_max_frame_bytes")]
    pub max_frame_bytes: u32,
    /// How long shutdown waits for in-flight responses.
    #[serde(default = "default_shutdown_grace", deserialize_with = "de_duration")]
    pub shutdown_grace: Duration,
    /// Decompressed record bytes that all Fetch rewrites in flight may hold
    /// together (`plan::budget`).
    #[serde(default = "default_decode_budget")]
    pub decode_budget: usize,
    /// Client connections served at once (all listeners); more are
    /// accepted and closed at once. Each one also holds a broker connection.
    #[serde(
        default = "default_max_connections",
        deserialize_with = "de_nonzero_u32"
    )]
    pub max_connections: u32,
    /// A client connection with no request (and no answer pending) for
    /// this long is closed.
    #[serde(
        default = "default_idle_timeout",
        deserialize_with = "de_nonzero_duration"
    )]
    pub idle_timeout: Duration,
    /// The highest Fetch version offered to clients; unset, the highest
    /// both the broker and the proxy know. A Fetch v16+ response may name
    /// brokers at its end (KIP-951), so the proxy reads it whole to rewrite
    /// them; at 15 or below, a response forwarded unchanged is spliced
    /// socket to socket. Clients then learn a moved leader from Metadata.
    #[serde(default, deserialize_with = "de_fetch_version")]
    pub fetch_max_version: Option<i16>,
    /// Cores no connection is planning on judge later stretches of a
    /// response's largest partitions (`filter::parallel`): lower latency
    /// and more records/s per partition, for a few per cent more CPU per
    /// judged record. Off: one thread per partition.
    #[serde(default = "default_judge_ahead")]
    pub judge_ahead: bool,
    /// How long a Fetch response waits for its records to be judged;
    /// unset (the default), until every record is. Past it, each policy
    /// partition ends before its next batch still to judge (never before
    /// its first), that rest is judged in the background, and the client
    /// fetches it again: lower latency for more broker reads per record.
    #[serde(default, deserialize_with = "de_some_duration")]
    pub judge_deadline: Option<Duration>,
    /// Request bytes all client connections may be receiving and handling
    /// at once (Kafka's `queued.max.request.bytes`, KIP-72): a frame larger
    /// than 64 KiB waits, unread, until there is room.
    #[serde(default = "default_max_queued_request_bytes")]
    pub max_queued_request_bytes: usize,
}

fn default_max_queued_request_bytes() -> usize {
    256 * 1024 * 1024
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: default_max_frame_bytes(),
            shutdown_grace: default_shutdown_grace(),
            decode_budget: default_decode_budget(),
            max_connections: default_max_connections(),
            idle_timeout: default_idle_timeout(),
            fetch_max_version: None,
            judge_ahead: default_judge_ahead(),
            judge_deadline: None,
            max_queued_request_bytes: default_max_queued_request_bytes(),
        }
    }
}

fn default_judge_ahead() -> bool {
    true
}

/// Four batches at the per-batch decompression cap (64 MiB).
fn default_decode_budget() -> usize {
    256 * 1024 * 1024
}

fn default_max_frame_bytes() -> u32 {
    100 * 1024 * 1024
}
fn default_shutdown_grace() -> Duration {
    Duration::from_secs(10)
}
/// Kafka's own default `max.connections` is unbounded; this bounds memory
/// (two sockets and two frame buffers per connection) yet leaves room for
/// large consumer fleets.
fn default_max_connections() -> u32 {
    10_000
}
/// Kafka's `connections.max.idle.ms` default.
fn default_idle_timeout() -> Duration {
    Duration::from_secs(600)
}

/// serde helper: a count that must be at least 1 (reported at its position).
fn de_nonzero_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match u32::deserialize(d)? {
        0 => Err(de::Error::custom("must be at least 1")),
        n => Ok(n),
    }
}

/// serde helper: a Fetch version the proxy can offer (4, the first with
/// record batches and an isolation level, up to the newest it decodes).
fn de_fetch_version<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i16>, D::Error> {
    let max = kafka_protocol::messages::ApiKey::Fetch.valid_versions().max;
    match i16::deserialize(d)? {
        v if (4..=max).contains(&v) => Ok(Some(v)),
        v => Err(de::Error::custom(format!("Fetch v{v}: must be 4 to {max}"))),
    }
}

/// serde helper: a duration given, for an optional one.
fn de_some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    de_duration(d).map(Some)
}

/// serde helper: a duration that must not be zero (reported at its position).
fn de_nonzero_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let t = de_duration(d)?;
    if t.is_zero() {
        return Err(de::Error::custom("must be longer than 0s"));
    }
    Ok(t)
}
