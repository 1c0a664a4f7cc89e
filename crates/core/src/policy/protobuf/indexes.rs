//! Confluent's message-index arrays, resolved against one compiled `.proto`
//! file: the array (zigzag varints after the schema id; a single `0` for the
//! file's first message) names a top-level message, then nested ones.
//!
//! [`IndexedFile`] keeps the file's top-level messages in declaration order
//! with their capture tables, so a record's array is resolved by indexing,
//! without walking the descriptor pool (`FileDescriptor::messages()` builds
//! every message's full name as it goes) and without allocating. Both the
//! `schema_ids` files of a policy and the schemas of a registry use it.

use std::borrow::Cow;

use prost_reflect::{FileDescriptor, MessageDescriptor};
use serde_json::Value;

use super::capture::{Links, Tables};
use super::{check_type_name, decode_message};
use crate::policy::json::{Captures, Plan};
use crate::policy::wire::read_zigzag;
use crate::policy::Invalid;

/// Longest index array accepted (Confluent's serializers write one entry
/// per nesting level).
const MAX_INDEXES: i64 = 32;

/// A compiled file and what resolving index arrays against it needs.
#[derive(Debug)]
pub struct IndexedFile {
    file: FileDescriptor,
    /// Top-level messages in declaration order, each with its table index.
    top: Vec<(MessageDescriptor, Option<usize>)>,
    /// The fast path's tables for every message type the file reaches.
    tables: Tables,
}

/// The message an index array names: borrowed for a top-level message,
/// with its table index; built for a nested one.
struct Named<'a> {
    desc: Cow<'a, MessageDescriptor>,
    table: Option<usize>,
}

impl IndexedFile {
    pub fn new(file: FileDescriptor) -> IndexedFile {
        let messages: Vec<MessageDescriptor> = file.messages().collect();
        let tables = Tables::compile(messages.iter().cloned());
        let top = (messages.into_iter())
            .map(|m| {
                let table = tables.index(m.full_name());
                (m, table)
            })
            .collect();
        IndexedFile { file, top, tables }
    }

    /// The trie nodes of `plan` for this file's message types, for records
    /// that must be of type `expected` (if set).
    pub(crate) fn links(&self, plan: &Plan, expected: Option<&str>) -> Links {
        let mut links = Links::new(&self.tables, plan);
        links.first_expected =
            expected.is_none_or(|e| self.first().is_some_and(|m| m.full_name() == e));
        links
    }

    pub fn file(&self) -> &FileDescriptor {
        &self.file
    }

    /// The file's first message (what the array `[0]` names).
    pub fn first(&self) -> Option<&MessageDescriptor> {
        self.top.first().map(|(m, _)| m)
    }

