use super::*;

fn h(k: &str, v: &str) -> (String, Option<Bytes>) {
    (k.to_string(), Some(Bytes::from(v.to_string())))
}

fn view(n: &NewRecord) -> Record<'_> {
    n.as_record()
}

/// A diverted record whose producer forged antidote's headers, a whole
/// trailer included, and sent a duplicate and a null header of its own.
fn forged_originals() -> Vec<(String, Option<Bytes>)> {
    vec![
        h("trace", "a"),
        ("trace".to_string(), None),
        h("x-original-topic", "geo"),
        h("x-original-offset", "2"),
        h("x-error-class", "stale"),
        h(H_CONTEXT, "2 2"),
        h("trace", "b"),
    ]
}

fn framed(keys: &Keys, topic: &str, partition: i32) -> NewRecord {
    Seal::new(keys, topic, partition).frame(
        5,
        Some(Bytes::from_static(b"k")),
        Some(Bytes::from_static(b"v")),
        forged_originals(),
        vec![
            h("x-original-topic", "geo"),
            h("x-original-offset", "4"),
            h("x-error-class", "poison"),
        ],
    )
}

#[test]
fn a_producers_reserved_headers_stay_original_and_never_become_context() {
    let rec = framed(&Keys::none(), "geo.dlt", 0);
    let ctx = open(&view(&rec), "geo.dlt", 0, &Keys::none()).unwrap();
    assert_eq!(ctx.num("x-original-offset"), Some(4));
    assert_eq!(ctx.text("x-error-class"), Some("poison"));
    assert_eq!(ctx.format, FORMAT);
    assert!(!ctx.signed);
    let originals: Vec<(String, Option<Bytes>)> = ctx
        .originals
        .iter()
        .map(|h| {
            (
                String::from_utf8(h.key.to_vec()).unwrap(),
                h.value.map(Bytes::copy_from_slice),
            )
        })
        .collect();
    assert_eq!(originals, forged_originals(), "originals restored exactly");
}

#[test]
fn signed_records_verify_only_where_they_were_written_and_unchanged() {
    let keys = Keys::new(&["0123456789abcdef0123"], false);
    let rec = framed(&keys, "geo.dlt", 1);
    let ctx = open(&view(&rec), "geo.dlt", 1, &keys).unwrap();
    assert!(ctx.signed);
    // Copied to another partition or topic: refused.
    assert_eq!(
        open(&view(&rec), "geo.dlt", 0, &keys).unwrap_err(),
        Refusal::BadSignature
    );
    assert_eq!(
        open(&view(&rec), "other.dlt", 1, &keys).unwrap_err(),
        Refusal::BadSignature
    );
    // Any byte of the value, key, an original or a context header changed.
    let mut v = rec.clone();
    v.value = Some(Bytes::from_static(b"w"));
    assert_eq!(
        open(&view(&v), "geo.dlt", 1, &keys).unwrap_err(),
        Refusal::BadSignature
    );
    let mut o = rec.clone();
    o.headers[0].1 = Some(Bytes::from_static(b"z"));
    assert_eq!(
        open(&view(&o), "geo.dlt", 1, &keys).unwrap_err(),
        Refusal::BadSignature
    );
    let mut c = rec.clone();
    let at = c.headers.len() - 3;
    c.headers[at].1 = Some(Bytes::from_static(b"stale"));
    assert_eq!(
        open(&view(&c), "geo.dlt", 1, &keys).unwrap_err(),
        Refusal::BadSignature
    );
    // Another fleet's key: refused; a rotated-in second key still verifies.
    let other = Keys::new(&["another-secret-of-16+"], false);
    assert_eq!(
        open(&view(&rec), "geo.dlt", 1, &other).unwrap_err(),
        Refusal::BadSignature
    );
    let rotated = Keys::new(&["the-new-signing-key!", "0123456789abcdef0123"], false);
    assert!(open(&view(&rec), "geo.dlt", 1, &rotated).unwrap().signed);
}

