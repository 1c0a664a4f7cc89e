//! CEL's values as a judged record holds them, borrowed (nothing here
//! allocates), and the standard definitions over them (langdef.md,
//! "Standard Definitions"): heterogeneous equality, ordering with
//! cross-type numeric comparison, and checked arithmetic.

use std::cmp::Ordering;

use serde_json::Value;

use super::Fault;

/// One CEL value. Strings are UTF-8 bytes (a record's string as it is);
/// lists and maps are a decoded value's arrays and objects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Val<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(&'a [u8]),
    Bytes(&'a [u8]),
    List(&'a [Value]),
    Map(&'a serde_json::Map<String, Value>),
}

/// A value's CEL type, as far as it is known before a record is read:
/// `Dyn` when it is not (a JSON field without a schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    List,
    Map,
    Dyn,
}

impl Type {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Type::Null => "null",
            Type::Bool => "bool",
            Type::Int => "int",
            Type::Uint => "uint",
            Type::Double => "double",
            Type::String => "string",
            Type::Bytes => "bytes",
            Type::List => "list",
            Type::Map => "map",
            Type::Dyn => "dyn",
        }
    }

    pub(super) fn is_number(self) -> bool {
        matches!(self, Type::Int | Type::Uint | Type::Double)
    }
}

impl<'a> Val<'a> {
    pub(crate) fn type_of(&self) -> Type {
        match self {
            Val::Null => Type::Null,
            Val::Bool(_) => Type::Bool,
            Val::Int(_) => Type::Int,
            Val::Uint(_) => Type::Uint,
            Val::Double(_) => Type::Double,
            Val::Str(_) => Type::String,
            Val::Bytes(_) => Type::Bytes,
            Val::List(_) => Type::List,
            Val::Map(_) => Type::Map,
        }
    }

    /// A decoded value as CEL sees it. Numbers written without a fraction
    /// or exponent are `int` (`uint` above `i64`), others `double`: what
    /// Confluent's CEL executors make of JSON, not the spec's all-double
    /// JSON mapping, so that integer fields of Avro and Protobuf records
    /// (captured as the same numbers) stay `int`.
    #[inline(always)]
    pub(crate) fn of_json(v: &'a Value) -> Val<'a> {
        match v {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => Val::of_number(n),
            Value::String(s) => Val::Str(s.as_bytes()),
            Value::Array(a) => Val::List(a),
            Value::Object(m) => Val::Map(m),
        }
    }

    #[inline(always)]
    pub(crate) fn of_number(n: &serde_json::Number) -> Val<'a> {
        if let Some(i) = n.as_i64() {
            Val::Int(i)
        } else if let Some(u) = n.as_u64() {
            Val::Uint(u)
        } else {
            Val::Double(n.as_f64().unwrap_or(f64::NAN))
        }
    }
}

/// `a == b`: false across types except numbers, which compare by value
/// (`1 == 1.0`, `1u == 1`); lists and maps element by element.
pub(crate) fn equal(a: Val<'_>, b: Val<'_>) -> bool {
    match (a, b) {
        (Val::Null, Val::Null) => true,
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Str(x), Val::Str(y)) | (Val::Bytes(x), Val::Bytes(y)) => x == y,
        (Val::List(x), Val::List(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(p, q)| equal(Val::of_json(p), Val::of_json(q)))
        }
        (Val::Map(x), Val::Map(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, p)| {
                    y.get(k)
                        .is_some_and(|q| equal(Val::of_json(p), Val::of_json(q)))
                })
        }
        (x, y) => numeric_order(x, y) == Some(Ordering::Equal),
    }
}

