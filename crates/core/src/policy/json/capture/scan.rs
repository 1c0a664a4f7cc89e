//! A byte scanner in front of the serde_json visitor: it accepts the plain
//! documents records usually are (no string escapes, integers of up to 18
//! digits) and fills the same [`Captures`] and shape checks as
//! [`super::At`], in about a third of the time, because it reads each byte
//! once without serde's visitor machinery. It never rejects: anything it
//! does not surely accept (an escape, a control character, a long integer,
//! a syntax error, a shape mismatch, a rule wanting a whole container) makes
//! it give up, and the visitor path parses the document again and decides.
//! So a record is only ever accepted here if serde_json's strict parser
//! accepts it too, with the same captured values. Numbers follow JSON's
//! grammar exactly; a decimal of at most 19 digits is one correctly
//! rounded division of floats up to 2^53 and past it a product with
//! 10^-k or an integer division (`decimal.rs`), any other
//! fraction or exponent goes to the standard library's correctly rounding
//! parser, which gives serde_json's (`float_roundtrip`) value bit for bit.
//! `json_proptests` checks both paths against each other.

use serde_json::Number;

use super::decimal;
use super::layout::{Learning, MemberSchema};
use super::strings::string_end;
use super::{Captured, Captures, Plan};
use crate::policy::shape::{same_key, Seen, ShapeNode};

/// Why the scan stopped: the visitor path must decide.
struct GiveUp;

type Scan<T> = Result<T, GiveUp>;

/// Whether the scanner surely accepts `text` (already checked to be
/// UTF-8), with its captures in `caps` (fresh from `Captures::new`); when
/// it gives up, `caps` holds whatever was captured before, and the visitor
/// path must decide with fresh captures. The captures are the caller's so
/// that they are not moved on the way out (they were 6 % of a judged
/// record's CPU as return values).
pub(super) fn scan<'de>(
    text: &'de str,
    max_depth: usize,
    plan: &Plan,
    caps: &mut Captures<'de>,
) -> bool {
    let mut s = Scanner {
        text,
        b: text.as_bytes(),
        i: 0,
        plan,
        max: max_depth,
        caps,
        entered: 0,
    };
    let shape = plan.shape.as_ref().map(|sh| sh.root());
    if s.value(Some(0), shape, 0).is_err() {
        return false;
    }
    s.ws();
    s.i == s.b.len()
}

struct Scanner<'p, 'c, 'de> {
    text: &'de str,
    b: &'de [u8],
    i: usize,
    plan: &'p Plan,
    max: usize,
    caps: &'c mut Captures<'de>,
    /// Trie nodes entered so far (bit per node below 64).
    entered: u64,
}

