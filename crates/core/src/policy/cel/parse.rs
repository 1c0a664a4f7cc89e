//! CEL's grammar (langdef.md, "Syntax") read by precedence climbing into
//! an [`Expr`] tree, with the limits that keep a hostile policy from
//! costing more than a bounded parse: nesting depth and node count.
//! Map and message literals are refused here (nothing antidote judges
//! needs them); everything else the grammar allows is parsed, and what
//! the compiler cannot run is refused there, with its position.

use super::lex::{tokens, Tok, Token};
use super::{CompileError, MAX_DEPTH, MAX_NODES};

/// One node of a parsed expression; `at` is the byte offset of the token
/// that names it (an operator's own token, a call's name).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Expr {
    pub(super) at: usize,
    pub(super) kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    Bool(bool),
    Null,
    Ident(String),
    /// `e.f`
    Select(Box<Expr>, String),
    /// `e[i]`
    Index(Box<Expr>, Box<Expr>),
    /// `f(args)` or `e.f(args)` (`target`).
    Call {
        target: Option<Box<Expr>>,
        name: String,
        args: Vec<Expr>,
    },
    /// `!e`, `-e`.
    Unary(&'static str, Box<Expr>),
    /// Every binary operator, as written: `&&`, `==`, `in`, `+`...
    Binary(&'static str, Box<Expr>, Box<Expr>),
    /// `c ? a : b`
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
}

/// Parse one expression.
pub(super) fn parse(text: &str) -> Result<Expr, CompileError> {
    let mut p = Parser {
        text,
        tokens: tokens(text)?,
        pos: 0,
        depth: 0,
        nodes: 0,
    };
    let e = p.expr()?;
    let t = p.peek();
    if t.kind != Tok::End {
        return Err(p.error(t.at, "expected the end of the expression"));
    }
    Ok(e)
}

struct Parser<'t> {
    text: &'t str,
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
    nodes: usize,
}

/// Binary operators by precedence, loosest first (after `?:`).
const LEVELS: [&[&str]; 5] = [
    &["||"],
    &["&&"],
    &["==", "!=", "<", "<=", ">", ">=", "in"],
    &["+", "-"],
    &["*", "/", "%"],
];

