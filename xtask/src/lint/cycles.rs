//! The import-cycle check: within each crate of the workspace, which source files name items of
//! which others, and which files reach each other that way (a cycle).
//!
//! A file A points at a file B when A names an item of the module B defines, by a `use` of
//! `crate::…`, `super::…` or `self::…`, by such a path in code (`super::enforcement::watch_host`),
//! by a path through one of its own submodules (`use subscribers::Audience` in a `mod.rs`), or
//! through a module it imported (`use super::enforcement;` … `enforcement::end_lease`). Modules
//! are found as rustc finds them: from each crate root (src/lib.rs, src/main.rs, src/bin/*.rs),
//! `mod x;` is `x.rs` or `x/mod.rs`, and an inline `mod x { … }` belongs to its file (so
//! `use super::*` in a file's `mod tests` is no arrow). The strongly connected components of
//! that graph (Tarjan) with more than one file are the cycles: each is reported with its files
//! and, for every arrow inside it, the names used.
//!
//! Folders are held to the same rule: every arrow between two files is also one between the
//! sibling modules that hold them (`daemon::io` and `daemon::state` for `daemon/io/outbox.rs`
//! and `daemon/state/registry.rs`), and siblings that reach each other that way are a cycle
//! even where no file reaches back, so a folder's floors stay one-way as its files' do.
//!
//! A child naming what its parent's `mod.rs` (or the crate root) defines, and a parent naming
//! its child's items, are arrows too, but they close no cycle: a parent that holds the types
//! its children share and calls into them is the module tree doing its job (main.rs's helpers
//! and the tasks that use them, daemon/mod.rs's `Daemon`), and counting it would make a cycle
//! of nearly every directory. A cycle is files that are not each other's ancestors, tangled.
//!
//! It reads tokens, not a syntax tree: comments and string literals are skipped, and paths are
//! followed as written. That is all it needs, and it keeps the check free of dependencies.

mod graph;
mod modules;
mod tokens;

use std::path::PathBuf;

use anyhow::Result;

pub(super) use graph::Cycle;
use graph::{Edges, cycles};
use modules::ModuleTree;

