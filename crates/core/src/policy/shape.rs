//! The JSON Schema subset the fast path checks while it parses.
//!
//! Most record schemas only say which fields exist, their types, lengths,
//! bounds and allowed strings. Such a schema is compiled at load into a
//! [`Shape`] (a tree following `properties` and `items`), and
//! `json::capture_shaped` checks it during the one streaming parse that
//! also captures the rules' values, so no `serde_json::Value` is built.
//!
//! The shape is a one-sided filter: when it accepts a document, the full
//! validator (the `jsonschema` crate) accepts it too; when it rejects, or
//! cannot decide cheaply (e.g. `1.0` against `"type": "integer"`, or a
//! bound compared across integer and float beyond 2^53), the record is
//! judged again on the full path, which gives the verdict and its wording.
//! A schema using any keyword outside the subset compiles to no shape at
//! all and every record takes the full path. Property tests check that the
//! two paths agree (`json_proptests.rs`).
//!
//! Subset: boolean schemas; `type` (string or list); `properties`,
//! `required`, `additionalProperties` (boolean or schema); `items` (one
//! schema), `minItems`, `maxItems`; `minLength`, `maxLength`; `minimum`,
//! `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numbers); `enum` and
//! `const` of strings, booleans and null; annotations (`title`,
//! `description`, `$schema`, `$id`, `$comment`, `default`, `examples`,
//! `deprecated`, `readOnly`, `writeOnly`).

use serde_json::{Map, Value};

mod fast;
mod limit;
pub(crate) use fast::{AsciiCheck, NumberCheck};
use limit::{compare, number, order_bit, Limit, EQ, EXACT, GT, LT};

const NULL: u8 = 1;
const BOOL: u8 = 2;
/// A number parsed as an integer (`serde_json` gave i64 or u64).
const INT: u8 = 4;
/// A number parsed as a float: meets `"type": "number"` only (a float with
/// no fraction is left to the full validator).
const FLOAT: u8 = 8;
const STR: u8 = 16;
const ARR: u8 = 32;
const OBJ: u8 = 64;
const ANY: u8 = 127;

/// Required properties tracked per object (a bit each).
const MAX_REQUIRED: usize = 64;

/// A compiled schema: node 0 is the document.
#[derive(Debug)]
pub(crate) struct Shape {
    nodes: Vec<ShapeNode>,
}

/// What `additionalProperties` allows for keys not in `properties`.
#[derive(Debug, Clone, Copy, Default)]
enum Additional {
    #[default]
    Any,
    Never,
    Node(usize),
}

/// One schema object.
#[derive(Debug, Clone)]
pub(crate) struct ShapeNode {
    types: u8,
    min_len: Option<u64>,
    max_len: Option<u64>,
    /// (the orderings `value.cmp(limit)` may have, as [`order_bit`]s, limit)
    bounds: Vec<(u8, Limit)>,
    /// `enum` and `const` lists; a value must be in each.
    allowed: Vec<Vec<Scalar>>,
    /// Keys named by `properties` or `required`: (name, schema node, bit).
    keys: Vec<(String, Option<usize>, Option<u32>)>,
    required: u64,
    additional: Additional,
    items: Option<usize>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    /// No lengths, bounds or allowed values: a scalar is checked by its
    /// type alone.
    plain: bool,
}

impl Default for ShapeNode {
    fn default() -> Self {
        ShapeNode {
            types: ANY,
            min_len: None,
            max_len: None,
            bounds: Vec::new(),
            allowed: Vec::new(),
            keys: Vec::new(),
            required: 0,
            additional: Additional::Any,
            items: None,
            min_items: None,
            max_items: None,
            plain: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Null,
    Bool(bool),
    Str(String),
}

/// A scalar as the parser reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seen<'a> {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'a str),
}

impl Seen<'_> {
    /// Its type bit.
    #[inline(always)]
    fn kind(&self) -> u8 {
        match self {
            Seen::Null => NULL,
            Seen::Bool(_) => BOOL,
            Seen::I64(_) | Seen::U64(_) => INT,
            Seen::F64(_) => FLOAT,
            Seen::Str(_) => STR,
        }
    }
}

/// Which key an object member is, for [`ShapeNode::member`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Member {
    /// One of `keys`, by index.
    Key(usize),
    /// Not among `keys`.
    Other,
}

impl Shape {
    /// Compile `schema`, or `None` if it uses anything outside the subset.
    pub(crate) fn compile(schema: &Value) -> Option<Shape> {
        let mut shape = Shape { nodes: Vec::new() };
        shape.node(schema)?;
        Some(shape)
    }

