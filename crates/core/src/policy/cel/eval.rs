//! Judging one record with a [`Program`]: each node run at most once,
//! values borrowed from the record and the program, nothing allocated.
//! `&&` and `||` are CEL's commutative ones: a `false` (`true`) operand
//! decides, whatever error the other one raised; a runtime error anywhere
//! else is the answer, explained only when asked ([`Program::explain`]).

use memchr::memmem;

use super::compile::{Arg, Ix, Op, Program};
use super::value::{arith, convert, equal, order, size, Type, Val};
use super::{EvalError, Fault, Slots};

type Out<'a> = Result<Val<'a>, EvalError>;

fn fault(node: Ix, fault: Fault) -> EvalError {
    EvalError { node, fault }
}

impl Program {
    /// Whether the condition holds for the record `slots` reads.
    #[inline]
    pub(crate) fn eval<S: Slots + ?Sized>(&self, slots: &S) -> Result<bool, EvalError> {
        self.truth(self.nodes.len().saturating_sub(1) as Ix, slots)
    }

    /// An operand's value: a field or a literal read in place, inlined
    /// into its operator, or a node evaluated.
    #[inline(always)]
    fn operand<'a, S: Slots + ?Sized>(&'a self, arg: &'a Arg, s: &'a S) -> Out<'a> {
        match arg {
            Arg::Slot(slot, node) => match s.get(*slot) {
                Some(v) => Ok(v),
                None => Err(fault(*node, Fault::NoSuchField)),
            },
            Arg::Int(x) => Ok(Val::Int(*x)),
            Arg::Double(x) => Ok(Val::Double(*x)),
            Arg::Str(b) => Ok(Val::Str(b)),
            Arg::Node(i) => self.value(*i, s),
        }
    }

    /// A node whose value must be a bool (a condition, an operand of
    /// `&&`, `||`, `!`, `?:`): answered as one, in registers, without
    /// making a [`Val`] of it. Comparisons and `&&`/`||` here; the rest
    /// out of line, so that this frame stays small (its register saves
    /// were a fifth of a two-field comparison).
    fn truth<S: Slots + ?Sized>(&self, i: Ix, s: &S) -> Result<bool, EvalError> {
        let Some(node) = self.nodes.get(i as usize) else {
            return Err(fault(i, Fault::NoSuchField));
        };
        match &node.op {
            Op::Order(a, b, holds) => {
                let (x, y) = (self.operand(a, s)?, self.operand(b, s)?);
                // Same-type numbers without the general dispatch.
                let ord = match (x, y) {
                    (Val::Int(p), Val::Int(q)) => Some(p.cmp(&q)),
                    (Val::Double(p), Val::Double(q)) => p.partial_cmp(&q),
                    _ => order(x, y).map_err(|f| fault(i, f))?,
                };
                Ok(ord.is_some_and(|o| holds[(o as i8 + 1) as usize]))
            }
            Op::Eq(a, b) => Ok(equal(self.operand(a, s)?, self.operand(b, s)?)),
            Op::Ne(a, b) => Ok(!equal(self.operand(a, s)?, self.operand(b, s)?)),
            Op::All(items) => self.logic(items, false, s),
            Op::Any(items) => self.logic(items, true, s),
            op => self.truth_of(i, op, s),
        }
    }

    /// [`Self::truth`] of the other nodes.
    #[inline(never)]
    fn truth_of<S: Slots + ?Sized>(&self, i: Ix, op: &Op, s: &S) -> Result<bool, EvalError> {
        match op {
            Op::Not(x) => Ok(!self.truth(*x, s)?),
            Op::Has(slot) => Ok(s.get(*slot).is_some()),
            Op::Bool(b) => Ok(*b),
            Op::Cond(c, y, n) => self.truth(if self.truth(*c, s)? { *y } else { *n }, s),
            Op::InList(..)
            | Op::In(..)
            | Op::StartsWith(..)
            | Op::EndsWith(..)
            | Op::Contains(..)
            | Op::Matches(..) => self.test(i, op, s),
            _ => match self.value(i, s)? {
                Val::Bool(b) => Ok(b),
                other => Err(fault(i, Fault::NotBool(other.type_of()))),
            },
        }
    }

    /// A node's value, of any type.
    fn value<'a, S: Slots + ?Sized>(&'a self, i: Ix, s: &'a S) -> Out<'a> {
        let Some(node) = self.nodes.get(i as usize) else {
            return Err(fault(i, Fault::NoSuchField));
        };
        let err = |f| fault(i, f);
        Ok(match &node.op {
            Op::Field(slot) => return s.get(*slot).ok_or(err(Fault::NoSuchField)),
            Op::Null => Val::Null,
            Op::Int(x) => Val::Int(*x),
            Op::Uint(x) => Val::Uint(*x),
            Op::Double(x) => Val::Double(*x),
            Op::Str(b) => Val::Str(b),
            Op::Bytes(b) => Val::Bytes(b),
            Op::Cond(c, y, n) => return self.value(if self.truth(*c, s)? { *y } else { *n }, s),
            Op::Arith(op, a, b) => {
                arith(*op, self.operand(a, s)?, self.operand(b, s)?).map_err(err)?
            }
            Op::Neg(x) => match self.operand(x, s)? {
                Val::Int(v) => Val::Int(v.checked_neg().ok_or(err(Fault::Overflow))?),
                Val::Double(v) => Val::Double(-v),
                other => return Err(err(Fault::NoOverloadFor(other.type_of()))),
            },
            Op::Size(x) => size(self.operand(x, s)?).map_err(err)?,
            Op::Convert(to, x) => convert(*to, self.operand(x, s)?).map_err(err)?,
            _ => Val::Bool(self.truth(i, s)?),
        })
    }

    /// Inclusion and the string tests, out of the hot match.
    #[inline(never)]
    fn test<S: Slots + ?Sized>(&self, i: Ix, op: &Op, s: &S) -> Result<bool, EvalError> {
        let err = |f| fault(i, f);
        let text = |x| self.string(x, i, s);
        Ok(match op {
            Op::InList(x, items) => {
                let x = self.operand(x, s)?;
                let mut found = false;
                for item in items.iter() {
                    found = found || equal(x, self.operand(item, s)?);
                }
                found
            }
            Op::In(x, c) => {
                let x = self.operand(x, s)?;
                match self.operand(c, s)? {
                    Val::List(l) => l.iter().any(|e| equal(x, Val::of_json(e))),
                    Val::Map(m) => match x {
                        Val::Str(k) => std::str::from_utf8(k).is_ok_and(|k| m.contains_key(k)),
                        _ => false,
                    },
                    other => return Err(err(Fault::NoOverloadFor(other.type_of()))),
                }
            }
            Op::StartsWith(a, b) => text(a)?.starts_with(text(b)?),
            Op::EndsWith(a, b) => text(a)?.ends_with(text(b)?),
            Op::Contains(a, b) => memmem::find(text(a)?, text(b)?).is_some(),
            Op::Matches(a, re) => re.is_match(text(a)?),
            _ => return Err(err(Fault::NoSuchField)),
        })
    }

    /// A string operand's bytes.
    fn string<'a, S: Slots + ?Sized>(
        &'a self,
        x: &'a Arg,
        i: Ix,
        s: &'a S,
    ) -> Result<&'a [u8], EvalError> {
        match self.operand(x, s)? {
            Val::Str(t) => Ok(t),
            other => Err(fault(i, Fault::NoOverloadFor(other.type_of()))),
        }
    }

    /// `a && b && ...` (`decides` false) or `a || b || ...` (`decides`
    /// true): an operand equal to `decides` is the answer even if another
    /// is an error (CEL's commutative operators); otherwise every operand
    /// must be a bool, and the first error is the answer.
    #[inline]
    fn logic<S: Slots + ?Sized>(
        &self,
        items: &[Ix],
        decides: bool,
        s: &S,
    ) -> Result<bool, EvalError> {
        let mut first = None;
        for i in items {
            match self.truth(*i, s) {
                Ok(x) if x == decides => return Ok(decides),
                Ok(_) => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(!decides), Err)
    }

    /// `Some((a, b, holds))` when the whole condition orders two fields
    /// (`message.x > message.y`): the shape a `cel` rule judges without
    /// this evaluator when both are numbers ([`super::CelRule::holds`]).
    pub(crate) fn two_fields(&self) -> Option<(u32, u32, [bool; 3])> {
        match &self.nodes.last()?.op {
            Op::Order(Arg::Slot(a, _), Arg::Slot(b, _), holds) => Some((*a, *b, *holds)),
            _ => None,
        }
    }

    /// Each slot the expression reads a field from, and the path as
    /// written (`message.a`), in order of first use.
    pub(crate) fn paths(&self) -> &[(u32, Box<str>)] {
        &self.paths
    }

    /// The expression as written.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// `e` as a reason a person can act on: where in the expression, and
    /// what (`column 9: no such field message.x`).
    pub(crate) fn explain(&self, e: &EvalError) -> String {
        let node = self.nodes.get(e.node as usize);
        let at = node.map_or(0, |n| n.at as usize);
        let column = self.text.get(..at).map_or(at, |t| t.chars().count()) + 1;
        let op = node.map_or("?", |n| op_name(&n.op));
        let what = match e.fault {
            Fault::NoSuchField => {
                let slot = match node.map(|n| &n.op) {
                    Some(Op::Field(slot)) => Some(*slot),
                    _ => None,
                };
                let path = self.paths.iter().find(|(s, _)| Some(*s) == slot);
                format!("no such field {}", path.map_or("?", |(_, p)| p))
            }
            Fault::NoOverload(a, b) => {
                format!("no overload of `{op}` for {} and {}", a.name(), b.name())
            }
            Fault::NoOverloadFor(t) => format!("no overload of `{op}` for {}", t.name()),
            Fault::Overflow => format!("`{op}`: integer overflow or out of range"),
            Fault::DivideByZero => "division by zero".into(),
            Fault::ModulusByZero => "modulus by zero".into(),
            Fault::BadConversion(t) => format!("`{}()`: not a {} in text", t.name(), t.name()),
            Fault::NoConversion(to, from) => {
                format!("no conversion from {} to {}", from.name(), to.name())
            }
            Fault::NotBool(t) => format!("expected a bool, found {}", t.name()),
        };
        format!("column {column}: {what}")
    }
}

/// How an operator is written, for reasons.
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Not(_) => "!",
        Op::Neg(_) => "-",
        Op::All(..) => "&&",
        Op::Any(..) => "||",
        Op::Cond(..) => "?:",
        Op::Eq(..) => "==",
        Op::Ne(..) => "!=",
        Op::Order(_, _, [true, false, false]) => "<",
        Op::Order(_, _, [true, true, false]) => "<=",
        Op::Order(_, _, [false, false, true]) => ">",
        Op::Order(..) => ">=",
        Op::Arith(a, ..) => a.symbol(),
        Op::InList(..) | Op::In(..) => "in",
        Op::Size(_) => "size",
        Op::StartsWith(..) => "startsWith",
        Op::EndsWith(..) => "endsWith",
        Op::Contains(..) => "contains",
        Op::Matches(..) => "matches",
        Op::Convert(Type::Int, _) => "int",
        Op::Convert(Type::Uint, _) => "uint",
        Op::Convert(..) => "double",
        _ => "value",
    }
}
