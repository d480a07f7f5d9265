//! The tokens of Rust source that paths are made of, for the import-cycle check: a lexer that
//! knows comments and literals well enough to skip them, and nothing more.

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

pub(super) fn is_ident(token: Option<&Token>, word: &str) -> bool {
    matches!(token, Some(Token::Ident(w)) if w == word)
}

/// The tokens of Rust source that matter to paths: identifiers (raw ones without `r#`), `::` and
/// single punctuation. Comments, string, char and number literals, and lifetimes are dropped.
pub(super) fn tokenize(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let ident_start = |c: char| c == '_' || c.is_alphabetic();
    let ident_char = |c: char| c == '_' || c.is_alphanumeric();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&chars, i) {
            i = end;
        } else if c == '"' || ((c == 'b' || c == 'c') && at(i + 1) == '"') {
            i += if c == '"' { 1 } else { 2 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            // A char literal ('a', '\n', b'x') or a lifetime ('a, 'static).
            let start = if c == 'b' { i + 1 } else { i };
            if at(start + 1) == '\\' {
                i = start + 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(start + 2) == '\'' {
                i = start + 3;
            } else {
                i = start + 1;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c == 'r' && at(i + 1) == '#' && ident_start(at(i + 2)) {
            let start = i + 2;
            i = start;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if ident_start(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token::PathSep);
            i += 2;
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// If a raw string literal (`r"…"`, `r#"…"#`, `br"…"`, `cr"…"`) starts at `i`, where it ends.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    j += hashes;
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && chars[j + 1..].iter().take_while(|&&c| c == '#').count() >= hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(source: &str) -> Vec<String> {
        tokenize(source)
            .into_iter()
            .filter_map(|t| match t {
                Token::Ident(w) => Some(w),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_chars_and_lifetimes_are_not_code() {
        let source = r##"
            // use crate::a;
            /* use crate::b; /* nested */ crate::c */
            let s = "crate::d \" crate::e";
            let r = r#"crate::f "quoted" "#;
            let c = '"'; let q = '\''; fn f<'a>(x: &'a str) {}
            real
        "##;
        assert_eq!(
            idents(source),
            [
                "let", "s", "let", "r", "let", "c", "let", "q", "fn", "f", "x", "str", "real"
            ]
        );
    }
}
