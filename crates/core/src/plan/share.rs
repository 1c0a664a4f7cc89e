//! Share groups (KIP-932): which acquired offsets a share consumer is
//! given, and the acknowledgements the proxy adds to its next request.
//! Pure: ranges and offsets in, ranges and batches out.
//!
//! A ShareFetch response carries record batches and, per partition, the
//! ranges of offsets the member acquired (`AcquiredRecords`); a share
//! consumer delivers exactly the acquired offsets whose records it finds.
//! The proxy delivers fewer: an offset it removed (diverted, dropped, or
//! withheld because it cannot be decided now) leaves the acquired ranges,
//! so the client never sees it and never acknowledges it. The proxy
//! acknowledges the removed-for-good offsets itself, inside the client's
//! next request of the same share session (`merge`), so they are never
//! delivered again; withheld offsets it leaves to the acquisition lock.
//!
//! Never here: which offsets are removed (the planner and the filter
//! decide), or any I/O.

/// Acknowledge types (ShareFetch/ShareAcknowledge `AcknowledgeTypes`).
pub const GAP: i8 = 0;
pub const ACCEPT: i8 = 1;
pub const RELEASE: i8 = 2;
pub const REJECT: i8 = 3;

/// One `AcquiredRecords` range: `first..=last`, delivered `delivery_count` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub first: i64,
    pub last: i64,
    pub delivery_count: i16,
}

impl Acquired {
    pub fn contains(&self, offset: i64) -> bool {
        self.first <= offset && offset <= self.last
    }
}

/// Whether `offset` is in any of `acquired`.
pub fn is_acquired(acquired: &[Acquired], offset: i64) -> bool {
    acquired.iter().any(|a| a.contains(offset))
}

/// `acquired` without the offsets in `removed` (sorted ascending, no
/// duplicates): ranges split around them, empty ranges dropped, each
/// piece keeping its delivery count. A malformed range (`last < first`)
/// is dropped: the client could not acknowledge it anyway.
pub fn subtract(acquired: &[Acquired], removed: &[i64]) -> Vec<Acquired> {
    let mut out = Vec::with_capacity(acquired.len());
    for a in acquired {
        if a.last < a.first {
            continue;
        }
        let start = removed.partition_point(|&o| o < a.first);
        let mut from = a.first;
        let mut open = true;
        for &o in removed[start..].iter().take_while(|&&o| o <= a.last) {
            if o > from {
                out.push(Acquired {
                    first: from,
                    last: o - 1,
                    ..*a
                });
            }
            match o.checked_add(1) {
                Some(next) => from = next,
                None => open = false, // `o` was i64::MAX: nothing is left
            }
        }
        if open && from <= a.last {
            out.push(Acquired { first: from, ..*a });
        }
    }
    out
}

/// One acknowledgement batch: `first..=last` with either one type for the
/// whole range or one per offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckBatch {
    pub first: i64,
    pub last: i64,
    pub types: Vec<i8>,
}

impl AckBatch {
    /// Well formed: a range, and one type or one per offset.
    pub fn is_valid(&self) -> bool {
        self.last >= self.first
            && (self.types.len() == 1
                || self
                    .last
                    .checked_sub(self.first)
                    .and_then(|n| u64::try_from(n).ok())
                    .and_then(|n| n.checked_add(1))
                    == Some(self.types.len() as u64))
    }

    /// The type of `offset` (inside the range).
    fn type_of(&self, offset: i64) -> i8 {
        if self.types.len() == 1 {
            self.types[0]
        } else {
            self.types[(offset - self.first) as usize]
        }
    }

    /// `first..=last`, a part of this batch, with its types.
    fn part(&self, first: i64, last: i64) -> AckBatch {
        let types = if self.types.len() == 1 {
            self.types.clone()
        } else {
            (first..=last).map(|o| self.type_of(o)).collect()
        };
        AckBatch { first, last, types }
    }
}

