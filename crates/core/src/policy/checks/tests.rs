use serde_json::{json, Value};

use super::Checks;
use crate::policy::json::{Captured, Captures};
use crate::policy::rules::{assign_slots, Coordinates, MaxAge, Pointer, Rule, TimeUnit};
use crate::policy::rules_testutil::edge_values;

/// The captures of a record whose slots hold `values` (`None`: missing),
/// as the readers fill them.
fn captures<'a>(values: &[Option<&'a Value>]) -> Captures<'a> {
    let mut caps = Captures::new(values.len());
    for (slot, v) in values.iter().enumerate() {
        let Some(v) = v else { continue };
        let c = match v {
            Value::Null => Captured::Null,
            Value::Bool(b) => Captured::Bool(*b),
            Value::Number(n) => Captured::Number(n.clone()),
            // Strings both ways the readers keep them.
            Value::String(s) if slot % 2 == 0 => Captured::Str(s),
            Value::String(s) => Captured::Ascii(s.as_bytes()),
            composite => {
                caps.set_value(slot, (*composite).clone());
                continue;
            }
        };
        caps.set(slot, c);
    }
    caps
}

/// Each rule compiled alone holds exactly when the rule holds, and all of
/// them compiled together when every one does, for every kind of rule at
/// every edge: missing, null, each type, bounds (NaN ones too), null
/// island, a bounding box wider and narrower than the globe, ages on
/// both sides of the limit, numbers beyond f64's range, and `one_of`
/// over strings (compiled) and over other values (asked as it is).
#[test]
fn checks_hold_exactly_when_the_rules_hold() {
    let p = |t: &str| Pointer::parse(t).unwrap();
    let mut rules = vec![
        Rule::one_of(p("/s"), vec![json!("ENTER"), json!(1), json!(null)], false),
        Rule::one_of(p("/s"), vec![json!("EXIT"), json!("ENTER")], true),
        Rule::one_of(p("/s"), vec![json!("EXIT"), json!("")], false),
        Rule::range(p("/n"), Some(0.0), Some(150.0), false),
        Rule::range(p("/n"), None, Some(-1.5), true),
        Rule::range(p("/n"), Some(2.0), None, false),
        Rule::range(p("/m"), Some(f64::NAN), Some(90.0), true),
        Rule::absent(p("/s")),
    ];
    for (island, bbox) in [
        (true, None),
        (false, Some([-10.0, -20.0, 10.0, 20.0])),
        (true, Some([-100.0, -200.0, 100.0, 200.0])),
        (false, Some([f64::NAN, -20.0, 10.0, f64::NAN])),
        (false, Some([10.0, 0.0, -10.0, 5.0])),
    ] {
        rules.push(Rule::Coordinates(Box::new(Coordinates {
            lat: p("/n"),
            lon: p("/m"),
            reject_null_island: island,
            bbox,
        })));
    }
    let mut stale = vec![
        MaxAge::new(p("/n"), 1000.0, "1s".into(), TimeUnit::Ms),
        MaxAge::new(p("/m"), 5000.0, "5s".into(), TimeUnit::S),
        MaxAge::new(p("/n"), 1.0, "1ms".into(), TimeUnit::Ns),
        MaxAge::new(p("/m"), 2.0, "2ms".into(), TimeUnit::Us),
    ];
    assert_eq!(assign_slots(&mut rules, &mut stale).len(), 3);
    let edges = edge_values();
    let pick = |v: Value| edges.iter().find(|e| **e == v);
    let now = 1_000_000;
    let mut fields = vec![None];
    fields.extend(edges.iter().map(Some));
    let all = Checks::new(&rules, &stale);
    let mut seen = [0usize; 2];
    for s in &fields {
        for n in &fields {
            for m in [None, pick(json!(null)), pick(json!(0)), pick(json!(-20))]
                .into_iter()
                .chain(fields.iter().step_by(5).copied())
            {
                let caps = captures(&[*s, *n, m]);
                let mut every = true;
                for r in &rules {
                    let one = Checks::new(std::slice::from_ref(r), &[]);
                    let (compiled, rule) = (
                        one.hold(&caps, std::slice::from_ref(r), now),
                        r.holds(&caps),
                    );
                    assert_eq!(compiled, rule, "{r:?} on {caps:?}");
                    seen[usize::from(rule)] += 1;
                    every &= rule;
                }
                for a in &stale {
                    let one = Checks::new(&[], std::slice::from_ref(a));
                    let (compiled, rule) = (one.hold(&caps, &[], now), a.holds(&caps, now));
                    assert_eq!(compiled, rule, "{a:?} on {caps:?}");
                    seen[usize::from(rule)] += 1;
                    every &= rule;
                }
                assert_eq!(all.hold(&caps, &rules, now), every, "{caps:?}");
            }
        }
    }
    assert!(seen[0] > 10_000 && seen[1] > 10_000, "{seen:?}");
}
