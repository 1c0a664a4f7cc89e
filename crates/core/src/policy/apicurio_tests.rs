//! Apicurio's own framings (`wire: apicurio-headers`, `apicurio-8byte`,
//! `apicurio-4byte`):
//! the id's namespace, the classes of a missing header, an unknown id, a
//! registry that has not answered and a malformed frame, and Apicurio's
//! Protobuf type reference.

use std::sync::Arc;

use super::formats::compile_schema as compile;
use super::registry::ApicurioId;
use super::registry_tests::{avro_datum, invalid, set, NOW, TRIGGER_AVSC};
use super::*;
use crate::kafka::record::{Header, Record};

fn policy(wire: &str, extra: &str) -> String {
    format!(
        r#"
policies:
  - name: apicurio
    topics: ["geo.a"]
    value: {{ format: avro, registry: true, wire: {wire}{extra} }}
    rules:
      - coordinates: {{ lat: /lat, lon: /lon }}
"#
    )
}

fn with_header<'a>(value: &'a [u8], name: &'a str, id: &'a [u8]) -> Record<'a> {
    Record {
        offset: 1,
        timestamp: NOW,
        key: None,
        value: Some(value),
        headers: vec![Header {
            key: name.as_bytes(),
            value: Some(id),
        }],
    }
}

fn judge(set: &PolicySet, r: &Record<'_>) -> Verdict {
    set.for_topic("geo.a")
        .expect("policy")
        .judge_in("geo.a", r, NOW)
}

#[test]
fn a_content_id_header_names_the_schema_in_its_own_namespace() {
    let cache = SchemaCache::new();
    let s = set(&policy("apicurio-headers", ""), &cache);
    let datum = avro_datum(1.0, None);
    let id = 5u64.to_be_bytes();
    let r = with_header(&datum, "apicurio.value.contentId", &id);
    // Not asked yet: held, and the native id is wanted (not Confluent's 5).
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    assert_eq!(
        cache.take_wants(),
        vec![Want::Apicurio(ApicurioId::Content, 5)]
    );
    // Confluent's id 5 and Apicurio's global id 5 are other schemas.
    cache.put_schema(5, compile(None, TRIGGER_AVSC, &[]));
    cache.put_apicurio(
        ApicurioId::Global,
        5,
        Some(compile(None, TRIGGER_AVSC, &[])),
        NOW,
    );
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    cache.put_apicurio(
        ApicurioId::Content,
        5,
        Some(compile(None, TRIGGER_AVSC, &[])),
        NOW,
    );
    assert!(judge(&s, &r).is_valid());
    let bad = avro_datum(95.0, None);
    assert_eq!(
        invalid(judge(
            &s,
            &with_header(&bad, "apicurio.value.contentId", &id)
        ))
        .rule,
        "coordinates"
    );
    // The registry said no such id: unknown.
    cache.put_apicurio(ApicurioId::Content, 6, None, NOW);
    let six = 6u64.to_be_bytes();
    let i = invalid(judge(
        &s,
        &with_header(&datum, "apicurio.value.contentId", &six),
    ));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Unknown, "schema-id"),
        "{i:?}"
    );
    assert!(i.reason.contains("Apicurio content id 6"), "{}", i.reason);
}

#[test]
fn a_missing_header_is_unknown_and_a_malformed_one_poison() {
    let cache = SchemaCache::new();
    let s = set(
        &policy("apicurio-headers", ", id: global, id_header: sid"),
        &cache,
    );
    let datum = avro_datum(1.0, None);
    let r = Record {
        value: Some(&datum),
        ..with_header(&datum, "apicurio.value.globalId", &[0; 8])
    };
    let i = invalid(judge(&s, &r));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Unknown, "schema-id"),
        "{i:?}"
    );
    assert!(i.reason.contains("no header sid"), "{}", i.reason);
    let i = invalid(judge(&s, &with_header(&datum, "sid", &[0, 1, 2])));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Poison, "decode"),
        "{i:?}"
    );
    assert!(cache.take_wants().is_empty());
    // The last header of the name counts, as Apicurio reads it.
    let mut r = with_header(&datum, "sid", &[9; 3]);
    let seven = 7u64.to_be_bytes();
    r.headers.push(Header {
        key: b"sid",
        value: Some(&seven),
    });
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    assert_eq!(
        cache.take_wants(),
        vec![Want::Apicurio(ApicurioId::Global, 7)]
    );
}