/// The proxy's acknowledgements (offset, type; any order) as batches: one
/// per run of consecutive offsets of one type.
pub fn batches(acks: &[(i64, i8)]) -> Vec<AckBatch> {
    let mut acks = acks.to_vec();
    acks.sort_unstable();
    acks.dedup_by_key(|a| a.0);
    let mut out: Vec<AckBatch> = Vec::new();
    for (o, t) in acks {
        match out.last_mut() {
            Some(b) if b.last + 1 == o && b.types == [t] => b.last = o,
            _ => out.push(AckBatch {
                first: o,
                last: o,
                types: vec![t],
            }),
        }
    }
    out
}

/// The client's batches of one partition with the proxy's acknowledgements
/// merged in: every offset the proxy acknowledges is taken out of the
/// client's batches (the proxy removed that record, so the client cannot
/// have processed it; it is acknowledged once, never twice), then the
/// proxy's batches are added, in offset order. `None` when a client batch
/// is malformed or two of them overlap: the request is left as it came
/// (the broker answers it) and the proxy's acknowledgements wait.
pub fn merge(client: &[AckBatch], proxy: &[(i64, i8)]) -> Option<Vec<AckBatch>> {
    let mut client: Vec<&AckBatch> = client.iter().collect();
    if client.iter().any(|b| !b.is_valid()) {
        return None;
    }
    client.sort_by_key(|b| b.first);
    if client.windows(2).any(|w| w[0].last >= w[1].first) {
        return None;
    }
    let ours = batches(proxy);
    let mut taken: Vec<i64> = ours.iter().flat_map(|b| b.first..=b.last).collect();
    taken.sort_unstable();
    let mut out = Vec::with_capacity(client.len() + ours.len());
    for b in client {
        let start = taken.partition_point(|&o| o < b.first);
        let mut from = Some(b.first);
        for &o in taken[start..].iter().take_while(|&&o| o <= b.last) {
            if let Some(f) = from.filter(|&f| o > f) {
                out.push(b.part(f, o - 1));
            }
            from = o.checked_add(1);
        }
        if let Some(f) = from.filter(|&f| f <= b.last) {
            out.push(b.part(f, b.last));
        }
    }
    out.extend(ours);
    out.sort_by_key(|b| b.first);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn acq(first: i64, last: i64) -> Acquired {
        Acquired {
            first,
            last,
            delivery_count: 1,
        }
    }

    #[test]
    fn removed_offsets_split_the_acquired_ranges() {
        let a = [acq(0, 9), acq(20, 20), acq(30, 32)];
        assert_eq!(
            subtract(&a, &[0, 4, 5, 9, 20, 31, 100]),
            vec![acq(1, 3), acq(6, 8), acq(30, 30), acq(32, 32)]
        );
        assert_eq!(subtract(&a, &[]), a.to_vec());
        assert_eq!(subtract(&[acq(5, 4)], &[]), vec![]);
    }

    #[test]
    fn the_proxys_acks_become_runs_of_one_type() {
        let got = batches(&[
            (7, REJECT),
            (5, REJECT),
            (6, REJECT),
            (9, REJECT),
            (10, ACCEPT),
        ]);
        assert_eq!(
            got,
            vec![
                AckBatch {
                    first: 5,
                    last: 7,
                    types: vec![REJECT]
                },
                AckBatch {
                    first: 9,
                    last: 9,
                    types: vec![REJECT]
                },
                AckBatch {
                    first: 10,
                    last: 10,
                    types: vec![ACCEPT]
                },
            ]
        );
    }

    #[test]
    fn a_client_ack_for_an_offset_the_proxy_acknowledges_is_dropped_not_sent_twice() {
        let client = [
            AckBatch {
                first: 0,
                last: 4,
                types: vec![ACCEPT],
            },
            AckBatch {
                first: 10,
                last: 12,
                types: vec![ACCEPT, RELEASE, GAP],
            },
        ];
        let got = merge(&client, &[(2, REJECT), (11, REJECT), (20, REJECT)]).unwrap();
        assert_eq!(
            got,
            vec![
                AckBatch {
                    first: 0,
                    last: 1,
                    types: vec![ACCEPT]
                },
                AckBatch {
                    first: 2,
                    last: 2,
                    types: vec![REJECT]
                },
                AckBatch {
                    first: 3,
                    last: 4,
                    types: vec![ACCEPT]
                },
                AckBatch {
                    first: 10,
                    last: 10,
                    types: vec![ACCEPT]
                },
                AckBatch {
                    first: 11,
                    last: 11,
                    types: vec![REJECT]
                },
                AckBatch {
                    first: 12,
                    last: 12,
                    types: vec![GAP]
                },
                AckBatch {
                    first: 20,
                    last: 20,
                    types: vec![REJECT]
                },
            ]
        );
    }

    #[test]
    fn malformed_or_overlapping_client_batches_are_left_alone() {
        let bad_len = AckBatch {
            first: 0,
            last: 3,
            types: vec![ACCEPT, ACCEPT],
        };
        assert_eq!(merge(&[bad_len], &[(9, REJECT)]), None);
        let backwards = AckBatch {
            first: 5,
            last: 3,
            types: vec![ACCEPT],
        };
        assert_eq!(merge(&[backwards], &[(9, REJECT)]), None);
        let a = AckBatch {
            first: 0,
            last: 5,
            types: vec![ACCEPT],
        };
        let b = AckBatch {
            first: 5,
            last: 6,
            types: vec![ACCEPT],
        };
        assert_eq!(merge(&[a, b], &[(9, REJECT)]), None);
        // A range too long for one type per offset is not mistaken for one.
        let huge = AckBatch {
            first: 0,
            last: i64::MAX,
            types: vec![ACCEPT, ACCEPT],
        };
        assert!(!huge.is_valid());
    }

    proptest! {
        /// Every offset ends up with exactly one type: the proxy's where it
        /// has one, else the client's; nothing else appears.
        #[test]
        fn merging_acknowledges_each_offset_once(
            runs in prop::collection::vec((0i64..6, 1i64..6, prop::bool::ANY), 0..6),
            ours in prop::collection::btree_set(0i64..80, 0..10),
        ) {
            let mut client = Vec::new();
            let mut at = 0;
            for (gap, len, per_offset) in runs {
                let first = at + gap;
                let last = first + len - 1;
                let types = if per_offset {
                    (first..=last).map(|o| (o % 4) as i8).collect()
                } else {
                    vec![ACCEPT]
                };
                client.push(AckBatch { first, last, types });
                at = last + 1;
            }
            let proxy: Vec<(i64, i8)> = ours.iter().map(|&o| (o, REJECT)).collect();
            let merged = merge(&client, &proxy).unwrap();
            let mut want = std::collections::BTreeMap::new();
            for b in &client {
                for o in b.first..=b.last {
                    want.insert(o, b.type_of(o));
                }
            }
            for &o in &ours {
                want.insert(o, REJECT);
            }
            let mut got = std::collections::BTreeMap::new();
            for b in &merged {
                prop_assert!(b.is_valid());
                for o in b.first..=b.last {
                    prop_assert!(got.insert(o, b.type_of(o)).is_none(), "offset {} twice", o);
                }
            }
            prop_assert_eq!(got, want);
        }

        #[test]
        fn subtracting_keeps_exactly_the_other_offsets(
            ranges in prop::collection::vec((0i64..5, 0i64..8), 0..5),
            removed in prop::collection::btree_set(0i64..60, 0..15),
        ) {
            let mut acquired = Vec::new();
            let mut at = 0;
            for (gap, len) in ranges {
                acquired.push(acq(at + gap, at + gap + len));
                at += gap + len + 1;
            }
            let removed: Vec<i64> = removed.into_iter().collect();
            let left = subtract(&acquired, &removed);
            for o in 0..80 {
                let want = is_acquired(&acquired, o) && removed.binary_search(&o).is_err();
                prop_assert_eq!(is_acquired(&left, o), want, "offset {}", o);
            }
        }
    }
}
