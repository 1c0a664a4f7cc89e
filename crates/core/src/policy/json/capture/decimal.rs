//! Decimals of 16 to 19 digits past 2^53 as f64, correctly rounded:
//! m / 10^k by a product with 10^-k where that decides, else by an exact
//! division (the JSON readers' `short_decimal`, past Clinger's path).

/// m / 10^k correctly rounded, for m > 0 and 1 <= k <= 19: bit for bit
/// what serde_json (`float_roundtrip`) parses.
#[inline(always)]
pub(super) fn quotient(m: u64, k: usize) -> f64 {
    product(m, k).unwrap_or_else(|| exact(m, k))
}

/// 10^-k for k in 1..=19 as `(t, s)`: t = floor(2^s / 10^k), with s such
/// that 2^127 <= t < 2^128 (long division, bit by bit, at compile time).
const RECIPROCALS: [(u128, u32); 20] = {
    let mut table = [(0, 0); 20];
    let mut k = 1;
    while k < 20 {
        let d = 10u128.pow(k as u32);
        let s = 127 + (128 - d.leading_zeros());
        let (mut q, mut r, mut bit) = (0u128, 0u128, s + 1);
        while bit > 0 {
            bit -= 1;
            r = (r << 1) | (bit == s) as u128;
            q <<= 1;
            if r >= d {
                r -= d;
                q |= 1;
            }
        }
        table[k] = (q, s);
        k += 1;
    }
    table
};

/// [`exact`] by a product instead of a division (Eisel and Lemire's
/// idea): m (at the top of a u64) times 10^-k truncated to 128 bits gives
/// the quotient's top 128 bits `r` less e, 0 < e < 2 units of the lowest
/// (10^-k is never exactly `t`, and the product's low 64 bits are
/// dropped). So something is always below the top 64 bits, and those are
/// exact unless the low 64 bits are all ones (a carry may be missing):
/// `None` then (a decimal exactly halfway between two floats is always
/// such a case), and [`exact`] decides.
#[inline]
fn product(m: u64, k: usize) -> Option<f64> {
    let &(t, s) = RECIPROCALS.get(k).filter(|_| k > 0 && m != 0)?;
    let lz = m.leading_zeros();
    let m = u128::from(m << lz);
    // The top 128 bits of the 192-bit m · t (no overflow: < 2^128 - 2^64).
    let r = m * (t >> 64) + ((m * (t & u128::from(u64::MAX))) >> 64);
    let (top, low) = ((r >> 64) as u64, r as u64);
    if low == u64::MAX {
        return None;
    }
    // m / 10^k = (r + e) · 2^(64 - lz - s); top >= 2^62, so its lowest bit,
    // set for what is below it, is below the rounding position. The
    // exponent is within [-126, -3] for any m, k here.
    let scale = f64::from_bits(((1023 + 128 - lz - s) as u64) << 52);
    Some((top | 1) as f64 * scale)
}

/// m / 10^k, correctly rounded, for any `m` and k <= 19 (the 16- to
/// 19-digit numbers Clinger's path cannot take, such as many shortest
/// forms of 17 digits). m / 10^k = (m / 5^k) * 2^-k: `m` shifted to the
/// top of a u128 divided by 5^k (< 2^45) leaves a quotient of more than
/// 82 bits; its conversion to f64 rounds to nearest even, with a lowest
/// bit set when the division left a remainder (so that a quotient just
/// above a halfway point is not taken for one: the bit is far below the
/// 53 kept). Scaling by a power of two is then exact (no result here is
/// near f64's limits).
#[inline(never)]
fn exact(m: u64, k: usize) -> f64 {
    debug_assert!(m != 0 && k <= 19);
    let shift = m.leading_zeros() + 64;
    let n = u128::from(m) << shift;
    let d = 5u128.pow(k as u32);
    let q = (n / d) | u128::from(!n.is_multiple_of(d));
    // 2^-(shift + k), built from its exponent: shift + k <= 146.
    let scale = f64::from_bits((1023 - u64::from(shift) - k as u64) << 52);
    q as f64 * scale
}

#[cfg(test)]
mod tests {
    use super::{exact, product};

    /// The product gives what the exact quotient gives, or steps aside
    /// (rarely), for m past 2^53 (where it is used) and below it, every k.
    #[test]
    fn product_is_the_quotient_or_steps_aside() {
        let (mut x, mut aside, mut n) = (0x9e37_79b9_7f4a_7c15u64, 0, 0);
        for i in 0..400_000u64 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let m = match i % 4 {
                0 => (1 << 53) + (x >> 11),
                1 => x % 10_000_000_000_000_000_000 + 1,
                2 => (x >> (x % 64)).max(1),
                _ => 20_032_100_000_000_004 + (x % 1000),
            };
            let k = 1 + (i as usize / 4) % 19;
            let past = m > 1 << 53 && !m.is_multiple_of(5);
            n += u64::from(past);
            match product(m, k) {
                Some(p) => assert_eq!(p.to_bits(), exact(m, k).to_bits(), "{m} / 10^{k}"),
                None => aside += u64::from(past),
            }
        }
        // Past 2^53 and not a multiple of 5 (whose quotient may be exact,
        // low bits 0): the product almost always decides.
        assert!(aside * 1000 < n, "{aside} of {n} stepped aside");
        assert_eq!(product(0, 3), None);
        assert_eq!(product(5, 0), None);
    }
}
