//! The check that no integration test runs anything of the clone as another user: a clone
//! under /root (mode 0700) is no place another user may enter, so what a test runs as one (the
//! leash binary, a script, a Python or Node library) must be a copy where anyone may read it
//! (`Daemon::leash_for_anyone`, `leash_for_anyone_in`, `copy_readable`).
//!
//! Static, on purpose: running the suite from a 0700 directory would build it all again. Per
//! function of tests/tests and tests/src (comments left out, string literals kept, since
//! shell and setpriv argv are strings): a function that changes user (`.uid(N)`, setpriv,
//! runuser, `as_nobody`...) must not name a path of the clone (`leash_binary()`,
//! `workspace_root()`, `CARGO_MANIFEST_DIR`, `target/`), itself or through a function of the
//! same file that does. A function that makes the readable copy is where the clone is meant to
//! be read, so it passes nothing on. A function that is right to do both (root runs the clone's
//! file; the user runs a copy) says why in a comment holding [`ALLOWED`].

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// What, in a function's code, runs something as another user.
const OTHER_USER: &[&str] = &[
    "setpriv",
    "--reuid",
    "runuser",
    "sudo -u",
    "as_nobody(",
    "setuid(",
    "setresuid(",
    ".gid(",
];

/// What names a path inside the clone.
const CLONE_PATHS: &[&str] = &[
    "leash_binary(",
    "workspace_root(",
    "CARGO_MANIFEST_DIR",
    "current_exe(",
    "target/",
];

/// What makes the copy another user may read: a function that calls or is one of these reads
/// the clone only to copy it.
const READABLE_COPY: &[&str] = &["leash_for_anyone", "copy_readable"];

/// The comment (any case) that says why a function both changes user and names the clone.
pub(super) const ALLOWED: &str = "readable by other users:";

/// One function of a source file: its name, its code without comments, and whether a comment
/// in it holds [`ALLOWED`].
#[derive(Debug)]
struct Function {
    name: String,
    code: String,
    allowed: bool,
}

/// A function that runs something of the clone as another user.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Finding {
    pub(super) file: PathBuf,
    pub(super) function: String,
    /// What names the clone in it.
    pub(super) path: String,
}

