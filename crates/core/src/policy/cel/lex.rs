//! CEL's lexis (langdef.md, "Syntax"): the tokens of one expression, each
//! with the byte offset it starts at. Literals are decoded here (escapes,
//! raw and triple-quoted strings, bytes, hex and unsigned integers), so
//! the parser sees values, never text.

use super::CompileError;

/// One token and where it starts (a byte offset into the expression).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub(super) at: usize,
    pub(super) kind: Tok,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    /// An integer literal as written (a magnitude: `-` is an operator),
    /// so that `-9223372036854775808` can be read.
    Int(u64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    True,
    False,
    Null,
    In,
    Ident(String),
    /// Punctuation and operators, as written (`&&`, `(`, `?`...).
    Punct(&'static str),
    End,
}

/// Words CEL reserves for embedding languages: never identifiers.
const RESERVED: [&str; 17] = [
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// Longest first, so `==` is not read as `=` `=`.
const PUNCT: [&str; 24] = [
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "+", "-", "*", "/", "%", "?", ":", ".", ",",
    "(", ")", "[", "]", "{", "}",
];

/// Every token of `text`, ending with [`Tok::End`].
pub(super) fn tokens(text: &str) -> Result<Vec<Token>, CompileError> {
    let mut lexer = Lexer { text, pos: 0 };
    let mut out = Vec::new();
    loop {
        let token = lexer.next()?;
        let end = token.kind == Tok::End;
        out.push(token);
        if end {
            return Ok(out);
        }
    }
}

struct Lexer<'t> {
    text: &'t str,
    pos: usize,
}

impl<'t> Lexer<'t> {
    fn rest(&self) -> &'t str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn error(&self, at: usize, message: impl Into<String>) -> CompileError {
        CompileError::new(self.text, at, message)
    }

    /// A string literal's bytes as text (UTF-8 by construction).
    fn text_of(&self, s: Vec<u8>) -> Result<Tok, CompileError> {
        String::from_utf8(s)
            .map(Tok::Str)
            .map_err(|_| self.error(self.pos, "string literal is not UTF-8"))
    }

    fn skip_space(&mut self) {
        loop {
            let rest = self.rest();
            let trimmed = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0c']);
            self.pos += rest.len() - trimmed.len();
            if trimmed.starts_with("//") {
                self.pos += trimmed.find('\n').unwrap_or(trimmed.len());
            } else {
                return;
            }
        }
    }

    fn next(&mut self) -> Result<Token, CompileError> {
        self.skip_space();
        let at = self.pos;
        let rest = self.rest();
        let Some(c) = rest.chars().next() else {
            return Ok(Token { at, kind: Tok::End });
        };
        let kind = if c.is_ascii_digit()
            || (c == '.' && rest[1..].starts_with(|d: char| d.is_ascii_digit()))
        {
            self.number()?
        } else if c == '_' || c.is_ascii_alphabetic() {
            self.word()?
        } else if c == '"' || c == '\'' {
            let s = self.string(false, false)?;
            self.text_of(s)?
        } else if let Some(p) = PUNCT.iter().find(|p| rest.starts_with(**p)) {
            self.pos += p.len();
            Tok::Punct(p)
        } else {
            return Err(self.error(at, format!("unexpected character `{c}`")));
        };
        Ok(Token { at, kind })
    }

    /// An identifier, keyword, or a prefixed string (`r"..."`, `b'...'`).
    fn word(&mut self) -> Result<Tok, CompileError> {
        let rest = self.rest();
        let len = rest
            .find(|c: char| c != '_' && !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        let word = &rest[..len];
        let after = rest[len..].chars().next();
        if matches!(after, Some('"' | '\'')) && len <= 2 {
            let lower = word.to_ascii_lowercase();
            let (raw, bytes) = (lower.contains('r'), lower.contains('b'));
            if matches!(lower.as_str(), "r" | "b" | "rb" | "br") {
                self.pos += len;
                let s = self.string(raw, bytes)?;
                return Ok(if bytes {
                    Tok::Bytes(s)
                } else {
                    self.text_of(s)?
                });
            }
        }
        let at = self.pos;
        self.pos += len;
        Ok(match word {
            "true" => Tok::True,
            "false" => Tok::False,
            "null" => Tok::Null,
            "in" => Tok::In,
            w if RESERVED.contains(&w) => {
                return Err(self.error(at, format!("`{w}` is a reserved word")))
            }
            w => Tok::Ident(w.to_string()),
        })
    }

    fn number(&mut self) -> Result<Tok, CompileError> {
        let at = self.pos;
        let rest = self.rest();
        let b = rest.as_bytes();
        let digits = |from: usize| {
            from + b
                .get(from..)
                .unwrap_or(&[])
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
        };
        if rest.starts_with("0x") || rest.starts_with("0X") {
            let len = 2 + rest[2..].bytes().take_while(u8::is_ascii_hexdigit).count();
            let n = u64::from_str_radix(&rest[2..len], 16)
                .map_err(|_| self.error(at, "hexadecimal literal out of range or empty"))?;
            return Ok(self.integer(len, n));
        }
        let mut end = digits(0);
        let mut float = false;
        if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
            end = digits(end + 1);
            float = true;
        }
        if matches!(b.get(end), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(b.get(end + 1), Some(b'+' | b'-')));
            let exp_end = digits(end + 1 + sign);
            if exp_end > end + 1 + sign {
                end = exp_end;
                float = true;
            }
        }
        if float {
            let x: f64 = rest[..end]
                .parse()
                .map_err(|_| self.error(at, "malformed floating-point literal"))?;
            self.pos += end;
            return Ok(Tok::Double(x));
        }
        let n: u64 = rest[..end]
            .parse()
            .map_err(|_| self.error(at, "integer literal out of range"))?;
        Ok(self.integer(end, n))
    }

    /// An integer of `len` bytes, with its `u` suffix if any.
    fn integer(&mut self, len: usize, n: u64) -> Tok {
        self.pos += len;
        if self.rest().starts_with(['u', 'U']) {
            self.pos += 1;
            Tok::Uint(n)
        } else {
            Tok::Int(n)
        }
    }

    /// A quoted string at `pos` (after any prefix) as bytes, escapes
    /// decoded unless `raw`. In `bytes`, octal and `\x` escapes stand for
    /// octets (`b"\377"` is one byte, `b"ÿ"` two); in a string, for code
    /// points, so a string's bytes are always UTF-8.
    fn string(&mut self, raw: bool, bytes: bool) -> Result<Vec<u8>, CompileError> {
        let at = self.pos;
        let rest = self.rest();
        let quote = if rest.starts_with("\"\"\"") {
            "\"\"\""
        } else if rest.starts_with("'''") {
            "'''"
        } else {
            &rest[..1]
        };
        let body_at = at + quote.len();
        let body = &self.text[body_at..];
        let mut out = Vec::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            if body[i..].starts_with(quote) {
                self.pos = body_at + i + quote.len();
                return Ok(out);
            }
            if quote.len() == 1 && (c == '\n' || c == '\r') {
                break;
            }
            if c == '\\' && !raw {
                let (code, used) =
                    escape(&body[i + 1..], bytes).map_err(|m| self.error(body_at + i, m))?;
                match (bytes, u8::try_from(code)) {
                    (true, Ok(octet)) if used > 1 => out.push(octet),
                    _ => push_char(&mut out, code).map_err(|m| self.error(body_at + i, m))?,
                }
                for _ in 0..used {
                    chars.next();
                }
            } else {
                push_char(&mut out, u32::from(c)).map_err(|m| self.error(body_at + i, m))?;
            }
        }
        Err(self.error(at, "unterminated string literal"))
    }
}

