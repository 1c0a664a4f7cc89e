//! What the flat reader checks of one member's value, decided once per
//! schema node at load (issue 30): an ASCII string by its length, a
//! number by a closed interval. Anything these cannot decide is asked of
//! the node itself ([`ShapeNode::scalar`], [`ShapeNode::ascii_string`]),
//! so each check answers exactly what the node would.

use super::{Seen, ShapeNode, ANY, EQ, EXACT, FLOAT, GT, INT, LT, STR};

/// What [`ShapeNode::ascii_string`] checks of a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum AsciiCheck {
    /// Any string.
    Any,
    /// No string.
    Never,
    /// A string of this many bytes (each one code point), inclusive.
    Len(u64, u64),
    /// Allowed values too: ask the node.
    Node,
}

impl AsciiCheck {
    /// [`ShapeNode::ascii_string`] of `node` (the node this was decided
    /// for; `None`: no schema) on the ASCII bytes `s`.
    #[inline(always)]
    pub(crate) fn holds(self, node: Option<&ShapeNode>, s: &[u8]) -> bool {
        match self {
            AsciiCheck::Any => true,
            AsciiCheck::Never => false,
            AsciiCheck::Len(lo, hi) => (lo..=hi).contains(&(s.len() as u64)),
            AsciiCheck::Node => node.is_none_or(|n| n.ascii_string(s)),
        }
    }
}

/// What [`ShapeNode::scalar`] checks of a scalar (named for what it adds:
/// numbers): its type, then (when the node has bounds) `lo <= x <= hi`
/// for a number, when every bound is
/// inclusive (`minimum`, `maximum`) and a float compares with it exactly.
/// `exact` is false otherwise (an exclusive bound, one past 2^53, an
/// `enum`): the node is asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NumberCheck {
    types: u8,
    /// No lengths, bounds or allowed values: the type decides.
    plain: bool,
    lo: f64,
    hi: f64,
    exact: bool,
}

impl NumberCheck {
    /// [`ShapeNode::scalar`] of `node` (the node this was decided for;
    /// `None`: no schema) on `v`: the type and numbers of at most 2^53
    /// here, anything else (a literal or string against a node that is
    /// not plain, larger integers) by the node.
    #[inline(always)]
    pub(crate) fn holds(self, node: Option<&ShapeNode>, v: Seen<'_>) -> bool {
        if self.types & v.kind() == 0 {
            return false;
        }
        if self.plain {
            return true;
        }
        let x = match v {
            Seen::F64(x) if self.exact => x,
            Seen::I64(i) if self.exact && i.unsigned_abs() <= EXACT as u64 => i as f64,
            Seen::U64(u) if self.exact && u <= EXACT as u64 => u as f64,
            _ => return node.is_none_or(|n| n.scalar(v)),
        };
        // Exact: `x` is the number itself, the bounds compare exactly, and
        // `x` is never NaN (the readers refuse what is not finite).
        self.lo <= x && x <= self.hi
    }
}

impl ShapeNode {
    /// [`Self::ascii_string`] reduced to what it checks: nothing, a length
    /// range, or the whole node.
    pub(crate) fn ascii_check(&self) -> AsciiCheck {
        if self.types & STR == 0 {
            AsciiCheck::Never
        } else if self.plain {
            AsciiCheck::Any
        } else if self.allowed.is_empty() {
            AsciiCheck::Len(self.min_len.unwrap_or(0), self.max_len.unwrap_or(u64::MAX))
        } else {
            AsciiCheck::Node
        }
    }

    /// Whether the node allows strings and nothing else.
    pub(crate) fn only_strings(&self) -> bool {
        self.types == STR
    }

    /// Whether the node allows numbers (integers, floats or both) and
    /// nothing else.
    pub(crate) fn only_numbers(&self) -> bool {
        self.types != 0 && self.types & !(INT | FLOAT) == 0
    }

    /// [`Self::scalar`] of a number reduced to its kinds and a closed
    /// interval, when the node's bounds allow it.
    pub(crate) fn number_check(&self) -> NumberCheck {
        // `enum` and `const` hold strings, booleans and null only: with
        // one, no number passes, which the node answers.
        let mut check = NumberCheck {
            types: self.types,
            plain: self.plain,
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
            exact: self.allowed.is_empty(),
        };
        for (ok, limit) in &self.bounds {
            match (*ok, limit.exact_float) {
                (o, Some(e)) if o == GT | EQ => check.lo = check.lo.max(e),
                (o, Some(e)) if o == LT | EQ => check.hi = check.hi.min(e),
                _ => check.exact = false,
            }
        }
        check
    }
}

/// The check with no schema: any scalar.
impl Default for NumberCheck {
    fn default() -> Self {
        NumberCheck {
            types: ANY,
            plain: true,
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
            exact: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::NumberCheck;
    use crate::policy::shape::{Seen, Shape};

    /// The number check answers what the node does, for bounds of every
    /// kind (inclusive, exclusive, past 2^53, fractional) and numbers on
    /// and beside each bound, as floats and as integers.
    #[test]
    fn number_checks_answer_what_the_node_does() {
        const P53: u64 = 1 << 53;
        let schemas = [
            json!({}),
            json!({"type": "number"}),
            json!({"type": "integer"}),
            json!({"type": ["integer", "null"], "minimum": 3}),
            json!({"minimum": 0}),
            json!({"maximum": 1.5}),
            json!({"minimum": -2, "maximum": 2}),
            json!({"minimum": 2, "maximum": -2}),
            json!({"exclusiveMinimum": 0}),
            json!({"exclusiveMaximum": 0.1, "minimum": -1}),
            json!({"minimum": 0.1}),
            json!({"minimum": P53 + 1}),
            json!({"maximum": P53}),
            json!({"minimum": -(P53 as i64) - 1}),
            json!({"maximum": u64::MAX}),
            json!({"enum": ["a"]}),
            json!({"const": null}),
            json!({"type": "string"}),
        ];
        let mut values: Vec<Seen> = [
            0.0,
            -0.0,
            0.1,
            0.1000000000000001,
            1.5,
            1.5000000000000002,
            2.0,
            -2.0,
            3.0,
            1e300,
            -1e300,
            P53 as f64,
            (P53 + 2) as f64,
        ]
        .into_iter()
        .map(Seen::F64)
        .collect();
        values.extend(
            [
                -3,
                0,
                1,
                2,
                3,
                -2,
                i64::MIN,
                i64::MAX,
                -(P53 as i64),
                -(P53 as i64) - 1,
            ]
            .map(Seen::I64),
        );
        values.extend([0, 3, P53, P53 + 1, u64::MAX].map(Seen::U64));
        values.extend([Seen::Null, Seen::Bool(true), Seen::Str("é")]);
        let (mut passed, mut failed) = (0, 0);
        for schema in &schemas {
            let shape = Shape::compile(schema).expect("in the subset");
            let node = shape.root();
            let check = node.number_check();
            for v in &values {
                let want = node.scalar(*v);
                assert_eq!(check.holds(Some(node), *v), want, "{schema} {v:?}");
                (passed, failed) = if want {
                    (passed + 1, failed)
                } else {
                    (passed, failed + 1)
                };
            }
        }
        assert!(
            passed > 100 && failed > 100,
            "{passed} passed, {failed} failed"
        );
        // No schema: every scalar passes.
        assert!(values
            .iter()
            .all(|v| NumberCheck::default().holds(None, *v)));
    }
}