/// The findings in every .rs file under `dirs`.
pub(super) fn check(dirs: &[PathBuf]) -> Result<Vec<Finding>> {
    let mut findings = Vec::new();
    for dir in dirs {
        for file in rust_files(dir)? {
            let source =
                fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            findings.extend(
                check_source(&source)
                    .into_iter()
                    .map(|(function, path)| Finding {
                        file: file.clone(),
                        function,
                        path,
                    }),
            );
        }
    }
    Ok(findings)
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The functions of `source` that change user and name the clone: each with what names it.
pub(super) fn check_source(source: &str) -> Vec<(String, String)> {
    let functions = functions(source);
    let copies = |f: &Function| {
        READABLE_COPY
            .iter()
            .any(|copy| f.name.contains(copy) || f.code.contains(copy))
    };
    // The clone's paths, and the functions of this file that name one, to a fixed point.
    let mut names: Vec<String> = CLONE_PATHS.iter().map(|p| p.to_string()).collect();
    let mut naming: BTreeSet<&str> = BTreeSet::new();
    loop {
        let more: Vec<&Function> = functions
            .iter()
            .filter(|f| !naming.contains(f.name.as_str()) && !copies(f))
            .filter(|f| names.iter().any(|n| f.code.contains(n.as_str())))
            .collect();
        if more.is_empty() {
            break;
        }
        for f in more {
            naming.insert(&f.name);
            names.push(format!("{}(", f.name));
        }
    }
    // A constant (a shell script) that changes user does so in the functions that use it.
    let scripts = user_constants(source);
    let changes_user =
        |code: &str| changes_user(code) || scripts.iter().any(|name| code.contains(name.as_str()));
    functions
        .iter()
        .filter(|f| !f.allowed && !copies(f) && changes_user(&f.code))
        .filter_map(|f| {
            let path = names.iter().find(|n| f.code.contains(n.as_str()))?;
            Some((f.name.clone(), path.clone()))
        })
        .collect()
}

fn changes_user(code: &str) -> bool {
    // `.uid(N)` sets a Command's uid; `.uid()` reads a file's owner.
    OTHER_USER.iter().any(|marker| code.contains(marker))
        || code
            .match_indices(".uid(")
            .any(|(at, m)| !code[at + m.len()..].starts_with(')'))
}

/// The names of the `const`s and `static`s of `source` whose value changes user.
fn user_constants(source: &str) -> Vec<String> {
    let (code, _) = split_comments(source);
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    for keyword in ["const", "static"] {
        let mut i = 0;
        while let Some(at) = find_word(&chars, i, keyword) {
            i = at + keyword.len();
            let name: String = chars[i..]
                .iter()
                .skip_while(|c| c.is_whitespace())
                .take_while(|c| c.is_alphanumeric() || **c == '_')
                .collect();
            let end = find_word(&chars, i, ";").unwrap_or(chars.len());
            let value: String = chars[i..end].iter().collect();
            if !name.is_empty() && name != "fn" && changes_user(&value) {
                found.push(name);
            }
            i = end;
        }
    }
    found
}

/// Every `fn` of `source` with its body (a nested function is in its parent's too).
fn functions(source: &str) -> Vec<Function> {
    let (code, comments) = split_comments(source);
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = find_word(&chars, i, "fn") {
        i = at + 2;
        let name: String = chars[i..]
            .iter()
            .skip_while(|c| c.is_whitespace())
            .take_while(|c| c.is_alphanumeric() || **c == '_')
            .collect();
        let Some(open) = (i..chars.len()).find(|&j| matches!(chars[j], '{' | ';')) else {
            break;
        };
        if chars[open] == ';' || name.is_empty() {
            continue;
        }
        let close = matching_brace(&chars, open);
        found.push(Function {
            name,
            code: chars[open..close].iter().collect(),
            allowed: comments.iter().any(|(at, text)| {
                (open..close).contains(at) && text.to_lowercase().contains(ALLOWED)
            }),
        });
    }
    found
}

/// Where the word (or punctuation) `word` next stands in code (not in a string), from `from`.
fn find_word(chars: &[char], from: usize, word: &str) -> Option<usize> {
    let word: Vec<char> = word.chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    // A word stands alone; punctuation (`;`) needs no boundary.
    let word_is_ident = word.iter().all(|&c| is_ident(c));
    let mut in_string = false;
    let mut i = from;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            if c == '\\' {
                i += 1;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if chars[i..].starts_with(&word)
            && (!word_is_ident
                || ((i == 0 || !is_ident(chars[i - 1]))
                    && !chars.get(i + word.len()).is_some_and(|&c| is_ident(c))))
        {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The index just past the `}` that closes the `{` at `open`, braces in strings not counted.
fn matching_brace(chars: &[char], open: usize) -> usize {
    let (mut depth, mut in_string) = (0usize, false);
    let mut i = open;
    while i < chars.len() {
        match (in_string, chars[i]) {
            (true, '\\') => i += 1,
            (true, '"') | (false, '"') => in_string = !in_string,
            (false, '{') => depth += 1,
            (false, '}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    chars.len()
}

/// `source` with its comments blanked out (so that indices stay), and the comments with where
/// each starts. Strings are kept: raw strings (`r#"…"#`, whose `"` and `\` are plain) are
/// turned into ordinary ones' shape by blanking their inner quotes, so that later passes need
/// to know only `"…"` with escapes. Char literals that are a quote (`'"'`) are blanked too.
fn split_comments(source: &str) -> (String, Vec<(usize, String)>) {
    let chars: Vec<char> = source.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut code = chars.clone();
    let mut comments = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            let start = i;
            while i < chars.len() && chars[i] != '\n' {
                code[i] = ' ';
                i += 1;
            }
            comments.push((start, chars[start..i].iter().collect()));
        } else if c == '/' && at(i + 1) == '*' {
            let (start, mut depth) = (i, 0);
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    code[i] = ' ';
                    code[i + 1] = ' ';
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    code[i] = ' ';
                    code[i + 1] = ' ';
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    code[i] = ' ';
                    i += 1;
                }
            }
            comments.push((start, chars[start..i].iter().collect()));
        } else if c == 'r'
            && matches!(at(i + 1), '#' | '"')
            && (i == 0 || !chars[i - 1].is_alphanumeric())
        {
            // A raw string: r, hashes, the quote; its end is a quote and as many hashes.
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            let open = i + 1 + hashes;
            if at(open) != '"' {
                i += 1;
                continue;
            }
            let mut j = open + 1;
            while j < chars.len()
                && !(chars[j] == '"'
                    && chars[j + 1..].iter().take(hashes).all(|&c| c == '#')
                    && chars.len() - j > hashes)
            {
                if matches!(chars[j], '"' | '\\') {
                    code[j] = ' ';
                }
                j += 1;
            }
            i = j + 1 + hashes;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' && at(i + 1) == '"' && at(i + 2) == '\'' {
            code[i + 1] = ' ';
            i += 3;
        } else {
            i += 1;
        }
    }
    (code.into_iter().collect(), comments)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test as it was before it ran a readable copy: the shim, from the build tree, as
    /// uid 61001, who cannot run it from a clone under /root.
    const BEFORE: &str = r####"
#[test]
fn a_shim_given_leash_lease_wipes_it_from_its_environ_while_it_registers() {
    let token = "0123456789abcdef0123456789abcdef";
    let mut shim = Command::new(leash_binary())
        .args(["--socket", path_str(&socket), "exec", "--", "true"])
        .env("LEASH_LEASE", token)
        .uid(USER_A)
        .gid(USER_A)
        .current_dir("/")
        .spawn()
        .unwrap();
    // Read as the shim's own user, as an agent of that user would.
    let environ = Command::new("setpriv")
        .args(setpriv_args(USER_A))
        .arg("cat")
        .output()
        .unwrap();
}
"####;

    #[test]
    fn the_shim_run_from_the_build_tree_as_another_user_is_found() {
        assert_eq!(
            check_source(BEFORE),
            [(
                "a_shim_given_leash_lease_wipes_it_from_its_environ_while_it_registers".into(),
                "leash_binary(".into()
            )]
        );
        let after = BEFORE.replace("leash_binary()", "leash_for_anyone_in(&dir.0)");
        assert_eq!(check_source(&after), []);
    }

    #[test]
    fn root_running_the_build_tree_and_reading_a_file_owner_are_not_findings() {
        let source = r#"
fn as_root() { Command::new(leash_binary()).spawn(); }
fn owner() { assert_eq!(fs::metadata(workspace_root()).unwrap().uid(), 0); }
// setpriv in a comment: workspace_root()
fn commented() { let x = leash_binary(); /* .uid(1) setpriv */ }
"#;
        assert_eq!(check_source(source), []);
    }

    #[test]
    fn a_clone_path_through_a_function_of_the_file_or_in_a_script_is_found() {
        let source = r##"
fn venv_python() -> PathBuf { workspace_root().join("target/hosts/python/bin/python") }
fn host() { Command::new("setpriv").args(setpriv_args(USER_A)).arg(venv_python()); }
const SCRIPT: &str = r#"setpriv --reuid 61001 "$0" run"#;
fn script() { Command::new("sh").args(["-c", SCRIPT, "x", "{"]).arg(leash_binary()); }
fn quoted() { let quote = r#"""#; Command::new("sh").arg(leash_binary()); }
"##;
        let found: Vec<String> = check_source(source).into_iter().map(|(f, _)| f).collect();
        assert_eq!(found, ["host", "script"]);
        let allowed = source.replace(
            "fn host() {",
            &format!("fn host() {{ // {ALLOWED} root makes the copy first\n"),
        );
        let found: Vec<String> = check_source(&allowed).into_iter().map(|(f, _)| f).collect();
        assert_eq!(found, ["script"]);
    }

    #[test]
    fn a_readable_copy_passes_nothing_on() {
        let source = r#"
fn leash_for_anyone_in(dir: &Path) -> PathBuf { fs::copy(leash_binary(), dir.join("leash")); }
fn host() { Command::new("setpriv").args(setpriv_args(1)).arg(leash_for_anyone_in(&dir)); }
"#;
        assert_eq!(check_source(source), []);
    }
}
