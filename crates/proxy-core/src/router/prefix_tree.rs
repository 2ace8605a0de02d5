//! A radix tree of path prefixes, laid out in five flat arrays: no allocation per node, and a
//! walk reads a few contiguous entries per level instead of chasing a pointer per label.
//! Built by insertion into an arena of nodes, then frozen; both steps loop rather than
//! recurse, so a deep tree (nested prefixes) cannot exhaust the stack.

/// Edges compared at once when choosing the one to follow.
const LANES: usize = 16;
/// `0x01` in every byte of a word.
const ONES: u128 = u128::from_le_bytes([1; LANES]);

/// `start..start + len` of one of the arrays.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn of<T>(list: &mut Vec<T>, items: impl IntoIterator<Item = T>) -> Span {
        let start = list.len();
        list.extend(items);
        // Tables past 4 billion entries are not a concern.
        Span {
            start: start as u32,
            len: (list.len() - start) as u32,
        }
    }

    fn get<T>(self, list: &[T]) -> &[T] {
        let start = self.start as usize;
        &list[start..start + self.len as usize]
    }
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Routes whose prefix ends here, in config order.
    routes: Span,
    edges: Span,
}

/// A labelled edge to a child. No two edges of a node start with the same byte.
#[derive(Debug, Clone, Copy)]
struct Edge {
    label: Span,
    child: u32,
}

pub(super) struct PrefixTree {
    /// `nodes[0]` is the root (the empty prefix).
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    /// The first byte of each edge's label, beside `edges`, and [`LANES`] zero bytes after
    /// the last: the edge to follow is found among a node's first bytes 16 at a time.
    firsts: Vec<u8>,
    labels: Vec<u8>,
    routes: Vec<u32>,
}

impl PrefixTree {
    /// Calls `visit` with the routes of every prefix of `path`, shortest first.
    pub(super) fn walk<'a>(&'a self, path: &[u8], mut visit: impl FnMut(&'a [u32])) {
        let mut node = self.nodes[0];
        let mut at = 0;
        loop {
            if node.routes.len > 0 {
                visit(node.routes.get(&self.routes));
            }
            let Some(&next) = path.get(at) else {
                return;
            };
            let Some(i) = self.edge_for(node.edges, next) else {
                return;
            };
            let edge = self.edges[node.edges.start as usize + i];
            // The first byte matched; compare the rest of the label, if any.
            let label = edge.label.get(&self.labels);
            if label.len() > 1 && !path[at + 1..].starts_with(&label[1..]) {
                return;
            }
            at += label.len();
            node = self.nodes[edge.child as usize];
        }
    }

    /// The index among `edges` of the one whose label starts with `byte`.
    fn edge_for(&self, edges: Span, byte: u8) -> Option<usize> {
        let start = edges.start as usize;
        let len = edges.len as usize;
        if len > LANES {
            return self.firsts[start..start + len]
                .iter()
                .position(|&b| b == byte);
        }
        // The node's first bytes as one 16-byte word (the padding keeps the read in
        // bounds); a byte equal to `byte` becomes zero, and the classic test finds the lowest
        // zero byte: bytes above a true zero may be flagged falsely, bytes below never.
        let word: [u8; LANES] = self.firsts.get(start..start + LANES)?.try_into().ok()?;
        let diff = u128::from_le_bytes(word) ^ (u128::from(byte) * ONES);
        let zeros = diff.wrapping_sub(ONES) & !diff & (ONES << 7);
        let at = (zeros.trailing_zeros() / 8) as usize;
        (at < len).then_some(at)
    }

    /// Bytes held by the tree's arrays.
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>()
            + self.edges.capacity() * size_of::<Edge>()
            + self.firsts.capacity()
            + self.labels.capacity()
            + self.routes.capacity() * size_of::<u32>()
    }
}

/// A tree being built: nodes in an arena, edges by node index.
#[derive(Default)]
pub(super) struct Builder {
    nodes: Vec<BuildNode>,
}

#[derive(Default)]
struct BuildNode {
    routes: Vec<u32>,
    children: Vec<(Box<[u8]>, u32)>,
}

impl Builder {
    pub(super) fn insert(&mut self, mut key: &[u8], route: u32) {
        if self.nodes.is_empty() {
            self.nodes.push(BuildNode::default());
        }
        let mut at = 0;
        loop {
            let Some(&first) = key.first() else {
                self.nodes[at].routes.push(route);
                return;
            };
            let found = self.nodes[at]
                .children
                .iter()
                .position(|(label, _)| label[0] == first);
            let Some(k) = found else {
                let leaf = self.nodes.len() as u32;
                self.nodes.push(BuildNode {
                    routes: vec![route],
                    children: Vec::new(),
                });
                self.nodes[at].children.push((key.into(), leaf));
                return;
            };
            let (label, child) = &self.nodes[at].children[k];
            let child = *child;
            let common = label.iter().zip(key).take_while(|(a, b)| a == b).count();
            if common < label.len() {
                // The key leaves the label part-way: a new node where they part.
                let rest: Box<[u8]> = label[common..].into();
                let middle = self.nodes.len() as u32;
                self.nodes.push(BuildNode {
                    routes: Vec::new(),
                    children: vec![(rest, child)],
                });
                self.nodes[at].children[k] = (key[..common].into(), middle);
                at = middle as usize;
            } else {
                at = child as usize;
            }
            key = &key[common..];
        }
    }