/// The order of two numbers of any numeric types, exactly (no rounding
/// of a large `int` to `double`); `None` for NaN or a non-number.
fn numeric_order(a: Val<'_>, b: Val<'_>) -> Option<Ordering> {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(&y)),
        (Val::Uint(x), Val::Uint(y)) => Some(x.cmp(&y)),
        (Val::Double(x), Val::Double(y)) => x.partial_cmp(&y),
        (Val::Int(x), Val::Uint(y)) => Some(int_uint(x, y)),
        (Val::Uint(x), Val::Int(y)) => Some(int_uint(y, x).reverse()),
        (Val::Int(x), Val::Double(y)) => int_double(i128::from(x), y),
        (Val::Double(x), Val::Int(y)) => int_double(i128::from(y), x).map(Ordering::reverse),
        (Val::Uint(x), Val::Double(y)) => int_double(i128::from(x), y),
        (Val::Double(x), Val::Uint(y)) => int_double(i128::from(y), x).map(Ordering::reverse),
        _ => None,
    }
}

fn int_uint(x: i64, y: u64) -> Ordering {
    u64::try_from(x).map_or(Ordering::Less, |x| x.cmp(&y))
}

/// An integer (of `i64` or `u64`) against a double, exactly.
fn int_double(x: i128, y: f64) -> Option<Ordering> {
    if y.is_nan() {
        return None;
    }
    // Every integer of i64 and u64 lies strictly within ±2^64.
    const TWO_64: f64 = 18_446_744_073_709_551_616.0;
    if y >= TWO_64 {
        return Some(Ordering::Less);
    }
    if y <= -TWO_64 {
        return Some(Ordering::Greater);
    }
    let whole = y.trunc();
    // Exact: |whole| < 2^64 fits an i128.
    let w = whole as i128;
    Some(x.cmp(&w).then_with(|| {
        let frac = y - whole;
        if frac > 0.0 {
            Ordering::Less
        } else if frac < 0.0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }))
}

/// `a <op> b` for `<`, `<=`, `>`, `>=`: numbers across types, strings
/// (by code point, which is UTF-8 byte order), bytes, bools; any other
/// pair has no overload. A NaN compares false.
pub(crate) fn order(a: Val<'_>, b: Val<'_>) -> Result<Option<Ordering>, Fault> {
    match (a, b) {
        (Val::Str(x), Val::Str(y)) | (Val::Bytes(x), Val::Bytes(y)) => Ok(Some(x.cmp(y))),
        (Val::Bool(x), Val::Bool(y)) => Ok(Some(x.cmp(&y))),
        (x, y) if x.type_of().is_number() && y.type_of().is_number() => Ok(numeric_order(x, y)),
        (x, y) => Err(Fault::NoOverload(x.type_of(), y.type_of())),
    }
}

/// The arithmetic operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// `x <op> y` for integers of one type, overflow and a zero divisor
/// being errors.
macro_rules! checked {
    ($op:expr, $x:expr, $y:expr) => {
        zero_divisor($op, $y == 0).and_then(|()| {
            match $op {
                Arith::Add => $x.checked_add($y),
                Arith::Sub => $x.checked_sub($y),
                Arith::Mul => $x.checked_mul($y),
                Arith::Div => $x.checked_div($y),
                Arith::Rem => $x.checked_rem($y),
            }
            .ok_or(Fault::Overflow)
        })
    };
}

/// `a <op> b` over two numbers of the same type: `int` and `uint` checked
/// (overflow, division or modulus by zero are errors), `double` IEEE (no
/// `%`). CEL converts nothing implicitly: `1 + 1.0` has no overload.
pub(crate) fn arith(op: Arith, a: Val<'_>, b: Val<'_>) -> Result<Val<'static>, Fault> {
    let none = || Fault::NoOverload(a.type_of(), b.type_of());
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => checked!(op, x, y).map(Val::Int),
        (Val::Uint(x), Val::Uint(y)) => checked!(op, x, y).map(Val::Uint),
        (Val::Double(x), Val::Double(y)) => Ok(Val::Double(match op {
            Arith::Add => x + y,
            Arith::Sub => x - y,
            Arith::Mul => x * y,
            Arith::Div => x / y,
            Arith::Rem => return Err(none()),
        })),
        _ => Err(none()),
    }
}