    fn node(&mut self, schema: &Value) -> Option<usize> {
        let id = self.nodes.len();
        self.nodes.push(ShapeNode::default());
        let n = match schema {
            Value::Bool(true) => ShapeNode::default(),
            Value::Bool(false) => ShapeNode {
                types: 0,
                ..ShapeNode::default()
            },
            Value::Object(m) => self.object(m)?,
            _ => return None,
        };
        let plain = n.min_len.is_none()
            && n.max_len.is_none()
            && n.bounds.is_empty()
            && n.allowed.is_empty();
        self.nodes[id] = ShapeNode { plain, ..n };
        Some(id)
    }

    fn object(&mut self, m: &Map<String, Value>) -> Option<ShapeNode> {
        let mut n = ShapeNode::default();
        for (k, v) in m {
            match k.as_str() {
                "$schema" | "$id" | "$comment" | "title" | "description" | "default"
                | "examples" | "deprecated" | "readOnly" | "writeOnly" => {}
                "type" => n.types = types(v)?,
                "minLength" => n.min_len = Some(v.as_u64()?),
                "maxLength" => n.max_len = Some(v.as_u64()?),
                "minItems" => n.min_items = Some(v.as_u64()?),
                "maxItems" => n.max_items = Some(v.as_u64()?),
                "minimum" => n.bounds.push((GT | EQ, number(v)?)),
                "maximum" => n.bounds.push((LT | EQ, number(v)?)),
                "exclusiveMinimum" => n.bounds.push((GT, number(v)?)),
                "exclusiveMaximum" => n.bounds.push((LT, number(v)?)),
                "enum" => n
                    .allowed
                    .push(v.as_array()?.iter().map(scalar).collect::<Option<_>>()?),
                "const" => n.allowed.push(vec![scalar(v)?]),
                "items" => n.items = Some(self.node(v)?),
                "additionalProperties" => {
                    n.additional = match v {
                        Value::Bool(true) => Additional::Any,
                        Value::Bool(false) => Additional::Never,
                        v => Additional::Node(self.node(v)?),
                    }
                }
                "properties" => {
                    for (name, sub) in v.as_object()? {
                        let child = self.node(sub)?;
                        match n.keys.iter_mut().find(|k| k.0 == *name) {
                            Some(k) => k.1 = Some(child),
                            None => n.keys.push((name.clone(), Some(child), None)),
                        }
                    }
                }
                "required" => {
                    let mut bits = 0u32;
                    for name in v.as_array()? {
                        let name = name.as_str()?;
                        let i = match n.keys.iter().position(|k| k.0 == name) {
                            Some(i) => i,
                            None => {
                                n.keys.push((name.to_string(), None, None));
                                n.keys.len() - 1
                            }
                        };
                        if n.keys[i].2.is_none() {
                            if bits as usize >= MAX_REQUIRED {
                                return None;
                            }
                            n.keys[i].2 = Some(bits);
                            n.required |= 1 << bits;
                            bits += 1;
                        }
                    }
                }
                _ => return None,
            }
        }
        Some(n)
    }

    pub(crate) fn root(&self) -> &ShapeNode {
        &self.nodes[0]
    }

