//! A parsed expression made a [`Program`]: paths resolved to slots by
//! the policy's [`Resolver`], operator overloads checked where types are
//! known (a string field compared with a number is a load error, not a
//! poison record per record), literal patterns compiled, and every
//! construct antidote does not run refused with the place it is written.

use regex::bytes::Regex;

use super::parse::{parse, Expr, Kind};
use super::value::{Arith, Type};
use super::{CompileError, Resolver, Step, MAX_LEN};

/// Index of a node in [`Program::nodes`].
pub(super) type Ix = u32;

/// A compiled condition. Nodes are stored children first; the last one
/// is the root.
#[derive(Debug)]
pub(crate) struct Program {
    pub(super) text: Box<str>,
    pub(super) nodes: Box<[Node]>,
    /// The path each slot was resolved from, as written, for reasons.
    pub(super) paths: Box<[(u32, Box<str>)]>,
}

#[derive(Debug)]
pub(super) struct Node {
    /// Byte offset of the node's token in the expression.
    pub(super) at: u32,
    pub(super) op: Op,
}

#[derive(Debug)]
pub(super) enum Op {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(Box<[u8]>),
    Bytes(Box<[u8]>),
    /// The value at a slot; a missing one is `no_such_field`.
    Field(u32),
    /// `has(path)`: whether the slot has a value.
    Has(u32),
    Not(Ix),
    Neg(Arg),
    /// `a && b && ...`: a chain of `&&` as one node (each operand a
    /// frame less than nesting them).
    All(Box<[Ix]>),
    /// `a || b || ...`
    Any(Box<[Ix]>),
    Cond(Ix, Ix, Ix),
    Eq(Arg, Arg),
    Ne(Arg, Arg),
    /// `<`, `<=`, `>`, `>=` as the orderings that make it true.
    Order(Arg, Arg, [bool; 3]),
    Arith(Arith, Arg, Arg),
    /// `x in [a, b, ...]`
    InList(Arg, Box<[Arg]>),
    /// `x in e`: an element of a list, a key of a map.
    In(Arg, Arg),
    Size(Arg),
    StartsWith(Arg, Arg),
    EndsWith(Arg, Arg),
    Contains(Arg, Arg),
    Matches(Arg, Box<Regex>),
    Convert(Type, Arg),
}

/// An operator's operand: a field or a literal held in place (read
/// without visiting a node: a two-field comparison is one node), or
/// another node.
#[derive(Debug)]
pub(super) enum Arg {
    /// A slot, and the node that reads it (for errors).
    Slot(u32, Ix),
    Int(i64),
    Double(f64),
    Str(Box<[u8]>),
    Node(Ix),
}

/// Compile `text` against `resolver`'s names.
pub(crate) fn compile(text: &str, resolver: &mut dyn Resolver) -> Result<Program, CompileError> {
    if text.len() > MAX_LEN {
        return Err(CompileError::new(
            text,
            MAX_LEN,
            format!("the expression is over {MAX_LEN} bytes; split it into several rules"),
        ));
    }
    let expr = parse(text)?;
    let mut c = Compiler {
        text,
        resolver,
        nodes: Vec::new(),
        paths: Vec::new(),
    };
    let (_, t) = c.expr(&expr)?;
    if !matches!(t, Type::Bool | Type::Dyn) {
        return Err(c.error(expr.at, format!("the condition is {}, not bool", t.name())));
    }
    Ok(Program {
        text: text.into(),
        nodes: c.nodes.into_boxed_slice(),
        paths: c.paths.into_boxed_slice(),
    })
}

pub(super) struct Compiler<'t, 'r> {
    text: &'t str,
    resolver: &'r mut dyn Resolver,
    nodes: Vec<Node>,
    paths: Vec<(u32, Box<str>)>,
}

impl Compiler<'_, '_> {
    pub(super) fn error(&self, at: usize, message: impl Into<String>) -> CompileError {
        CompileError::new(self.text, at, message)
    }

    /// Node `i` as an operand: in place when it is a field or a literal.
    pub(super) fn arg(&self, i: Ix) -> Arg {
        match self.nodes.get(i as usize).map(|n| &n.op) {
            Some(Op::Field(slot)) => Arg::Slot(*slot, i),
            Some(Op::Int(x)) => Arg::Int(*x),
            Some(Op::Double(x)) => Arg::Double(*x),
            Some(Op::Str(b)) => Arg::Str(b.clone()),
            _ => Arg::Node(i),
        }
    }

    pub(super) fn push(&mut self, at: usize, op: Op) -> Ix {
        self.nodes.push(Node { at: at as u32, op });
        (self.nodes.len() - 1) as Ix
    }

