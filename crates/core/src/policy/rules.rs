//! Rules over a decoded value: compiled JSON pointers, field rules
//! (`one_of`, `min`/`max`), `coordinates`, and `max_age` staleness.
//!
//! Everything here is compiled at load (pointer tokens split and unescaped,
//! rule identifiers formatted once) so judging allocates only on failure.
//!
//! Rules read a value through [`Doc`], which answers "what is at this
//! pointer" as a borrowed [`Field`]. Two representations implement it: a
//! `serde_json::Value` (Avro, Protobuf, and JSON policies with a JSON
//! Schema), resolved with [`Pointer::get`]; and the fast path's
//! [`super::json::Captures`] (JSON policies without a schema), which holds
//! only the values the rules' pointers name, looked up by the pointer's
//! slot (assigned at load by [`assign_slots`]) instead of walking a map.

use std::fmt;

use serde_json::{Number, Value};

use super::shape::same_bytes;
use super::Invalid;

mod max_age;
#[cfg(test)]
use max_age::human_ms;
pub(crate) use max_age::{MaxAge, TimeUnit};

mod slots;
pub(crate) use slots::{assign_more, assign_slots};

/// An RFC 6901 JSON pointer, split into unescaped reference tokens.
#[derive(Debug, Clone)]
pub(crate) struct Pointer {
    text: String,
    tokens: Vec<Token>,
    /// Index of this pointer's value in [`super::json::Captures`]; set at
    /// load by [`assign_slots`] (pointers with the same text share a slot).
    slot: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) key: String,
    /// The token as an array index, when it is one (`0`, or digits without a leading zero).
    pub(crate) index: Option<usize>,
}

impl Pointer {
    pub(crate) fn parse(text: &str) -> Result<Pointer, String> {
        if text.is_empty() {
            return Ok(Pointer {
                text: String::new(),
                tokens: Vec::new(),
                slot: usize::MAX,
            });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "`{text}` is not a JSON pointer: it must start with `/` (e.g. `/lat`)"
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut key = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => key.push('~'),
                        Some('1') => key.push('/'),
                        _ => {
                            return Err(format!(
                                "`{text}` is not a JSON pointer: `~` must be followed by 0 or 1"
                            ))
                        }
                    }
                } else {
                    key.push(c);
                }
            }
            let index = if key == "0" || (!key.starts_with('0') && !key.is_empty()) {
                key.parse::<usize>().ok()
            } else {
                None
            };
            tokens.push(Token { key, index });
        }
        Ok(Pointer {
            text: text.to_string(),
            tokens,
            slot: usize::MAX,
        })
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    pub(crate) fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// Resolve against `root`, without allocating.
    pub(crate) fn get<'v>(&self, root: &'v Value) -> Option<&'v Value> {
        self.get_below(root, 0)
    }

    /// Resolve the tokens after the first `skip` against `root` (the value
    /// the first `skip` tokens lead to).
    pub(crate) fn get_below<'v>(&self, root: &'v Value, skip: usize) -> Option<&'v Value> {
        let mut cur = root;
        for t in self.tokens.get(skip..).unwrap_or(&[]) {
            cur = match cur {
                Value::Object(map) => map.get(&t.key)?,
                Value::Array(items) => items.get(t.index?)?,
                _ => return None,
            };
        }
        Some(cur)
    }
}

/// A decoded value as the rules see it: what is at a pointer.
pub(crate) trait Doc {
    fn field(&self, ptr: &Pointer) -> Option<Field<'_>>;
}

impl Doc for Value {
    fn field(&self, ptr: &Pointer) -> Option<Field<'_>> {
        ptr.get(self).map(Field::of)
    }
}

/// A borrowed view of one JSON value; arrays and objects are always a
/// `serde_json::Value`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u8)]
pub(crate) enum Field<'a> {
    Null,
    Bool(bool),
    Number(&'a Number),
    /// A string's UTF-8 bytes (compared as bytes; a reader that saw them
    /// all ASCII need not make a `str` of them).
    Str(&'a [u8]),
    /// An array or an object.
    Composite(&'a Value),
}

impl<'a> Field<'a> {
    pub(crate) fn of(v: &'a Value) -> Field<'a> {
        match v {
            Value::Null => Field::Null,
            Value::Bool(b) => Field::Bool(*b),
            Value::Number(n) => Field::Number(n),
            Value::String(s) => Field::Str(s.as_bytes()),
            Value::Array(_) | Value::Object(_) => Field::Composite(v),
        }
    }
}

/// Displayed exactly as the `serde_json::Value` it stands for.
impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Null => f.write_str("null"),
            Field::Bool(b) => write!(f, "{b}"),
            Field::Number(n) => write!(f, "{n}"),
            Field::Str(s) => write!(f, "{}", Value::String(String::from_utf8_lossy(s).into())),
            Field::Composite(v) => write!(f, "{v}"),
        }
    }
}