impl Arith {
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
            Arith::Rem => "%",
        }
    }
}

fn zero_divisor(op: Arith, zero: bool) -> Result<(), Fault> {
    match op {
        Arith::Div if zero => Err(Fault::DivideByZero),
        Arith::Rem if zero => Err(Fault::ModulusByZero),
        _ => Ok(()),
    }
}

/// `int(x)`, `uint(x)`, `double(x)`: numbers converted with range
/// checks (a double truncated toward zero), strings parsed.
pub(crate) fn convert(to: Type, v: Val<'_>) -> Result<Val<'static>, Fault> {
    let parse_err = || Fault::BadConversion(to);
    let text = |b| std::str::from_utf8(b).ok();
    match (to, v) {
        (Type::Int, Val::Int(x)) => Ok(Val::Int(x)),
        (Type::Int, Val::Uint(x)) => i64::try_from(x).map(Val::Int).map_err(|_| Fault::Overflow),
        (Type::Int, Val::Double(x)) => {
            // The range CEL allows: [-2^63, 2^63), NaN refused.
            if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&x) {
                Err(Fault::Overflow)
            } else {
                Ok(Val::Int(x as i64))
            }
        }
        (Type::Uint, Val::Uint(x)) => Ok(Val::Uint(x)),
        (Type::Uint, Val::Int(x)) => u64::try_from(x).map(Val::Uint).map_err(|_| Fault::Overflow),
        (Type::Uint, Val::Double(x)) => {
            if !(x > -1.0 && x < 18_446_744_073_709_551_616.0) {
                Err(Fault::Overflow)
            } else {
                Ok(Val::Uint(x as u64))
            }
        }
        (Type::Double, Val::Double(x)) => Ok(Val::Double(x)),
        (Type::Double, Val::Int(x)) => Ok(Val::Double(x as f64)),
        (Type::Double, Val::Uint(x)) => Ok(Val::Double(x as f64)),
        (Type::Int, Val::Str(s)) => text(s)
            .and_then(|t| t.parse().ok())
            .map(Val::Int)
            .ok_or_else(parse_err),
        (Type::Uint, Val::Str(s)) => text(s)
            .and_then(|t| t.parse().ok())
            .map(Val::Uint)
            .ok_or_else(parse_err),
        (Type::Double, Val::Str(s)) => text(s)
            .and_then(|t| t.parse().ok())
            .map(Val::Double)
            .ok_or_else(parse_err),
        (_, v) => Err(Fault::NoConversion(to, v.type_of())),
    }
}

/// `size(x)`: code points of a string, bytes of bytes, elements of a
/// list, entries of a map.
pub(crate) fn size(v: Val<'_>) -> Result<Val<'static>, Fault> {
    let n = match v {
        Val::Str(s) => s.iter().filter(|b| (**b & 0xC0) != 0x80).count(),
        Val::Bytes(b) => b.len(),
        Val::List(l) => l.len(),
        Val::Map(m) => m.len(),
        other => return Err(Fault::NoOverloadFor(other.type_of())),
    };
    i64::try_from(n).map(Val::Int).map_err(|_| Fault::Overflow)
}

/// A value as a reason shows it (CEL's literal syntax), cut at 64 bytes.
pub(crate) fn show(v: Val<'_>) -> String {
    let text = match v {
        Val::Null => "null".into(),
        Val::Bool(b) => b.to_string(),
        Val::Int(i) => i.to_string(),
        Val::Uint(u) => format!("{u}u"),
        Val::Double(x) => format!("{x:?}"),
        Val::Str(s) => Value::String(String::from_utf8_lossy(s).into()).to_string(),
        Val::Bytes(b) => format!("b\"{}\"", b.get(..64).unwrap_or(b).escape_ascii()),
        Val::List(l) => Value::Array(l.to_vec()).to_string(),
        Val::Map(m) => Value::Object(m.clone()).to_string(),
    };
    match text.char_indices().nth(64) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
