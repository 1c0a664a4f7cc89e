//! The template: a flat layout compiled into a straight run of steps, one
//! per member, for records written exactly as the layout's first record
//! was (no whitespace, every member present and in order), which is how
//! one producer writes every record. A step compares the bytes before its
//! value in one go (`{` or `,`, the member's remembered bytes, and for a
//! member the schema says is a string, its opening quote) and reads the
//! value by the kind the schema gives it, without the general reader's
//! whitespace tokens, separator matching and value dispatch (issue 30).
//!
//! It accepts only documents the flat reader accepts, with the same
//! captures: the same bytes in the same order are the same tokens, and
//! each value is read, checked and captured by the same [`Member`]
//! methods. Anything else (whitespace, a member left out, a value of
//! another kind) fails a step, and the flat reader's member loop goes on
//! from that step's member, keeping the members read before it: a record
//! unlike the template costs one failed comparison, not a second read.

use wide::u8x32;

use super::{Captured, Member, Seen, Stop};
use crate::policy::json::capture::scan::number;
use crate::policy::shape::same_bytes;

/// The most bytes a step compares before its value.
const MAX_PREFIX: usize = 32;

/// A flat layout's members as steps.
#[derive(Debug)]
pub(super) struct Template {
    steps: Box<[Step]>,
    /// The required bits of all the members.
    seen: u64,
}

/// A member's step.
#[derive(Debug)]
struct Step {
    /// The bytes before the value.
    prefix: Prefix,
    value: Value,
    /// The member (a copy of the flat reader's, so that a step needs no
    /// lookup).
    member: Member,
    /// Which member it is, and the required bits of the members before it:
    /// where the member loop goes on when this step fails. Both derivable
    /// (the step's position, the bits of the steps before it), but kept:
    /// counting steps in the loop instead cost ~30 instructions a record
    /// (`benches/results/judge-cost-filter-fdff6fa.txt`).
    index: usize,
    before: u64,
}

impl Step {
    /// Where the member loop goes on when this step fails at `at`.
    #[cold]
    fn stop(&self, at: usize) -> Stop {
        Stop {
            at,
            next: self.index,
            seen: self.before,
        }
    }
}

/// How a step reads its value, decided by the member's schema.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    /// Strings only: the opening quote is in the prefix.
    Str,
    /// Numbers only.
    Number,
    /// Any scalar, dispatched on its first byte.
    Any,
}

/// Bytes compared as one 32-byte vector when the document has
/// [`MAX_PREFIX`] bytes from where they are tried, else byte for byte.
#[derive(Debug)]
struct Prefix {
    bytes: Box<[u8]>,
    /// The bytes, then zeros; and which of those lanes to ignore (all
    /// ones past the bytes).
    expect: u8x32,
    ignore: u8x32,
}

impl Prefix {
    fn new(bytes: Vec<u8>) -> Option<Prefix> {
        if bytes.is_empty() || bytes.len() > MAX_PREFIX {
            return None;
        }
        let mut expect = [0u8; MAX_PREFIX];
        expect[..bytes.len()].copy_from_slice(&bytes);
        let ignore = std::array::from_fn(|k| if k < bytes.len() { 0 } else { u8::MAX });
        Some(Prefix {
            bytes: bytes.into_boxed_slice(),
            expect: u8x32::new(expect),
            ignore: u8x32::new(ignore),
        })
    }

    /// Where the prefix ends, if `b[i..]` starts with it.
    #[inline(always)]
    fn after(&self, b: &[u8], i: usize) -> Option<usize> {
        let rest = b.get(i..)?;
        let same = match rest.first_chunk::<MAX_PREFIX>() {
            Some(window) => (u8x32::new(*window).simd_eq(self.expect) | self.ignore).all(),
            // The last members of a record: fewer bytes left than a window.
            None => rest
                .get(..self.bytes.len())
                .is_some_and(|s| same_bytes(s, &self.bytes)),
        };
        same.then_some(i + self.bytes.len())
    }
}

impl Template {
    /// The template of `members` (of an object with these `required`
    /// bits), or `None` when a member's bytes are too long for a step or
    /// the members do not cover what is required (the flat reader then
    /// refuses every record anyway).
    pub(super) fn build(members: &[Member], required: u64) -> Option<Template> {
        let mut steps = Vec::with_capacity(members.len());
        let mut bits = 0;
        for (k, m) in members.iter().enumerate() {
            let value = match &m.shape {
                Some(s) if s.only_strings() => Value::Str,
                Some(s) if s.only_numbers() => Value::Number,
                _ => Value::Any,
            };
            let mut prefix = vec![if k == 0 { b'{' } else { b',' }];
            prefix.extend_from_slice(&m.text);
            if value == Value::Str {
                prefix.push(b'"');
            }
            steps.push(Step {
                prefix: Prefix::new(prefix)?,
                value,
                member: m.clone(),
                index: k,
                before: bits,
            });
            bits |= m.bit;
        }
        (!steps.is_empty() && bits & required == required).then(|| Template {
            steps: steps.into_boxed_slice(),
            seen: bits,
        })
    }

    /// Whether `b` is exactly the template's object (then its captures are
    /// in `slots`); when it is not, where the template stopped: after the
    /// last member it read in full, whose captures stand (a step that
    /// fails captures nothing), for the flat reader's member loop to go on
    /// from there (`next` 0: nothing read).
    #[inline(always)]
    pub(super) fn read<'de>(&self, b: &'de [u8], slots: &mut [Captured<'de>]) -> Result<(), Stop> {
        let mut i = 0;
        for step in &self.steps {
            let m = &step.member;
            let end = step.prefix.after(b, i).and_then(|i| match step.value {
                Value::Str => m.string(b, i, slots),
                Value::Number => {
                    let (v, end): (Seen<'_>, usize) = number(b, i)?;
                    m.scalar(v, slots)?;
                    Some(end)
                }
                Value::Any => m.value(b, i, *b.get(i)?, slots),
            });
            i = match end {
                Some(end) => end,
                None => return Err(step.stop(i)),
            };
        }
        if i + 1 == b.len() && b[i] == b'}' {
            Ok(())
        } else {
            Err(Stop {
                at: i,
                next: self.steps.len(),
                seen: self.seen,
            })
        }
    }
}