    pub(super) fn freeze(self) -> PrefixTree {
        let mut tree = PrefixTree {
            nodes: Vec::with_capacity(self.nodes.len().max(1)),
            edges: Vec::with_capacity(self.nodes.len().saturating_sub(1)),
            firsts: Vec::with_capacity(self.nodes.len().saturating_sub(1)),
            labels: Vec::new(),
            routes: Vec::new(),
        };
        for node in &self.nodes {
            let routes = Span::of(&mut tree.routes, node.routes.iter().copied());
            let edges: Vec<Edge> = node
                .children
                .iter()
                .map(|(label, child)| Edge {
                    label: Span::of(&mut tree.labels, label.iter().copied()),
                    child: *child,
                })
                .collect();
            let edges = Span::of(&mut tree.edges, edges);
            tree.firsts
                .extend(node.children.iter().map(|(label, _)| label[0]));
            tree.nodes.push(Node { routes, edges });
        }
        if tree.nodes.is_empty() {
            tree.nodes.push(Node {
                routes: Span::default(),
                edges: Span::default(),
            });
        }
        tree.firsts.extend([0; LANES]);
        tree.labels.shrink_to_fit();
        tree.routes.shrink_to_fit();
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(prefixes: &[&str]) -> PrefixTree {
        let mut builder = Builder::default();
        for (i, p) in prefixes.iter().enumerate() {
            builder.insert(p.as_bytes(), i as u32);
        }
        builder.freeze()
    }

    fn found(tree: &PrefixTree, path: &str) -> Vec<u32> {
        let mut all = Vec::new();
        tree.walk(path.as_bytes(), |routes| all.extend_from_slice(routes));
        all
    }

    #[test]
    fn every_prefix_of_the_path_is_visited_shortest_first() {
        let t = tree(&["/api/v1", "/", "/api", "/api/v2", "/api", "/b", "/api/v1/x"]);
        assert_eq!(found(&t, "/api/v1/x/y"), [1, 2, 4, 0, 6]);
        assert_eq!(found(&t, "/api/v2"), [1, 2, 4, 3]);
        assert_eq!(found(&t, "/ap"), [1]);
        assert_eq!(found(&t, "/b"), [1, 5]);
        assert_eq!(found(&t, "x"), Vec::<u32>::new());
        assert_eq!(found(&tree(&[]), "/"), Vec::<u32>::new());
    }

    #[test]
    fn nested_prefixes_build_and_walk() {
        // A level per prefix: nothing recurses, however deep.
        const DEPTH: usize = 2_000;
        let deep: Vec<String> = (1..=DEPTH).map(|n| "/".repeat(n)).collect();
        let refs: Vec<&str> = deep.iter().map(String::as_str).collect();
        let t = tree(&refs);
        let path = "/".repeat(DEPTH + 1);
        assert_eq!(found(&t, &path).len(), DEPTH);
        assert!(t.heap_bytes() < DEPTH * 64, "{}", t.heap_bytes());
    }

    mod differential {
        use super::*;
        use proptest::prelude::*;

        /// Prefixes over a few bytes (deep, narrow trees) or many (nodes with more than 16
        /// edges), and the routes a scan finds: every prefix of the path, shortest first, in
        /// insertion order among equals.
        fn scan(prefixes: &[Vec<u8>], path: &[u8]) -> Vec<u32> {
            let mut found: Vec<(usize, u32)> = prefixes
                .iter()
                .enumerate()
                .filter(|(_, p)| path.starts_with(p))
                .map(|(i, p)| (p.len(), i as u32))
                .collect();
            found.sort();
            found.into_iter().map(|(_, i)| i).collect()
        }

        fn bytes() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(prop::sample::select(b"/ab".to_vec()), 0..6),
                prop::collection::vec(0u8..=255, 0..4),
                prop::collection::vec(32u8..72, 0..3),
            ]
        }

        proptest! {
            #[test]
            fn the_walk_finds_what_a_scan_finds(
                prefixes in prop::collection::vec(bytes(), 0..80),
                paths in prop::collection::vec(bytes(), 1..30),
            ) {
                let mut builder = Builder::default();
                for (i, p) in prefixes.iter().enumerate() {
                    builder.insert(p, i as u32);
                }
                let tree = builder.freeze();
                for path in paths {
                    let mut walked = Vec::new();
                    tree.walk(&path, |routes| walked.extend_from_slice(routes));
                    prop_assert_eq!(walked, scan(&prefixes, &path), "path {:?}", path);
                }
            }
        }
    }
}