/// What a JSON value is, for messages.
fn kind(v: Field<'_>) -> &'static str {
    match v {
        Field::Null => "null",
        Field::Bool(_) => "a boolean",
        Field::Number(_) => "a number",
        Field::Str(_) => "a string",
        Field::Composite(Value::Array(_)) => "an array",
        Field::Composite(_) => "an object",
    }
}

/// Format a bound without a useless `.0` (`-90`, `150`, `2.5`).
pub(crate) fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// A number at `ptr`, or the reason it is not one.
#[inline(always)]
pub(super) fn number_at<D: Doc + ?Sized>(ptr: &Pointer, root: &D) -> Result<f64, String> {
    let field = root.field(ptr);
    if let Some(Field::Number(n)) = field {
        if let Some(x) = n.as_f64().filter(|x| x.is_finite()) {
            return Ok(x);
        }
    }
    Err(not_a_number(ptr, field))
}

/// Why `field`, at `ptr`, is not a finite number: [`number_at`]'s error,
/// kept out of line (inlining the fast part saved ~80 instructions per
/// judged record, `scripts/bench/judge-cost.sh`).
#[cold]
#[inline(never)]
fn not_a_number(ptr: &Pointer, field: Option<Field<'_>>) -> String {
    match field {
        None => format!("{}: missing", ptr.as_str()),
        Some(Field::Number(n)) => format!("{}: {n} is not a finite number", ptr.as_str()),
        Some(other) => format!("{}: expected a number, found {}", ptr.as_str(), kind(other)),
    }
}

/// One compiled rule, judged in file order (staleness is separate).
#[derive(Debug)]
#[repr(u8)]
pub(crate) enum Rule {
    OneOf {
        id: String,
        ptr: Pointer,
        optional: bool,
        allowed: Vec<Value>,
        /// `ENTER, EXIT, DWELL` for messages.
        listed: String,
    },
    Range {
        id: String,
        ptr: Pointer,
        optional: bool,
        min: Option<f64>,
        max: Option<f64>,
    },
    Coordinates(Box<Coordinates>),
    /// The field must be missing or null (e.g. personal data that must
    /// never be present). The reason never quotes the value.
    Absent {
        id: String,
        ptr: Pointer,
    },
}

#[derive(Debug)]
pub(crate) struct Coordinates {
    pub(crate) lat: Pointer,
    pub(crate) lon: Pointer,
    pub(crate) reject_null_island: bool,
    /// `[min_lat, min_lon, max_lat, max_lon]`.
    pub(crate) bbox: Option<[f64; 4]>,
}

impl Rule {
    pub(crate) fn one_of(ptr: Pointer, allowed: Vec<Value>, optional: bool) -> Rule {
        let listed = allowed
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        Rule::OneOf {
            id: format!("one_of:{}", ptr.as_str()),
            ptr,
            optional,
            allowed,
            listed,
        }
    }

    pub(crate) fn range(ptr: Pointer, min: Option<f64>, max: Option<f64>, optional: bool) -> Rule {
        Rule::Range {
            id: format!("range:{}", ptr.as_str()),
            ptr,
            optional,
            min,
            max,
        }
    }

    pub(crate) fn absent(ptr: Pointer) -> Rule {
        Rule::Absent {
            id: format!("absent:{}", ptr.as_str()),
            ptr,
        }
    }

    pub(crate) fn check<D: Doc + ?Sized>(&self, v: &D) -> Result<(), Invalid> {
        match self {
            Rule::Absent { id, ptr } => match v.field(ptr) {
                None | Some(Field::Null) => Ok(()),
                Some(_) => Err(Invalid::poison(
                    id,
                    format!("{}: present, and must be absent", ptr.as_str()),
                )),
            },
            Rule::OneOf {
                id,
                ptr,
                optional,
                allowed,
                listed,
            } => match v.field(ptr) {
                None | Some(Field::Null) if *optional => Ok(()),
                None => Err(Invalid::poison(id, format!("{}: missing", ptr.as_str()))),
                Some(x) if allowed.iter().any(|a| json_eq(a, x)) => Ok(()),
                Some(x) => Err(Invalid::poison(
                    id,
                    format!("{}: {x} is not one of [{listed}]", ptr.as_str()),
                )),
            },
            Rule::Range {
                id,
                ptr,
                optional,
                min,
                max,
            } => {
                if *optional && matches!(v.field(ptr), None | Some(Field::Null)) {
                    return Ok(());
                }
                let x = number_at(ptr, v).map_err(|r| Invalid::poison(id, r))?;
                let below = min.is_some_and(|m| x < m);
                let above = max.is_some_and(|m| x > m);
                if below || above {
                    let bound = match (min, max) {
                        (Some(lo), Some(hi)) => {
                            format!("outside [{}, {}]", fmt_num(*lo), fmt_num(*hi))
                        }
                        (Some(lo), None) => format!("below the minimum {}", fmt_num(*lo)),
                        (None, Some(hi)) => format!("above the maximum {}", fmt_num(*hi)),
                        (None, None) => String::new(),
                    };
                    return Err(Invalid::poison(
                        id,
                        format!("{}: {} is {bound}", ptr.as_str(), fmt_num(x)),
                    ));
                }
                Ok(())
            }
            Rule::Coordinates(c) => c.check(v).map_err(|r| Invalid::poison("coordinates", r)),
        }
    }
}

impl Rule {
    /// Whether `v` passes, exactly when [`Self::check`] is `Ok`, without
    /// building an error: the judging path asks this first and asks
    /// `check` only to explain a failure (issue 30: the error paths
    /// inlined in `check` cost every passing record a heavy frame).
    #[inline]
    pub(crate) fn holds<D: Doc + ?Sized>(&self, v: &D) -> bool {
        match self {
            Rule::Absent { ptr, .. } => matches!(v.field(ptr), None | Some(Field::Null)),
            Rule::OneOf {
                ptr,
                optional,
                allowed,
                ..
            } => match v.field(ptr) {
                None | Some(Field::Null) if *optional => true,
                None => false,
                Some(x) => allowed.iter().any(|a| json_eq(a, x)),
            },
            Rule::Range {
                ptr,
                optional,
                min,
                max,
                ..
            } => match v.field(ptr) {
                None | Some(Field::Null) if *optional => true,
                field => finite(field)
                    .is_some_and(|x| !(min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m))),
            },
            Rule::Coordinates(c) => c.holds(v),
        }
    }
}