    /// Compile `e`: its root node and its type (`Dyn` when unknown).
    pub(super) fn expr(&mut self, e: &Expr) -> Result<(Ix, Type), CompileError> {
        let lit = |op, t| Ok::<_, CompileError>((op, t));
        let (op, t) = match &e.kind {
            Kind::Null => lit(Op::Null, Type::Null)?,
            Kind::Bool(b) => lit(Op::Bool(*b), Type::Bool)?,
            Kind::Int(i) => lit(Op::Int(*i), Type::Int)?,
            Kind::Uint(u) => lit(Op::Uint(*u), Type::Uint)?,
            Kind::Double(x) => lit(Op::Double(*x), Type::Double)?,
            Kind::Str(s) => lit(Op::Str(s.as_bytes().into()), Type::String)?,
            Kind::Bytes(b) => lit(Op::Bytes(b.as_slice().into()), Type::Bytes)?,
            Kind::Ident(_) | Kind::Select(..) | Kind::Index(..) => {
                let (slot, t) = self.field(e)?;
                return Ok((self.push(start(e), Op::Field(slot)), t));
            }
            Kind::Unary(op, x) => return self.unary(e.at, op, x),
            Kind::Binary(op, l, r) => return self.binary(e.at, op, l, r),
            Kind::Cond(c, y, n) => {
                let c = self.boolean(c)?;
                let (y, ty) = self.expr(y)?;
                let (n, tn) = self.expr(n)?;
                let t = if ty == tn { ty } else { Type::Dyn };
                (Op::Cond(c, y, n), t)
            }
            Kind::List(_) => {
                return Err(self.error(e.at, "a list literal is supported only after `in`"))
            }
            Kind::Call { target, name, args } => {
                return self.call(e.at, target.as_deref(), name, args)
            }
        };
        Ok((self.push(e.at, op), t))
    }

    /// A path's slot and type.
    pub(super) fn field(&mut self, e: &Expr) -> Result<(u32, Type), CompileError> {
        let (variable, steps) = self.path(e)?;
        let (slot, t) = self
            .resolver
            .resolve(variable, &steps)
            .map_err(|m| self.error(start(e), m))?;
        if !self.paths.iter().any(|(s, _)| *s == slot) {
            self.paths.push((slot, render(variable, &steps).into()));
        }
        Ok((slot, t))
    }

