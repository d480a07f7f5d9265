//! A crate's modules as rustc finds them from a root, and the items of the crate each file's
//! `use`s and paths name (resolved to the file of the module that defines them).

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::{
    graph::Edges,
    tokens::{Token, is_ident, tokenize},
};

/// One crate root's modules: each module path (`["daemon", "owner"]`) and the file it is in
/// (inline modules are in their parent's file).
#[derive(Debug, Default)]
pub(super) struct ModuleTree {
    modules: HashMap<Vec<String>, PathBuf>,
    /// Each file and the module path it defines.
    files: Vec<(PathBuf, Vec<String>)>,
}

impl ModuleTree {
    pub(super) fn discover(root: &Path) -> Result<Self> {
        let mut tree = Self::default();
        let dir = root.parent().context("a crate root has a directory")?;
        tree.load(root, Vec::new(), dir.to_path_buf())?;
        Ok(tree)
    }

    /// Reads `file`, the module `path`, whose `mod x;` children live in `dir`.
    fn load(&mut self, file: &Path, path: Vec<String>, dir: PathBuf) -> Result<()> {
        let source =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let tokens = tokenize(&source);
        self.modules.insert(path.clone(), file.to_path_buf());
        self.files.push((file.to_path_buf(), path.clone()));
        let mut inline = Vec::new();
        let mut braces: Vec<Option<String>> = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                Token::Ident(word) if word == "mod" => {
                    if let Some(Token::Ident(name)) = tokens.get(i + 1) {
                        let mut child = path.clone();
                        child.extend(inline.iter().cloned());
                        child.push(name.clone());
                        match tokens.get(i + 2) {
                            Some(Token::Punct(';')) => {
                                let mut child_dir = dir.clone();
                                child_dir.extend(&inline);
                                let flat = child_dir.join(format!("{name}.rs"));
                                let nested = child_dir.join(name).join("mod.rs");
                                let (child_file, grandchildren) = if flat.exists() {
                                    (flat, child_dir.join(name))
                                } else if nested.exists() {
                                    (nested, child_dir.join(name))
                                } else {
                                    // A module that rustc would not find either (cfg'd out).
                                    i += 3;
                                    continue;
                                };
                                self.load(&child_file, child, grandchildren)?;
                                i += 3;
                                continue;
                            }
                            Some(Token::Punct('{')) => {
                                self.modules.insert(child, file.to_path_buf());
                                inline.push(name.clone());
                                braces.push(Some(name.clone()));
                                i += 3;
                                continue;
                            }
                            _ => {}
                        }
                    }
                }
                Token::Punct('{') => braces.push(None),
                Token::Punct('}') => {
                    if let Some(Some(_)) = braces.pop() {
                        inline.pop();
                    }
                }
                _ => {}
            }
            i += 1;
        }
        Ok(())
    }

    fn exists(&self, path: &[String]) -> bool {
        self.modules.contains_key(path)
    }

    /// Adds the arrows out of every file of this tree to `edges`, and what they make of the
    /// folders to `rooms`.
    ///
    /// Arrows between a module and its own ancestors (a child naming what its parent's mod.rs
    /// defines, a parent naming or re-exporting its child's items) are the module tree itself,
    /// not a tangle: they go to `family` and close no cycle. Without that, every mod.rs that
    /// both holds its children's shared types and calls into them would be one.
    ///
    /// Every other arrow is also one between two sibling modules, each with all below it: the
    /// children of the deepest module both files are in. Those go to `rooms`, keyed by the
    /// files that define the two siblings (`daemon/io.rs → daemon/rules.rs`), so that folders
    /// that reach each other are a cycle even where their files never do.
    pub(super) fn add_edges(
        &self,
        edges: &mut Edges,
        family: &mut Edges,
        rooms: &mut Edges,
    ) -> Result<()> {
        let module_of: HashMap<&Path, &[String]> = self
            .files
            .iter()
            .map(|(file, path)| (file.as_path(), path.as_slice()))
            .collect();
        for (file, path) in &self.files {
            let source =
                fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            for (target, name) in self.references(file, path, &tokenize(&source)) {
                if &target == file {
                    continue;
                }
                let other = module_of.get(target.as_path()).copied().unwrap_or_default();
                let related = path.starts_with(other) || other.starts_with(path);
                if related {
                    family
                        .entry((file.clone(), target))
                        .or_default()
                        .insert(name);
                    continue;
                }
                if let Some(siblings) = self.siblings(path, other) {
                    rooms.entry(siblings).or_default().insert(name.clone());
                }
                edges
                    .entry((file.clone(), target))
                    .or_default()
                    .insert(name);
            }
        }
        Ok(())
    }

    /// The files of the two sibling modules that hold modules `a` and `b` (neither an ancestor
    /// of the other): the children, on each side, of the deepest module both are in.
    fn siblings(&self, a: &[String], b: &[String]) -> Option<(PathBuf, PathBuf)> {
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let a = self.modules.get(a.get(..=common)?)?;
        let b = self.modules.get(b.get(..=common)?)?;
        Some((a.clone(), b.clone()))
    }

    /// The (file, name) of every item of this crate that the file of module `path` names.
    fn references(&self, file: &Path, path: &[String], tokens: &[Token]) -> Vec<(PathBuf, String)> {
        let mut scope = Scope {
            tree: self,
            aliases: HashMap::new(),
            globs: Vec::new(),
        };
        let (uses, paths) = collect_paths(path, tokens);
        let mut found = Vec::new();
        // `use` first: they make the names that paths in code start with.
        for (module, leaf) in &uses {
            if let Some(resolved) = scope.resolve(module, &leaf.segments) {
                if resolved.is_module {
                    let name = leaf
                        .alias
                        .clone()
                        .or_else(|| resolved.module.last().cloned());
                    if let Some(name) = name.filter(|n| n != "_") {
                        scope.aliases.insert(name, resolved.module.clone());
                    }
                } else if resolved.name == "*" {
                    scope.globs.push(resolved.module.clone());
                }
                found.push(resolved);
            }
        }
        for (module, segments) in &paths {
            if let Some(resolved) = scope.resolve(module, segments) {
                found.push(resolved);
            }
        }
        found
            .into_iter()
            .filter_map(|r| Some((self.modules.get(&r.module)?.clone(), r.name)))
            .filter(|(target, _)| target != file)
            .collect()
    }
}

