//! One record of a v2 record batch, as the policy layer sees it.
//!
//! This is the shared vocabulary between `kafka::batch` (which produces
//! records from batch bytes) and `policy` (which judges them). It borrows
//! from the (possibly decompressed) records buffer and never copies bytes.

/// A record header: a key and an optional (nullable) value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// One decoded record. `offset` and `timestamp` are absolute: the batch's
/// base offset and base timestamp have been added to the record's deltas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<Header<'a>>,
}

impl<'a> Record<'a> {
    /// The value of the first header named `key`, if any.
    pub fn header(&self, key: &str) -> Option<Option<&'a [u8]>> {
        self.headers
            .iter()
            .find(|h| h.key == key.as_bytes())
            .map(|h| h.value)
    }
}
