//! The code the docs show type-checks, as a host author's editor would check it: every block
//! fenced as `python`, `ts` or `js` in README.md, clients/python/README.md,
//! clients/node/README.md and docs/HOSTS.md is written to a file of its own and checked, the
//! Python ones with `mypy --strict` against the library in clients/python/src, the TypeScript and
//! JavaScript ones with `tsc --strict` against clients/node's declarations and the Claude Agent
//! SDK's, as an app beside a node_modules would see them. A fragment that cannot stand alone is
//! marked `<!-- no-check -->` on the line before its fence.
//!
//! mypy is the one `cargo xtask test` installs in target/hosts/python; TypeScript, Node's types
//! and the SDK are in the hosts' npm cache it fills (LEASH_HOSTS_CACHE, or /var/cache/leash-hosts).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use leash_tests::{Removed, SKIP_HOSTS_VAR, hosts_cache, hosts_skipped, workspace_root};

/// The documents whose code blocks a host author copies.
const DOCS: &[&str] = &[
    "README.md",
    "clients/python/README.md",
    "clients/node/README.md",
    "docs/HOSTS.md",
];

/// The line that leaves the next block out.
const NO_CHECK: &str = "<!-- no-check -->";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Language {
    Python,
    TypeScript,
    JavaScript,
}

impl Language {
    fn from_fence(info: &str) -> Option<Self> {
        match info.split_whitespace().next()? {
            "python" | "py" => Some(Self::Python),
            "ts" | "typescript" => Some(Self::TypeScript),
            "js" | "javascript" => Some(Self::JavaScript),
            _ => None,
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Self::Python => "py",
            Self::TypeScript => "ts",
            Self::JavaScript => "js",
        }
    }
}

/// One block: where it is (for the checkers' messages, its file is named after it) and its code.
struct Block {
    doc: &'static str,
    /// The line of its opening fence, counted from 1.
    line: usize,
    language: Language,
    code: String,
}

impl Block {
    /// A file name that says where the block is, and is a valid Python module name.
    fn file_name(&self) -> String {
        let doc: String = self
            .doc
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!(
            "{}_line_{}.{}",
            doc.to_lowercase(),
            self.line,
            self.language.extension()
        )
    }
}

/// The checked blocks of `doc`, whose text is `text`.
fn blocks(doc: &'static str, text: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<(usize, Option<Language>, bool)> = None;
    let mut code = String::new();
    let mut previous = "";
    for (index, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&open, fence) {
            (None, Some(info)) => {
                let skipped = previous.trim() == NO_CHECK;
                open = Some((index + 1, Language::from_fence(info), skipped));
                code.clear();
            }
            (Some((start, language, skipped)), Some(_)) => {
                if let (Some(language), false) = (language, skipped) {
                    found.push(Block {
                        doc,
                        line: *start,
                        language: *language,
                        code: code.clone(),
                    });
                }
                open = None;
            }
            (Some(_), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    assert!(open.is_none(), "{doc}: a code block is never closed");
    found
}

fn all_blocks() -> Vec<Block> {
    let root = workspace_root();
    DOCS.iter()
        .flat_map(|doc| {
            let text =
                fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("reading {doc}: {e}"));
            blocks(doc, &text)
        })
        .collect()
}

fn scratch(label: &str) -> Removed {
    let dir = std::env::temp_dir().join(format!("leash-doc-{label}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    Removed(dir)
}

/// Writes `blocks` into `dir`, each a file named after where it is; returns the file names.
fn write_blocks(dir: &Path, blocks: &[&Block]) -> Vec<String> {
    blocks
        .iter()
        .map(|block| {
            let name = block.file_name();
            fs::write(dir.join(&name), &block.code).unwrap();
            name
        })
        .collect()
}

fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} found errors in the docs' code (each file is named after its document and the \
         line of its fence):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_docs_python_blocks_pass_mypy_strict() {
    if hosts_skipped("docs' Python examples'") {
        return;
    }
    let blocks = all_blocks();
    let python: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.language == Language::Python)
        .collect();
    assert!(
        python.len() >= 4,
        "only {} Python blocks found in {DOCS:?}",
        python.len()
    );
    let root = workspace_root();
    let interpreter = root.join("target/hosts/python/bin/python");
    assert!(
        interpreter.is_file(),
        "no Python environment at {}: run `cargo xtask test`, which creates it with mypy (or set \
         {SKIP_HOSTS_VAR}=1 to leave the host libraries' checks out)",
        interpreter.display()
    );
    let dir = scratch("python");
    let files = write_blocks(&dir.0, &python);
    run(
        Command::new(&interpreter)
            .args([
                "-m",
                "mypy",
                "--strict",
                "--no-incremental",
                "--config-file",
            ])
            .arg(root.join("clients/python/pyproject.toml"))
            .args(&files)
            .env("MYPYPATH", root.join("clients/python/src"))
            .current_dir(&dir.0),
        "mypy --strict",
    );
}

