//! Judging one record with a [`Program`]: each node run at most once,
//! values borrowed from the record and the program, nothing allocated.
//! `&&` and `||` are CEL's commutative ones: a `false` (`true`) operand
//! decides, whatever error the other one raised; a runtime error anywhere
//! else is the answer, explained only when asked ([`Program::explain`]).

use memchr::memmem;

use super::compile::{Ix, Op, Program};
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
        let root = self.nodes.len().saturating_sub(1) as Ix;
        match self.value(root, slots)? {
            Val::Bool(b) => Ok(b),
            other => Err(fault(root, Fault::NotBool(other.type_of()))),
        }
    }

    fn value<'a, S: Slots + ?Sized>(&'a self, i: Ix, s: &'a S) -> Out<'a> {
        let Some(node) = self.nodes.get(i as usize) else {
            return Err(fault(i, Fault::NoSuchField));
        };
        let err = |f| fault(i, f);
        Ok(match &node.op {
            Op::Field(slot) => return s.get(*slot).ok_or(err(Fault::NoSuchField)),
            Op::Has(slot) => Val::Bool(s.get(*slot).is_some()),
            Op::Null => Val::Null,
            Op::Bool(b) => Val::Bool(*b),
            Op::Int(x) => Val::Int(*x),
            Op::Uint(x) => Val::Uint(*x),
            Op::Double(x) => Val::Double(*x),
            Op::Str(b) => Val::Str(b),
            Op::Bytes(b) => Val::Bytes(b),
            Op::And(a, b) => return self.logic(*a, *b, false, s),
            Op::Or(a, b) => return self.logic(*a, *b, true, s),
            Op::Not(x) => Val::Bool(!self.boolean(*x, s)?),
            Op::Cond(c, y, n) => return self.value(if self.boolean(*c, s)? { *y } else { *n }, s),
            Op::Eq(a, b) => Val::Bool(equal(self.value(*a, s)?, self.value(*b, s)?)),
            Op::Ne(a, b) => Val::Bool(!equal(self.value(*a, s)?, self.value(*b, s)?)),
            Op::Order(a, b, holds) => {
                let ord = order(self.value(*a, s)?, self.value(*b, s)?).map_err(err)?;
                Val::Bool(ord.is_some_and(|o| holds[(o as i8 + 1) as usize]))
            }
            Op::Arith(op, a, b) => {
                arith(*op, self.value(*a, s)?, self.value(*b, s)?).map_err(err)?
            }
            Op::Neg(x) => match self.value(*x, s)? {
                Val::Int(v) => Val::Int(v.checked_neg().ok_or(err(Fault::Overflow))?),
                Val::Double(v) => Val::Double(-v),
                other => return Err(err(Fault::NoOverloadFor(other.type_of()))),
            },
            Op::Size(x) => size(self.value(*x, s)?).map_err(err)?,
            Op::Convert(to, x) => convert(*to, self.value(*x, s)?).map_err(err)?,
            _ => return self.rare(i, &node.op, s),
        })
    }

    /// The operators no two-field comparison uses, out of the hot match.
    #[inline(never)]
    fn rare<'a, S: Slots + ?Sized>(&'a self, i: Ix, op: &'a Op, s: &'a S) -> Out<'a> {
        let err = |f| fault(i, f);
        let text = |x: Ix| match self.value(x, s)? {
            Val::Str(t) => Ok(t),
            other => Err(err(Fault::NoOverloadFor(other.type_of()))),
        };
        Ok(Val::Bool(match op {
            Op::InList(x, items) => {
                let x = self.value(*x, s)?;
                let mut found = false;
                for item in items.iter() {
                    found = found || equal(x, self.value(*item, s)?);
                }
                found
            }
            Op::In(x, c) => {
                let x = self.value(*x, s)?;
                match self.value(*c, s)? {
                    Val::List(l) => l.iter().any(|e| equal(x, Val::of_json(e))),
                    Val::Map(m) => match x {
                        Val::Str(k) => std::str::from_utf8(k).is_ok_and(|k| m.contains_key(k)),
                        _ => false,
                    },
                    other => return Err(err(Fault::NoOverloadFor(other.type_of()))),
                }
            }
            Op::StartsWith(a, b) => text(*a)?.starts_with(text(*b)?),
            Op::EndsWith(a, b) => text(*a)?.ends_with(text(*b)?),
            Op::Contains(a, b) => memmem::find(text(*a)?, text(*b)?).is_some(),
            Op::Matches(a, re) => re.is_match(text(*a)?),
            _ => return Err(err(Fault::NoSuchField)),
        }))
    }

    /// A bool operand, or the error it is.
    #[inline]
    fn boolean<S: Slots + ?Sized>(&self, x: Ix, s: &S) -> Result<bool, EvalError> {
        match self.value(x, s)? {
            Val::Bool(b) => Ok(b),
            other => Err(fault(x, Fault::NoOverloadFor(other.type_of()))),
        }
    }

    /// `a && b` (`decides` false) or `a || b` (`decides` true): an operand
    /// equal to `decides` is the answer even if the other is an error;
    /// otherwise both must be bools, and the first error is the answer.
    fn logic<'a, S: Slots + ?Sized>(&'a self, a: Ix, b: Ix, decides: bool, s: &'a S) -> Out<'a> {
        match self.boolean(a, s) {
            Ok(x) if x == decides => Ok(Val::Bool(decides)),
            Ok(_) => self.boolean(b, s).map(Val::Bool),
            Err(e) => match self.boolean(b, s) {
                Ok(y) if y == decides => Ok(Val::Bool(decides)),
                _ => Err(e),
            },
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
            Fault::NotBool(t) => format!("the condition is {}, not bool", t.name()),
        };
        format!("column {column}: {what}")
    }
}

/// How an operator is written, for reasons.
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Not(_) => "!",
        Op::Neg(_) => "-",
        Op::And(..) => "&&",
        Op::Or(..) => "||",
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
