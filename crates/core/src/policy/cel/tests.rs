//! CEL conditions: parsing, types, CEL's semantics (cross-type numbers,
//! checked arithmetic, commutative `&&`/`||`), every refused construct
//! and its position, and properties against a reference evaluator.

use serde_json::{json, Value};

use super::compile::render;
use super::{compile, CompileError, Resolver, Slots, Step, Type, Val};

/// A record for the tests: a decoded value as `message`, headers as a
/// map only indexed, `key` and `timestamp`; every path gets the next
/// slot, typed by `types` when it names the path (else `dyn`).
#[derive(Default)]
struct Record {
    message: Value,
    headers: Vec<(String, Vec<u8>)>,
    types: Vec<(&'static str, Type)>,
    paths: Vec<(String, Vec<Step>)>,
}

impl Resolver for Record {
    fn resolve(&mut self, variable: &str, steps: &[Step]) -> Result<(u32, Type), String> {
        match (variable, steps) {
            ("message", _) | ("key" | "timestamp", []) | ("headers", [Step::Key(_)]) => {}
            ("headers", _) => return Err("headers can only be indexed: headers[\"name\"]".into()),
            _ => return Err(format!("undeclared reference to `{variable}`")),
        }
        let written = render(variable, steps);
        let t = self
            .types
            .iter()
            .find(|(p, _)| *p == written)
            .map_or(Type::Dyn, |(_, t)| *t);
        let slot = match self
            .paths
            .iter()
            .position(|(v, s)| v == variable && s == steps)
        {
            Some(i) => i,
            None => {
                self.paths.push((variable.to_string(), steps.to_vec()));
                self.paths.len() - 1
            }
        };
        Ok((slot as u32, t))
    }
}

impl Slots for Record {
    fn get(&self, slot: u32) -> Option<Val<'_>> {
        let (variable, steps) = self.paths.get(slot as usize)?;
        match variable.as_str() {
            "message" => {
                let mut v = &self.message;
                for s in steps {
                    v = match (v, s) {
                        (Value::Object(m), Step::Key(k)) => m.get(k)?,
                        (Value::Array(a), Step::Index(i)) => a.get(*i as usize)?,
                        _ => return None,
                    };
                }
                Some(Val::of_json(v))
            }
            "headers" => {
                let Some(Step::Key(k)) = steps.first() else {
                    return None;
                };
                let (_, v) = self.headers.iter().find(|(h, _)| h == k)?;
                Some(Val::Bytes(v))
            }
            "key" => Some(Val::Bytes(b"device-1")),
            "timestamp" => Some(Val::Int(1_700_000_000_000)),
            _ => None,
        }
    }
}

fn record(message: Value) -> Record {
    Record {
        message,
        headers: vec![("trace-id".into(), b"abc".to_vec())],
        ..Record::default()
    }
}

/// The condition's answer on `message`, or its error as explained.
fn judge(expr: &str, message: Value) -> Result<bool, String> {
    let mut r = record(message);
    let p = compile(expr, &mut r).map_err(|e| format!("compile: {e}"))?;
    p.eval(&r).map_err(|e| p.explain(&e))
}

fn holds(expr: &str, message: Value) -> bool {
    match judge(expr, message) {
        Ok(b) => b,
        Err(e) => panic!("`{expr}`: {e}"),
    }
}

/// The compile error of `expr` (all fields `dyn`).
fn refused(expr: &str) -> CompileError {
    match compile(expr, &mut record(json!({}))) {
        Ok(p) => panic!("`{expr}` compiled: {p:?}"),
        Err(e) => e,
    }
}

fn geo() -> Value {
    json!({
        "transition": "DWELL", "dwell_seconds": 5, "enter_time": 1000, "exit_time": 2000,
        "speed": 2.5, "big": 18446744073709551615u64, "neg": -3, "name": "héllo",
        "tags": ["a", "b"], "attrs": {"k": 1}, "none": null, "odd-key": 7,
        "nested": {"inner": {"x": 1}},
    })
}

#[test]
fn two_field_conditions() {
    assert!(holds("message.exit_time > message.enter_time", geo()));
    assert!(!holds("message.exit_time < message.enter_time", geo()));
    let c = r#"message.transition != "DWELL" || message.dwell_seconds > 0"#;
    assert!(holds(c, geo()));
    assert!(!holds(
        c,
        json!({"transition": "DWELL", "dwell_seconds": 0})
    ));
    assert!(
        holds(c, json!({"transition": "ENTER"})),
        "|| decides on its left"
    );
}

