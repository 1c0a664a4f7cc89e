//! The `antidote dlt` commands: operator tools over dead-letter topics.
//!
//! - [`inspect`]: list or summarise what is in a DLT.
//! - [`replay`]: re-drive chosen DLT records to their original topic once the
//!   cause is fixed.
//! - [`discard`]: give up a blocked key's parked records.
//! - [`breaker`]: close a diversion circuit breaker.
//! - [`check`]: warnings about DLT settings (`antidote check`).
//!
//! Owns the command lines and what they print. The operations themselves
//! (reading, decoding, replaying, closing a breaker) are `service`'s,
//! shared with the admin console.

pub mod breaker;
pub mod check;
pub mod discard;
pub mod inspect;
pub mod replay;

pub use crate::service::{
    dlt_record, escape_controls, format_time, parse_time_arg, read_dlt, show_bytes, Context,
    DltError, DltRecord, Filters, CONTEXT_HEADERS, H_ATTEMPT, H_CLASS, H_ERROR, H_FAILED_AT,
    H_OFFSET, H_PARTITION, H_POLICY, H_REPLAYED_FROM, H_RULE, H_TIMESTAMP, H_TOPIC,
};
pub use inspect::InspectArgs;
pub use replay::ReplayArgs;
