//! CRC-32C arithmetic for rewriting a batch without reading it twice.
//!
//! A batch's CRC is verified by reading every byte once; [`Marks`] keeps
//! the running CRC at every [`MARK_EVERY`] bytes of that read, so the CRC
//! of the batch up to any point costs at most that many bytes more. A
//! batch that loses records (`splice`) then gets its new CRC from those
//! running CRCs and the CRC algebra ([`shift`]: the CRC of `A ‖ B` is the
//! CRC of `A` shifted past `|B|` bytes, xor the CRC of `B`), instead of
//! reading every kept byte again: one shift per run of kept records.
//!
//! The crc32c crate computes CRCs (with the CPU's CRC32 instruction); its
//! own `crc32c_combine` builds its shift operator by squaring 32 × 32 bit
//! matrices for every bit of the length (tens of thousands of instructions
//! a call), where [`shift`] multiplies by a precomputed power of x per set
//! bit (a few thousand in all), which is why the shift is written here.
//!
//! On x86-64 CPUs with SSE4.2 (every one since 2008-2011), [`append`]
//! reads with the CRC32 instruction in its own loop (`lanes.rs`), 0.16
//! instructions a byte where the crate's takes 0.42; elsewhere (other
//! CPUs, other architectures) it is the crate's.

#[cfg(target_arch = "x86_64")]
mod lanes;

/// The CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    append(0, data)
}

