//! The functions and macros a condition may call, compiled: `has`,
//! `size`, `startsWith`, `endsWith`, `contains`, `matches` (a literal
//! pattern, compiled once by the `regex` crate: linear time, size-bounded),
//! the numeric conversions `int`, `uint`, `double`, and `dyn`. Any other
//! name is refused with the reason ([`refused`]) or as unknown.

use regex::bytes::RegexBuilder;

use super::compile::{start, Arg, Compiler, Op};
use super::parse::{Expr, Kind};
use super::value::Type;
use super::CompileError;

/// The most memory a `matches` pattern may compile to.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Functions CEL defines that antidote refuses, and why.
fn refused(name: &str) -> Option<&'static str> {
    Some(match name {
        "all" | "exists" | "exists_one" | "map" | "filter" => {
            "comprehension macros (`all`, `exists`, `exists_one`, `map`, `filter`) are not supported: their cost grows with a record's lists"
        }
        "timestamp" | "duration" | "getFullYear" | "getMonth" | "getDate" | "getDayOfMonth"
        | "getDayOfWeek" | "getDayOfYear" | "getHours" | "getMinutes" | "getSeconds"
        | "getMilliseconds" => {
            "timestamps and durations are not supported: compare epoch numbers (e.g. `message.exit_ms > message.enter_ms`; `timestamp` is the record's time in ms)"
        }
        "string" | "bytes" | "type" | "bool" => {
            "this conversion is not supported (it would build a value per record)"
        }
        _ => return None,
    })
}

impl Compiler<'_, '_> {
    pub(super) fn call(
        &mut self,
        at: usize,
        target: Option<&Expr>,
        name: &str,
        args: &[Expr],
    ) -> Result<(super::compile::Ix, Type), CompileError> {
        let (op, t) = match (name, target, args) {
            ("has", None, [arg]) => (Op::Has(self.presence(arg)?), Type::Bool),
            ("size", None, [x]) | ("size", Some(x), []) => {
                let i = self.operand(x, &[Type::String, Type::Bytes, Type::List, Type::Map])?;
                (Op::Size(i), Type::Int)
            }
            ("startsWith" | "endsWith" | "contains", Some(s), [x]) => {
                let s = self.operand(s, &[Type::String])?;
                let x = self.operand(x, &[Type::String])?;
                let op = match name {
                    "startsWith" => Op::StartsWith(s, x),
                    "endsWith" => Op::EndsWith(s, x),
                    _ => Op::Contains(s, x),
                };
                (op, Type::Bool)
            }
            ("matches", None, [s, p]) | ("matches", Some(s), [p]) => {
                let s = self.operand(s, &[Type::String])?;
                (Op::Matches(s, self.pattern(p)?), Type::Bool)
            }
            ("int" | "uint" | "double", None, [x]) => {
                let to = match name {
                    "int" => Type::Int,
                    "uint" => Type::Uint,
                    _ => Type::Double,
                };
                let from = [Type::Int, Type::Uint, Type::Double, Type::String];
                (Op::Convert(to, self.operand(x, &from)?), to)
            }
            ("dyn", None, [x]) => return Ok((self.expr(x)?.0, Type::Dyn)),
            _ => return Err(self.unknown(at, target.is_some(), name)),
        };
        Ok((self.push(at, op), t))
    }

    fn unknown(&self, at: usize, method: bool, name: &str) -> CompileError {
        if let Some(why) = refused(name) {
            return self.error(at, format!("`{name}`: {why}"));
        }
        let known = [
            "has",
            "size",
            "startsWith",
            "endsWith",
            "contains",
            "matches",
            "int",
            "uint",
            "double",
            "dyn",
        ];
        if known.contains(&name) {
            let form = if method {
                "as a method"
            } else {
                "with these arguments"
            };
            self.error(at, format!("`{name}` cannot be called {form}"))
        } else {
            self.error(at, format!("unknown function `{name}`"))
        }
    }

    /// An operand of one of the types `allowed` (or of unknown type).
    fn operand(&mut self, e: &Expr, allowed: &[Type]) -> Result<Arg, CompileError> {
        let (i, t) = self.expr(e)?;
        if t != Type::Dyn && !allowed.contains(&t) {
            let names: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
            return Err(self.error(
                start(e),
                format!("expected {}, found {}", names.join(" or "), t.name()),
            ));
        }
        Ok(self.arg(i))
    }

    /// `has(e.f)`'s slot: the operand must select a field.
    fn presence(&mut self, e: &Expr) -> Result<u32, CompileError> {
        if !matches!(e.kind, Kind::Select(..) | Kind::Index(..)) {
            return Err(self.error(start(e), "has() needs a field, e.g. has(message.a)"));
        }
        Ok(self.field(e)?.0)
    }

    /// A `matches` pattern: a string literal, compiled now.
    fn pattern(&self, p: &Expr) -> Result<Box<regex::bytes::Regex>, CompileError> {
        let Kind::Str(text) = &p.kind else {
            return Err(self.error(
                start(p),
                "the pattern of matches() must be a string literal (it is compiled at load)",
            ));
        };
        RegexBuilder::new(text)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(Box::new)
            .map_err(|e| self.error(p.at, format!("invalid pattern: {e}")))
    }
}
