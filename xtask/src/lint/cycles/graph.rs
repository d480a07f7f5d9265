//! The file graph's cycles: its strongly connected components of more than one file (Tarjan's
//! algorithm), each with the arrows inside it and one loop through it.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    path::PathBuf,
};

/// The arrows of one crate's file graph: (from, to) → the names `from` uses of `to`.
pub(super) type Edges = BTreeMap<(PathBuf, PathBuf), BTreeSet<String>>;

/// A set of files that reach each other, and the arrows among them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Cycle {
    pub(crate) files: Vec<PathBuf>,
    pub(crate) edges: Vec<(PathBuf, PathBuf, Vec<String>)>,
    /// One shortest loop through the first file, to show how the circle closes.
    pub(crate) example: Vec<PathBuf>,
}

/// The strongly connected components of more than one file, by Tarjan's algorithm, each with
/// the arrows inside it.
pub(super) fn cycles(edges: &Edges) -> Vec<Cycle> {
    let mut nodes: BTreeSet<&PathBuf> = BTreeSet::new();
    let mut out: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        nodes.insert(from);
        nodes.insert(to);
        out.entry(from).or_default().push(to);
    }
    let mut tarjan = Tarjan {
        out: &out,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        components: Vec::new(),
    };
    for node in &nodes {
        if !tarjan.index.contains_key(node) {
            tarjan.visit(node);
        }
    }
    let mut components = tarjan.components;
    components.retain(|c| c.len() > 1);
    components
        .into_iter()
        .map(|members| {
            let mut files: Vec<PathBuf> = members.iter().map(|p| (*p).clone()).collect();
            files.sort();
            let inside = |p: &PathBuf| files.contains(p);
            let edges: Vec<_> = edges
                .iter()
                .filter(|((from, to), _)| inside(from) && inside(to))
                .map(|((from, to), names)| {
                    (from.clone(), to.clone(), names.iter().cloned().collect())
                })
                .collect();
            let example = shortest_loop(&files[0], &edges);
            Cycle {
                files,
                edges,
                example,
            }
        })
        .collect()
}

struct Tarjan<'a> {
    out: &'a BTreeMap<&'a PathBuf, Vec<&'a PathBuf>>,
    index: HashMap<&'a PathBuf, usize>,
    low: HashMap<&'a PathBuf, usize>,
    stack: Vec<&'a PathBuf>,
    on_stack: BTreeSet<&'a PathBuf>,
    next: usize,
    components: Vec<Vec<&'a PathBuf>>,
}

impl<'a> Tarjan<'a> {
    /// Recursive: a crate's file graph is a few hundred nodes at most.
    fn visit(&mut self, node: &'a PathBuf) {
        self.index.insert(node, self.next);
        self.low.insert(node, self.next);
        self.next += 1;
        self.stack.push(node);
        self.on_stack.insert(node);
        for &next in self.out.get(node).into_iter().flatten() {
            if !self.index.contains_key(next) {
                self.visit(next);
                let low = self.low[node].min(self.low[next]);
                self.low.insert(node, low);
            } else if self.on_stack.contains(next) {
                let low = self.low[node].min(self.index[next]);
                self.low.insert(node, low);
            }
        }
        if self.low[node] == self.index[node] {
            let mut component = Vec::new();
            while let Some(member) = self.stack.pop() {
                self.on_stack.remove(member);
                component.push(member);
                if member == node {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// The shortest path from `start` back to itself along `edges` (breadth first).
fn shortest_loop(start: &PathBuf, edges: &[(PathBuf, PathBuf, Vec<String>)]) -> Vec<PathBuf> {
    let mut came_from: HashMap<&PathBuf, &PathBuf> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for (from, to, _) in edges {
            if from != node {
                continue;
            }
            if to == start {
                let mut chain = Vec::new();
                let mut at = node;
                while at != start {
                    chain.push(at.clone());
                    at = came_from[at];
                }
                chain.reverse();
                let mut path = vec![start.clone()];
                path.extend(chain);
                path.push(start.clone());
                return path;
            }
            if !came_from.contains_key(to) {
                came_from.insert(to, node);
                queue.push_back(to);
            }
        }
    }
    Vec::new()
}
