//! A radix tree of path prefixes, laid out in flat arrays: no allocation per node, and a walk
//! reads a few contiguous entries per level instead of chasing a pointer per label. Nodes are
//! stored breadth first, so a node's children sit side by side: the child to follow is found
//! among their first bytes, eight at a time (one word), or, for a node with more children
//! than that, by one read of its 256-entry jump table.
//! Built by insertion into an arena of nodes, then frozen; both steps loop rather than
//! recurse, so a deep tree (nested prefixes) cannot exhaust the stack.

/// Children compared at once when choosing the one to follow: a machine word of first bytes.
const LANES: usize = 8;
/// `0x01` in every byte of a word.
const ONES: u64 = u64::from_le_bytes([1; LANES]);
/// A [`Node::jump`] for a node whose children fit in one word.
const NO_JUMP: u32 = u32::MAX;
/// In a jump table, a byte no child starts with.
const NO_CHILD: u8 = u8::MAX;

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
        list.get(start..start + self.len as usize).unwrap_or(&[])
    }
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// The label of the edge into this node past its first byte (which is in `firsts`).
    label: Span,
    /// Routes whose prefix ends here, in config order.
    routes: Span,
    /// The children are the nodes `first_child..first_child + children`.
    first_child: u32,
    children: u32,
    /// For a node with more children than a word holds, where its jump table starts in
    /// `jumps`: by byte, the child that byte leads to (as an offset from `first_child`).
    jump: u32,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            label: Span::default(),
            routes: Span::default(),
            first_child: 0,
            children: 0,
            jump: NO_JUMP,
        }
    }
}

pub(super) struct PrefixTree {
    /// `nodes[0]` is the root (the empty prefix); then breadth first.
    nodes: Vec<Node>,
    /// The first byte of the label into each node, beside `nodes` (the root's is unused),
    /// and [`LANES`] zero bytes after the last: a node's children's first bytes are read a word
    /// at a time.
    firsts: Vec<u8>,
    /// 256 bytes per wide node: a level of a table of many routes (`/v1`..`/v99999`) costs
    /// one read instead of a scan of its children.
    jumps: Vec<u8>,
    labels: Vec<u8>,
    routes: Vec<u32>,
}

impl PrefixTree {
    /// Calls `visit` with the routes of every prefix of `path`, shortest first.
    pub(super) fn walk<'a>(&'a self, path: &[u8], mut visit: impl FnMut(&'a [u32])) {
        let mut at = 0;
        let mut node = 0;
        while let Some(current) = self.nodes.get(node) {
            let routes = current.routes;
            if routes.len > 0 {
                visit(routes.get(&self.routes));
            }
            let Some(&byte) = path.get(at) else {
                return;
            };
            let Some(child) = self.child(current, byte) else {
                return;
            };
            // The first byte matched; the rest of the label must follow it.
            let Some(label) = self.nodes.get(child).map(|c| c.label) else {
                return;
            };
            at += 1;
            if label.len > 0 {
                let end = at + label.len as usize;
                let Some(next) = path.get(at..end) else {
                    return;
                };
                if !same(next, label.get(&self.labels)) {
                    return;
                }
                at = end;
            }
            node = child;
        }
    }

    /// The child of `node` whose label starts with `byte`.
    fn child(&self, node: &Node, byte: u8) -> Option<usize> {
        let first = node.first_child as usize;
        if node.jump != NO_JUMP {
            let offset = *self.jumps.get(node.jump as usize + usize::from(byte))?;
            return (offset != NO_CHILD).then_some(first + usize::from(offset));
        }
        let count = node.children as usize;
        let splat = u64::from_le_bytes([byte; LANES]);
        let mut base = 0;
        while base < count {
            // Eight first bytes as one word (the padding keeps the read in bounds); a byte
            // equal to `byte` becomes zero, and the classic test finds the lowest zero byte:
            // bytes above a true zero may be flagged falsely, bytes below never.
            let at = first + base;
            let word: [u8; LANES] = self.firsts.get(at..at + LANES)?.try_into().ok()?;
            let diff = u64::from_le_bytes(word) ^ splat;
            let zeros = diff.wrapping_sub(ONES) & !diff & (ONES << 7);
            if zeros != 0 {
                let i = base + (zeros.trailing_zeros() / 8) as usize;
                // Past the last child, the bytes are another node's: no child matched.
                return (i < count).then_some(first + i);
            }
            base += LANES;
        }
        None
    }

    /// Bytes held by the tree's arrays.
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>()
            + self.firsts.capacity()
            + self.jumps.capacity()
            + self.labels.capacity()
            + self.routes.capacity() * size_of::<u32>()
    }
}

/// Whether two slices of equal length hold the same bytes. Labels are mostly a few bytes, which
/// a loop compares for less than a call to `memcmp` costs.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() <= LANES {
        a.iter().zip(b).all(|(x, y)| x == y)
    } else {
        a == b
    }
}

