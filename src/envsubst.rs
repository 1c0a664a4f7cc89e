//! `${VAR}` and `${VAR:-default}` in the config file, expanded from the
//! process environment on the text, before YAML parsing.
//!
//! Owns: the substitution syntax, its errors (line and column of the `${`),
//! and the rule that a substituted value can never change the shape of the
//! YAML document. It never reads files and never parses YAML.
//!
//! Why on the text: a variable may stand for a number (`broker_port_base:
//! ${PORT_BASE}`), and typed values must be parsed by YAML as if they had
//! been written there. Why values are checked instead of quoted: quoting
//! would turn that number into a string, and a reference inside an already
//! quoted scalar cannot be quoted again. So a value that YAML would read as
//! structure (a newline, `: `, ` #`, flow brackets, quotes, a leading
//! indicator) is rejected with the position of its `${`. Values keep their
//! line: positions of later YAML errors stay on the right line (columns to
//! the right of a substitution shift by the length difference).
//!
//! Comments are copied untouched, so a `${X}` in a comment needs no `X`.
//! `$$` is a literal `$`; a `$` not followed by `{` or `$` is kept as is.

/// Why a config file's text could not be expanded; positions are 1-based,
/// the column counts characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvSubstError {
    #[error("{line}:{column}: environment variable {name} is not set (give a default with ${{{name}:-value}})")]
    Unset {
        line: usize,
        column: usize,
        name: String,
    },
    #[error(
        "{line}:{column}: unterminated `${{`: no `}}` on this line (write `$$` for a literal `$`)"
    )]
    Unterminated { line: usize, column: usize },
    #[error("{line}:{column}: `${{{text}}}`: expected ${{NAME}} or ${{NAME:-default}}, NAME of letters, digits and _ not starting with a digit")]
    BadName {
        line: usize,
        column: usize,
        text: String,
    },
    #[error("{line}:{column}: the value of {name} contains {why}, which would change the YAML structure; such values cannot be substituted")]
    Unsafe {
        line: usize,
        column: usize,
        name: String,
        why: &'static str,
    },
}