impl<'p, 'de> Scanner<'p, '_, 'de> {
    #[inline]
    fn ws(&mut self) {
        self.i = ws(self.b, self.i);
    }

    #[inline]
    fn peek(&mut self) -> Scan<u8> {
        self.ws();
        self.b.get(self.i).copied().ok_or(GiveUp)
    }

    fn eat(&mut self, byte: u8) -> Scan<()> {
        if self.peek()? != byte {
            return Err(GiveUp);
        }
        self.i += 1;
        Ok(())
    }

    /// A string without escapes or control characters, after its opening
    /// quote; borrowed from the input.
    fn string(&mut self) -> Scan<&'de str> {
        let start = self.i;
        // The document was checked to be UTF-8: whether the string is
        // ASCII does not matter here.
        let (i, _) = string_end(self.b, start).ok_or(GiveUp)?;
        // Both ends are ASCII quotes, so this slice is on char boundaries.
        let s = self.text.get(start..i).ok_or(GiveUp)?;
        self.i = i + 1;
        Ok(s)
    }

    /// A number, as serde_json would report it to a visitor.
    fn number(&mut self) -> Scan<Seen<'de>> {
        let (seen, end) = number(self.b, self.i).ok_or(GiveUp)?;
        self.i = end;
        Ok(seen)
    }

    /// The value at trie node `node` under schema `shape`, at `depth`.
    fn value(
        &mut self,
        node: Option<usize>,
        shape: Option<&'p ShapeNode>,
        depth: usize,
    ) -> Scan<()> {
        let trie = node.and_then(|n| self.plan.nodes.get(n));
        let seen = match self.peek()? {
            b'{' | b'[' => {
                if depth >= self.max
                    || trie.is_some_and(|t| t.slot.is_some())
                    || shape.is_some_and(|s| {
                        !if self.b[self.i] == b'{' {
                            s.open_object()
                        } else {
                            s.open_array()
                        }
                    })
                {
                    return Err(GiveUp);
                }
                return if self.b[self.i] == b'{' {
                    self.object(node, shape, depth + 1)
                } else {
                    self.array(node, shape, depth + 1)
                };
            }
            first => self.scalar(first)?,
        };
        if shape.is_some_and(|s| !s.scalar(seen)) {
            return Err(GiveUp);
        }
        if let Some(slot) = trie.and_then(|t| t.slot) {
            self.caps.set(slot, captured(seen));
        }
        Ok(())
    }

    /// A string, literal or number starting with `first` (not yet read).
    #[inline]
    fn scalar(&mut self, first: u8) -> Scan<Seen<'de>> {
        Ok(match first {
            b'"' => {
                self.i += 1;
                Seen::Str(self.string()?)
            }
            b't' | b'f' | b'n' => {
                let (v, end) = literal(self.b, self.i, first).ok_or(GiveUp)?;
                self.i = end;
                v
            }
            _ => self.number()?,
        })
    }

    /// Entering a member or element with trie node `node`: a repeated
    /// object key replaces the earlier value, so forget what was captured
    /// under it (as the visitor does).
    fn reset(&mut self, node: Option<usize>) {
        let Some(n) = node else { return };
        // A node entered for the first time has nothing captured below it.
        if let Some(bit) = u32::try_from(n).ok().and_then(|n| 1u64.checked_shl(n)) {
            if self.entered & bit == 0 {
                self.entered |= bit;
                return;
            }
        }
        if let Some(t) = self.plan.nodes.get(n) {
            for &slot in &t.below {
                self.caps.set(slot, Captured::Missing);
            }
        }
    }

    /// An object's members (after `{`), whose own depth is `depth`.
    fn object(
        &mut self,
        node: Option<usize>,
        shape: Option<&'p ShapeNode>,
        depth: usize,
    ) -> Scan<()> {
        self.i += 1;
        let plan = self.plan;
        let trie = node.and_then(|n| plan.nodes.get(n));
        let children: &[_] = trie.map_or(&[], |t| &t.children);
        let all = plan.shape.as_ref();
        // Members are matched against the layout learned here, or read to
        // learn one.
        let learned = trie.map(|t| t.layout.get());
        let layout = learned.flatten().filter(|l| l.fits(shape));
        let mut learning = matches!(learned, Some(None)).then(Learning::default);
        let mut next = 0usize;
        let mut seen = 0u64;
        if self.peek()? == b'}' {
            self.i += 1;
        } else {
            loop {
                let start = self.i;
                let (child, schema) = match layout.and_then(|l| l.member_at(next, self.b, start)) {
                    Some((e, end, k)) => {
                        (self.i, next) = (end, k);
                        (e.child, e.schema)
                    }
                    None => {
                        self.eat(b'"')?;
                        let key = self.string()?;
                        self.eat(b':')?;
                        let child = children.iter().find(|c| same_key(&c.0, key)).map(|c| c.2);
                        let schema = match (shape, all) {
                            (Some(s), Some(all)) => {
                                let m = s.key(key);
                                MemberSchema {
                                    bit: s.bit(m),
                                    sub: all.member_slot(s, m).map_err(|()| GiveUp)?,
                                }
                            }
                            _ => MemberSchema::default(),
                        };
                        if let Some(l) = &mut learning {
                            l.push(&self.b[start..self.i], child, schema);
                        }
                        (child, schema)
                    }
                };
                seen |= schema.bit;
                let sub = schema.sub.and_then(|i| all.and_then(|a| a.get(i)));
                self.reset(child);
                self.value(child, sub, depth)?;
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(GiveUp),
                }
            }
        }
        if shape.is_some_and(|s| !s.complete(seen)) {
            return Err(GiveUp);
        }
        if let (Some(t), Some(l)) = (trie, learning) {
            // Another thread may have learned one first: either will do.
            let _ = t.layout.set(l.finish(shape));
        }
        Ok(())
    }

    /// An array's elements (after `[`), whose own depth is `depth`.
    fn array(
        &mut self,
        node: Option<usize>,
        shape: Option<&'p ShapeNode>,
        depth: usize,
    ) -> Scan<()> {
        self.i += 1;
        let plan = self.plan;
        let trie = node.and_then(|n| plan.nodes.get(n));
        let items = match (shape, plan.shape.as_ref()) {
            (Some(s), Some(all)) => all.items(s),
            _ => None,
        };
        let mut n = 0usize;
        if self.peek()? == b']' {
            self.i += 1;
        } else {
            loop {
                let child = trie
                    .and_then(|t| t.children.iter().find(|c| c.1 == Some(n)))
                    .map(|c| c.2);
                self.reset(child);
                self.value(child, items, depth)?;
                n += 1;
                match self.peek()? {
                    b',' => self.i += 1,
                    b']' => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(GiveUp),
                }
            }
        }
        if shape.is_some_and(|s| !s.items_ok(n as u64)) {
            return Err(GiveUp);
        }
        Ok(())
    }
}