/// `crc` (the CRC-32C of some `A`, 0 for nothing) continued over `data`:
/// the CRC-32C of `A ‖ data`.
#[inline]
pub fn append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: `lanes::append` is safe code compiled for SSE4.2, which
        // this CPU has (checked just above; std caches the answer).
        return unsafe { lanes::append(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

/// The CRC-32C polynomial, bit-reflected (bit 31 is x⁰).
const POLY: u32 = 0x82F6_3B78;

/// How often, in bytes of the records section, [`Marks`] keeps the
/// running CRC: the most a derived CRC reads again at each end of a run
/// (4 bytes of marks per 24 KiB of records). [`append`] (and the crc32c
/// crate) reads 24 KiB in its fastest way (three interleaved 8 KiB
/// lanes), so marks are that far apart, and aligned for the crate:
/// smaller steps cost a fifth more to verify every batch.
pub const MARK_EVERY: usize = 3 * 8192;

/// `a · b mod P`, both bit-reflected.
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `x^(2^k) mod P` for every k a byte count in bits can need.
const POWERS: [u32; 67] = {
    let mut t = [0u32; 67];
    t[0] = 1 << 30; // x¹
    let mut k = 1;
    while k < 67 {
        t[k] = multiply(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// `crc` (of some `A`) advanced past `len` bytes: xor it with the CRC of
/// any `B` of `len` bytes and it is the CRC of `A ‖ B`.
pub fn shift(crc: u32, len: usize) -> u32 {
    // x^(8·len): bit k of len multiplies by x^(2^(k+3)).
    let (mut crc, mut len, mut k) = (crc, len as u64, 3);
    while len != 0 {
        if len & 1 != 0 {
            crc = multiply(POWERS[k], crc);
        }
        len >>= 1;
        k += 1;
    }
    crc
}

/// The running CRC of a byte string read in [`MARK_EVERY`]-byte steps
/// after a fixed head: `at[0]` is the CRC of the head, `at[k]` that of
/// the head and the first `lead + (k - 1) · MARK_EVERY` bytes, where
/// `lead` (under 8) brings the steps to 8-byte-aligned memory.
#[derive(Debug, Clone, Default)]
pub struct Marks {
    at: Box<[u32]>,
    lead: usize,
    /// The CRC of the head and all the data read (`None` without marks).
    whole: Option<(usize, u32)>,
}

impl Marks {
    /// The CRC of `head ‖ data`, read once, with its marks.
    pub fn read(head: &[u8], data: &[u8]) -> (u32, Marks) {
        let lead = ((8 - data.as_ptr() as usize % 8) % 8).min(data.len());
        let mut at = Vec::with_capacity((data.len() - lead) / MARK_EVERY + 2);
        let mut crc = crc32c(head);
        at.push(crc);
        crc = append(crc, &data[..lead]);
        at.push(crc);
        let mut steps = data[lead..].chunks_exact(MARK_EVERY);
        for step in &mut steps {
            crc = append(crc, step);
            at.push(crc);
        }
        crc = append(crc, steps.remainder());
        let marks = Marks {
            at: at.into_boxed_slice(),
            lead,
            whole: Some((data.len(), crc)),
        };
        (crc, marks)
    }

    /// Whether these marks are of nothing (a compressed batch has none).
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Bytes the marks take.
    pub fn memory(&self) -> usize {
        self.at.len() * std::mem::size_of::<u32>()
    }

    /// The CRC of the head and `data[..end]`, where `data` is what was
    /// read; `None` past it or without marks.
    pub fn up_to(&self, data: &[u8], end: usize) -> Option<u32> {
        self.up_to_from(data, end, None)
    }

    /// [`Self::up_to`], from `known` (a point of `data` and the CRC up to
    /// it) when that is nearer than the last mark before `end`; the CRC
    /// of all the data is known without reading.
    fn up_to_from(&self, data: &[u8], end: usize, known: Option<(usize, u32)>) -> Option<u32> {
        if let Some((len, crc)) = self.whole {
            if end == len && len == data.len() {
                return Some(crc);
            }
        }
        let (k, from) = match end.checked_sub(self.lead) {
            None => (0, 0),
            Some(past) => {
                let steps = past / MARK_EVERY;
                (steps + 1, self.lead + steps * MARK_EVERY)
            }
        };
        let (from, crc) = match known {
            Some((at, crc)) if at >= from && at <= end => (at, crc),
            _ => (from, *self.at.get(k)?),
        };
        Some(append(crc, data.get(from..end)?))
    }

    /// The CRC of `new_head ‖ data[r₀] ‖ data[r₁] ‖ …` for increasing,
    /// non-overlapping ranges of what was read: one shift a range, and at
    /// most [`MARK_EVERY`] bytes read again at each end of it (less when
    /// the previous end is nearer than a mark: removed records between two
    /// runs are read once; the end of the data is not read again). `None`
    /// when a range is outside `data` or there are no marks.
    pub fn derive(
        &self,
        data: &[u8],
        new_head: &[u8],
        ranges: impl IntoIterator<Item = (usize, usize)>,
    ) -> Option<u32> {
        let mut crc = crc32c(new_head);
        let mut known = None;
        for (start, end) in ranges {
            // crc(h ‖ R) = shift(crc(h), |R|) ^ crc(R), and
            // crc(R) = up_to(end) ^ shift(up_to(start), |R|).
            let len = end.checked_sub(start)?;
            let at_start = self.up_to_from(data, start, known)?;
            let at_end = self.up_to_from(data, end, Some((start, at_start)))?;
            known = Some((end, at_end));
            crc = shift(crc ^ at_start, len) ^ at_end;
        }
        Some(crc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect()
    }

    /// Every length around the lanes' block sizes, at every alignment and
    /// from a CRC of something before: the crc32c crate's answer.
    #[test]
    fn append_is_the_crates_crc() {
        let all = bytes(3 * 3 * 8192 + 3 * 768 + 40, 9);
        let lens = (0..100)
            .chain((1..4).flat_map(|k| [k * 768 - 1, k * 768, k * 768 + 7]))
            .chain((1..4).flat_map(|k| [k * MARK_EVERY - 1, k * MARK_EVERY, k * MARK_EVERY + 775]))
            .chain([5_000, 2 * MARK_EVERY + 2 * 768 + 13]);
        for n in lens {
            for skew in [0, 1, 3, 7] {
                let data = &all[skew..skew + n];
                for before in [0, 0x1234_5678] {
                    assert_eq!(
                        append(before, data),
                        crc32c::crc32c_append(before, data),
                        "{n} {skew}"
                    );
                }
            }
        }
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn shift_is_what_concatenating_does() {
        for len_a in [0, 1, 7, 100] {
            for len_b in [0, 1, 2, 3, 8, 255, 4096, 4097, 70_001] {
                let (a, b) = (bytes(len_a, 1), bytes(len_b, 2));
                let whole = crc32c::crc32c(&[&a[..], &b[..]].concat());
                let derived = shift(crc32c::crc32c(&a), len_b) ^ crc32c::crc32c(&b);
                assert_eq!(derived, whole, "{len_a} + {len_b}");
                let theirs = crc32c::crc32c_combine(crc32c::crc32c(&a), crc32c::crc32c(&b), len_b);
                assert_eq!(derived, theirs);
            }
        }
    }

    /// At every alignment of the data, every prefix's CRC.
    #[test]
    fn marks_read_the_crc_of_every_prefix() {
        let head = bytes(40, 3);
        let all = bytes(3 * MARK_EVERY + 40, 4);
        for n in [
            0,
            1,
            9,
            MARK_EVERY - 1,
            MARK_EVERY,
            MARK_EVERY + 9,
            3 * MARK_EVERY + 17,
        ] {
            for skew in 0..8 {
                let data = &all[skew..skew + n];
                let (crc, marks) = Marks::read(&head, data);
                assert_eq!(crc, crc32c::crc32c(&[&head[..], data].concat()));
                assert_eq!(marks.memory(), 4 * marks.at.len());
                assert!(marks.at.len() <= n / MARK_EVERY + 2);
                let ends = (0..=n.min(20)).chain((0..=n).step_by(997)).chain([n]);
                for end in ends.chain((1..4).flat_map(|k| [k * MARK_EVERY - 1, k * MARK_EVERY + 7]))
                {
                    let want =
                        (end <= n).then(|| crc32c::crc32c(&[&head[..], &data[..end]].concat()));
                    assert_eq!(marks.up_to(data, end), want, "{n} {skew} {end}");
                }
            }
        }
    }

    /// Any ranges under a new head: the CRC of the bytes they select.
    #[test]
    fn derive_is_the_crc_of_what_is_kept() {
        let (head, new_head) = (bytes(40, 5), bytes(40, 6));
        let data = bytes(5 * MARK_EVERY + 333, 7);
        let data = &data[3..];
        let (_, marks) = Marks::read(&head, data);
        let cases: [&[(usize, usize)]; 6] = [
            &[],
            &[(0, data.len())],
            &[(0, 100), (250, data.len())],
            &[
                (5, 6),
                (MARK_EVERY, MARK_EVERY),
                (MARK_EVERY + 1, 2 * MARK_EVERY + 9),
            ],
            &[
                (17, 4 * MARK_EVERY),
                (4 * MARK_EVERY + 50, 5 * MARK_EVERY + 1),
            ],
            &[(data.len(), data.len())],
        ];
        for ranges in cases {
            let mut kept = new_head.clone();
            for &(s, e) in ranges {
                kept.extend_from_slice(&data[s..e]);
            }
            let got = marks.derive(data, &new_head, ranges.iter().copied());
            assert_eq!(got, Some(crc32c::crc32c(&kept)), "{ranges:?}");
        }
        assert_eq!(marks.derive(data, &new_head, [(0, data.len() + 1)]), None);
        assert_eq!(marks.derive(data, &new_head, [(9, 8)]), None);
        assert_eq!(Marks::default().derive(data, &new_head, [(0, 1)]), None);
    }
}
