//! For the binary formats' property tests (`avro_proptests`,
//! `protobuf_proptests`): byte edits that turn a datum a serializer wrote
//! into near misses (bytes replaced, inserted, removed, or the tail cut
//! off), and a record carrying a value.

use proptest::prelude::*;

use super::PolicySet;
use crate::kafka::record::Record;

#[derive(Debug, Clone)]
pub(super) enum Edit {
    Replace(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Cut(usize),
}

pub(super) fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop_oneof![
        any::<u8>(),
        Just(0u8),
        Just(1),
        Just(2),
        Just(0x7f),
        Just(0x80),
        Just(0xff)
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Cut),
    ]
}

pub(super) fn apply(mut d: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let n = d.len();
        match *e {
            Edit::Replace(i, b) if n > 0 => d[i % n] = b,
            Edit::Insert(i, b) => d.insert(i % (n + 1), b),
            Edit::Remove(i) if n > 0 => {
                d.remove(i % n);
            }
            Edit::Cut(i) => d.truncate(i % (n + 1)),
            _ => {}
        }
    }
    d
}

/// A record whose value is `value`, at `now_ms`, without key or headers.
pub(super) fn record(value: &[u8], now_ms: i64) -> Record<'_> {
    Record {
        offset: 0,
        timestamp: now_ms,
        key: None,
        value: Some(value),
        headers: vec![],
    }
}

/// The set's first policy (raw values) judges `value`, and its second
/// (framed) judges `frame` + `value`, as their full decoders do: same
/// captured values where the fast path reads them, same verdict.
pub(super) fn agree(
    set: &PolicySet,
    value: &[u8],
    frame: &[u8],
    now_ms: i64,
) -> Result<(), TestCaseError> {
    let mut framed = frame.to_vec();
    framed.extend_from_slice(value);
    for (p, bytes) in set.policies().iter().zip([value, &framed[..]]) {
        let r = record(bytes, now_ms);
        if let Err(e) = p.inner.binary_captures_agree(bytes) {
            return Err(TestCaseError::fail(format!(
                "policy {}: {e} on {bytes:?}",
                p.name
            )));
        }
        prop_assert_eq!(
            p.inner.judge("", &r, now_ms),
            p.inner.judge_reference(&r, now_ms),
            "policy {} on {:?}",
            p.name,
            bytes
        );
    }
    Ok(())
}