/// Past JSON whitespace (as serde_json reads it) from `i`.
#[inline(always)]
pub(super) fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The literal (`true`, `false` or `null`) that `first`, the byte at
/// `b[i]`, starts, and where it ends; `None` for anything else.
#[inline]
pub(super) fn literal(b: &[u8], i: usize, first: u8) -> Option<(Seen<'static>, usize)> {
    let (word, v): (&[u8], _) = match first {
        b't' => (b"true", Seen::Bool(true)),
        b'f' => (b"false", Seen::Bool(false)),
        b'n' => (b"null", Seen::Null),
        _ => return None,
    };
    let end = i + word.len();
    (b.get(i..end)? == word).then_some((v, end))
}

/// The number token at `b[start..]`, as serde_json would report it to a
/// visitor, and where it ends; `None` to give up.
#[inline(always)]
pub(super) fn number(b: &[u8], start: usize) -> Option<(Seen<'static>, usize)> {
    let negative = b.get(start) == Some(&b'-');
    let digits = start + usize::from(negative);
    // The integer part, accumulated as it is read (used only when it
    // has at most 18 digits, which fit i64 and u64).
    let mut i = digits;
    let mut v: u64 = 0;
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => (i, v) = int_digits_at(b, i),
        _ => return None,
    }
    let int_digits = i - digits;
    match b.get(i) {
        Some(b'.') => {
            if let Some((x, end)) = short_decimal(b, i + 1, v, int_digits) {
                return Some((Seen::F64(if negative { -x } else { x }), end));
            }
        }
        Some(b'e' | b'E') => {}
        _ => {
            // "-0" is a float to serde_json.
            if int_digits > 18 || (negative && b[digits] == b'0') {
                return None;
            }
            let v = if negative {
                Seen::I64(-(v as i64))
            } else {
                Seen::U64(v)
            };
            return Some((v, i));
        }
    }
    // The rest of JSON's number grammar: a fraction of at least one
    // digit, an exponent of at least one digit after its sign. What
    // follows the token is the caller's to check (`1.5.3` gives up there).
    if b[i] == b'.' {
        let end = digits_at(b, i + 1, 0).0;
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        let sign = usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
        let end = digits_at(b, i + 1 + sign, 0).0;
        if end == i + 1 + sign {
            return None;
        }
        i = end;
    }
    // The standard library's parser rounds correctly, as serde_json's
    // does with `float_roundtrip` (crates/core/Cargo.toml), so the value
    // is bit for bit the one the visitor path captures
    // (`numbers_are_what_serde_json_parses`). serde_json refuses a
    // number out of f64's range, which parses here as an infinity.
    let x: f64 = std::str::from_utf8(b.get(start..i)?).ok()?.parse().ok()?;
    if !x.is_finite() {
        return None;
    }
    Some((Seen::F64(x), i))
}