    /// The schema node at `i` (as [`Shape::member_slot`] gives it).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&ShapeNode> {
        self.nodes.get(i)
    }

    /// The schema for a member of an object checked by `node`; `Err` when
    /// the member is not allowed at all.
    #[inline]
    pub(crate) fn member(&self, node: &ShapeNode, m: Member) -> Result<Option<&ShapeNode>, ()> {
        Ok(self.member_slot(node, m)?.and_then(|i| self.get(i)))
    }

    /// Where [`Shape::member`]'s schema is ([`Shape::get`] gives it), for
    /// callers that keep it.
    #[inline]
    pub(crate) fn member_slot(&self, node: &ShapeNode, m: Member) -> Result<Option<usize>, ()> {
        let additional = match m {
            Member::Key(i) => match node.keys.get(i).and_then(|k| k.1) {
                Some(child) => return Ok(Some(child)),
                None => node.additional,
            },
            Member::Other => node.additional,
        };
        match additional {
            Additional::Any => Ok(None),
            Additional::Never => Err(()),
            Additional::Node(child) => Ok(Some(child)),
        }
    }

    /// The schema for the elements of an array checked by `node`.
    pub(crate) fn items(&self, node: &ShapeNode) -> Option<&ShapeNode> {
        node.items.and_then(|i| self.get(i))
    }

    /// Whether `node` surely accepts a built value (used where the fast path
    /// builds a container the rules need in full).
    pub(crate) fn accepts(&self, node: &ShapeNode, v: &Value) -> bool {
        match v {
            Value::Null => node.scalar(Seen::Null),
            Value::Bool(b) => node.scalar(Seen::Bool(*b)),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => node.scalar(Seen::I64(i)),
                (_, Some(u), _) => node.scalar(Seen::U64(u)),
                (_, _, Some(f)) => node.scalar(Seen::F64(f)),
                _ => false,
            },
            Value::String(s) => node.scalar(Seen::Str(s)),
            Value::Array(items) => {
                node.open(ARR)
                    && node.items_ok(items.len() as u64)
                    && items
                        .iter()
                        .all(|x| self.items(node).is_none_or(|s| self.accepts(s, x)))
            }
            Value::Object(members) => {
                let mut seen = 0u64;
                node.open(OBJ)
                    && members.iter().all(|(k, x)| {
                        let m = node.key(k);
                        seen |= node.bit(m);
                        match self.member(node, m) {
                            Ok(s) => s.is_none_or(|s| self.accepts(s, x)),
                            Err(()) => false,
                        }
                    })
                    && node.complete(seen)
            }
        }
    }
}

impl ShapeNode {
    /// Whether a scalar surely meets this schema.
    #[inline]
    pub(crate) fn scalar(&self, v: Seen<'_>) -> bool {
        self.types & v.kind() != 0 && (self.plain || self.constrained(v))
    }

    /// [`Self::scalar`] of a string whose bytes `s` are all ASCII (so
    /// each byte is one code point), without making it a `str`.
    #[inline]
    pub(crate) fn ascii_string(&self, s: &[u8]) -> bool {
        if self.types & STR == 0 {
            return false;
        }
        if self.plain {
            return true;
        }
        let n = s.len() as u64;
        if self.min_len.is_some_and(|m| n < m) || self.max_len.is_some_and(|m| n > m) {
            return false;
        }
        self.allowed.iter().all(|list| {
            list.iter()
                .any(|a| matches!(a, Scalar::Str(a) if a.as_bytes() == s))
        })
    }

    /// The required-property bits of this object's keys.
    pub(crate) fn required(&self) -> u64 {
        self.required
    }

    /// Whether a scalar of an allowed type meets the lengths, bounds and
    /// allowed values.
    fn constrained(&self, v: Seen<'_>) -> bool {
        match v {
            Seen::Str(s) => {
                // Lengths count code points, and a string of b bytes has
                // between b/4 and b of them: count only when those bounds
                // do not already decide (counting was 3 % of a judged
                // record's CPU, `scripts/bench/deterministic.py`).
                let bytes = s.len() as u64;
                let surely = self.min_len.is_none_or(|m| bytes.div_ceil(4) >= m)
                    && self.max_len.is_none_or(|m| bytes <= m);
                if !surely && (self.min_len.is_some() || self.max_len.is_some()) {
                    let n = s.chars().count() as u64;
                    if self.min_len.is_some_and(|m| n < m) || self.max_len.is_some_and(|m| n > m) {
                        return false;
                    }
                }
            }
            Seen::I64(_) | Seen::U64(_) | Seen::F64(_) => {
                for (ok, limit) in &self.bounds {
                    match compare(v, limit) {
                        Some(o) if ok & order_bit(o) != 0 => {}
                        _ => return false,
                    }
                }
            }
            Seen::Null | Seen::Bool(_) => {}
        }
        self.allowed.iter().all(|list| {
            list.iter().any(|a| match (a, v) {
                (Scalar::Null, Seen::Null) => true,
                (Scalar::Bool(a), Seen::Bool(b)) => *a == b,
                (Scalar::Str(a), Seen::Str(b)) => a == b,
                _ => false,
            })
        })
    }

    /// Whether an array or object (`kind`) may start here.
    pub(crate) fn open(&self, kind: u8) -> bool {
        // `enum`/`const` hold scalars only, so no container is in them.
        self.types & kind != 0 && self.allowed.is_empty()
    }

    pub(crate) fn open_array(&self) -> bool {
        self.open(ARR)
    }

    pub(crate) fn open_object(&self) -> bool {
        self.open(OBJ)
    }