#[test]
fn the_8_byte_framing_reads_a_global_id_after_magic_byte_0() {
    let cache = SchemaCache::new();
    let s = set(&policy("apicurio-8byte", ""), &cache);
    cache.put_apicurio(
        ApicurioId::Global,
        300,
        Some(compile(None, TRIGGER_AVSC, &[])),
        NOW,
    );
    let mut v = vec![0];
    v.extend_from_slice(&300u64.to_be_bytes());
    v.extend_from_slice(&avro_datum(2.0, None));
    let r = Record {
        value: Some(&v),
        ..with_header(&v, "x", b"")
    };
    assert!(judge(&s, &r).is_valid());
    // Confluent's 4-byte framing of the same datum reads another id.
    let short = [0u8, 0, 0, 1, 44];
    let i = invalid(judge(
        &s,
        &Record {
            value: Some(&short),
            ..r.clone()
        },
    ));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Poison, "decode"),
        "{i:?}"
    );
    // Not Apicurio's frame at all (a producer without a serializer).
    let raw = b"\x01raw bytes";
    let i = invalid(judge(
        &s,
        &Record {
            value: Some(raw),
            ..r.clone()
        },
    ));
    assert_eq!(i.class, Class::Poison, "{i:?}");
}

/// 3.x's default (`Default4ByteIdHandler`): Confluent's 5-byte head, the
/// id a content id, and a Protobuf value's `Ref` where Confluent's indexes
/// would be.
#[test]
fn the_4_byte_framing_reads_a_content_id_and_apicurio_s_protobuf_ref() {
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: apicurio
    topics: ["geo.a"]
    value: { format: protobuf, registry: true, wire: apicurio-4byte }
    rules:
      - field: /lat
        max: 90
"#;
    let s = set(yaml, &cache);
    // `Ref { name: "T" }`, then `T { lat: 3.0 }`, after magic 0 and id 9.
    let mut v = vec![0, 0, 0, 0, 9, 3, 0x0a, 1, b'T', 0x09];
    v.extend_from_slice(&3.0f64.to_le_bytes());
    let r = Record {
        value: Some(&v),
        ..with_header(&v, "x", b"")
    };
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    assert_eq!(
        cache.take_wants(),
        vec![Want::Apicurio(ApicurioId::Content, 9)]
    );
    let proto = "syntax = \"proto3\"; package geo; message T { double lat = 1; }";
    // Confluent's id 9 is another namespace: still not known.
    cache.put_schema(9, compile(Some("PROTOBUF"), proto, &[]));
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    assert_eq!(
        cache.take_wants(),
        vec![Want::Apicurio(ApicurioId::Content, 9)]
    );
    cache.put_apicurio(
        ApicurioId::Content,
        9,
        Some(compile(Some("PROTOBUF"), proto, &[])),
        NOW,
    );
    assert!(judge(&s, &r).is_valid());
    // Confluent's indexes where the `Ref` belongs, and a short frame: poison.
    for bad in [&[0u8, 0, 0, 0, 9, 0, 0x09, 1][..], &[0, 0, 0][..]] {
        let i = invalid(judge(
            &s,
            &Record {
                value: Some(bad),
                ..r.clone()
            },
        ));
        assert_eq!(
            (i.class, i.rule.as_str()),
            (Class::Poison, "decode"),
            "{i:?}"
        );
    }
    // `id: global` reads the same bytes as a global id.
    let s = set(
        &yaml.replace("apicurio-4byte", "apicurio-4byte, id: global"),
        &cache,
    );
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    assert_eq!(
        cache.take_wants(),
        vec![Want::Apicurio(ApicurioId::Global, 9)]
    );
}

