//! Policy rules (`rules:` list items) compiled: coordinates, enums
//! (`one_of`), ranges, absent fields, staleness (`max_age`) and CEL
//! conditions (`cel`), each item to the checks it stands for, every
//! mistake named at its place.

use super::*;
use crate::policy::cel::CelRule;
use crate::policy::rules::{fmt_num, Coordinates, MaxAge, Rule, TimeUnit};

pub(in crate::policy) fn compile_rule(
    r: &Located<RuleDoc>,
    rules: &mut Vec<Rule>,
    stale: &mut Vec<MaxAge>,
    cel: &mut Vec<CelRule>,
) -> Result<(), Vec<At>> {
    let d = &r.v;
    let mut errs = Vec::new();
    if let Some(c) = &d.cel {
        return compile_cel(r, c, cel);
    }
    if let Some(n) = &d.name {
        return Err(vec![at(n, "name: only a `cel` rule takes a name")]);
    }
    if let Some(c) = &d.coordinates {
        return compile_coordinates(r, c, rules);
    }
    let Some(field) = &d.field else {
        return Err(vec![at(
            r,
            "rules: a rule needs `coordinates` or `field` (with one_of, min/max or max_age)",
        )]);
    };
    let ptr = pointer(field, "field").map_err(|e| vec![e])?;
    let absent = d.absent.as_ref().is_some_and(|a| a.v);
    if let Some(a) = d.absent.as_ref().filter(|a| a.v) {
        if d.one_of.is_some() || d.min.is_some() || d.max.is_some() || d.max_age.is_some() {
            return Err(vec![at(a, "absent: a field that must be absent has nothing else to check; write other rules as separate list items")]);
        }
    }
    if absent {
        rules.push(Rule::absent(ptr));
        return Ok(());
    }
    if d.one_of.is_none() && d.min.is_none() && d.max.is_none() && d.max_age.is_none() {
        return Err(vec![at(
            field,
            format!(
                "field: `{}` has nothing to check; add one_of, min/max, max_age or absent: true",
                field.v
            ),
        )]);
    }
    if let Some(o) = &d.one_of {
        if o.v.is_empty() {
            errs.push(at(o, "one_of: the list of allowed values is empty"));
        } else {
            rules.push(Rule::one_of(ptr.clone(), o.v.clone(), d.optional));
        }
    }
    if d.min.is_some() || d.max.is_some() {
        let (lo, hi) = check_range(d, &mut errs);
        rules.push(Rule::range(ptr.clone(), lo, hi, d.optional));
    }
    compile_max_age(d, ptr, stale, &mut errs);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

/// Whether a rule item sets any key of a field rule.
fn has_field_keys(d: &RuleDoc) -> bool {
    d.field.is_some()
        || d.one_of.is_some()
        || d.min.is_some()
        || d.max.is_some()
        || d.max_age.is_some()
        || d.unit.is_some()
        || d.optional
        || d.absent.is_some()
}

/// A `cel` rule (it takes `name` and `class` only): the expression
/// compiled now, its errors placed at the `cel` value with their column
/// within the expression.
fn compile_cel(
    r: &Located<RuleDoc>,
    c: &Located<String>,
    cel: &mut Vec<CelRule>,
) -> Result<(), Vec<At>> {
    let d = &r.v;
    if d.coordinates.is_some() || has_field_keys(d) {
        return Err(vec![at(
            r,
            "rules: a `cel` rule takes `name` and `class` only; write field rules as separate list items",
        )]);
    }
    let name = d.name.as_ref().map(|n| n.v.as_str());
    if let Some(n) = d.name.as_ref().filter(|n| n.v.trim().is_empty()) {
        return Err(vec![at(n, "name: a rule name cannot be empty")]);
    }
    let rule = CelRule::new(name, &c.v).map_err(|e| vec![at(c, format!("cel: {e}"))])?;
    cel.push(rule);
    Ok(())
}

/// A `coordinates` rule (it takes no other keys).
fn compile_coordinates(
    r: &Located<RuleDoc>,
    c: &Located<CoordDoc>,
    rules: &mut Vec<Rule>,
) -> Result<(), Vec<At>> {
    let d = &r.v;
    let mut errs = Vec::new();
    if has_field_keys(d) {
        return Err(vec![at(
            r,
            "rules: a `coordinates` rule takes no other keys; write field rules as separate list items",
        )]);
    }
    let lat = pointer(&c.v.lat, "coordinates.lat");
    let lon = pointer(&c.v.lon, "coordinates.lon");
    let bbox = match &c.v.bbox {
        None => None,
        Some(b) => match check_bbox(&b.v) {
            Ok(bb) => Some(bb),
            Err(m) => {
                errs.push(at(b, format!("coordinates.bbox: {m}")));
                None
            }
        },
    };
    match (lat, lon) {
        (Ok(lat), Ok(lon)) if errs.is_empty() => {
            rules.push(Rule::Coordinates(Box::new(Coordinates {
                lat,
                lon,
                reject_null_island: c.v.reject_null_island,
                bbox,
            })));
            Ok(())
        }
        (a, b) => {
            errs.extend(a.err());
            errs.extend(b.err());
            Err(errs)
        }
    }
}

/// `min`/`max`: finite, and not crossed.
fn check_range(d: &RuleDoc, errs: &mut Vec<At>) -> (Option<f64>, Option<f64>) {
    let lo = d.min.as_ref().map(|m| m.v);
    let hi = d.max.as_ref().map(|m| m.v);
    for l in [&d.min, &d.max].into_iter().flatten() {
        if !l.v.is_finite() {
            errs.push(at(l, "min/max: must be a finite number"));
        }
    }
    if let (Some(a), Some(b), Some(hl)) = (lo, hi, &d.max) {
        if a > b {
            errs.push(at(
                hl,
                format!("max: {} is below min {}", fmt_num(b), fmt_num(a)),
            ));
        }
    }
    (lo, hi)
}

/// `max_age` (with its `unit`), or a `unit` alone (an error).
fn compile_max_age(d: &RuleDoc, ptr: Pointer, stale: &mut Vec<MaxAge>, errs: &mut Vec<At>) {
    match (&d.max_age, &d.unit) {
        (Some(a), unit) => match max_age_ms(&a.v) {
            Ok(ms) => {
                let written = match &a.v {
                    serde_yaml::Value::String(s) => s.clone(),
                    other => format!("{}s", yaml_num(other)),
                };
                let unit = unit.as_ref().map_or(TimeUnit::Ms, |u| u.v);
                stale.push(MaxAge::new(ptr, ms, written, unit));
            }
            Err(m) => errs.push(at(a, format!("max_age: {m}"))),
        },
        (None, Some(u)) => errs.push(at(u, "unit: applies to max_age only")),
        (None, None) => {}
    }
}

fn yaml_num(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn max_age_ms(v: &serde_yaml::Value) -> Result<f64, String> {
    let d = match v {
        serde_yaml::Value::String(s) => crate::text::parse_duration(s)?,
        serde_yaml::Value::Number(n) => crate::text::parse_duration(&n.to_string())?,
        _ => return Err("expected a duration like 30s, 15m or 1h".into()),
    };
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d.as_secs_f64() * 1000.0)
}

fn check_bbox(b: &[f64]) -> Result<[f64; 4], String> {
    let [min_lat, min_lon, max_lat, max_lon] = b else {
        return Err(format!(
            "expected [min_lat, min_lon, max_lat, max_lon], got {} numbers",
            b.len()
        ));
    };
    if !(-90.0..=90.0).contains(min_lat) || !(-90.0..=90.0).contains(max_lat) {
        return Err("latitudes must be within [-90, 90]".into());
    }
    if !(-180.0..=180.0).contains(min_lon) || !(-180.0..=180.0).contains(max_lon) {
        return Err("longitudes must be within [-180, 180]".into());
    }
    if min_lat > max_lat || min_lon > max_lon {
        return Err("min_lat must not exceed max_lat, nor min_lon max_lon".into());
    }
    Ok([*min_lat, *min_lon, *max_lat, *max_lon])
}