#[test]
fn literals() {
    for e in [
        "0x1F == 31",
        "31u == 0x1fU",
        "1e3 == 1000.0",
        ".5 == 0.5",
        "-9223372036854775808 < 0",
        "'a' == \"a\"",
        r#""\x41\u0042\U00000043\101" == "ABCA""#,
        r#"r"\n" != "\n" && size(r"\n") == 2"#,
        "'''a'b''' == \"a'b\"",
        r#"b"\377" != b"ÿ" && size(b"\377") == 1 && size(b"ÿ") == 2"#,
        r#""\303\277" == "Ã¿""#,
        "true != false && null == null",
        "// a comment\n true",
    ] {
        assert!(holds(e, json!({})), "{e}");
    }
}

#[test]
fn precedence_and_associativity() {
    for e in [
        "1 + 2 * 3 == 7",
        "(1 + 2) * 3 == 9",
        "10 - 4 - 3 == 3",
        "2 * 3 % 4 == 2",
        "!false && true",
        "true || false && false",
        "(false ? 1 : true ? 2 : 3) == 2",
        "-(-1) == 1",
        "--1 == 1",
        "1 < 2 == true",
    ] {
        assert!(holds(e, json!({})), "{e}");
    }
}

#[test]
fn numbers_compare_across_types_exactly() {
    for e in [
        "1 == 1.0",
        "1u == 1",
        "-1 < 1u",
        "1u > -1",
        "9223372036854775807 < 9223372036854775808.0",
        "9223372036854775807 != 9223372036854775808.0",
        "18446744073709551615u < 18446744073709551616.0",
        "2 > 1.5 && 1 < 1.5 && 1.5 < 2u",
        "message.big > message.neg",
        "message.speed > message.dwell_seconds / 5",
        "2 in [1, 2.0]",
    ] {
        assert!(holds(e, geo()), "{e}");
    }
    assert!(
        !holds("0.0 / 0.0 < 1 || 0.0 / 0.0 >= 1", json!({})),
        "NaN orders false"
    );
}

#[test]
fn equality_across_other_types_is_false() {
    for e in [
        "1 == '1'",
        "null == 0",
        "b'a' == 'a'",
        "message.tags == message.attrs",
        "true == 1",
    ] {
        assert!(!holds(e, geo()), "{e}");
    }
    assert!(holds(
        "message.none == null && message.tags == message.tags",
        geo()
    ));
}

#[test]
fn arithmetic_is_checked() {
    for e in [
        "-7 / 2 == -3",
        "-7 % 2 == -1",
        "5u - 2u == 3u",
        "1.0 / 0.0 > 1e308",
        "7 % 3 == 1",
    ] {
        assert!(holds(e, json!({})), "{e}");
    }
    for (e, why) in [
        ("9223372036854775807 + 1 > 0", "integer overflow"),
        ("-9223372036854775808 - 1 < 0", "integer overflow"),
        ("(-9223372036854775807 - 1) / -1 > 0", "integer overflow"),
        ("(-9223372036854775807 - 1) % -1 == 0", "integer overflow"),
        ("-(-9223372036854775807 - 1) > 0", "integer overflow"),
        ("0u - 1u > 0u", "integer overflow"),
        ("1 / 0 == 0", "division by zero"),
        ("1 % 0 == 0", "modulus by zero"),
        (
            "message.dwell_seconds + message.speed > 0.0",
            "no overload of `+` for int and double",
        ),
        ("message.speed % 2.0 > 0.0", "no overload of `%` for double"),
    ] {
        let got = judge(e, geo()).expect_err(e);
        assert!(got.contains(why), "{e}: {got}");
    }
}

#[test]
fn and_or_absorb_errors_from_either_side() {
    let m = json!({"a": 1});
    assert!(holds("message.missing > 1 || true", m.clone()));
    assert!(holds("true || message.missing > 1", m.clone()));
    assert!(!holds("message.missing > 1 && false", m.clone()));
    assert!(!holds("false && message.missing > 1", m.clone()));
    assert!(
        !holds("message.a && false", m.clone()),
        "a non-bool is an error, absorbed"
    );
    for e in [
        "message.missing > 1 && true",
        "true && message.missing > 1",
        "message.missing > 1 || false",
        "false || message.missing",
        "!message.missing",
        "message.missing ? true : false",
        "message.a ? true : false",
        "message.a",
    ] {
        assert!(judge(e, m.clone()).is_err(), "{e}");
    }
    let e = judge("message.missing || message.a", m).expect_err("both errors");
    assert_eq!(
        e, "column 1: no such field message.missing",
        "the first error is named"
    );
}

