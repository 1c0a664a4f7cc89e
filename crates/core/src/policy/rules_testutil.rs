//! Test support for the rules and their compiled checks: the values at
//! their edges.

use serde_json::{json, Value};

/// Values at every edge the rules' tests read (a missing field aside):
/// null, each type, strings `one_of` lists or nearly, bounds on both
/// sides, null island, numbers past f64's exact range, and times around
/// the limits of `max_age` tests at 1,000,000 ms.
pub(crate) fn edge_values() -> Vec<Value> {
    vec![
        json!(null),
        json!(true),
        json!("ENTER"),
        json!("EXIT"),
        json!(""),
        json!("ENTERS"),
        json!([1]),
        json!({"a": 1}),
        json!(0),
        json!(-0.0),
        json!(1),
        json!(1.0),
        json!(-1.5),
        json!(-1.6),
        json!(2),
        json!(5),
        json!(9.0),
        json!(10.5),
        json!(-20),
        json!(20.000001),
        json!(90),
        json!(90.5),
        json!(-90),
        json!(-180),
        json!(180.1),
        json!(150),
        json!(150.01),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!(-1e300),
        json!(1_000_000),
        json!(999_000),
        json!(998_999),
        json!(999_999_999),
        json!(1_000),
    ]
}
