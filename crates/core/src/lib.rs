//! antidote-core: everything antidote decides, with no I/O and no async
//! runtime. Bytes in, values out; unit-tested, property-tested and fuzzed
//! without sockets.
//!
//! ```text
//! plan        one Fetch partition: which batches pass, which lose records,
//!   |         which records go to a DLT, where to hold; and the door's
//!   |         verdict on one Produce partition (plan::produce)
//!   +-> policy      record -> verdict (schemas, field rules, classes)
//!   +-> kafka       record batches: decode, splice, build, compress
//!   +-> dlt_record  the DLT record format: context headers, written and read
//!   +-> dlt_marker  release/discard/attempt/lease markers kept in DLTs
//! replay      one DLT record read back: what replay and re-drive do with it
//! text, clock       leaves: YAML error positions, durations, wall clock
//! ```
//!
//! Each module depends only on modules below it (`scripts/check-layers.py`).

pub mod clock;
pub mod dlt_context;
pub mod dlt_marker;
pub mod dlt_record;
pub mod kafka;
pub mod plan;
pub mod policy;
pub mod replay;
pub mod text;