#[test]
fn ternary_takes_one_branch() {
    assert!(holds(
        "message.a > 0 ? true : message.missing",
        json!({"a": 1})
    ));
    assert!(holds(
        "message.a > 0 ? message.missing : true",
        json!({"a": 0})
    ));
}

#[test]
fn fields_paths_and_presence() {
    for e in [
        "message.nested.inner.x == 1",
        "message[\"odd-key\"] == 7",
        "message.tags[1] == 'b'",
        "message['nested']['inner'].x == 1",
        "has(message.none) && has(message.nested.inner)",
        "!has(message.missing) && !has(message.missing.deeper)",
        "'k' in message.attrs && !('x' in message.attrs)",
        "'a' in message.tags && !('c' in message.tags)",
        "message.transition in ['ENTER', 'DWELL']",
        "size(message.name) == 5 && message.name.size() == 5 && size(message.tags) == 2",
        "size(message.attrs) == 1 && size(b'ab') == 2",
        "message.name.startsWith('hé') && message.name.endsWith('lo') && message.name.contains('ll')",
        "message.name.matches('^h.llo$') && matches(message.transition, 'WEL')",
        "int('12') == 12 && uint('7') == 7u && double('2.5') == 2.5",
        "int(-1.5) == -1 && uint(3.9) == 3u && double(message.big) > 1e19",
        "double(message.dwell_seconds) + message.speed == 7.5",
        "dyn(message.a) == null || true",
    ] {
        assert!(holds(e, geo()), "{e}");
    }
    for (e, why) in [
        (
            "message.missing == 1",
            "column 1: no such field message.missing",
        ),
        (
            "1 == message.nested.nope",
            "column 6: no such field message.nested.nope",
        ),
        ("message.tags[5] == 1", "no such field message.tags[5]"),
        (
            "message.name > 1",
            "column 14: no overload of `>` for string and int",
        ),
        ("uint(-1) == 1u", "`uint`: integer overflow or out of range"),
        ("int(1e19) == 1", "integer overflow"),
        ("int('x') == 1", "`int()`: not a int in text"),
        (
            "size(message.dwell_seconds) == 1",
            "no overload of `size` for int",
        ),
        (
            "message.name.contains(message.dwell_seconds)",
            "no overload of `contains` for int",
        ),
        ("5 in message.name", "no overload of `in` for string"),
    ] {
        let got = judge(e, geo()).expect_err(e);
        assert!(got.contains(why), "{e}: {got}");
    }
}

#[test]
fn key_headers_and_timestamp() {
    for e in [
        "headers['trace-id'] == b'abc'",
        "'trace-id' in headers && !('other' in headers)",
        "has(headers.other) == false",
        "key == b'device-1' && timestamp > 0",
        "headers['trace-id'] != 'abc'",
    ] {
        assert!(holds(e, json!({})), "{e}");
    }
    assert!(judge("headers.other == b''", json!({})).is_err());
}

#[test]
fn known_types_are_checked_at_load() {
    let mut r = record(json!({}));
    r.types = vec![
        ("message.name", Type::String),
        ("message.n", Type::Int),
        ("message.d", Type::Double),
    ];
    let cases = [
        (
            "message.name > 5",
            14,
            "no overload of `>` for string and int",
        ),
        (
            "message.n + message.d > 1.0",
            11,
            "no overload of `+` for int and double",
        ),
        (
            "message.name.startsWith(1)",
            25,
            "expected string, found int",
        ),
        (
            "size(message.n) > 0",
            6,
            "expected string or bytes or list or map, found int",
        ),
        ("message.n + 1", 11, "the condition is int, not bool"),
        ("-message.name == 1", 1, "no overload of `-` for string"),
        ("!message.n", 2, "expected a bool, found int"),
        ("message.n % message.d > 0.0", 11, "no overload of `%`"),
    ];
    for (e, column, why) in cases {
        let err = compile(e, &mut r).expect_err(e);
        assert!(err.message.contains(why), "{e}: {err}");
        assert_eq!(err.column, column, "{e}: {err}");
    }
    assert!(compile("message.n + 1 > message.d", &mut r).is_ok());
}