/// Expand `text` with the process environment. On error, every problem is
/// reported as `file:line:column: message`, one per line.
pub fn expand_file_text(text: &str, path: &std::path::Path) -> Result<String, String> {
    expand(text, |name| std::env::var(name).ok()).map_err(|errors| {
        errors
            .iter()
            .map(|e| format!("{}:{e}", path.display()))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Expand `text`, looking variables up with `lookup`; every error is collected.
pub fn expand(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, Vec<EnvSubstError>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        expand_line(line, i + 1, &lookup, &mut out, &mut errors);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// One line: copy it to `out`, expanding references outside comments.
fn expand_line(
    line: &str,
    line_no: usize,
    lookup: &impl Fn(&str) -> Option<String>,
    out: &mut String,
    errors: &mut Vec<EnvSubstError>,
) {
    let chars: Vec<char> = line.chars().collect();
    let mut scan = Scanner::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if scan.starts_comment(c) {
            out.extend(&chars[i..]);
            return;
        }
        scan.step(c);
        match (c, chars.get(i + 1)) {
            ('$', Some('$')) => {
                out.push('$');
                i += 2;
            }
            ('$', Some('{')) => {
                let at = (line_no, i + 1);
                match chars[i + 2..].iter().position(|&c| c == '}' || c == '\n') {
                    Some(len) if chars[i + 2 + len] == '}' => {
                        let inner: String = chars[i + 2..i + 2 + len].iter().collect();
                        match reference(&inner, at, lookup) {
                            Ok(value) => out.push_str(&value),
                            Err(e) => errors.push(e),
                        }
                        i += len + 3;
                    }
                    _ => {
                        errors.push(EnvSubstError::Unterminated {
                            line: at.0,
                            column: at.1,
                        });
                        return;
                    }
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
}

/// Tracks quoted scalars on one line, to tell a comment's `#` from a `#`
/// inside a value. A quote opens a scalar only where a scalar can start
/// (line start, after `: `, `- `, `[`, `{`, `,`), so `it's` stays plain.
#[derive(Default)]
struct Scanner {
    quote: Option<char>,
    prev: Option<char>,
    last_non_space: Option<char>,
}

impl Scanner {
    fn starts_comment(&self, c: char) -> bool {
        c == '#' && self.quote.is_none() && self.prev.is_none_or(char::is_whitespace)
    }

    fn step(&mut self, c: char) {
        match self.quote {
            Some('"') if c == '"' && self.prev != Some('\\') => self.quote = None,
            Some('\'') if c == '\'' => self.quote = None,
            Some(_) => {}
            None if (c == '"' || c == '\'')
                && self
                    .last_non_space
                    .is_none_or(|p| matches!(p, ':' | '-' | '[' | '{' | ','))
                && self
                    .prev
                    .is_none_or(|p| p.is_whitespace() || "[{,".contains(p)) =>
            {
                self.quote = Some(c)
            }
            None => {}
        }
        self.prev = Some(c);
        if !c.is_whitespace() {
            self.last_non_space = Some(c);
        }
    }
}

/// The value of one `${...}` (its inner text), or why it has none.
fn reference(
    inner: &str,
    (line, column): (usize, usize),
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<String, EnvSubstError> {
    let (name, default) = match inner.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (inner, None),
    };
    if !is_name(name) {
        return Err(EnvSubstError::BadName {
            line,
            column,
            text: inner.to_string(),
        });
    }
    // Shell semantics: `:-` also replaces a variable that is set but empty.
    let value = match (lookup(name), default) {
        (Some(v), Some(d)) if v.is_empty() => d.to_string(),
        (Some(v), _) => v,
        (None, Some(d)) => d.to_string(),
        (None, None) => {
            return Err(EnvSubstError::Unset {
                line,
                column,
                name: name.to_string(),
            })
        }
    };
    match unsafe_reason(&value) {
        Some(why) => Err(EnvSubstError::Unsafe {
            line,
            column,
            name: name.to_string(),
            why,
        }),
        None => Ok(value),
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What in `v` YAML would read as structure rather than as scalar text, if
/// anything. Conservative: it must hold wherever the reference stands
/// (plain or quoted scalar, block or flow context, key or value).
fn unsafe_reason(v: &str) -> Option<&'static str> {
    if v.chars().any(char::is_control) {
        return Some("a control character (newline, tab, ...)");
    }
    if v.contains(": ") || v.ends_with(':') {
        return Some("`: ` (a mapping key)");
    }
    if v.contains(" #") || v.starts_with('#') {
        return Some("` #` (a comment)");
    }
    if v.contains(['{', '}', '[', ']', ',']) {
        return Some("a flow indicator ({ } [ ] ,)");
    }
    if v.contains(['"', '\'', '\\']) {
        return Some("a quote or backslash");
    }
    if v.starts_with(' ') || v.ends_with(' ') {
        return Some("a leading or trailing space");
    }
    let mut chars = v.chars();
    let first = chars.next();
    let second = chars.next();
    if first.is_some_and(|c| "!&*|>%@`".contains(c))
        || (matches!(first, Some('-' | '?')) && second.is_none_or(|c| c == ' '))
    {
        return Some("a leading YAML indicator");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn set_variables_and_defaults_are_expanded() {
        let text = "a: ${A}\nb: ${B:-7}\nc: ${C:-dflt}\nd: x${A}y\n";
        let got = expand(text, env(&[("A", "1"), ("B", "2")])).unwrap();
        assert_eq!(got, "a: 1\nb: 2\nc: dflt\nd: x1y\n");
    }

    #[test]
    fn a_set_but_empty_variable_takes_the_default() {
        assert_eq!(expand("a: ${A:-9}", env(&[("A", "")])).unwrap(), "a: 9");
        assert_eq!(expand("a: '${A}'", env(&[("A", "")])).unwrap(), "a: ''");
    }

    #[test]
    fn double_dollar_is_a_literal_dollar_and_a_lone_dollar_stays() {
        let got = expand("a: $${A}\nb: 5$\nc: $x\n", env(&[])).unwrap();
        assert_eq!(got, "a: ${A}\nb: 5$\nc: $x\n");
    }

    #[test]
    fn an_unset_variable_names_line_and_column_of_its_dollar() {
        let errs = expand("x: 1\nlisten:\n  bootstrap: ${NOPE}\n", env(&[])).unwrap_err();
        assert_eq!(
            errs,
            vec![EnvSubstError::Unset {
                line: 3,
                column: 14,
                name: "NOPE".into()
            }]
        );
        assert!(errs[0]
            .to_string()
            .starts_with("3:14: environment variable NOPE is not set"));
    }

    #[test]
    fn every_error_of_a_file_is_reported() {
        let errs = expand("a: ${X}\nb: ${1BAD}\nc: ${Y\n", env(&[])).unwrap_err();
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(matches!(
            errs[1],
            EnvSubstError::BadName {
                line: 2,
                column: 4,
                ..
            }
        ));
        assert_eq!(errs[2], EnvSubstError::Unterminated { line: 3, column: 4 });
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["${}", "${A-B}", "${A B}", "${9}", "${A:=x}", "${é}"] {
            let errs = expand(&format!("k: {bad}"), env(&[("A", "v")])).unwrap_err();
            assert!(
                matches!(
                    errs[0],
                    EnvSubstError::BadName {
                        line: 1,
                        column: 4,
                        ..
                    }
                ),
                "{bad}: {errs:?}"
            );
        }
    }

    #[test]
    fn an_unterminated_reference_does_not_run_into_the_next_line() {
        let errs = expand("a: ${A\nb: }\n", env(&[("A", "v")])).unwrap_err();
        assert_eq!(
            errs,
            vec![EnvSubstError::Unterminated { line: 1, column: 4 }]
        );
    }

    #[test]
    fn values_that_would_change_the_yaml_shape_are_refused() {
        for v in [
            "1\nadmin: {listen: 0.0.0.0:1}",
            "a: b",
            "a:",
            "x #c",
            "#c",
            "[1]",
            "a,b",
            "{a}",
            "\"q",
            "it's",
            "back\\",
            " lead",
            "trail ",
            "- x",
            "-",
            "? k",
            "*alias",
            "&anc",
            "!tag",
            "|",
            ">",
            "%x",
            "@x",
            "`x",
            "tab\there",
        ] {
            let errs = expand("k: ${V}", env(&[("V", v)])).unwrap_err();
            assert!(
                matches!(
                    errs[0],
                    EnvSubstError::Unsafe {
                        line: 1,
                        column: 4,
                        ..
                    }
                ),
                "{v:?}: {errs:?}"
            );
        }
        // Defaults obey the same rule.
        assert!(expand("k: ${V:-a: b}", env(&[])).is_err());
    }

    #[test]
    fn ordinary_values_are_accepted() {
        for v in [
            "29100",
            "-1",
            "0.0.0.0:9644",
            "kafka-0.kafka.svc:9092",
            "/etc/antidote/x.pem",
            "https://registry:8081/a?b=c&d=e",
            "p#q",
            "10s",
            "true",
            "ünïcode",
            "",
        ] {
            assert_eq!(
                expand("k: ${V}", env(&[("V", v)])).unwrap(),
                format!("k: {v}"),
                "{v:?}"
            );
        }
    }

    #[test]
    fn comments_are_not_expanded() {
        let text = "# ${NOT_SET}\na: 1 # ${NOT_SET} too\nb: \"x # ${A}\"\nc: 'y # ${A}'\nd: it's ${A} # ${NOT_SET}\n";
        let got = expand(text, env(&[("A", "v")])).unwrap();
        assert_eq!(got, "# ${NOT_SET}\na: 1 # ${NOT_SET} too\nb: \"x # v\"\nc: 'y # v'\nd: it's v # ${NOT_SET}\n");
    }

    #[test]
    fn an_injected_value_cannot_add_keys_even_inside_quotes() {
        // Inside a quoted scalar a quote would end it early: refused too.
        let errs = expand("k: \"${V}\"", env(&[("V", "x\", admin: \"y")])).unwrap_err();
        assert!(matches!(errs[0], EnvSubstError::Unsafe { .. }));
    }

    #[test]
    fn file_errors_carry_the_path() {
        let err = expand_file_text(
            "a: ${ANTIDOTE_TEST_SURELY_UNSET_VAR}\n",
            std::path::Path::new("/etc/a.yaml"),
        )
        .unwrap_err();
        assert!(
            err.starts_with("/etc/a.yaml:1:4: environment variable ANTIDOTE_TEST_SURELY_UNSET_VAR"),
            "{err}"
        );
    }
}
