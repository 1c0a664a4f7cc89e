//! Kafka wire formats that the proxy reads and rewrites by hand: record
//! batches (`batch`), the records inside them (`record`) and their codecs
//! (`compression`). Request and response framing lives in `proxy::frame`;
//! message bodies are decoded with the `kafka-protocol` crate.

pub mod batch;
pub mod compression;
pub mod record;