#[test]
fn refused_constructs_name_why_and_where() {
    let cases: &[(&str, usize, &str)] = &[
        ("message.tags.all(t, t != '')", 14, "comprehension macros"),
        (
            "message.tags.exists(t, t == 'a')",
            14,
            "comprehension macros",
        ),
        (
            "message.tags.exists_one(t, t == 'a')",
            14,
            "comprehension macros",
        ),
        (
            "message.tags.map(t, t).size() > 0",
            14,
            "comprehension macros",
        ),
        (
            "message.tags.filter(t, true).size() > 0",
            14,
            "comprehension macros",
        ),
        (
            "timestamp(message.t) > timestamp('2024-01-01T00:00:00Z')",
            1,
            "compare epoch numbers",
        ),
        (
            "duration('1h') > duration('1m')",
            1,
            "timestamps and durations",
        ),
        ("string(message.n) == '1'", 1, "conversion is not supported"),
        ("type(message.n) == int", 1, "conversion is not supported"),
        ("frobnicate(message.n)", 1, "unknown function `frobnicate`"),
        (
            "message.n.startsWith()",
            11,
            "`startsWith` cannot be called as a method",
        ),
        (
            "size(1, 2) == 1",
            1,
            "cannot be called with these arguments",
        ),
        ("{'a': 1}.size() == 1", 1, "map literals"),
        ("T{a: 1} == T{a: 1}", 2, "message construction"),
        (".message.a == 1", 1, "root scope"),
        (
            "[1, 2] == [1, 2]",
            1,
            "list literal is supported only after `in`",
        ),
        (
            "message.a[message.i] == 1",
            11,
            "an index must be a string or a non-negative integer",
        ),
        ("[1][0] == 1", 1, "fields can be selected from"),
        ("size(message.s).x == 1", 1, "fields can be selected from"),
        ("foo.bar == 1", 1, "undeclared reference to `foo`"),
        ("message.s + 'x' == 'ax'", 11, "concatenation"),
        ("'a' < 1", 5, "no overload of `<` for string and int"),
        ("1 + 1", 3, "the condition is int, not bool"),
        (
            "message.s.matches(message.p)",
            19,
            "must be a string literal",
        ),
        ("message.s.matches('(')", 19, "invalid pattern"),
        ("if == 1", 1, "reserved word"),
        ("'abc", 1, "unterminated string"),
        ("'a\\qb' == ''", 3, "unknown escape"),
        ("9223372036854775808 > 0", 1, "integer literal out of range"),
        (
            "18446744073709551616u > 0u",
            1,
            "integer literal out of range",
        ),
        ("1 == 1 )", 8, "expected the end"),
        ("(1 == 1", 8, "expected `)`"),
        ("1 ==", 5, "ends too early"),
        ("1 # 2", 3, "unexpected character `#`"),
        ("has(message)", 5, "has() needs a field"),
        ("true ? 1 : 2", 6, "the condition is"),
        ("1 ? true : false", 1, "expected a bool, found int"),
    ];
    for (e, column, why) in cases {
        let err = refused(e);
        assert!(err.message.contains(why), "{e}: {err}");
        assert_eq!(err.column, *column, "{e}: {err}");
    }
}

#[test]
fn size_limits_are_refused_at_load() {
    let long = format!("message.a == '{}'", "x".repeat(super::MAX_LEN));
    assert!(refused(&long).message.contains("over 4096 bytes"));
    let many = vec!["message.a == 1"; 70].join(" || ");
    assert!(
        refused(&many).message.contains("more than 200 terms"),
        "{}",
        refused(&many)
    );
    let deep = format!("{}true{}", "(".repeat(40), ")".repeat(40));
    assert!(refused(&deep)
        .message
        .contains("nested more than 32 levels"));
    let deep_not = format!("{}true", "!".repeat(40));
    assert!(refused(&deep_not)
        .message
        .contains("nested more than 32 levels"));
    // What CEL requires an implementation to take: 32 terms of `||`, a
    // list of 32, nesting just under the limit.
    let wide = vec!["message.a == 1"; 32].join(" || ");
    assert!(compile(&wide, &mut record(json!({}))).is_ok());
    let list = (0..32)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    assert!(holds(&format!("31 in [{list}]"), json!({})));
    let nested = format!("{}true{}", "(".repeat(25), ")".repeat(25));
    assert!(holds(&nested, json!({})));
}

