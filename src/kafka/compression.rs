//! Record-batch codecs: gzip, snappy (raw and xerial-framed), lz4 (frame
//! format, independent blocks) and zstd.
//!
//! STUB: the real implementation is being written.

/// The codec named by bits 0-2 of a batch's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}
