//! The console's query strings and JSON bodies, checked before anything is
//! read: only known parameters, each at most once and at most
//! [`MAX_VALUE`] characters, numbers within their bounds, times as `dlt
//! inspect --since` takes them, topic names as Kafka allows them. Every
//! refusal is a message for a 400.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::policy::Class;

/// Longest parameter value accepted.
pub const MAX_VALUE: usize = 256;
/// Longest query string accepted (the admin listener's head is 8 KiB).
pub const MAX_QUERY: usize = 4096;

/// Checked parameters: name -> value.
#[derive(Debug, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    /// Parse `raw` (the part after `?`) allowing only `known` names.
    pub fn query(raw: Option<&str>, known: &[&str]) -> Result<Params, String> {
        let raw = raw.unwrap_or("");
        if raw.len() > MAX_QUERY {
            return Err(format!("the query string is longer than {MAX_QUERY} bytes"));
        }
        let mut out = BTreeMap::new();
        for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
            Self::put(&mut out, &k, v.into_owned(), known)?;
        }
        Ok(Params(out))
    }

    /// A JSON object body's members, as parameters (numbers and booleans
    /// as their text), allowing only `known` names.
    pub fn json(body: &[u8], known: &[&str]) -> Result<Params, String> {
        let v: Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
        let Value::Object(m) = v else {
            return Err("the body must be a JSON object".into());
        };
        let mut out = BTreeMap::new();
        for (k, v) in m {
            let text = match v {
                Value::Null => continue,
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return Err(format!("`{k}` must be a string, number or boolean")),
            };
            Self::put(&mut out, &k, text, known)?;
        }
        Ok(Params(out))
    }

    fn put(
        out: &mut BTreeMap<String, String>,
        k: &str,
        v: String,
        known: &[&str],
    ) -> Result<(), String> {
        if !known.contains(&k) {
            let k: String = k.chars().take(40).collect();
            return Err(format!(
                "unknown parameter `{}` (known: {})",
                k.escape_debug(),
                known.join(", ")
            ));
        }
        if v.chars().count() > MAX_VALUE {
            return Err(format!("`{k}` is longer than {MAX_VALUE} characters"));
        }
        if out.insert(k.to_string(), v).is_some() {
            return Err(format!("`{k}` is given twice"));
        }
        Ok(())
    }

    /// The value of `name`, if given and not empty.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// An integer within `min..=max`.
    pub fn int(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, String> {
        let Some(v) = self.text(name) else {
            return Ok(None);
        };
        match v.trim().parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(format!("`{name}` must be an integer from {min} to {max}")),
        }
    }

    /// A number within `min..=max` (a rate).
    pub fn number(&self, name: &str, min: f64, max: f64) -> Result<Option<f64>, String> {
        let Some(v) = self.text(name) else {
            return Ok(None);
        };
        match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n >= min && n <= max => Ok(Some(n)),
            _ => Err(format!("`{name}` must be a number from {min} to {max}")),
        }
    }

    /// `true`/`false` (also `1`/`0`); absent is false.
    pub fn flag(&self, name: &str) -> Result<bool, String> {
        match self.text(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(_) => Err(format!("`{name}` must be true or false")),
        }
    }

    /// A time as `dlt inspect --since` takes it, in epoch milliseconds.
    pub fn time(&self, name: &str) -> Result<Option<i64>, String> {
        self.text(name)
            .map(|v| crate::service::parse_time_arg(v).map_err(|e| format!("`{name}`: {e}")))
            .transpose()
    }

    /// A topic name Kafka would accept (required).
    pub fn topic(&self, name: &str) -> Result<String, String> {
        let t = self
            .text(name)
            .ok_or_else(|| format!("`{name}` is required"))?;
        check_topic(name, t)?;
        Ok(t.to_string())
    }

    /// A verdict class (`poison`, `stale`, ...).
    pub fn class(&self, name: &str) -> Result<Option<String>, String> {
        let Some(v) = self.text(name) else {
            return Ok(None);
        };
        match Class::ALL
            .iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(v))
        {
            Some(c) => Ok(Some(c.as_str().to_string())),
            None => Err(format!(
                "`{name}` must be one of {}",
                Class::ALL.map(|c| c.as_str()).join(", ")
            )),
        }
    }
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn check_topic(name: &str, t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a topic name (1 to 249 of a-z A-Z 0-9 . _ -)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["topic", "limit", "class", "since", "decode"];

    #[test]
    fn good_queries_read_back() {
        let p = Params::query(Some("topic=geo.dlt&limit=20&class=POISON&since=2h"), KNOWN).unwrap();
        assert_eq!(p.topic("topic").unwrap(), "geo.dlt");
        assert_eq!(p.int("limit", 1, 500).unwrap(), Some(20));
        assert_eq!(p.class("class").unwrap().as_deref(), Some("poison"));
        assert!(p.time("since").unwrap().is_some());
        assert!(!p.flag("decode").unwrap());
        assert_eq!(p.int("absent", 1, 2).unwrap(), None);
    }

    #[test]
    fn bad_queries_say_why() {
        let e = |q: &str| Params::query(Some(q), KNOWN).unwrap_err();
        assert!(
            e("nope=1").starts_with("unknown parameter `nope`"),
            "{}",
            e("nope=1")
        );
        assert_eq!(e("limit=1&limit=2"), "`limit` is given twice");
        assert!(e(&format!("class={}", "x".repeat(300))).contains("longer than 256"));
        assert!(e(&"a".repeat(MAX_QUERY + 1)).contains("query string"));
        let p = |q: &str| Params::query(Some(q), KNOWN).unwrap();
        assert_eq!(
            p("limit=0").int("limit", 1, 500).unwrap_err(),
            "`limit` must be an integer from 1 to 500"
        );
        assert!(p("limit=1e9").int("limit", 1, 500).is_err());
        assert!(p("topic=a%2Fb").topic("topic").is_err());
        assert!(p("topic=..").topic("topic").is_err());
        assert!(p("topic=").topic("topic").unwrap_err().contains("required"));
        assert!(p("class=bad")
            .class("class")
            .unwrap_err()
            .contains("poison"));
        assert!(p("since=yesterday")
            .time("since")
            .unwrap_err()
            .starts_with("`since`"));
        assert!(p("decode=yes").flag("decode").is_err());
    }

    #[test]
    fn json_bodies_are_checked_alike() {
        let p = Params::json(
            br#"{"topic":"geo.dlt","limit":5,"decode":true,"class":null}"#,
            KNOWN,
        )
        .unwrap();
        assert_eq!(p.int("limit", 1, 10).unwrap(), Some(5));
        assert!(p.flag("decode").unwrap());
        assert!(Params::json(b"[1]", KNOWN).is_err());
        assert!(Params::json(b"{\"topic\": [1]}", KNOWN).is_err());
        assert!(Params::json(b"{\"x\": 1}", KNOWN).is_err());
        assert!(Params::json(b"not json", KNOWN).is_err());
    }
}