/// What a file's paths start from: the crate's modules, and the modules it imported.
struct Scope<'a> {
    tree: &'a ModuleTree,
    /// `use super::enforcement;` makes `enforcement` name that module in this file.
    aliases: HashMap<String, Vec<String>>,
    /// `use super::*;` makes the children of that module nameable too.
    globs: Vec<Vec<String>>,
}

#[derive(Debug)]
struct Resolved {
    /// The module whose file defines (or re-exports) the name.
    module: Vec<String>,
    /// The item named, or the module's own name when the path ends at a module.
    name: String,
    is_module: bool,
}

impl Scope<'_> {
    /// Where `segments`, written in `module`, lead: None if not into this crate.
    fn resolve(&self, module: &[String], segments: &[String]) -> Option<Resolved> {
        let first = segments.first()?;
        let (mut current, mut i) = match first.as_str() {
            "crate" => (Vec::new(), 1),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                (module[..module.len().checked_sub(ups)?].to_vec(), ups)
            }
            "self" => (module.to_vec(), 1),
            name => {
                let child = [module, &[name.to_owned()]].concat();
                if self.tree.exists(&child) {
                    (child, 1)
                } else if let Some(alias) = self.aliases.get(name) {
                    (alias.clone(), 1)
                } else {
                    let glob = self.globs.iter().find_map(|g| {
                        let child = [g.as_slice(), &[name.to_owned()]].concat();
                        self.tree.exists(&child).then_some(child)
                    })?;
                    (glob, 1)
                }
            }
        };
        while let Some(segment) = segments.get(i) {
            let child = [current.as_slice(), std::slice::from_ref(segment)].concat();
            if !self.tree.exists(&child) {
                break;
            }
            current = child;
            i += 1;
        }
        let (name, is_module) = match segments.get(i) {
            Some(item) => (item.clone(), false),
            None => (
                current
                    .last()
                    .cloned()
                    .unwrap_or_else(|| "crate".to_owned()),
                true,
            ),
        };
        Some(Resolved {
            module: current,
            name,
            is_module,
        })
    }
}

/// One path a `use` brings in: `use super::owner::{self, Owner as O}` has two.
#[derive(Debug, PartialEq, Eq)]
struct UseLeaf {
    segments: Vec<String>,
    alias: Option<String>,
}

/// A module path, or a path as written: its segments.
type Segments = Vec<String>;
/// Something written in a module (the module's path first).
type Written<T> = (Segments, T);