#[test]
fn columns_count_characters_not_bytes() {
    let err = refused("'héllo' == 1 && frob()");
    assert_eq!(err.column, 17, "{err}");
    let p = {
        let mut r = record(json!({}));
        compile("'é' == 'é' && message.x == 1", &mut r).expect("compiles")
    };
    let e = p.eval(&record(json!({}))).expect_err("missing");
    assert_eq!(p.explain(&e), "column 15: no such field message.x");
}

mod properties {
    //! Random arithmetic and logic over small integers, printed as CEL
    //! text, compiled and judged; a reference evaluator in `i128` says
    //! what CEL must answer (overflow and division by zero as errors,
    //! `&&`/`||` absorbing an error when the other side decides).

    use proptest::prelude::*;
    use serde_json::json;

    use super::judge;

    #[derive(Debug, Clone)]
    enum E {
        Int(i64),
        Missing,
        Arith(&'static str, Box<E>, Box<E>),
        Less(Box<E>, Box<E>),
        And(Box<E>, Box<E>),
        Or(Box<E>, Box<E>),
        Not(Box<E>),
        Cond(Box<E>, Box<E>, Box<E>),
    }

    /// `None`: a CEL error. Ints and bools as i128 (bools 0/1 tagged).
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum V {
        I(i64),
        B(bool),
    }

    fn reference(e: &E) -> Option<V> {
        Some(match e {
            E::Int(i) => V::I(*i),
            E::Missing => return None,
            E::Arith(op, a, b) => {
                let (V::I(x), V::I(y)) = (reference(a)?, reference(b)?) else {
                    return None;
                };
                let (x, y) = (i128::from(x), i128::from(y));
                let r = match *op {
                    "+" => x + y,
                    "-" => x - y,
                    "*" => x * y,
                    "/" if y != 0 => x / y,
                    // i64::MIN % -1 overflows in CEL (cel-go's
                    // modInt64Checked), though the i128 result fits.
                    "%" if y != 0 && !(x == i128::from(i64::MIN) && y == -1) => x % y,
                    _ => return None,
                };
                V::I(i64::try_from(r).ok()?)
            }
            E::Less(a, b) => match (reference(a)?, reference(b)?) {
                (V::I(x), V::I(y)) => V::B(x < y),
                (V::B(x), V::B(y)) => V::B(!x & y),
                _ => return None,
            },
            E::And(a, b) | E::Or(a, b) => {
                let decides = matches!(e, E::Or(..));
                let (x, y) = (reference(a), reference(b));
                if x == Some(V::B(decides)) || y == Some(V::B(decides)) {
                    V::B(decides)
                } else {
                    match (x?, y?) {
                        (V::B(_), V::B(_)) => V::B(!decides),
                        _ => return None,
                    }
                }
            }
            E::Not(a) => match reference(a)? {
                V::B(b) => V::B(!b),
                _ => return None,
            },
            E::Cond(c, y, n) => match reference(c)? {
                V::B(true) => reference(y)?,
                V::B(false) => reference(n)?,
                _ => return None,
            },
        })
    }

    fn text(e: &E) -> String {
        match e {
            // Of unknown type, so that no tree is refused at load.
            E::Int(i) => format!("dyn({i})"),
            E::Missing => "message.missing".into(),
            E::Arith(op, a, b) => format!("({} {op} {})", text(a), text(b)),
            E::Less(a, b) => format!("dyn({} < {})", text(a), text(b)),
            E::And(a, b) => format!("dyn({} && {})", text(a), text(b)),
            E::Or(a, b) => format!("dyn({} || {})", text(a), text(b)),
            E::Not(a) => format!("dyn(!{})", text(a)),
            E::Cond(c, y, n) => format!("({} ? {} : {})", text(c), text(y), text(n)),
        }
    }