/// A finite number, as [`number_at`] reads one.
#[inline(always)]
pub(super) fn finite(field: Option<Field<'_>>) -> Option<f64> {
    match field {
        Some(Field::Number(n)) => n.as_f64().filter(|x| x.is_finite()),
        _ => None,
    }
}

impl Coordinates {
    /// Whether [`Self::check`] is `Ok`.
    #[inline]
    fn holds<D: Doc + ?Sized>(&self, v: &D) -> bool {
        let (Some(lat), Some(lon)) = (finite(v.field(&self.lat)), finite(v.field(&self.lon)))
        else {
            return false;
        };
        (-90.0..=90.0).contains(&lat)
            && (-180.0..=180.0).contains(&lon)
            && !(self.reject_null_island && lat == 0.0 && lon == 0.0)
            && self
                .bbox
                .is_none_or(|[min_lat, min_lon, max_lat, max_lon]| {
                    !(lat < min_lat || lat > max_lat || lon < min_lon || lon > max_lon)
                })
    }
}

/// Numbers compare by value (`1` equals `1.0`), everything else structurally.
#[inline(always)]
fn json_eq(a: &Value, b: Field<'_>) -> bool {
    match (a, b) {
        (Value::Number(x), Field::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Null, Field::Null) => true,
        (Value::Bool(x), Field::Bool(y)) => *x == y,
        // Short strings without a call to memcmp (issue 30).
        (Value::String(x), Field::Str(y)) => same_bytes(x.as_bytes(), y),
        (_, Field::Composite(y)) => a == y,
        _ => false,
    }
}