#[test]
fn the_docs_typescript_and_javascript_blocks_pass_tsc_strict() {
    if hosts_skipped("docs' TypeScript examples'") {
        return;
    }
    let blocks = all_blocks();
    let scripts: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.language != Language::Python)
        .collect();
    assert!(
        scripts.len() >= 4,
        "only {} TypeScript and JavaScript blocks found in {DOCS:?}",
        scripts.len()
    );
    let cache = hosts_cache().join("node_modules");
    let tsc = cache.join("typescript/bin/tsc");
    assert!(
        tsc.is_file(),
        "no TypeScript at {}: run `cargo xtask test`, which installs it with the Claude Agent SDK \
         (or set {SKIP_HOSTS_VAR}=1 to leave the host libraries' checks out)",
        tsc.display()
    );
    // An app as a host author has it: its files beside a node_modules holding leash-client, the
    // SDK and Node's types. The SDK's optional peers are not installed, so skipLibCheck lets what
    // comes from them be `any`; what the docs call is checked in full.
    let dir = scratch("ts");
    let modules = dir.0.join("node_modules");
    fs::create_dir_all(modules.join("@anthropic-ai")).unwrap();
    fs::create_dir_all(modules.join("@types")).unwrap();
    let links: [(PathBuf, &str); 3] = [
        (workspace_root().join("clients/node"), "leash-client"),
        (
            cache.join("@anthropic-ai/claude-agent-sdk"),
            "@anthropic-ai/claude-agent-sdk",
        ),
        (cache.join("@types/node"), "@types/node"),
    ];
    for (target, name) in links {
        std::os::unix::fs::symlink(&target, modules.join(name)).unwrap();
    }
    let files = write_blocks(&dir.0, &scripts);
    fs::write(dir.0.join("package.json"), r#"{"type":"module"}"#).unwrap();
    let config = serde_json::json!({
        "compilerOptions": {
            "target": "es2022",
            "lib": ["es2022", "esnext.disposable"],
            "module": "nodenext",
            "moduleResolution": "nodenext",
            "strict": true,
            "allowJs": true,
            "checkJs": true,
            "noEmit": true,
            "skipLibCheck": true,
            "types": ["node"],
        },
        "files": files,
    });
    fs::write(dir.0.join("tsconfig.json"), config.to_string()).unwrap();
    run(
        Command::new("node").arg(&tsc).arg("--project").arg(&dir.0),
        "tsc --strict",
    );
}

#[test]
fn blocks_are_found_with_their_lines_and_the_marker_leaves_one_out() {
    let text = "# Title\n\n```python\nx: int = 1\n```\n\n<!-- no-check -->\n\n```ts\nlet y\n```\n\
                ```sh\nls\n```\n```js\nconst z = 1;\n```\n";
    let found = blocks("doc.md", text);
    let seen: Vec<(usize, Language, &str)> = found
        .iter()
        .map(|b| (b.line, b.language, b.code.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (3, Language::Python, "x: int = 1\n"),
            (15, Language::JavaScript, "const z = 1;\n"),
        ]
    );
    assert_eq!(found[0].file_name(), "doc_md_line_3.py");
}