#[test]
fn with_keys_unsigned_records_are_refused_unless_accepted() {
    let keys = Keys::new(&["0123456789abcdef0123"], false);
    let unsigned = framed(&Keys::none(), "geo.dlt", 0);
    assert_eq!(
        open(&view(&unsigned), "geo.dlt", 0, &keys).unwrap_err(),
        Refusal::Unsigned
    );
    let legacy = NewRecord {
        headers: vec![h("x-original-topic", "geo"), h("x-original-offset", "3")],
        ..Default::default()
    };
    assert_eq!(
        open(&view(&legacy), "geo.dlt", 0, &keys).unwrap_err(),
        Refusal::Unsigned
    );
    let migrating = Keys::new(&["0123456789abcdef0123"], true);
    assert!(open(&view(&unsigned), "geo.dlt", 0, &migrating).is_ok());
    assert_eq!(
        open(&view(&legacy), "geo.dlt", 0, &migrating)
            .unwrap()
            .num("x-original-offset"),
        Some(3)
    );
    // A plain record (no reserved name) is never refused: it has no context.
    let plain = NewRecord {
        headers: vec![h("trace", "a")],
        ..Default::default()
    };
    assert!(open(&view(&plain), "geo", 0, &keys).unwrap().is_empty());
}

#[test]
fn format1_records_are_refused_with_a_reserved_name_twice_or_unknown() {
    // What the forgery of e068479 produced: the producer's offset first.
    let forged = NewRecord {
        headers: vec![
            h("x-original-topic", "geo"),
            h("x-original-partition", "0"),
            h("x-original-offset", "2"),
            h("x-original-topic", "geo"),
            h("x-original-partition", "0"),
            h("x-original-offset", "4"),
        ],
        ..Default::default()
    };
    let none = Keys::none();
    assert_eq!(
        open(&view(&forged), "geo.dlt", 0, &none).unwrap_err(),
        Refusal::Duplicate
    );
    let unknown = NewRecord {
        headers: vec![h("x-original-offset", "4"), h("x-antidote-whatever", "1")],
        ..Default::default()
    };
    assert_eq!(
        open(&view(&unknown), "geo.dlt", 0, &none).unwrap_err(),
        Refusal::Unexpected
    );
}

#[test]
fn malformed_frames_are_refused() {
    let none = Keys::none();
    let rec = |hs: Vec<(String, Option<Bytes>)>| NewRecord {
        headers: hs,
        ..Default::default()
    };
    for (hs, why) in [
        (vec![h(H_CONTEXT, "2 3")], Refusal::BadFrame),
        (
            vec![h("x-attempt", "1"), h(H_CONTEXT, "3 1")],
            Refusal::BadFrame,
        ),
        (
            vec![h("x-attempt", "1"), h(H_CONTEXT, "2 x")],
            Refusal::BadFrame,
        ),
        (
            vec![h("x-attempt", "1"), h(H_CONTEXT, "2 999")],
            Refusal::BadFrame,
        ),
        (
            vec![h("x-attempt", "1"), h(H_SIGNATURE, "AAAA")],
            Refusal::BadFrame,
        ),
        (
            vec![
                h("x-attempt", "1"),
                h("x-attempt", "2"),
                h(H_CONTEXT, "2 2"),
            ],
            Refusal::Duplicate,
        ),
        (
            vec![h("trace", "1"), h(H_CONTEXT, "2 1")],
            Refusal::Unexpected,
        ),
    ] {
        assert_eq!(
            open(&view(&rec(hs.clone())), "t", 0, &none).unwrap_err(),
            why,
            "{hs:?}"
        );
    }
    // A null trailer value.
    let null = rec(vec![(H_CONTEXT.to_string(), None)]);
    assert_eq!(
        open(&view(&null), "t", 0, &none).unwrap_err(),
        Refusal::BadFrame
    );
}

#[test]
fn reserved_names_cover_every_context_header_antidote_writes() {
    for n in FORMAT1_NAMES.iter().chain([&H_CONTEXT, &H_SIGNATURE]) {
        assert!(is_reserved(n.as_bytes()), "{n}");
    }
    assert!(!is_reserved(b"x-request-id"));
    assert!(!is_reserved(b"trace"));
}