impl Coordinates {
    fn check<D: Doc + ?Sized>(&self, v: &D) -> Result<(), String> {
        let lat = number_at(&self.lat, v)?;
        let lon = number_at(&self.lon, v)?;
        if !(-90.0..=90.0).contains(&lat) {
            return Err(format!(
                "{}: {} is outside [-90, 90]",
                self.lat.as_str(),
                fmt_num(lat)
            ));
        }
        if !(-180.0..=180.0).contains(&lon) {
            return Err(format!(
                "{}: {} is outside [-180, 180]",
                self.lon.as_str(),
                fmt_num(lon)
            ));
        }
        if self.reject_null_island && lat == 0.0 && lon == 0.0 {
            return Err(format!(
                "{}, {}: 0, 0 is null island, a placeholder for an unknown position",
                self.lat.as_str(),
                self.lon.as_str()
            ));
        }
        if let Some([min_lat, min_lon, max_lat, max_lon]) = self.bbox {
            if lat < min_lat || lat > max_lat || lon < min_lon || lon > max_lon {
                return Err(format!(
                    "{}, {}: {}, {} is outside the bounding box [{}, {}, {}, {}]",
                    self.lat.as_str(),
                    self.lon.as_str(),
                    fmt_num(lat),
                    fmt_num(lon),
                    fmt_num(min_lat),
                    fmt_num(min_lon),
                    fmt_num(max_lat),
                    fmt_num(max_lon)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointers() {
        let v = json!({"a": {"b/c": [10, 20], "~x": 1}, "": 5});
        assert_eq!(
            Pointer::parse("/a/b~1c/1").unwrap().get(&v),
            Some(&json!(20))
        );
        assert_eq!(Pointer::parse("/a/~0x").unwrap().get(&v), Some(&json!(1)));
        assert_eq!(Pointer::parse("/").unwrap().get(&v), Some(&json!(5)));
        assert_eq!(Pointer::parse("").unwrap().get(&v), Some(&v));
        assert_eq!(Pointer::parse("/a/b~1c/01").unwrap().get(&v), None);
        assert!(Pointer::parse("lat").is_err());
        assert!(Pointer::parse("/a~2").is_err());
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_ms(1500.0), "1.5s");
        assert_eq!(human_ms(1_000_000.0), "16m 40s");
        assert_eq!(human_ms(7_500_000.0), "2h 5m");
    }

    /// `holds` is `check(..).is_ok()` for every rule kind, at every edge:
    /// missing, null, wrong type, bounds, null island, bounding box, ages
    /// on both sides of the limit, and numbers beyond f64's range.
    #[test]
    fn holds_agrees_with_check() {
        let p = |t: &str| Pointer::parse(t).unwrap();
        let mut rules = vec![
            Rule::one_of(p("/s"), vec![json!("ENTER"), json!(1), json!(null)], false),
            Rule::one_of(p("/s"), vec![json!("EXIT")], true),
            Rule::range(p("/n"), Some(0.0), Some(150.0), false),
            Rule::range(p("/n"), None, Some(-1.5), true),
            Rule::range(p("/n"), Some(2.0), None, false),
            Rule::absent(p("/s")),
        ];
        for (island, bbox) in [(true, None), (false, Some([-10.0, -20.0, 10.0, 20.0]))] {
            rules.push(Rule::Coordinates(Box::new(Coordinates {
                lat: p("/n"),
                lon: p("/m"),
                reject_null_island: island,
                bbox,
            })));
        }
        let stale = [
            MaxAge::new(p("/n"), 1000.0, "1s".into(), TimeUnit::Ms),
            MaxAge::new(p("/m"), 5000.0, "5s".into(), TimeUnit::S),
            MaxAge::new(p("/n"), 1.0, "1ms".into(), TimeUnit::Ns),
        ];
        let edges = crate::policy::rules_testutil::edge_values();
        let pick = |v: Value| edges.iter().find(|e| **e == v);
        let mut fields = vec![None];
        fields.extend(edges.iter().map(Some));
        let mut seen = [0usize; 2];
        for s in &fields {
            for n in &fields {
                for m in [
                    None,
                    pick(json!(0)),
                    pick(json!(-180)),
                    pick(json!(998_999)),
                ] {
                    let mut doc = serde_json::Map::new();
                    for (k, v) in [("s", s), ("n", n), ("m", &m)] {
                        if let Some(v) = v {
                            doc.insert(k.into(), (*v).clone());
                        }
                    }
                    let doc = Value::Object(doc);
                    for r in &rules {
                        let (fast, full) = (r.holds(&doc), r.check(&doc).is_ok());
                        assert_eq!(fast, full, "{r:?} on {doc}");
                        seen[usize::from(fast)] += 1;
                    }
                    for a in &stale {
                        let now = 1_000_000;
                        let (fast, full) = (a.holds(&doc, now), a.check(&doc, now).is_ok());
                        assert_eq!(fast, full, "{a:?} on {doc}");
                        seen[usize::from(fast)] += 1;
                    }
                }
            }
        }
        assert!(seen[0] > 1000 && seen[1] > 1000, "{seen:?}");
    }
}