#[test]
fn apicurio_keys_are_load_errors_where_they_do_not_apply() {
    let cache = SchemaCache::new();
    for (yaml, want) in [
        (
            policy("confluent", ", id: global"),
            "value.id: applies to Apicurio's wires",
        ),
        (
            policy("apicurio-8byte", ", id_header: x"),
            "value.id_header: applies to `wire: apicurio-headers`",
        ),
        (
            policy("apicurio-headers", ", subject: \"{topic}-value\""),
            "value.subject: applies to `wire: confluent`",
        ),
        (
            policy("apicurio-4byte", ", subject: \"{topic}-value\""),
            "value.subject: applies to `wire: confluent`",
        ),
    ] {
        let e = PolicySet::parse_with(&yaml, std::path::Path::new("/tmp/a.yaml"), &cache)
            .expect_err("refused");
        assert!(e[0].message.contains(want), "{e:?}");
        assert!(e[0].line > 1, "placed: {e:?}");
    }
    let file = "policies:\n  - name: f\n    topics: [t]\n    value: { format: avro, wire: apicurio-8byte, schema: x.avsc }\n";
    let e = PolicySet::parse_with(file, std::path::Path::new("/tmp/a.yaml"), &cache)
        .expect_err("refused");
    assert!(
        e.iter()
            .any(|e| e.message.contains("need `registry: true`")),
        "{e:?}"
    );
}

#[test]
fn apicurio_protobuf_values_start_with_a_type_reference() {
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: apicurio
    topics: ["geo.a"]
    value: { format: protobuf, registry: true, wire: apicurio-headers }
    rules:
      - field: /lat
        max: 90
"#;
    let s = set(yaml, &cache);
    let proto = "syntax = \"proto3\"; package geo; message Other { string x = 1; } message T { double lat = 1; }";
    cache.put_apicurio(
        ApicurioId::Content,
        1,
        Some(compile(Some("PROTOBUF"), proto, &[])),
        NOW,
    );
    let value = |name: &str, lat: f64| {
        let mut r = vec![0x0a, name.len() as u8];
        r.extend_from_slice(name.as_bytes());
        let mut v = vec![r.len() as u8];
        v.extend_from_slice(&r);
        v.push(0x09);
        v.extend_from_slice(&lat.to_le_bytes());
        v
    };
    let id = 1u64.to_be_bytes();
    let ok = value("T", 3.0);
    assert!(judge(&s, &with_header(&ok, "apicurio.value.contentId", &id)).is_valid());
    let far = value("T", 95.0);
    assert_eq!(
        invalid(judge(
            &s,
            &with_header(&far, "apicurio.value.contentId", &id)
        ))
        .rule,
        "range:/lat"
    );
    let none = value("Nope", 3.0);
    let i = invalid(judge(
        &s,
        &with_header(&none, "apicurio.value.contentId", &id),
    ));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Poison, "schema"),
        "{i:?}"
    );
    let i = invalid(judge(
        &s,
        &with_header(&[0xff, 1], "apicurio.value.contentId", &id),
    ));
    assert_eq!(
        (i.class, i.rule.as_str()),
        (Class::Poison, "decode"),
        "{i:?}"
    );
}

#[test]
fn keys_read_apicurio_key_headers() {
    let cache = SchemaCache::new();
    let yaml = r#"
policies:
  - name: apicurio
    topics: ["geo.a"]
    key: { format: avro, registry: true, wire: apicurio-headers }
"#;
    let s = set(yaml, &cache);
    let key = avro_datum(1.0, None);
    let id = 3u64.to_be_bytes();
    let r = Record {
        key: Some(&key),
        ..with_header(b"v", "apicurio.key.contentId", &id)
    };
    assert_eq!(invalid(judge(&s, &r)).class, Class::Transient);
    assert_eq!(
        cache.take_wants(),
        vec![Want::Apicurio(ApicurioId::Content, 3)]
    );
    let _ = Arc::clone(&cache);
}