/// The jump table of a node with these children, appended to `jumps`, if it has more than
/// a word of them. Offsets are bytes and [`NO_CHILD`] is one of them, so a node with 255
/// children or more has no table and is scanned.
fn jump_table(jumps: &mut Vec<u8>, children: &[(&[u8], u32)]) -> u32 {
    if children.len() <= LANES || children.len() > usize::from(NO_CHILD) {
        return NO_JUMP;
    }
    let start = jumps.len();
    jumps.resize(start + 256, NO_CHILD);
    for (offset, (label, _)) in children.iter().enumerate() {
        // `offset < NO_CHILD`, checked above.
        jumps[start + usize::from(label[0])] = offset as u8;
    }
    // Tables past 4 GiB are not a concern.
    start as u32
}

/// A tree being built: nodes in an arena, edges by node index, labels borrowed from the
/// prefixes inserted (a table of thousands is built on every change to it: no allocation
/// per label, none per leaf).
#[derive(Default)]
pub(super) struct Builder<'a> {
    nodes: Vec<BuildNode<'a>>,
}

#[derive(Default)]
struct BuildNode<'a> {
    routes: EndingHere,
    children: Vec<(&'a [u8], u32)>,
}

/// The routes whose prefix ends at a node, in insertion order: the first inline, as most
/// nodes have one or none.
#[derive(Default)]
struct EndingHere {
    first: Option<u32>,
    more: Vec<u32>,
}

impl EndingHere {
    fn one(route: u32) -> Self {
        Self {
            first: Some(route),
            more: Vec::new(),
        }
    }

    fn push(&mut self, route: u32) {
        match self.first {
            None => self.first = Some(route),
            Some(_) => self.more.push(route),
        }
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }
}

impl<'a> Builder<'a> {
    pub(super) fn insert(&mut self, mut key: &'a [u8], route: u32) {
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
                    routes: EndingHere::one(route),
                    children: Vec::new(),
                });
                self.nodes[at].children.push((key, leaf));
                return;
            };
            let (label, child) = self.nodes[at].children[k];
            let common = label.iter().zip(key).take_while(|(a, b)| a == b).count();
            if common < label.len() {
                // The key leaves the label part-way: a new node where they part.
                let middle = self.nodes.len() as u32;
                self.nodes.push(BuildNode {
                    routes: EndingHere::default(),
                    children: vec![(&label[common..], child)],
                });
                self.nodes[at].children[k] = (&key[..common], middle);
                at = middle as usize;
            } else {
                at = child as usize;
            }
            key = &key[common..];
        }
    }

    /// The tree in breadth-first order: each node's children get consecutive positions.
    pub(super) fn freeze(self) -> PrefixTree {
        let count = self.nodes.len().max(1);
        let mut tree = PrefixTree {
            nodes: Vec::with_capacity(count),
            firsts: Vec::with_capacity(count + LANES),
            jumps: Vec::new(),
            labels: Vec::new(),
            routes: Vec::new(),
        };
        // Arena nodes in their new order, with the label into each.
        let mut order: Vec<(u32, &[u8])> = Vec::with_capacity(count);
        order.push((0, &[]));
        let mut next = 0;
        while let Some(&(arena, label)) = order.get(next) {
            let Some(built) = self.nodes.get(arena as usize) else {
                // An empty builder: the root alone.
                tree.nodes.push(Node::default());
                tree.firsts.push(0);
                break;
            };
            let first_child = order.len() as u32;
            order.extend(built.children.iter().map(|&(l, c)| (c, l)));
            tree.firsts.push(label.first().copied().unwrap_or(0));
            tree.nodes.push(Node {
                label: Span::of(&mut tree.labels, label.iter().skip(1).copied()),
                routes: Span::of(&mut tree.routes, built.routes.iter()),
                first_child,
                children: built.children.len() as u32,
                jump: jump_table(&mut tree.jumps, &built.children),
            });
            next += 1;
        }
        tree.firsts.extend([0; LANES]);
        tree.jumps.shrink_to_fit();
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
    fn wide_nodes_are_walked_by_table_or_by_scan() {
        // 200 children (a jump table) and 256 (too many for one: scanned word by word).
        for count in [200, 256] {
            let prefixes: Vec<Vec<u8>> = (0..count).map(|b| vec![b as u8, b'/']).collect();
            let mut builder = Builder::default();
            for (i, p) in prefixes.iter().enumerate() {
                builder.insert(p, i as u32);
            }
            let t = builder.freeze();
            assert_eq!(t.jumps.len(), if count == 200 { 256 } else { 0 });
            for (i, p) in prefixes.iter().enumerate() {
                let mut all = Vec::new();
                t.walk(&[p.as_slice(), b"x"].concat(), |r| all.extend_from_slice(r));
                assert_eq!(all, [i as u32], "{p:?}");
            }
            let mut none = Vec::new();
            t.walk(&[255, b'/'], |r| none.extend_from_slice(r));
            assert_eq!(none.len(), usize::from(count == 256));
        }
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
