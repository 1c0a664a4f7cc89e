//! Topic patterns and the topic → policy index.
//!
//! A pattern is an exact Kafka topic name or a glob where `*` matches any run
//! of characters (including none) and `?` matches exactly one. Lookup is a
//! hash probe on exact names, then globs in load order; the glob outcome for
//! a topic is cached (topics are few and are looked up per Fetch partition).

use std::collections::HashMap;
use std::sync::RwLock;

/// Most topics cached; past this, glob lookups are computed each time.
const CACHE_LIMIT: usize = 65_536;

/// Check a topic pattern: Kafka's topic alphabet plus `*` and `?`.
pub(crate) fn check_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("a topic pattern cannot be empty".into());
    }
    if p.len() > 249 {
        return Err(format!(
            "`{p}` is longer than Kafka's 249-character topic limit"
        ));
    }
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*' | '?')))
    {
        return Err(format!(
            "`{p}` is not a topic name or glob: `{c}` is not allowed (letters, digits, `.`, `_`, `-`, and the wildcards `*` and `?`)"
        ));
    }
    Ok(())
}

pub(crate) fn is_glob(p: &str) -> bool {
    p.contains(['*', '?'])
}

/// Match `text` against a glob with `*` and `?` (bytes; topic names are ASCII).
/// Iterative with single backtrack point: O(len(text) * len(pattern)) worst case.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Topic → index of the covering policy.
#[derive(Debug, Default)]
pub(crate) struct TopicIndex {
    exact: HashMap<String, usize>,
    globs: Vec<(String, usize)>,
    cache: RwLock<HashMap<String, Option<usize>>>,
}

impl TopicIndex {
    /// Build from each policy's patterns, in load order. An exact name seen
    /// twice keeps the first policy (load rejects that case anyway).
    pub(crate) fn new<'a>(patterns: impl Iterator<Item = &'a [String]>) -> Self {
        let mut idx = TopicIndex::default();
        for (i, pats) in patterns.enumerate() {
            for p in pats {
                if is_glob(p) {
                    idx.globs.push((p.clone(), i));
                } else {
                    idx.exact.entry(p.clone()).or_insert(i);
                }
            }
        }
        idx
    }

    pub(crate) fn lookup(&self, topic: &str) -> Option<usize> {
        if let Some(&i) = self.exact.get(topic) {
            return Some(i);
        }
        if self.globs.is_empty() {
            return None;
        }
        if let Ok(cache) = self.cache.read() {
            if let Some(&hit) = cache.get(topic) {
                return hit;
            }
        }
        let found = self
            .globs
            .iter()
            .find(|(g, _)| glob_match(g, topic))
            .map(|&(_, i)| i);
        if let Ok(mut cache) = self.cache.write() {
            if cache.len() < CACHE_LIMIT {
                cache.insert(topic.to_string(), found);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches() {
        assert!(glob_match("geo.*", "geo.x"));
        assert!(glob_match("geo.*", "geo."));
        assert!(!glob_match("geo.*", "geo"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*.dlt", "x.y.dlt"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b*c", "aXbYbZ"));
        assert!(glob_match("*", ""));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }

    #[test]
    fn bad_patterns() {
        assert!(check_pattern("geo.[ab]").is_err());
        assert!(check_pattern("").is_err());
        assert!(check_pattern("geo.*-x?").is_ok());
    }

    #[test]
    fn exact_beats_glob_and_first_glob_wins() {
        let a = vec!["geo.*".to_string()];
        let b = vec!["geo.x".to_string(), "g*".to_string()];
        let idx = TopicIndex::new([a.as_slice(), b.as_slice()].into_iter());
        assert_eq!(idx.lookup("geo.x"), Some(1));
        assert_eq!(idx.lookup("geo.y"), Some(0));
        assert_eq!(idx.lookup("geo.y"), Some(0)); // cached
        assert_eq!(idx.lookup("gamma"), Some(1));
        assert_eq!(idx.lookup("other"), None);
    }
}