    /// Whether an array of `len` elements has an allowed length.
    pub(crate) fn items_ok(&self, len: u64) -> bool {
        !(self.min_items.is_some_and(|m| len < m) || self.max_items.is_some_and(|m| len > m))
    }

    /// Which of this object's named keys `name` is.
    #[inline]
    pub(crate) fn key(&self, name: &str) -> Member {
        match self.keys.iter().position(|k| same_key(&k.0, name)) {
            Some(i) => Member::Key(i),
            None => Member::Other,
        }
    }

    /// The required-property bit of a member (0 if not required).
    #[inline]
    pub(crate) fn bit(&self, m: Member) -> u64 {
        match m {
            Member::Key(i) => self.keys.get(i).and_then(|k| k.2).map_or(0, |b| 1 << b),
            Member::Other => 0,
        }
    }

    /// Whether the members seen (their bits) include every required one.
    pub(crate) fn complete(&self, seen: u64) -> bool {
        seen & self.required == self.required
    }
}

fn types(v: &Value) -> Option<u8> {
    let one = |t: &Value| {
        Some(match t.as_str()? {
            "null" => NULL,
            "boolean" => BOOL,
            "integer" => INT,
            "number" => INT | FLOAT,
            "string" => STR,
            "array" => ARR,
            "object" => OBJ,
            _ => return None,
        })
    };
    match v {
        Value::Array(list) => list.iter().try_fold(0, |acc, t| Some(acc | one(t)?)),
        t => one(t),
    }
}

fn scalar(v: &Value) -> Option<Scalar> {
    Some(match v {
        Value::Null => Scalar::Null,
        Value::Bool(b) => Scalar::Bool(*b),
        Value::String(s) => Scalar::Str(s.clone()),
        _ => return None,
    })
}