/// The `use` leaves and the paths in code of a file whose module is `file_module`, each with the
/// module it is written in (the file's, or an inline module's inside it). Paths in code are
/// those of two or more segments, from their first: `a::b::c`, not `b::c` within it.
fn collect_paths(
    file_module: &[String],
    tokens: &[Token],
) -> (Vec<Written<UseLeaf>>, Vec<Written<Segments>>) {
    let mut uses = Vec::new();
    let mut paths = Vec::new();
    let mut module = file_module.to_vec();
    let mut braces: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(word) if word == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    module.push(name.clone());
                    braces.push(true);
                    i += 3;
                    continue;
                }
            }
            Token::Ident(word) if word == "use" => {
                let mut leaves = Vec::new();
                i = parse_use_tree(tokens, i + 1, &[], &mut leaves);
                uses.extend(leaves.into_iter().map(|leaf| (module.clone(), leaf)));
                continue;
            }
            Token::Ident(first)
                if tokens.get(i + 1) == Some(&Token::PathSep)
                    && !matches!(
                        i.checked_sub(1).map(|p| &tokens[p]),
                        Some(Token::PathSep | Token::Punct('.' | '$'))
                    ) =>
            {
                let mut segments = vec![first.clone()];
                let mut j = i + 1;
                while tokens.get(j) == Some(&Token::PathSep) {
                    match tokens.get(j + 1) {
                        Some(Token::Ident(next)) => {
                            segments.push(next.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                paths.push((module.clone(), segments));
                i = j;
                continue;
            }
            Token::Punct('{') => braces.push(false),
            Token::Punct('}') => {
                if let Some(true) = braces.pop() {
                    module.pop();
                }
            }
            _ => {}
        }
        i += 1;
    }
    (uses, paths)
}

/// Parses the use tree starting at `i` (after `use`, or inside braces) under `prefix`, pushing
/// its leaves; returns the index after it (past the `;` at the top level).
fn parse_use_tree(
    tokens: &[Token],
    mut i: usize,
    prefix: &[String],
    leaves: &mut Vec<UseLeaf>,
) -> usize {
    let mut segments = prefix.to_vec();
    let mut first = true;
    loop {
        match tokens.get(i) {
            Some(Token::PathSep) => i += 1,
            Some(Token::Ident(name)) if name == "self" && first && !prefix.is_empty() => {
                i += 1;
                let alias = alias_at(tokens, &mut i);
                leaves.push(UseLeaf { segments, alias });
                break;
            }
            Some(Token::Ident(name)) => {
                segments.push(name.clone());
                i += 1;
                if tokens.get(i) != Some(&Token::PathSep) {
                    let alias = alias_at(tokens, &mut i);
                    leaves.push(UseLeaf { segments, alias });
                    break;
                }
            }
            Some(Token::Punct('*')) => {
                segments.push("*".to_owned());
                leaves.push(UseLeaf {
                    segments,
                    alias: None,
                });
                i += 1;
                break;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                loop {
                    match tokens.get(i) {
                        Some(Token::Punct('}')) => {
                            i += 1;
                            break;
                        }
                        Some(Token::Punct(',')) => i += 1,
                        None => return i,
                        Some(_) => i = parse_use_tree(tokens, i, &segments, leaves),
                    }
                }
                break;
            }
            _ => break,
        }
        first = false;
    }
    if prefix.is_empty() && tokens.get(i) == Some(&Token::Punct(';')) {
        i += 1;
    }
    i
}

/// `as NAME` at `i`, if there: the name, and `i` moved past it.
fn alias_at(tokens: &[Token], i: &mut usize) -> Option<String> {
    if !is_ident(tokens.get(*i), "as") {
        return None;
    }
    let Some(Token::Ident(name)) = tokens.get(*i + 1) else {
        return None;
    };
    *i += 2;
    Some(name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_trees_flatten_to_their_leaves() {
        let tokens = tokenize("use super::{Daemon, owner::{self, Owner as O}, *}; next");
        let mut leaves = Vec::new();
        let end = parse_use_tree(&tokens, 1, &[], &mut leaves);
        let leaf = |s: &[&str], alias: Option<&str>| UseLeaf {
            segments: s.iter().map(|s| s.to_string()).collect(),
            alias: alias.map(str::to_owned),
        };
        assert_eq!(
            leaves,
            [
                leaf(&["super", "Daemon"], None),
                leaf(&["super", "owner"], None),
                leaf(&["super", "owner", "Owner"], Some("O")),
                leaf(&["super", "*"], None),
            ]
        );
        assert_eq!(tokens[end], Token::Ident("next".into()));
    }
}
