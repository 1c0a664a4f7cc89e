//! Kafka wire formats that the proxy reads and rewrites by hand: record
//! batches (`batch`, `splice`, `builder`, `marker`) and their CRCs (`crc`), the records inside them (`record`,
//! `varint`), their codecs (`compression`), and the one bounds-checked
//! reader all hand-written parsing goes through (`cursor`). Request and response framing
//! lives in the binary crate (`transport::frame`); message bodies are decoded with the
//! `kafka-protocol` crate.

pub mod batch;
pub mod builder;
pub mod compression;
pub mod crc;
pub mod cursor;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod marker;
#[cfg(test)]
mod proptests;
pub mod record;
pub mod splice;
#[cfg(test)]
pub(crate) mod testutil;
pub mod varint;