/// The cycles of the crate whose roots are `roots` (files under one `src/`): of files, then of
/// folders (sibling modules with all below them, each named by the file that defines it) that
/// are not one of those already.
pub(super) fn crate_cycles(roots: &[PathBuf]) -> Result<Vec<Cycle>> {
    let (mut edges, mut family, mut rooms) = (Edges::new(), Edges::new(), Edges::new());
    for root in roots {
        let tree = ModuleTree::discover(root)?;
        tree.add_edges(&mut edges, &mut family, &mut rooms)?;
    }
    let mut found = cycles(&edges);
    let of_folders: Vec<Cycle> = cycles(&rooms)
        .into_iter()
        .filter(|room| found.iter().all(|file| file.files != room.files))
        .collect();
    found.extend(of_folders);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;

    /// A crate in a temporary directory, removed when dropped (a failed test too).
    struct Fixture(PathBuf);

    impl std::ops::Deref for Fixture {
        type Target = Path;

        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A crate of (relative path, source) pairs in a temporary directory.
    fn fixture(name: &str, files: &[(&str, &str)]) -> Fixture {
        let dir = std::env::temp_dir().join(format!("leash-cycles-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (path, source) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, source).unwrap();
        }
        Fixture(dir)
    }

    fn names(cycles: &[Cycle], dir: &Path) -> Vec<Vec<String>> {
        cycles
            .iter()
            .map(|c| {
                c.files
                    .iter()
                    .map(|f| f.strip_prefix(dir).unwrap().display().to_string())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn siblings_naming_each_other_are_a_cycle_and_tests_modules_are_not() {
        let dir = fixture(
            "siblings",
            &[
                ("lib.rs", "mod d; mod plain;"),
                ("d/mod.rs", "mod a; mod b; mod c; pub struct Shared;"),
                ("d/a.rs", "use super::b::B; pub struct A;"),
                ("d/b.rs", "pub struct B; fn f() { super::c::go(); }"),
                // c reaches a through an imported module; its tests' `super::*` is itself.
                (
                    "d/c.rs",
                    "use crate::d::a; pub fn go() { let _ = a::A; }\
                     #[cfg(test)] mod tests { use super::*; use crate::plain::P; }",
                ),
                ("plain.rs", "pub struct P;"),
            ],
        );
        let cycles = crate_cycles(&[dir.join("lib.rs")]).unwrap();
        assert_eq!(names(&cycles, &dir), [["d/a.rs", "d/b.rs", "d/c.rs"]]);
        let cycle = &cycles[0];
        let arrow = |from: &str, to: &str| {
            cycle
                .edges
                .iter()
                .find(|(f, t, _)| f == &dir.join(from) && t == &dir.join(to))
                .map(|(_, _, names)| names.clone())
        };
        assert_eq!(arrow("d/a.rs", "d/b.rs"), Some(vec!["B".to_owned()]));
        assert_eq!(arrow("d/b.rs", "d/c.rs"), Some(vec!["go".to_owned()]));
        assert_eq!(
            arrow("d/c.rs", "d/a.rs"),
            Some(vec!["A".to_owned(), "a".to_owned()])
        );
        assert_eq!(cycle.example.len(), 4);
    }

    #[test]
    fn a_parent_and_a_child_naming_each_other_are_no_cycle() {
        let dir = fixture(
            "parent",
            &[
                ("main.rs", "mod p; fn main() {}"),
                (
                    "p/mod.rs",
                    "mod child; pub use child::Thing; pub struct Config;",
                ),
                ("p/child.rs", "pub struct Thing(super::Config);"),
            ],
        );
        assert!(crate_cycles(&[dir.join("main.rs")]).unwrap().is_empty());
        // A parent's file and a module outside it still make one.
        let dir = fixture(
            "cousins",
            &[
                ("main.rs", "mod p; mod q; fn main() {}"),
                ("p/mod.rs", "mod child; pub fn helper(_: crate::q::Q) {}"),
                ("p/child.rs", "fn f() { super::helper(crate::q::Q) }"),
                ("q.rs", "pub struct Q; fn f() { crate::p::helper(Q) }"),
            ],
        );
        let cycles = crate_cycles(&[dir.join("main.rs")]).unwrap();
        assert_eq!(names(&cycles, &dir), [["p/mod.rs", "q.rs"]]);
        assert_eq!(cycles[0].example.first(), cycles[0].example.last());
    }

    #[test]
    fn folders_that_reach_each_other_are_a_cycle_though_their_files_do_not() {
        let dir = fixture(
            "folders",
            &[
                ("lib.rs", "mod io; mod state;"),
                ("io.rs", "mod outbox; mod socket;"),
                ("io/outbox.rs", "pub struct Outbox;"),
                (
                    "io/socket.rs",
                    "pub fn bind(_: crate::state::registry::Registry) {}",
                ),
                ("state.rs", "mod registry;"),
                (
                    "state/registry.rs",
                    "pub struct Registry(super::super::io::outbox::Outbox);",
                ),
            ],
        );
        let cycles = crate_cycles(&[dir.join("lib.rs")]).unwrap();
        assert_eq!(names(&cycles, &dir), [["io.rs", "state.rs"]]);
        let names: Vec<_> = cycles[0].edges.iter().map(|(_, _, n)| n.clone()).collect();
        assert_eq!(names, [vec!["Registry"], vec!["Outbox"]]);
    }

    #[test]
    fn one_way_arrows_are_no_cycle() {
        let dir = fixture(
            "oneway",
            &[
                ("lib.rs", "mod a; mod b; pub use a::A;"),
                (
                    "a.rs",
                    "pub struct A(crate::b::B); mod inner { use self::deep::X; mod deep { pub struct X; } }",
                ),
                (
                    "b.rs",
                    "pub struct B; fn f(x: std::a::A, s: Self::a) { x.crate_thing::<a::A>(); }",
                ),
            ],
        );
        assert!(crate_cycles(&[dir.join("lib.rs")]).unwrap().is_empty());
    }
}