fn push_char(out: &mut Vec<u8>, code: u32) -> Result<(), String> {
    let c = char::from_u32(code).ok_or_else(|| format!("{code:#x} is not a code point"))?;
    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
    Ok(())
}

/// An escape after its `\`: the character it stands for and how many
/// characters of `after` it used.
fn escape(after: &str, bytes: bool) -> Result<(u32, usize), String> {
    let c = after.chars().next().ok_or("a string ends with `\\`")?;
    let simple = match c {
        'a' => Some('\x07'),
        'b' => Some('\x08'),
        'f' => Some('\x0c'),
        'n' => Some('\n'),
        'r' => Some('\r'),
        't' => Some('\t'),
        'v' => Some('\x0b'),
        '\\' | '?' | '"' | '\'' | '`' => Some(c),
        _ => None,
    };
    if let Some(s) = simple {
        return Ok((u32::from(s), 1));
    }
    let (radix, len) = match c {
        'x' | 'X' => (16, 2),
        'u' if !bytes => (16, 4),
        'U' if !bytes => (16, 8),
        '0'..='3' => (8, 3),
        _ => return Err(format!("unknown escape `\\{c}`")),
    };
    let start = usize::from(radix == 16);
    let digits = after
        .get(start..start + len)
        .ok_or_else(|| format!("escape `\\{c}` needs {len} digits"))?;
    let code = u32::from_str_radix(digits, radix)
        .map_err(|_| format!("escape `\\{c}` needs {len} digits"))?;
    Ok((code, start + len))
}