/// `a == b` for object keys, without a call to `memcmp` for keys of up to
/// 16 bytes (a call per candidate key was 10 % of a judged record's CPU):
/// two overlapping loads cover every byte of such a key.
#[inline]
pub(crate) fn same_key(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

/// `a == b`, as [`same_key`] compares keys.
#[inline]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let u64_at = |s: &[u8], at: usize| {
        s.get(at..at + 8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
    };
    let u32_at = |s: &[u8], at: usize| {
        s.get(at..at + 4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap_or([0; 4])))
    };
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => u32_at(a, 0) == u32_at(b, 0) && u32_at(a, n - 4) == u32_at(b, n - 4),
        8..=16 => u64_at(a, 0) == u64_at(b, 0) && u64_at(a, n - 8) == u64_at(b, n - 8),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every length up to 20, a difference at every position.
    #[test]
    fn same_key_compares_every_byte() {
        for n in 0..20usize {
            let a: String = (0..n).map(|i| char::from(b'a' + i as u8)).collect();
            assert!(same_key(&a, &a.clone()), "{a}");
            for at in 0..n {
                let mut b = a.clone().into_bytes();
                b[at] = b'Z';
                let b = String::from_utf8(b).unwrap();
                assert!(!same_key(&a, &b), "{a} {b}");
            }
            assert!(!same_key(&a, &format!("{a}x")));
        }
    }

    /// `ascii_string` is `scalar` of the same ASCII string under every
    /// kind of string schema, at and around each length bound.
    #[test]
    fn ascii_string_is_scalar_of_the_string() {
        let schemas = [
            json!({"type": "string"}),
            json!({"type": "number"}),
            json!({"type": ["string", "null"], "minLength": 2, "maxLength": 4}),
            json!({"minLength": 3}),
            json!({"maxLength": 0}),
            json!({"enum": ["ab", "abcd", null]}),
            json!({"const": "abc", "maxLength": 3}),
            json!({"type": "string", "enum": [null, true]}),
            json!({"type": "string", "minLength": 1, "maxLength": 5}),
        ];
        for schema in schemas {
            let shape = Shape::compile(&schema).expect("in the subset");
            let node = shape.root();
            for n in 0..7 {
                let s: String = "abcdefg"[..n].to_string();
                assert_eq!(
                    node.ascii_string(s.as_bytes()),
                    node.scalar(Seen::Str(&s)),
                    "{schema} on {s:?}"
                );
                // What the flat reader checks instead, decided at load.
                let quick = node.ascii_check().holds(Some(node), s.as_bytes());
                assert_eq!(quick, node.ascii_string(s.as_bytes()), "{schema} on {s:?}");
            }
        }
    }

    fn reference() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policies/schemas/trigger.schema.json"
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn reference_schema_compiles() {
        assert!(Shape::compile(&reference()).is_some());
    }

    #[test]
    fn keywords_outside_the_subset_give_no_shape() {
        for s in [
            json!({"type": "string", "pattern": "^a"}),
            json!({"properties": {"a": {"$ref": "#/$defs/x"}}}),
            json!({"anyOf": [{"type": "string"}]}),
            json!({"enum": [1, 2]}),
            json!({"items": [{"type": "string"}]}),
            json!({"exclusiveMinimum": true}),
            json!({"type": "string", "format": "email"}),
            json!({"minLength": 1.5}),
            json!(3),
        ] {
            assert!(Shape::compile(&s).is_none(), "{s}");
        }
    }

    /// Lengths are code points; the byte-length shortcut must agree with
    /// counting on both sides of each bound, for 1- to 4-byte characters.
    #[test]
    fn string_lengths_count_code_points() {
        let s = Shape::compile(&json!({"type": "string", "minLength": 2, "maxLength": 3})).unwrap();
        for (text, ok) in [
            ("a", false),
            ("ab", true),
            ("abc", true),
            ("abcd", false),
            ("é", false),
            ("éé", true),
            ("ééé", true),
            ("éééé", false),
            ("𝄞", false),
            ("𝄞𝄞", true),
            ("𝄞𝄞𝄞", true),
            ("𝄞𝄞𝄞𝄞", false),
            ("a€", true),
        ] {
            assert_eq!(s.accepts(s.root(), &json!(text)), ok, "{text:?}");
        }
    }

    #[test]
    fn shape_decides_what_it_can() {
        let s = Shape::compile(&json!({
            "type": "object",
            "required": ["a", "b"],
            "properties": {
                "a": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10},
                "b": {"type": "string", "maxLength": 2, "enum": ["é😀", "x", "xyz"]},
                "c": {"type": "array", "items": {"type": ["number", "null"]}, "maxItems": 2}
            },
            "additionalProperties": false
        }))
        .unwrap();
        let ok = |v: Value| s.accepts(s.root(), &v);
        assert!(ok(json!({"a": 0, "b": "é😀"})));
        assert!(ok(json!({"a": 9, "b": "x", "c": [1.5, null]})));
        assert!(!ok(json!({"a": 10, "b": "x"})));
        assert!(!ok(json!({"a": -1, "b": "x"})));
        assert!(!ok(json!({"a": 1.5, "b": "x"})));
        assert!(!ok(json!({"a": 1, "b": "xyz"})), "too long");
        assert!(!ok(json!({"a": 1, "b": "y"})), "not in enum");
        assert!(!ok(json!({"a": 1})), "b is required");
        assert!(
            !ok(json!({"a": 1, "b": "x", "d": 1})),
            "no additional properties"
        );
        assert!(!ok(json!({"a": 1, "b": "x", "c": [1, 2, 3]})));
        assert!(!ok(json!({"a": 1, "b": "x", "c": ["s"]})));
        assert!(!ok(json!([1])));
    }

    #[test]
    fn lengths_count_code_points() {
        let s = Shape::compile(&json!({"minLength": 2, "maxLength": 3})).unwrap();
        let ok = |v: &str| s.root().scalar(Seen::Str(v));
        assert!(!ok("é"), "1 code point in 2 bytes");
        assert!(ok("éé"));
        assert!(ok("ab"));
        assert!(ok("😀😀😀"), "3 code points in 12 bytes");
        assert!(!ok("😀😀😀😀"));
        assert!(!ok("abcd"));
        assert!(!ok("a"));
    }

    #[test]
    fn bounds_compare_exactly_or_not_at_all() {
        let max = |n: Value| Shape::compile(&json!({"maximum": n})).unwrap();
        let below = |s: &Shape, v: Seen<'_>| s.root().scalar(v);
        let s = max(json!(9007199254740993u64));
        assert!(below(&s, Seen::U64(9007199254740993)));
        assert!(!below(&s, Seen::U64(9007199254740994)));
        // A float against an integer limit beyond 2^53: undecided, so no.
        assert!(!below(&s, Seen::F64(1.0)));
        let s = max(json!(1.5));
        assert!(below(&s, Seen::I64(1)));
        assert!(!below(&s, Seen::I64(2)));
        assert!(below(&s, Seen::F64(1.5)));
        assert!(!below(&s, Seen::I64(i64::MAX)), "undecided beyond 2^53");
    }
}
