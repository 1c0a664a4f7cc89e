//! Share groups (KIP-932): which acquired offsets a share consumer is
//! given, and the acknowledgements the proxy adds to its next request.
//! Pure: ranges in, ranges and batches out. Offsets are always handled as
//! inclusive ranges ([`Span`]), never one by one: a broker's range, or a
//! batch diverted whole, may cover millions of offsets, and the work here
//! is proportional to the number of ranges, not to what they cover.
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

/// The offsets `first..=last` (`.0 <= .1`).
pub type Span = (i64, i64);

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

/// Whether any of `acquired` meets `span`.
pub fn meets(acquired: &[Acquired], span: Span) -> bool {
    acquired
        .iter()
        .any(|a| a.first <= span.1 && span.0 <= a.last)
}

/// Why a broker's acquired ranges for a records section are not believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRanges {
    /// A range ends before it starts.
    Backwards,
    /// Ranges out of order or overlapping.
    Unsorted,
    /// A range reaches outside the records section's offsets.
    Outside,
    /// More ranges than the section's records could need (one per record
    /// and one more: a range may cover offsets with no record, compacted
    /// away or taken by control batches).
    TooMany,
}

impl BadRanges {
    pub fn as_str(self) -> &'static str {
        match self {
            BadRanges::Backwards => "backwards",
            BadRanges::Unsorted => "unsorted",
            BadRanges::Outside => "outside",
            BadRanges::TooMany => "too_many",
        }
    }
}

/// Check a broker's acquired ranges against the records section they come
/// with: its first base offset and last offset (`section`, `None` if it
/// holds no complete batch) and how many records its batches say they
/// hold. Sorted, disjoint, within the section, at most `records + 1`.
pub fn check_acquired(
    acquired: &[Acquired],
    section: Option<Span>,
    records: u64,
) -> Result<(), BadRanges> {
    if acquired.is_empty() {
        return Ok(());
    }
    if acquired.len() as u64 > records.saturating_add(1) {
        return Err(BadRanges::TooMany);
    }
    if acquired.iter().any(|a| a.last < a.first) {
        return Err(BadRanges::Backwards);
    }
    if acquired.windows(2).any(|w| w[0].last >= w[1].first) {
        return Err(BadRanges::Unsorted);
    }
    let (first, last) = section.ok_or(BadRanges::Outside)?;
    let (lo, hi) = (acquired[0].first, acquired[acquired.len() - 1].last);
    if lo < first || hi > last {
        return Err(BadRanges::Outside);
    }
    Ok(())
}

/// `spans` sorted, with overlapping and adjacent ones joined; backwards
/// ones dropped.
pub fn normalize(mut spans: Vec<Span>) -> Vec<Span> {
    spans.retain(|s| s.0 <= s.1);
    spans.sort_unstable();
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(l) if s.0 <= l.1.saturating_add(1) => l.1 = l.1.max(s.1),
            _ => out.push(s),
        }
    }
    out
}