/// A number with a fraction and no exponent of at most 19 digits
/// (`52.123456`, `2.0032100000000004`): `m` is the integer part's value
/// (`int_digits` digits), the fraction starts at `frac`. The value and
/// where the number ends, bit for bit what serde_json's exact parser
/// (`float_roundtrip`, enabled in this build) returns; `None` for any
/// other number. At most 19 digits, so `m` (all of them as one integer)
/// never wrapped.
#[inline(always)]
fn short_decimal(b: &[u8], frac: usize, mut m: u64, int_digits: usize) -> Option<(f64, usize)> {
    const POW10: [f64; 20] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19,
    ];
    let end;
    (end, m) = digits_at(b, frac, m);
    let k = end - frac;
    if k == 0 || int_digits + k > 19 || matches!(b.get(end), Some(b'e' | b'E')) {
        return None;
    }
    if m <= 1 << 53 {
        // `m` and 10^k are exact in an f64, so m / 10^k is one correctly
        // rounded division (Clinger's fast path). As an i64 `m` converts
        // in one instruction.
        return Some((m as i64 as f64 / POW10[k], end));
    }
    Some((decimal::quotient(m, k), end))
}

/// The decimal digits from `i` on, accumulated into `v` (wrapping, as
/// `v * 10 + digit` per digit would): where they end and the value. Eight
/// bytes at a time where eight are there (SWAR, as simdjson parses them),
/// and a last run of four to seven digits too; shorter runs, and digits
/// within the last seven bytes of `b`, one at a time.
#[inline(always)]
fn digits_at(b: &[u8], mut i: usize, mut v: u64) -> (usize, u64) {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const POW10: [u64; 8] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];
    while let Some(word) = word_at(b, i) {
        let x = word.wrapping_sub(ZEROS);
        // A byte is flagged when it was below '0' (its high bit after the
        // subtraction) or above '9' (adding 0x76 reaches 0x80); borrows
        // and carries move up from a flagged byte only, so the lowest flag
        // is the first byte that is not a digit, and the bytes below it
        // are digits, 0-9 in `x`.
        let flags = (x | x.wrapping_add(0x7676_7676_7676_7676)) & 0x8080_8080_8080_8080;
        if flags != 0 {
            let n = (flags.trailing_zeros() / 8) as usize;
            if n < 4 {
                // Fewer instructions one at a time (below).
                break;
            }
            // The n digits to the top bytes, zeros (leading zeros) below.
            v = v
                .wrapping_mul(POW10[n])
                .wrapping_add(eight_digits(x << (64 - 8 * n)));
            return (i + n, v);
        }
        v = v.wrapping_mul(100_000_000).wrapping_add(eight_digits(x));
        i += 8;
    }
    while let Some(&d @ b'0'..=b'9') = b.get(i) {
        v = v.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
        i += 1;
    }
    (i, v)
}

/// [`digits_at`] for an integer part, which is mostly one to three
/// digits (`48.1`, `3.5`): those one at a time before any word is read.
#[inline(always)]
fn int_digits_at(b: &[u8], mut i: usize) -> (usize, u64) {
    let mut v = 0u64;
    for _ in 0..3 {
        match b.get(i) {
            Some(&d @ b'0'..=b'9') => v = v * 10 + u64::from(d - b'0'),
            _ => return (i, v),
        }
        i += 1;
    }
    digits_at(b, i, v)
}

/// The value of eight digits 0-9, one per byte, the lowest byte the most
/// significant: pairs, then fours, then all eight.
#[inline]
fn eight_digits(x: u64) -> u64 {
    let x = (x.wrapping_mul(10) + (x >> 8)) & 0x00ff_00ff_00ff_00ff;
    let x = (x.wrapping_mul(100) + (x >> 16)) & 0x0000_ffff_0000_ffff;
    (x.wrapping_mul(10_000) + (x >> 32)) & 0xffff_ffff
}

/// The eight bytes of `b` from `i` on as a little-endian word, if there
/// are eight.
#[inline]
fn word_at(b: &[u8], i: usize) -> Option<u64> {
    let mut word = [0u8; 8];
    word.copy_from_slice(b.get(i..i + 8)?);
    Some(u64::from_le_bytes(word))
}