    /// The rules' values of a framed message (`rest`: what follows the
    /// schema id), read into `caps`; false when the full decoder must judge
    /// it: a bad array, a type other than `expected`, or a message the
    /// tables do not read.
    pub(crate) fn capture<'a>(
        &'a self,
        rest: &'a [u8],
        expected: Option<&str>,
        links: &Links,
        caps: &mut Captures<'a>,
    ) -> bool {
        let mut payload = rest;
        let (named, checked) = match self.first_of(&mut payload) {
            Some(named) => (named, links.first_expected),
            None => match self.resolve(&mut payload) {
                Ok(named) => (named, false),
                Err(_) => return false,
            },
        };
        if !checked && expected.is_some_and(|e| e != named.desc.full_name()) {
            return false;
        }
        match named.table {
            Some(t) => self.tables.capture_index(t, payload, links, caps),
            None => self.tables.capture(&named.desc, payload, links, caps),
        }
    }

    /// The array nearly every serializer writes, `[0]` as one byte: the
    /// file's first message, with `buf` left after the byte.
    #[inline]
    fn first_of(&self, buf: &mut &[u8]) -> Option<Named<'_>> {
        let ([0, after @ ..], Some((desc, table))) = (*buf, self.top.first()) else {
            return None;
        };
        *buf = after;
        Some(Named {
            desc: Cow::Borrowed(desc),
            table: *table,
        })
    }

    /// Decode a framed message (`rest`: what follows the schema id) as JSON.
    pub(crate) fn decode(&self, rest: &[u8], expected: Option<&str>) -> Result<Value, Invalid> {
        let mut payload = rest;
        let named = self.resolve(&mut payload)?;
        check_type_name(&named.desc, expected)?;
        decode_message(named.desc.into_owned(), payload)
    }

    /// Read the index array at the start of `buf` (leaving `buf` after it)
    /// and name its message. Cold: the fast path reads `[0]` inline
    /// ([`Self::first_of`]), and other arrays are rare.
    #[cold]
    fn resolve(&self, buf: &mut &[u8]) -> Result<Named<'_>, Invalid> {
        let bad = |what: &str| {
            Invalid::poison(
                "decode",
                format!("schema-registry message indexes are invalid: {what}"),
            )
        };
        if let Some(named) = self.first_of(buf) {
            return Ok(named);
        }
        let next = |buf: &mut &[u8]| read_zigzag(buf).ok_or_else(|| bad("truncated"));
        let count = next(buf)?;
        if !(0..=MAX_INDEXES).contains(&count) {
            return Err(bad(&format!("{count} indexes")));
        }
        // An empty array stands for [0].
        let first = if count == 0 { 0 } else { next(buf)? };
        let (desc, table) = usize::try_from(first)
            .ok()
            .and_then(|i| self.top.get(i))
            .ok_or_else(|| bad(&format!("no message #{first} in {}", self.file.name())))?;
        let mut named = Named {
            desc: Cow::Borrowed(desc),
            table: *table,
        };
        for _ in 1..count {
            let i = next(buf)?;
            let child = usize::try_from(i)
                .ok()
                .and_then(|k| named.desc.child_messages().nth(k))
                .ok_or_else(|| {
                    bad(&format!(
                        "no nested message #{i} in {}",
                        named.desc.full_name()
                    ))
                })?;
            named = Named {
                desc: Cow::Owned(child),
                table: None,
            };
        }
        Ok(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::formats::compile_schema as compile;
    use crate::policy::registry::Registered;

    fn file() -> IndexedFile {
        let text = "syntax = \"proto3\"; package p; \
                    message A { int32 a = 1; } \
                    message B { message C { int32 c = 1; } message D { int32 d = 1; } C c = 1; }";
        match compile(Some("PROTOBUF"), text, &[]) {
            Registered::Protobuf(f) => f,
            other => panic!("{other:?}"),
        }
    }

    /// The message an encoded array names, and what follows the array.
    fn named(f: &IndexedFile, bytes: &[u8]) -> Result<(String, Option<usize>, usize), String> {
        let mut buf = bytes;
        let n = f.resolve(&mut buf).map_err(|e| e.reason)?;
        Ok((n.desc.full_name().to_string(), n.table, buf.len()))
    }

    #[test]
    fn arrays_name_top_level_then_nested_messages() {
        let f = file();
        let table = |name: &str| f.tables.index(name);
        // Zigzag varints: the count, then the indexes (0 → 0, 1 → 2, 2 → 4).
        let cases: [(&[u8], &str, Option<usize>); 6] = [
            (&[0, 9], "p.A", table("p.A")),
            (&[2, 0, 9], "p.A", table("p.A")),
            (&[2, 2, 9], "p.B", table("p.B")),
            (&[4, 2, 0, 9], "p.B.C", None),
            (&[4, 2, 2, 9], "p.B.D", None),
            (&[6, 2, 0, 0], "", None),
        ];
        assert!(table("p.A").is_some() && table("p.B").is_some());
        for (bytes, name, t) in &cases[..5] {
            assert_eq!(named(&f, bytes), Ok((name.to_string(), *t, 1)), "{bytes:?}");
        }
        // C has no nested message #0.
        let err = named(&f, cases[5].0).unwrap_err();
        assert!(err.contains("no nested message #0 in p.B.C"), "{err}");
    }

    #[test]
    fn bad_arrays_are_poison_with_a_reason() {
        let f = file();
        for (bytes, reason) in [
            (&[][..], "truncated"),
            (&[2][..], "truncated"),
            (&[4, 2][..], "truncated"),
            (&[2, 4][..], "no message #2 in"),
            (&[2, 1][..], "no message #-1 in"),
            (&[1][..], "-1 indexes"),
            (&[66][..], "33 indexes"),
            (&[2, 0x80][..], "truncated"),
        ] {
            let err = named(&f, bytes).unwrap_err();
            assert!(err.contains(reason), "{bytes:?}: {err}");
        }
        // The longest array accepted: 32 levels.
        let mut deep = vec![64];
        deep.extend([2u8; 32]);
        let err = named(&f, &deep).unwrap_err();
        assert!(err.contains("no nested message #1 in p.B.D"), "{err}");
    }
}
