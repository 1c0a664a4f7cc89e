//! What the Protobuf full decoder may build for a message, bounded by the
//! message's bytes before it becomes JSON.
//!
//! prost-reflect builds at most a few values per input byte: every field,
//! list item and map entry takes at least one byte (a packed item), a tag
//! and a length for a message, and nesting stops at prost's recursion
//! limit (100). The JSON conversion adds a value for every field without
//! presence that is unset (proto3 scalars, repeated fields, maps appear
//! with their default), so a message of F such fields costs F values
//! whatever its size: a repeated field of a 100-field message, each item
//! two bytes (tag, length 0), built 6.7 GB from 1 MB. [`check`] counts the
//! values the conversion would build, without building them:
//!
//! ```text
//! JSON values (fields shown, list items, map entries)  ≤  PROTO_VALUES_PER_BYTE × bytes + PROTO_FREE_VALUES
//! ```
//!
//! A message over it is poison with rule `limits`: the count depends on
//! its bytes and the policy's schema only, so every instance reaches it.

use prost_reflect::{DynamicMessage, ReflectMessage, Value as P};

use crate::policy::Invalid;

/// JSON values a message may build per byte of it.
pub(crate) const PROTO_VALUES_PER_BYTE: usize = 16;

/// JSON values any message may build beyond [`PROTO_VALUES_PER_BYTE`]:
/// room for a wide message with few fields set.
pub(crate) const PROTO_FREE_VALUES: usize = 4096;

/// The JSON values a message of `len` bytes may build.
pub(crate) fn value_budget(len: usize) -> usize {
    len.saturating_mul(PROTO_VALUES_PER_BYTE)
        .saturating_add(PROTO_FREE_VALUES)
}

/// Refuse (poison, rule `limits`) a decoded message of `len` bytes whose
/// JSON would hold more values than [`value_budget`] allows.
pub(crate) fn check(msg: &DynamicMessage, len: usize) -> Result<(), Invalid> {
    let budget = value_budget(len);
    let mut left = budget;
    if count(msg, &mut left) {
        return Ok(());
    }
    Err(Invalid::poison(
        "limits",
        format!(
            "Protobuf value would build more than {budget} JSON values (unset fields \
             shown with their defaults), over what its {len} bytes allow \
             ({PROTO_VALUES_PER_BYTE} per byte plus {PROTO_FREE_VALUES})"
        ),
    ))
}

/// Take one from `left`; `false` when it is spent.
fn take(left: &mut usize, n: usize) -> bool {
    match left.checked_sub(n) {
        Some(l) => {
            *left = l;
            true
        }
        None => false,
    }
}

/// Charge the values `message_to_json` builds for `msg` (the fields it
/// shows, as it chooses them) to `left`; `false` when they do not fit.
fn count(msg: &DynamicMessage, left: &mut usize) -> bool {
    let desc = msg.descriptor();
    for field in desc.fields() {
        if field.supports_presence() && !msg.has_field(&field) {
            continue;
        }
        if !take(left, 1) {
            return false;
        }
        let fits = match &*msg.get_field(&field) {
            P::Message(m) => count(m, left),
            P::List(items) => take(left, items.len()) && items.iter().all(|v| inner(v, left)),
            P::Map(m) => take(left, m.len()) && m.values().all(|v| inner(v, left)),
            _ => true,
        };
        if !fits {
            return false;
        }
    }
    true
}

/// A list item or map value: a message has fields of its own.
fn inner(v: &P, left: &mut usize) -> bool {
    match v {
        P::Message(m) => count(m, left),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::kafka::record::Record;
    use crate::policy::avro::bound::counting::peak_during;
    use crate::policy::{Class, PolicySet, Verdict};

    /// A raw policy on `Outer { repeated Wide items = 1; }`, `Wide` of 100
    /// int32 fields, with a rule on `/items` whole (the full decoder judges).
    fn wide_policy() -> PolicySet {
        let dir = tempfile::tempdir().expect("tempdir");
        let fields: String = (1..=100)
            .map(|i| format!("  int32 f{i} = {i};\n"))
            .collect();
        let proto = format!(
            "syntax = \"proto3\";\npackage w;\nmessage Wide {{\n{fields}}}\n\
             message Outer {{ repeated Wide items = 1; int32 n = 2; }}\n"
        );
        std::fs::write(dir.path().join("w.proto"), proto).expect("write");
        let text = format!(
            "policies:\n  - name: p\n    topics: [p]\n    value: {{format: protobuf, \
             wire: raw, schema: \"{}\", message: w.Outer}}\n    rules:\n      \
             - field: /n\n        max: 5\n",
            dir.path().join("w.proto").display()
        );
        PolicySet::parse(&text, Path::new("p.yaml")).expect("loads")
    }

    fn record(value: &[u8]) -> Record<'_> {
        Record {
            offset: 0,
            timestamp: 0,
            key: None,
            value: Some(value),
            headers: vec![],
        }
    }

    /// `n` empty `Wide` items: two bytes each.
    fn empty_items(n: usize) -> Vec<u8> {
        std::iter::repeat_n([0x0a, 0x00], n).flatten().collect()
    }

    #[test]
    fn empty_items_of_a_wide_message_are_poison_limits_in_bounded_memory() {
        let set = wide_policy();
        let p = set.for_topic("p").expect("policy");
        // 32 768 items, 64 KiB: 3.3 M JSON values, ~456 MB, before.
        let value = empty_items(32_768);
        let (v, peak) = peak_during(|| p.inner.decode_value("p", &value, 0));
        match v {
            Err(i) => assert_eq!((i.class, i.rule.as_str()), (Class::Poison, "limits")),
            Ok(_) => panic!("decoded"),
        }
        // prost-reflect's message (~100 B per item) and no JSON.
        assert!(peak < 16 << 20, "peak {peak} bytes");
        match p.judge(&record(&value), 0) {
            Verdict::Invalid(i) => assert_eq!(i.rule, "limits"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn wide_messages_within_the_bound_decode() {
        let set = wide_policy();
        let p = set.for_topic("p").expect("policy");
        // 101 values per 2-byte item; 16 per byte plus 4096: 32 n + 4096
        // ≥ 2 + 101 n (`items`, `n`, then items and their fields) up to
        // n = 59.
        assert!(p.judge(&record(&empty_items(59)), 0).is_valid());
        match p.judge(&record(&empty_items(60)), 0) {
            Verdict::Invalid(i) => assert_eq!(i.rule, "limits"),
            v => panic!("{v:?}"),
        }
        // Items carrying data: 1000 items of f1..f8 set (18 bytes each).
        let item: Vec<u8> = (1..=8u8).flat_map(|f| [f << 3, 7]).collect();
        let value: Vec<u8> = (0..1000)
            .flat_map(|_| [&[0x0a, item.len() as u8][..], &item].concat())
            .collect();
        let json = (p.inner.decode_value("p", &value, 0))
            .expect("valid")
            .expect("a value");
        assert_eq!(json["items"].as_array().map(Vec::len), Some(1000));
        assert_eq!(json["items"][999]["f8"], 7);
    }
}
