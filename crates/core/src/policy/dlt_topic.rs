//! Dead-letter topic templates: `{topic}` and `{class}` placeholders,
//! compiled once at load and rendered per diverted record.

use super::glob::glob_match;
use super::Class;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Topic,
    Class,
}

/// A compiled dead-letter topic template such as `{topic}.dlt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTemplate {
    text: String,
    parts: Vec<Part>,
    /// The template as a glob (`{topic}` → `*`, `{class}` → `*`).
    glob: String,
}

impl DeadLetterTemplate {
    pub const DEFAULT: &'static str = "{topic}.dlt";

    /// Compile a template; only `{topic}` and `{class}` are placeholders, and
    /// the literal parts must be valid topic characters.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut glob = String::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("{topic}") {
                parts.push(Part::Topic);
                glob.push('*');
                rest = r;
            } else if let Some(r) = rest.strip_prefix("{class}") {
                parts.push(Part::Class);
                glob.push('*');
                rest = r;
            } else if rest.starts_with('{') {
                let end = rest.find('}').map_or(rest.len(), |i| i + 1);
                return Err(format!(
                    "`{}` is not a placeholder (use {{topic}} and {{class}})",
                    &rest[..end]
                ));
            } else {
                let end = rest.find('{').unwrap_or(rest.len());
                let lit = &rest[..end];
                if let Some(c) = lit
                    .chars()
                    .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
                {
                    return Err(format!("`{c}` cannot appear in a topic name"));
                }
                parts.push(Part::Lit(lit.to_string()));
                glob.push_str(lit);
                rest = &rest[end..];
            }
        }
        if parts.is_empty() {
            return Err("the dead-letter topic cannot be empty".into());
        }
        Ok(DeadLetterTemplate {
            text: text.to_string(),
            parts,
            glob,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The template as a glob over topic names (placeholders become `*`).
    pub fn as_glob(&self) -> &str {
        &self.glob
    }

    /// Whether `topic` could have been produced by this template.
    pub fn matches(&self, topic: &str) -> bool {
        glob_match(&self.glob, topic)
    }

    /// The dead-letter topic for a record of `topic` judged `class`.
    pub fn render(&self, topic: &str, class: Class) -> String {
        let mut out = String::with_capacity(topic.len() + 16);
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Topic => out.push_str(topic),
                Part::Class => out.push_str(class.as_str()),
            }
        }
        out
    }
}

impl Default for DeadLetterTemplate {
    fn default() -> Self {
        DeadLetterTemplate {
            text: Self::DEFAULT.to_string(),
            parts: vec![Part::Topic, Part::Lit(".dlt".to_string())],
            glob: "*.dlt".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders() {
        let t = DeadLetterTemplate::parse("{topic}.{class}.dlt").unwrap();
        assert_eq!(t.render("geo", Class::Stale), "geo.stale.dlt");
        assert!(t.matches("geo.stale.dlt"));
        assert_eq!(
            DeadLetterTemplate::default().render("a", Class::Poison),
            "a.dlt"
        );
        assert_eq!(
            DeadLetterTemplate::parse("{topic}.dlt").unwrap(),
            DeadLetterTemplate::default()
        );
    }

    #[test]
    fn rejects_unknown_placeholder() {
        let e = DeadLetterTemplate::parse("{topik}.dlt").unwrap_err();
        assert!(e.contains("{topik}"), "{e}");
        assert!(DeadLetterTemplate::parse("a b").is_err());
    }
}