    fn expr() -> impl Strategy<Value = E> {
        let leaf = prop_oneof![
            prop_oneof![any::<i64>(), -3i64..3, Just(i64::MAX), Just(i64::MIN)].prop_map(E::Int),
            Just(E::Missing),
        ];
        leaf.prop_recursive(5, 40, 3, |inner| {
            let op = prop_oneof![Just("+"), Just("-"), Just("*"), Just("/"), Just("%")];
            let b = || inner.clone().prop_map(Box::new);
            prop_oneof![
                (op, b(), b()).prop_map(|(o, a, c)| E::Arith(o, a, c)),
                (b(), b()).prop_map(|(a, c)| E::Less(a, c)),
                (b(), b()).prop_map(|(a, c)| E::And(a, c)),
                (b(), b()).prop_map(|(a, c)| E::Or(a, c)),
                b().prop_map(E::Not),
                (b(), b(), b()).prop_map(|(c, y, n)| E::Cond(c, y, n)),
            ]
        })
    }

    proptest! {
        #[test]
        fn agrees_with_the_reference(e in expr()) {
            let text = text(&e);
            let got = judge(&format!("dyn({text}) == true"), json!({}));
            if let Err(msg) = &got {
                prop_assert!(!msg.starts_with("compile"), "{}: {}", text, msg);
            }
            let want = match reference(&e) {
                Some(V::B(b)) => Some(b),
                Some(V::I(_)) => Some(false),
                None => None,
            };
            prop_assert_eq!(got.ok(), want, "{}", text);
        }

        #[test]
        fn and_or_are_commutative(a in expr(), b in expr()) {
            for op in ["&&", "||"] {
                let l = judge(&format!("dyn({}) {op} dyn({})", text(&a), text(&b)), json!({}));
                let r = judge(&format!("dyn({}) {op} dyn({})", text(&b), text(&a)), json!({}));
                prop_assert_eq!(l.ok(), r.ok());
            }
        }
    }
}

/// The probe `scripts/bench/cel-cost.sh` counts under cachegrind: the
/// condition `CEL_CASE` names (`two`: two fields compared; `ten`: the
/// ten-clause worst case of `TEN`) judged `CEL_LOOPS` times as a policy's
/// `cel` rule judges a record whose fields were captured (what
/// `Compiled::check_captured` adds per record), the reading of the record
/// itself not included.
#[test]
#[ignore = "a cachegrind probe: scripts/bench/cel-cost.sh"]
fn cost_probe() {
    use crate::kafka::record::Record;
    use crate::policy::cel::CelRule;
    use crate::policy::json::{Captured, Captures};

    let loops: u64 = std::env::var("CEL_LOOPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let case = std::env::var("CEL_CASE").unwrap_or_default();
    let text = if case == "ten" {
        TEN
    } else {
        "message.exit_time > message.enter_time"
    };
    let doc = json!({
        "a": 7, "b": 3, "c": "Y", "d": 1, "e": 50, "f": true, "g": "B",
        "h": 9, "s": "abcdef", "i": 4, "j": 2, "enter_time": 1000, "exit_time": 2000,
    });
    let mut rule = CelRule::new(None, text).expect("compiles");
    let mut pointers = Vec::new();
    crate::policy::rules::assign_more(&mut pointers, rule.pointers_mut());
    // The fields captured, as the JSON reader leaves them.
    let mut caps = Captures::new(pointers.len());
    for (slot, p) in pointers.iter().enumerate() {
        let v = match p.get(&doc).expect("present") {
            Value::Number(n) => Captured::Number(n.clone()),
            Value::String(s) => Captured::Str(s),
            Value::Bool(b) => Captured::Bool(*b),
            other => panic!("{other}"),
        };
        caps.set(slot, v);
    }
    let record = Record {
        offset: 0,
        timestamp: 0,
        key: None,
        value: None,
        headers: Vec::new(),
    };
    assert!(rule.holds(&caps, &record));
    let mut held = 0u64;
    for _ in 0..loops {
        held += u64::from(rule.holds(std::hint::black_box(&caps), &record));
    }
    assert_eq!(held, loops);
}

/// The worst case the probe measures: ten clauses, every kind a
/// condition over a flat record uses (all of them true, so `&&` reads
/// all ten).
const TEN: &str = r#"message.a > message.b && message.c != "X" && message.d >= 0
    && message.e <= 100 && message.f == true && message.g in ["A", "B", "C"]
    && message.h > message.a && size(message.s) < 64 && message.s.startsWith("ab")
    && message.i + 1 > message.j"#;