    /// `message.a["b"][0]` as its variable and steps; any other operand of
    /// a selection is refused (selection is of paths only).
    fn path<'e>(&self, e: &'e Expr) -> Result<(&'e str, Vec<Step>), CompileError> {
        match &e.kind {
            Kind::Ident(name) => Ok((name, Vec::new())),
            Kind::Select(inner, field) => {
                let (v, mut steps) = self.path(inner)?;
                steps.push(Step::Key(field.clone()));
                Ok((v, steps))
            }
            Kind::Index(inner, i) => {
                let (v, mut steps) = self.path(inner)?;
                steps.push(match &i.kind {
                    Kind::Str(k) => Step::Key(k.clone()),
                    Kind::Int(n) if *n >= 0 => Step::Index(*n as u64),
                    Kind::Uint(n) => Step::Index(*n),
                    _ => {
                        return Err(self.error(
                            start(i),
                            "an index must be a string or a non-negative integer literal",
                        ))
                    }
                });
                Ok((v, steps))
            }
            _ => Err(self.error(
                start(e),
                "fields can be selected from `message`, `key`, `headers` and their fields only",
            )),
        }
    }

    /// A condition operand: a bool, or of unknown type.
    fn boolean(&mut self, e: &Expr) -> Result<Ix, CompileError> {
        let (i, t) = self.expr(e)?;
        if !matches!(t, Type::Bool | Type::Dyn) {
            return Err(self.error(start(e), format!("expected a bool, found {}", t.name())));
        }
        Ok(i)
    }

    fn unary(&mut self, at: usize, op: &str, x: &Expr) -> Result<(Ix, Type), CompileError> {
        let (op, t) = if op == "!" {
            (Op::Not(self.boolean(x)?), Type::Bool)
        } else {
            let (i, t) = self.expr(x)?;
            if !matches!(t, Type::Int | Type::Double | Type::Dyn) {
                return Err(self.error(at, format!("no overload of `-` for {}", t.name())));
            }
            (Op::Neg(self.arg(i)), t)
        };
        Ok((self.push(at, op), t))
    }

    fn binary(
        &mut self,
        at: usize,
        op: &str,
        l: &Expr,
        r: &Expr,
    ) -> Result<(Ix, Type), CompileError> {
        if op == "in" {
            return self.inclusion(at, l, r);
        }
        if op == "&&" || op == "||" {
            let all = op == "&&";
            let (a, b) = (self.boolean(l)?, self.boolean(r)?);
            let mut items = self.chain(a, all);
            items.extend(self.chain(b, all));
            let op = if all {
                Op::All(items.into())
            } else {
                Op::Any(items.into())
            };
            return Ok((self.push(at, op), Type::Bool));
        }
        let (a, ta) = self.expr(l)?;
        let (b, tb) = self.expr(r)?;
        let (a, b) = (self.arg(a), self.arg(b));
        let known = ta != Type::Dyn && tb != Type::Dyn;
        let no_overload = || format!("no overload of `{op}` for {} and {}", ta.name(), tb.name());
        let (op, t) = match op {
            "==" => (Op::Eq(a, b), Type::Bool),
            "!=" => (Op::Ne(a, b), Type::Bool),
            "<" | "<=" | ">" | ">=" => {
                let comparable = (ta.is_number() && tb.is_number())
                    || (ta == tb && matches!(ta, Type::String | Type::Bytes | Type::Bool));
                if known && !comparable {
                    return Err(self.error(at, no_overload()));
                }
                // [Less, Equal, Greater]
                let holds = match op {
                    "<" => [true, false, false],
                    "<=" => [true, true, false],
                    ">" => [false, false, true],
                    _ => [false, true, true],
                };
                (Op::Order(a, b, holds), Type::Bool)
            }
            _ => {
                let arith = match op {
                    "+" => Arith::Add,
                    "-" => Arith::Sub,
                    "*" => Arith::Mul,
                    "/" => Arith::Div,
                    _ => Arith::Rem,
                };
                if matches!(ta, Type::String | Type::Bytes | Type::List)
                    || matches!(tb, Type::String | Type::Bytes | Type::List)
                {
                    return Err(self.error(at, format!("`{op}` on {} and {} is not supported (concatenation would build a value per record)", ta.name(), tb.name())));
                }
                let fits =
                    ta == tb && ta.is_number() && !(arith == Arith::Rem && ta == Type::Double);
                if known && !fits {
                    return Err(self.error(at, no_overload()));
                }
                (Op::Arith(arith, a, b), if known { ta } else { Type::Dyn })
            }
        };
        Ok((self.push(at, op), t))
    }

    /// The operands of node `i` when it is a chain of the same operator
    /// (`all`: `&&`), taken out of it (the node is left unused); else `i`.
    fn chain(&mut self, i: Ix, all: bool) -> Vec<Ix> {
        match self.nodes.get_mut(i as usize).map(|n| &mut n.op) {
            Some(Op::All(items)) if all => std::mem::take(items).into_vec(),
            Some(Op::Any(items)) if !all => std::mem::take(items).into_vec(),
            _ => vec![i],
        }
    }

    /// `x in [..]`, `x in path` (list elements, map keys), and
    /// `"name" in headers` (a map only indexed: `has(headers["name"])`).
    fn inclusion(&mut self, at: usize, l: &Expr, r: &Expr) -> Result<(Ix, Type), CompileError> {
        if let Kind::List(items) = &r.kind {
            let (x, _) = self.expr(l)?;
            let x = self.arg(x);
            let items = items
                .iter()
                .map(|i| self.expr(i).map(|(i, _)| self.arg(i)))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok((self.push(at, Op::InList(x, items.into())), Type::Bool));
        }
        if let (Kind::Str(key), Ok((variable, mut steps))) = (&l.kind, self.path(r)) {
            if self.resolver.resolve(variable, &steps).is_err() {
                steps.push(Step::Key(key.clone()));
                let (slot, _) = self
                    .resolver
                    .resolve(variable, &steps)
                    .map_err(|m| self.error(r.at, m))?;
                return Ok((self.push(at, Op::Has(slot)), Type::Bool));
            }
        }
        let (x, _) = self.expr(l)?;
        let (c, t) = self.expr(r)?;
        if !matches!(t, Type::List | Type::Map | Type::Dyn) {
            return Err(self.error(at, format!("no overload of `in` for {}", t.name())));
        }
        Ok((self.push(at, Op::In(self.arg(x), self.arg(c))), Type::Bool))
    }
}

/// Where `e`'s text starts: its leftmost token (an operator node's own
/// `at` is its operator).
pub(super) fn start(e: &Expr) -> usize {
    match &e.kind {
        Kind::Select(inner, _) | Kind::Index(inner, _) | Kind::Binary(_, inner, _) => start(inner),
        Kind::Cond(inner, ..) => start(inner),
        Kind::Call {
            target: Some(inner),
            ..
        } => start(inner),
        _ => e.at,
    }
}

/// A path as antidote words it in reasons: `message.a["b-c"][0]`.
pub(super) fn render(variable: &str, steps: &[Step]) -> String {
    let mut out = variable.to_string();
    for s in steps {
        match s {
            Step::Key(k) if is_name(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Key(k) => out.push_str(&format!("[{}]", serde_json::Value::String(k.clone()))),
            Step::Index(n) => out.push_str(&format!("[{n}]")),
        }
    }
    out
}

fn is_name(k: &str) -> bool {
    k.starts_with(|c: char| c == '_' || c.is_ascii_alphabetic())
        && k.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
}
