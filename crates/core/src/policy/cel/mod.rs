//! CEL conditions (issue 56): one expression in Google's Common
//! Expression Language compiled at load into a flat [`Program`] over a
//! record's field slots, and judged per record without allocating.
//!
//! Why not a CEL crate: `cel` 0.15 (cel-rust, the maintained one; MIT)
//! evaluates a two-field comparison in ~6,000 instructions with the
//! message bound once and ~20,000 with the record's fields made a CEL map
//! per record (`benches/results/cel-crate-probe-*.txt`), against a budget
//! of 200; its parser needs the ANTLR runtime (`antlr4rust`, plus `nom`,
//! `typed-arena`, `murmur3`, `bit-set` ... nine crates new to this tree)
//! and its Pratt parser is hidden behind an unstable feature. The subset
//! antidote needs parses in ~500 lines here ([`lex`], [`parse`]) and runs
//! as a tree of nodes over slots ([`eval`]), in the tens of instructions.
//!
//! Layout: [`lex`] (tokens, literals), [`parse`] (grammar, depth and size
//! limits), [`compile`] (names resolved to slots, types checked where
//! known, everything unsupported refused with its position), [`value`]
//! (values, equality, ordering, arithmetic), [`eval`] (the judging loop,
//! with CEL's commutative `&&`/`||`), [`rule`] (a policy's `- cel:` rule:
//! its names, and a record's values by slot).
//!
//! Bounded per record by construction: no loops (comprehension macros are
//! refused), at most [`MAX_NODES`] nodes each run at most once, string
//! functions linear in the field, regular expressions compiled at load by
//! the `regex` crate (linear time, size-limited).

mod compile;
mod eval;
mod functions;
mod lex;
mod parse;
mod rule;
mod value;

#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod tests;

use std::fmt;

pub(crate) use compile::{compile, Program};
pub(crate) use rule::{ordered, CelRule, FieldScope};
pub(crate) use value::{Type, Val};

/// Longest expression text accepted, in bytes.
pub(crate) const MAX_LEN: usize = 4096;
/// Most nodes (literals, names, operators, calls) in one expression.
pub(crate) const MAX_NODES: usize = 200;
/// Deepest nesting of parentheses and operands (CEL implementations must
/// allow 32).
pub(crate) const MAX_DEPTH: usize = 32;

/// One step of a field path after its variable: `.name` or `["name"]`,
/// or `[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Key(String),
    Index(u64),
}

/// What the policy layer tells the compiler about names: the slot a path
/// such as `message.a.b` is read from at judging time, and the type its
/// value has when the schema says (`Type::Dyn` when it does not).
pub(crate) trait Resolver {
    /// `Err` with the reason when the path names nothing (an unknown
    /// variable, a field the schema does not have).
    fn resolve(&mut self, variable: &str, steps: &[Step]) -> Result<(u32, Type), String>;
}

/// A record's values by slot, as the resolver assigned them. `None`: the
/// record has no value there (a missing field, a missing header).
pub(crate) trait Slots {
    fn get(&self, slot: u32) -> Option<Val<'_>>;
}

/// Why an expression does not compile: a byte offset into it and its
/// 1-based column (in characters), and what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompileError {
    pub(crate) at: usize,
    pub(crate) column: usize,
    pub(crate) message: String,
}

impl CompileError {
    pub(crate) fn new(text: &str, at: usize, message: impl Into<String>) -> CompileError {
        let at = at.min(text.len());
        let column = text.get(..at).map_or(at, |s| s.chars().count()) + 1;
        CompileError {
            at,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.message)
    }
}

/// What went wrong judging one record: a CEL runtime error. Makes no
/// string: [`Program::explain`] words it when the record is diverted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fault {
    /// The record has no value at a path (`no_such_field`).
    NoSuchField,
    /// No overload of the operator or function for these operand types.
    NoOverload(Type, Type),
    NoOverloadFor(Type),
    /// `int`/`uint` arithmetic or a conversion out of range.
    Overflow,
    DivideByZero,
    ModulusByZero,
    /// `int("x")`: a string that is not a number of that type.
    BadConversion(Type),
    NoConversion(Type, Type),
    /// A condition, or an operand of `&&`, `||`, `!`, `?:`, that is not
    /// a bool.
    NotBool(Type),
}

/// A [`Fault`] and the node it arose at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EvalError {
    pub(crate) node: u32,
    pub(crate) fault: Fault,
}