/// What the visitor path captures for a scalar it was shown.
pub(super) fn captured(seen: Seen<'_>) -> Captured<'_> {
    match seen {
        Seen::Null => Captured::Null,
        Seen::Bool(b) => Captured::Bool(b),
        Seen::I64(v) => Captured::Number(v.into()),
        Seen::U64(v) => Captured::Number(v.into()),
        Seen::F64(v) => Number::from_f64(v).map_or(Captured::Null, Captured::Number),
        Seen::Str(s) => Captured::Str(s),
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::shape::Seen;
    use proptest::prelude::*;

    /// The scanner's reading of a whole number token followed by `after`
    /// (the rest of a document); `None` when it gives up (or stops
    /// elsewhere than the token's end).
    fn scanned(text: &str, after: &str) -> Option<Seen<'static>> {
        let doc = format!("{text}{after}");
        let (seen, end) = super::number(doc.as_bytes(), 0)?;
        (end == text.len()).then_some(seen)
    }

    /// A token by JSON's number grammar: sign, integer part, fraction,
    /// exponent, each with up to 25 digits (so past f64's 17 and past
    /// its range).
    fn json_number() -> impl Strategy<Value = String> {
        let digits = |n| {
            prop::collection::vec(0u8..10, n)
                .prop_map(|d| d.iter().map(|d| char::from(b'0' + d)).collect::<String>())
        };
        (
            any::<bool>(),
            prop_oneof![
                Just("0".to_string()),
                (1u8..10, digits(0..25)).prop_map(|(d, r)| format!("{d}{r}"))
            ],
            prop::option::of(digits(1..25)),
            prop::option::of((
                prop_oneof![Just(""), Just("+"), Just("-")],
                digits(1..5),
                any::<bool>(),
            )),
        )
            .prop_map(|(neg, int, frac, exp)| {
                let mut t = format!("{}{int}", if neg { "-" } else { "" });
                if let Some(f) = frac {
                    t += &format!(".{f}");
                }
                if let Some((sign, e, upper)) = exp {
                    t += &format!("{}{sign}{e}", if upper { "E" } else { "e" });
                }
                t
            })
    }

    fn short_decimal(text: &str) -> Option<f64> {
        let b = text.as_bytes();
        let negative = b.first() == Some(&b'-');
        let digits = usize::from(negative);
        let int_end = digits
            + b[digits..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
        let m = text[digits..int_end].parse::<u64>().ok()?;
        let (x, at) = super::short_decimal(b, int_end + 1, m, int_end - digits)?;
        (at == b.len()).then_some(if negative { -x } else { x })
    }

    /// Decimals exactly halfway between two f64s (which round to the even
    /// one) and one unit of their last digit on either side, of 17 to 19
    /// digits: `quotient` rounds them as serde_json does.
    #[test]
    fn halfway_decimals_round_as_serde_json_does() {
        let mut texts = Vec::new();
        for mid in [
            "9007199254740993.0",
            "9007199254740995.0",
            "4503599627370497.5",
            "4503599627370496.5",
            "2251799813685248.25",
            "2251799813685248.75",
            "1125899906842624.125",
            "1125899906842624.375",
            "18014398509481986.0",
            "18014398509481990.0",
        ] {
            let digits: String = mid.chars().filter(char::is_ascii_digit).collect();
            let dot = mid.find('.').expect("a fraction");
            let m: u64 = digits.parse().expect("at most 19 digits");
            for m in [m - 1, m, m + 1] {
                let d = format!("{m:0>width$}", width = digits.len());
                texts.push(format!("{}.{}", &d[..dot], &d[dot..]));
            }
        }
        for text in &texts {
            let parsed: f64 = serde_json::from_str(text).expect("a JSON number");
            let x = short_decimal(text).expect("taken");
            assert_eq!(x.to_bits(), parsed.to_bits(), "{text}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20000, ..ProptestConfig::default() })]

        /// Bit for bit what serde_json parses, for every split of up to 20
        /// digits into an integer part and a fraction (taken whenever there
        /// are at most 19), around 2^53 where Clinger's path ends and up to
        /// the largest 19-digit integers.
        #[test]
        fn short_decimals_are_what_serde_json_parses(
            m in prop_oneof![
                0u64..1000,
                0u64..1_000_000_000_000_000,
                (1u64 << 53) - 1000..(1u64 << 53) + 1000,
                0u64..10_000_000_000_000_000_000,
            ],
            k in 1usize..21,
            negative in any::<bool>(),
        ) {
            let digits = format!("{m:0>width$}", width = k + 1);
            let (int, frac) = digits.split_at(digits.len() - k);
            let text = format!("{}{int}.{frac}", if negative { "-" } else { "" });
            let parsed: f64 = serde_json::from_str(&text).expect("a JSON number");
            match short_decimal(&text) {
                Some(x) => prop_assert_eq!(x.to_bits(), parsed.to_bits(), "{}", text),
                None => prop_assert!(int.len() + k > 19, "{} not taken", text),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20000, ..ProptestConfig::default() })]

        /// Every number token the scanner reads is the number serde_json
        /// parses, bit for bit (the visitor path captures that one); it
        /// reads every fraction or exponent serde_json accepts, and tokens
        /// with no fraction or exponent of up to 18 digits (but "-0").
        #[test]
        fn numbers_are_what_serde_json_parses(
            text in prop_oneof![
                json_number(),
                any::<f64>().prop_map(|x| format!("{x}")),
                any::<f64>().prop_map(|x| format!("{x:e}")),
                "[-+.eE0-9]{1,12}",
            ]
        ) {
            let serde: Option<serde_json::Number> = serde_json::from_str(&text).ok();
            // Alone, and inside a document: where 16 bytes can be read at
            // once and where they cannot.
            for after in ["", "}", ",\"event_time_ms\":1764000000000}"] {
            match (scanned(&text, after), &serde) {
                (Some(Seen::F64(x)), Some(n)) => {
                    prop_assert!(n.is_f64(), "{} is not a float to serde_json", text);
                    prop_assert_eq!(n.as_f64().map(f64::to_bits), Some(x.to_bits()), "{}", text);
                }
                (Some(Seen::U64(v)), Some(n)) => prop_assert_eq!(n.as_u64(), Some(v), "{}", text),
                (Some(Seen::I64(v)), Some(n)) => prop_assert_eq!(n.as_i64(), Some(v), "{}", text),
                (Some(other), _) => prop_assert!(false, "{} read as {:?}, serde_json: {:?}", text, other, serde),
                (None, Some(n)) => {
                    let plain_integer = !text.contains(['.', 'e', 'E']);
                    prop_assert!(
                        plain_integer && (text.len() > 18 || text.starts_with("-0")),
                        "gave up on {} (serde_json: {})", text, n
                    );
                }
                (None, None) => {}
            }
            }
        }
    }

    /// Runs of digits of every length up to 40, with every byte after
    /// them, and at the end of the input: the same end and (wrapping)
    /// value as one digit at a time, for `digits_at` and `int_digits_at`.
    #[test]
    fn digits_at_reads_what_one_digit_at_a_time_reads() {
        let naive = |b: &[u8], mut i: usize| {
            let mut v = 7u64;
            while let Some(&d @ b'0'..=b'9') = b.get(i) {
                v = v.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
                i += 1;
            }
            (i, v)
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..40usize {
            for after in 0..=255u8 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mut b = vec![b'-'];
                b.extend((0..n).map(|j| b'0' + ((seed >> (j % 60)) % 10) as u8));
                b.push(after);
                b.extend_from_slice(b"12345678");
                // With bytes after the run, and ending with it or after it.
                for end in [b.len(), n + 2, n + 1] {
                    let b = &b[..end];
                    assert_eq!(super::digits_at(b, 1, 7), naive(b, 1), "{b:?}");
                    let (i, v) = naive(b, 1);
                    // From 0, not 7: 7 * 10^n wraps away for long runs.
                    let from_zero =
                        v.wrapping_sub(7u64.wrapping_mul(10u64.wrapping_pow((i - 1) as u32)));
                    assert_eq!(super::int_digits_at(b, 1), (i, from_zero), "{b:?}");
                }
            }
        }
    }
}