/// The parts of `spans` (normalized) inside `acquired` (sorted, disjoint).
pub fn within(spans: &[Span], acquired: &[Acquired]) -> Vec<Span> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < spans.len() && j < acquired.len() {
        let (s, a) = (spans[i], acquired[j]);
        let (lo, hi) = (s.0.max(a.first), s.1.min(a.last));
        if lo <= hi {
            out.push((lo, hi));
        }
        if s.1 < a.last {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `spans` without `removed` (both normalized).
pub fn minus(spans: &[Span], removed: &[Span]) -> Vec<Span> {
    let mut out = Vec::with_capacity(spans.len());
    let mut j = 0;
    for &(first, last) in spans {
        while j < removed.len() && removed[j].1 < first {
            j += 1;
        }
        let mut from = Some(first);
        let mut k = j;
        while let (Some(f), Some(&r)) = (from, removed.get(k)) {
            if r.0 > last {
                break;
            }
            if r.0 > f {
                out.push((f, r.0 - 1));
            }
            from = r.1.checked_add(1).filter(|&n| n <= last);
            k += 1;
        }
        if let Some(f) = from {
            out.push((f, last));
        }
    }
    out
}

/// `spans` without anything at or after `from`.
pub fn before(spans: &[Span], from: Option<i64>) -> Vec<Span> {
    let Some(from) = from else {
        return spans.to_vec();
    };
    spans
        .iter()
        .filter(|s| s.0 < from)
        .map(|&(f, l)| (f, l.min(from - 1)))
        .collect()
}

/// How many offsets `spans` cover, saturating.
pub fn count(spans: &[Span]) -> u64 {
    spans
        .iter()
        .map(|&(f, l)| (i128::from(l) - i128::from(f) + 1).clamp(0, i128::from(u64::MAX)) as u64)
        .fold(0u64, u64::saturating_add)
}

/// `acquired` without the offsets in `removed` (normalized): ranges split
/// around them, empty ranges dropped, each piece keeping its delivery
/// count. A malformed range (`last < first`) is dropped: the client could
/// not acknowledge it anyway.
pub fn subtract(acquired: &[Acquired], removed: &[Span]) -> Vec<Acquired> {
    let mut out = Vec::with_capacity(acquired.len());
    for a in acquired {
        if a.last < a.first {
            continue;
        }
        for (first, last) in minus(&[(a.first, a.last)], removed) {
            out.push(Acquired { first, last, ..*a });
        }
    }
    out
}

/// What to do with one partition's acquired offsets, as the filter sorted
/// them.
#[derive(Debug, Default)]
pub struct Settle {
    /// Removed for good: acknowledged by the proxy.
    pub done: Vec<Span>,
    /// Not decided now: withheld, no acknowledgement, by reason.
    pub withheld: Vec<(Span, &'static str)>,
    /// Withheld from this offset on (a batch that cannot be judged).
    pub held_from: Option<i64>,
}

/// What becomes of one partition's acquired offsets, as ranges.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Acknowledged by the proxy.
    pub done: Vec<Span>,
    /// Every acquired offset that leaves the acquired ranges (done and
    /// withheld).
    pub removed: Vec<Span>,
    /// The withheld ones, by reason (kept acquired by renewals; `held`
    /// from `held_from` on).
    pub held: Vec<(Span, &'static str)>,
    /// What the member is left with: its acquired ranges without
    /// `removed`.
    pub left: Vec<Acquired>,
}

impl Settle {
    /// What becomes of `acquired` (checked: sorted, disjoint): withheld
    /// wins over done (a batch diverted whole and not written is withheld
    /// whole), `held_from` cuts everything from it on.
    pub fn outcome(&self, acquired: &[Acquired]) -> Outcome {
        let mut withheld = Vec::new();
        let mut by_reason = Vec::new();
        for &(span, reason) in &self.withheld {
            let mine = before(&within(&[span], acquired), self.held_from);
            by_reason.extend(mine.iter().map(|&s| (s, reason)));
            withheld.extend(mine);
        }
        let withheld = normalize(withheld);
        let done = normalize(self.done.clone());
        let done = before(&within(&done, acquired), self.held_from);
        let done = minus(&done, &withheld);
        let mut removed: Vec<Span> = done.iter().chain(&withheld).copied().collect();
        if let Some(from) = self.held_from {
            let cut = within(&[(from, i64::MAX)], acquired);
            by_reason.extend(cut.iter().map(|&s| (s, "held")));
            removed.extend(cut);
        }
        let removed = normalize(removed);
        Outcome {
            left: subtract(acquired, &removed),
            done,
            removed,
            held: by_reason,
        }
    }
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

/// The proxy's acknowledgements (range, type; any order) as batches: one
/// per run of consecutive offsets of one type. Where two overlap (a record
/// owed twice), the first in offset order wins.
pub fn batches(acks: &[(Span, i8)]) -> Vec<AckBatch> {
    let mut acks: Vec<(Span, i8)> = acks.iter().copied().filter(|a| a.0 .0 <= a.0 .1).collect();
    acks.sort_unstable();
    let mut out: Vec<AckBatch> = Vec::new();
    for ((first, last), t) in acks {
        let first = match out.last() {
            Some(b) if b.last >= last => continue,
            Some(b) if b.last >= first => b.last + 1,
            _ => first,
        };
        match out.last_mut() {
            Some(b) if b.last.checked_add(1) == Some(first) && b.types == [t] => b.last = last,
            _ => out.push(AckBatch {
                first,
                last,
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
pub fn merge(client: &[AckBatch], proxy: &[(Span, i8)]) -> Option<Vec<AckBatch>> {
    let mut client: Vec<&AckBatch> = client.iter().collect();
    if client.iter().any(|b| !b.is_valid()) {
        return None;
    }
    client.sort_by_key(|b| b.first);
    if client.windows(2).any(|w| w[0].last >= w[1].first) {
        return None;
    }
    let ours = batches(proxy);
    let taken = normalize(ours.iter().map(|b| (b.first, b.last)).collect());
    let mut out = Vec::with_capacity(client.len() + ours.len());
    for b in client {
        for (f, l) in minus(&[(b.first, b.last)], &taken) {
            out.push(b.part(f, l));
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
    fn withheld_wins_over_done_and_a_hold_cuts_everything_from_it_on() {
        let acquired = [acq(0, 9), acq(20, 29)];
        let settle = Settle {
            done: vec![(2, 4), (7, 8), (40, 41)],
            withheld: vec![((4, 5), "dlt"), ((15, 21), "transient")],
            held_from: Some(25),
        };
        let out = settle.outcome(&acquired);
        assert_eq!(
            out.done,
            vec![(2, 3), (7, 8)],
            "4 withheld, 40 not acquired"
        );
        assert_eq!(
            out.held,
            vec![((4, 5), "dlt"), ((20, 21), "transient"), ((25, 29), "held")]
        );
        assert_eq!(out.removed, vec![(2, 5), (7, 8), (20, 21), (25, 29)]);
        assert_eq!(out.left, vec![acq(0, 1), acq(6, 6), acq(9, 9), acq(22, 24)]);
    }

    #[test]
    fn removed_offsets_split_the_acquired_ranges() {
        let a = [acq(0, 9), acq(20, 20), acq(30, 32)];
        assert_eq!(
            subtract(
                &a,
                &[(0, 0), (4, 5), (9, 9), (20, 20), (31, 31), (100, 100)]
            ),
            vec![acq(1, 3), acq(6, 8), acq(30, 30), acq(32, 32)]
        );
        assert_eq!(subtract(&a, &[]), a.to_vec());
        assert_eq!(subtract(&[acq(5, 4)], &[]), vec![]);
    }

    #[test]
    fn the_proxys_acks_become_runs_of_one_type() {
        let got = batches(&[
            ((7, 7), REJECT),
            ((5, 6), REJECT),
            ((6, 6), REJECT),
            ((9, 9), REJECT),
            ((10, 10), ACCEPT),
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
        let got = merge(
            &client,
            &[((2, 2), REJECT), ((11, 11), REJECT), ((20, 20), REJECT)],
        )
        .unwrap();
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
        assert_eq!(merge(&[bad_len], &[((9, 9), REJECT)]), None);
        let backwards = AckBatch {
            first: 5,
            last: 3,
            types: vec![ACCEPT],
        };
        assert_eq!(merge(&[backwards], &[((9, 9), REJECT)]), None);
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
        assert_eq!(merge(&[a, b], &[((9, 9), REJECT)]), None);
        // A range too long for one type per offset is not mistaken for one.
        let huge = AckBatch {
            first: 0,
            last: i64::MAX,
            types: vec![ACCEPT, ACCEPT],
        };
        assert!(!huge.is_valid());
    }

    #[test]
    fn a_brokers_ranges_are_believed_only_sorted_disjoint_inside_and_few() {
        let section = Some((10, 19));
        assert_eq!(
            check_acquired(&[acq(10, 12), acq(15, 19)], section, 10),
            Ok(())
        );
        assert_eq!(check_acquired(&[], None, 0), Ok(()));
        assert_eq!(
            check_acquired(&[acq(12, 11)], section, 10),
            Err(BadRanges::Backwards)
        );
        assert_eq!(
            check_acquired(&[acq(15, 19), acq(10, 12)], section, 10),
            Err(BadRanges::Unsorted)
        );
        assert_eq!(
            check_acquired(&[acq(10, 15), acq(15, 19)], section, 10),
            Err(BadRanges::Unsorted)
        );
        assert_eq!(
            check_acquired(&[acq(9, 12)], section, 10),
            Err(BadRanges::Outside)
        );
        assert_eq!(
            check_acquired(&[acq(10, 20)], section, 10),
            Err(BadRanges::Outside)
        );
        assert_eq!(
            check_acquired(&[acq(10, 10)], None, 10),
            Err(BadRanges::Outside)
        );
        // Two records: at most three ranges.
        let four = [acq(10, 10), acq(12, 12), acq(14, 14), acq(16, 16)];
        assert_eq!(check_acquired(&four[..3], section, 2), Ok(()));
        assert_eq!(check_acquired(&four, section, 2), Err(BadRanges::TooMany));
    }

    #[test]
    fn ranges_as_wide_as_the_offsets_cost_no_more_than_narrow_ones() {
        // One range over all of i64: nothing is enumerated.
        let all = [Acquired {
            first: 0,
            last: i64::MAX,
            delivery_count: 1,
        }];
        let left = subtract(&all, &[(5, i64::MAX - 1)]);
        assert_eq!(left, vec![acq(0, 4), acq(i64::MAX, i64::MAX)]);
        assert_eq!(count(&[(0, i64::MAX)]), 1u64 << 63);
        let client = [AckBatch {
            first: 0,
            last: 9,
            types: vec![ACCEPT],
        }];
        let merged = merge(&client, &[((3, i64::MAX), REJECT)]).unwrap();
        assert_eq!(
            merged,
            vec![
                AckBatch {
                    first: 0,
                    last: 2,
                    types: vec![ACCEPT]
                },
                AckBatch {
                    first: 3,
                    last: i64::MAX,
                    types: vec![REJECT]
                },
            ]
        );
        assert_eq!(
            within(&[(5, 100)], &[acq(0, 9), acq(50, 60)]),
            vec![(5, 9), (50, 60)]
        );
        assert_eq!(
            before(&[(0, 9), (20, 30)], Some(25)),
            vec![(0, 9), (20, 24)]
        );
        assert_eq!(
            normalize(vec![(5, 6), (0, 2), (3, 4), (9, 8)]),
            vec![(0, 6)]
        );
    }

    proptest! {
        /// The range operations agree with the same operations offset by offset.
        #[test]
        fn range_operations_agree_with_sets_of_offsets(
            a in prop::collection::vec((0i64..40, 0i64..6), 0..6),
            b in prop::collection::vec((0i64..40, 0i64..6), 0..6),
            cut in prop::option::of(0i64..50),
        ) {
            use std::collections::BTreeSet;
            let set = |v: &[Span]| -> BTreeSet<i64> { v.iter().flat_map(|&(f, l)| f..=l).collect() };
            let a = normalize(a.into_iter().map(|(f, n)| (f, f + n)).collect());
            let b = normalize(b.into_iter().map(|(f, n)| (f, f + n)).collect());
            let acquired: Vec<Acquired> = b.iter().map(|&(f, l)| acq(f, l)).collect();
            prop_assert_eq!(set(&minus(&a, &b)), &set(&a) - &set(&b));
            prop_assert_eq!(set(&within(&a, &acquired)), &set(&a) & &set(&b));
            let kept: BTreeSet<i64> = set(&a).into_iter().filter(|&o| cut.is_none_or(|c| o < c)).collect();
            prop_assert_eq!(set(&before(&a, cut)), kept);
            prop_assert_eq!(count(&a), set(&a).len() as u64);
        }
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
            let proxy: Vec<(Span, i8)> = ours.iter().map(|&o| ((o, o), REJECT)).collect();
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
            let spans = normalize(removed.iter().map(|&o| (o, o)).collect());
            let left = subtract(&acquired, &spans);
            for o in 0..80 {
                let want = is_acquired(&acquired, o) && removed.binary_search(&o).is_err();
                prop_assert_eq!(is_acquired(&left, o), want, "offset {}", o);
            }
        }
    }
}