impl Parser<'_> {
    fn peek(&self) -> Token {
        self.tokens.get(self.pos).cloned().unwrap_or(Token {
            at: self.text.len(),
            kind: Tok::End,
        })
    }

    fn bump(&mut self) -> Token {
        let t = self.peek();
        self.pos = (self.pos + 1).min(self.tokens.len());
        t
    }

    fn error(&self, at: usize, message: impl Into<String>) -> CompileError {
        CompileError::new(self.text, at, message)
    }

    fn is(&self, p: &str) -> bool {
        matches!(self.peek().kind, Tok::Punct(q) if q == p)
    }

    fn expect(&mut self, p: &str) -> Result<Token, CompileError> {
        let t = self.bump();
        match t.kind {
            Tok::Punct(q) if q == p => Ok(t),
            _ => Err(self.error(t.at, format!("expected `{p}`"))),
        }
    }

    /// A node, counted against [`MAX_NODES`].
    fn node(&mut self, at: usize, kind: Kind) -> Result<Expr, CompileError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(self.error(
                at,
                format!(
                    "the expression has more than {MAX_NODES} terms; split it into several rules"
                ),
            ));
        }
        Ok(Expr { at, kind })
    }

    /// Enter one level of nesting (parentheses, operands, arguments).
    fn enter(&mut self, at: usize) -> Result<(), CompileError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(at, format!("nested more than {MAX_DEPTH} levels deep")));
        }
        Ok(())
    }

    /// `Expr = ConditionalOr ["?" ConditionalOr ":" Expr]`
    fn expr(&mut self) -> Result<Expr, CompileError> {
        self.enter(self.peek().at)?;
        let cond = self.binary(0)?;
        let e = if self.is("?") {
            let at = self.bump().at;
            let yes = self.binary(0)?;
            self.expect(":")?;
            let no = self.expr()?;
            self.node(at, Kind::Cond(cond.into(), yes.into(), no.into()))?
        } else {
            cond
        };
        self.depth -= 1;
        Ok(e)
    }

    /// The binary operators of `LEVELS[level..]`, left-associative.
    fn binary(&mut self, level: usize) -> Result<Expr, CompileError> {
        let Some(ops) = LEVELS.get(level) else {
            return self.unary();
        };
        let mut left = self.binary(level + 1)?;
        loop {
            let t = self.peek();
            let op = match &t.kind {
                Tok::Punct(p) => ops.iter().find(|o| *o == p).copied(),
                Tok::In => ops.iter().find(|o| **o == "in").copied(),
                _ => None,
            };
            let Some(op) = op else { return Ok(left) };
            self.bump();
            self.enter(t.at)?;
            let right = self.binary(level + 1)?;
            self.depth -= 1;
            left = self.node(t.at, Kind::Binary(op, left.into(), right.into()))?;
        }
    }

    /// `!`/`-` prefixes, then a member. `-` before an integer literal is
    /// part of it, so `-9223372036854775808` is an int.
    fn unary(&mut self) -> Result<Expr, CompileError> {
        let t = self.peek();
        let op = match t.kind {
            Tok::Punct("!") => "!",
            Tok::Punct("-") => "-",
            _ => return self.member(),
        };
        self.bump();
        self.enter(t.at)?;
        if op == "-" {
            if let Tok::Int(n) = self.peek().kind {
                if !self.followed_by_member(1) {
                    self.bump();
                    let v = 0i64
                        .checked_sub_unsigned(n)
                        .ok_or_else(|| self.error(t.at, "integer literal out of range"))?;
                    self.depth -= 1;
                    return self.node(t.at, Kind::Int(v));
                }
            }
        }
        let e = self.unary()?;
        self.depth -= 1;
        self.node(t.at, Kind::Unary(op, e.into()))
    }

    /// Whether the token `ahead` after this one starts a member suffix
    /// (`.`, `[`), which binds tighter than a sign.
    fn followed_by_member(&self, ahead: usize) -> bool {
        matches!(
            self.tokens.get(self.pos + ahead).map(|t| &t.kind),
            Some(Tok::Punct("." | "["))
        )
    }

    /// `Member = Primary {"." IDENT ["(" args ")"] | "[" Expr "]"}`
    fn member(&mut self) -> Result<Expr, CompileError> {
        let mut e = self.primary()?;
        loop {
            let t = self.peek();
            if self.is(".") {
                self.bump();
                let name = self.ident()?;
                e = if self.is("(") {
                    let args = self.args()?;
                    let target = Some(Box::new(e));
                    self.node(
                        name.0,
                        Kind::Call {
                            target,
                            name: name.1,
                            args,
                        },
                    )?
                } else {
                    self.node(name.0, Kind::Select(e.into(), name.1))?
                };
            } else if self.is("[") {
                self.bump();
                let i = self.expr()?;
                self.expect("]")?;
                e = self.node(t.at, Kind::Index(e.into(), i.into()))?;
            } else if self.is("{") {
                return Err(self.error(t.at, "message construction (`T{...}`) is not supported"));
            } else {
                return Ok(e);
            }
        }
    }

    fn ident(&mut self) -> Result<(usize, String), CompileError> {
        let t = self.bump();
        match t.kind {
            Tok::Ident(name) => Ok((t.at, name)),
            _ => Err(self.error(t.at, "expected a field or function name")),
        }
    }

    /// `"(" [Expr {"," Expr}] ")"`, the `(` next.
    fn args(&mut self) -> Result<Vec<Expr>, CompileError> {
        self.expect("(")?;
        self.list(")")
    }

    /// Expressions separated by commas up to `close` (consumed).
    fn list(&mut self, close: &str) -> Result<Vec<Expr>, CompileError> {
        let mut out = Vec::new();
        if self.is(close) {
            self.bump();
            return Ok(out);
        }
        loop {
            out.push(self.expr()?);
            if self.is(",") {
                self.bump();
                if self.is(close) {
                    self.bump();
                    return Ok(out);
                }
            } else {
                self.expect(close)?;
                return Ok(out);
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, CompileError> {
        let t = self.bump();
        let kind = match t.kind {
            Tok::Int(n) => Kind::Int(
                i64::try_from(n).map_err(|_| self.error(t.at, "integer literal out of range"))?,
            ),
            Tok::Uint(n) => Kind::Uint(n),
            Tok::Double(x) => Kind::Double(x),
            Tok::Str(s) => Kind::Str(s),
            Tok::Bytes(b) => Kind::Bytes(b),
            Tok::True => Kind::Bool(true),
            Tok::False => Kind::Bool(false),
            Tok::Null => Kind::Null,
            Tok::Ident(name) if self.is("(") => {
                let args = self.args()?;
                Kind::Call {
                    target: None,
                    name,
                    args,
                }
            }
            Tok::Ident(name) => Kind::Ident(name),
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                return Ok(e);
            }
            Tok::Punct("[") => Kind::List(self.list("]")?),
            Tok::Punct("{") => {
                return Err(self.error(t.at, "map literals (`{k: v}`) are not supported"))
            }
            Tok::Punct(".") => {
                return Err(self.error(
                    t.at,
                    "names from the root scope (`.name`) are not supported",
                ))
            }
            Tok::End => return Err(self.error(t.at, "the expression ends too early")),
            _ => return Err(self.error(t.at, "expected a value, a name or `(`")),
        };
        self.node(t.at, kind)
    }
}
