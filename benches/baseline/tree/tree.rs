//! B+tree over range starts, one copy of the registry's map.
//!
//! `floor` is the read path (used by lock-free readers and by the writer). Everything else edits a
//! copy and runs under the writer lock, on a copy no reader is told to use (see `latch.rs`), so
//! edits may write fields in any order.
//!
//! Separators are exact: `keys[i]` (i >= 1) of an internal node is the smallest start in child
//! `i`. That is what lets `floor` descend without ever backtracking to a left neighbour: the child
//! chosen at each level holds the answer whenever one exists. Removing a leaf's smallest key
//! therefore repairs the one separator that named it (`fix_separator`).

use super::node::{Node, Record, Root, B, MAX_HEIGHT};
use super::slab::{Ptr, Slab};

/// Non-root nodes keep at least this many entries (lazy: fewer merges than `B / 2`).
const MIN: usize = B / 4;
/// Two siblings merge when they fit in this many entries, leaving room for later inserts.
const MERGE_MAX: usize = B - B / 4;

/// The leaf slot with the largest start `<= x`: the only range that can contain `x`.
///
/// Read path: loads only, no panics, at most `MAX_HEIGHT` steps whatever the nodes contain.
#[inline(always)]
fn floor_slot(root: &Root, x: usize) -> Option<(&Node, usize)> {
    let mut node = root.node()?;
    for _ in 0..root.height() {
        node = node.kid(node.rank(x).saturating_sub(1))?;
    }
    Some((node, node.rank(x).checked_sub(1)?))
}

/// Reader and writer: the entry with the largest start `<= x`.
#[inline(always)]
pub(super) fn floor(root: &Root, x: usize) -> Option<(usize, &Record)> {
    let (node, i) = floor_slot(root, x)?;
    Some((node.key(i), node.rec(i)?))
}

/// Writer: like [`floor`], plus the record's handle.
pub(super) fn floor_entry(root: &Root, x: usize) -> Option<(usize, &Record, Ptr<Record>)> {
    let (node, i) = floor_slot(root, x)?;
    Some((node.key(i), node.rec(i)?, node.rec_ptr(i)?))
}

/// Calls `f` for every entry with `lo <= start <= hi`, in order.
pub(super) fn collect(
    root: &Root,
    lo: usize,
    hi: usize,
    f: &mut impl FnMut(usize, &Record, Ptr<Record>),
) {
    if let Some(top) = root.node() {
        walk(top, root.height(), lo, hi, f);
    }
}

fn walk(
    node: &Node,
    below: usize,
    lo: usize,
    hi: usize,
    f: &mut impl FnMut(usize, &Record, Ptr<Record>),
) {
    if below == 0 {
        let from = if lo == 0 { 0 } else { node.rank(lo - 1) };
        for i in from..node.len() {
            let k = node.key(i);
            if k > hi {
                break;
            }
            let rec = node.rec(i).expect("leaf entry has a record");
            f(k, rec, node.rec_ptr(i).expect("leaf entry has a record"));
        }
        return;
    }
    let a = node.rank(lo).saturating_sub(1);
    let b = node.rank(hi).saturating_sub(1);
    for i in a..=b {
        walk(
            node.kid(i).expect("internal entry has a child"),
            below - 1,
            lo,
            hi,
            f,
        );
    }
}

/// Internal nodes visited on the way to a leaf, and the child index taken in each. Filled in
/// place (it is a few hundred bytes; moving it around showed up in profiles).
struct Path<'a> {
    nodes: [Option<&'a Node>; MAX_HEIGHT],
    idx: [u8; MAX_HEIGHT],
    /// Number of internal levels (the leaf is level `height`).
    height: usize,
}

impl<'a> Path<'a> {
    fn new() -> Self {
        Path {
            nodes: [None; MAX_HEIGHT],
            idx: [0; MAX_HEIGHT],
            height: 0,
        }
    }

    fn node(&self, level: usize) -> &'a Node {
        self.nodes[level].expect("path level was recorded")
    }

    fn idx(&self, level: usize) -> usize {
        self.idx[level] as usize
    }

    /// Walks from `root` towards `x`, recording the way; returns the leaf.
    fn descend(&mut self, root: &'a Root, x: usize) -> Option<&'a Node> {
        let mut node = root.node()?;
        self.height = root.height();
        for level in 0..self.height {
            let i = node.rank(x).saturating_sub(1);
            self.nodes[level] = Some(node);
            self.idx[level] = i as u8;
            node = node.kid(i).expect("internal entry has a child");
        }
        Some(node)
    }
}

/// The value half of an entry.
#[derive(Clone, Copy)]
enum Val {
    Rec(Ptr<Record>),
    Kid(Ptr<Node>),
}

fn set_entry(node: &Node, i: usize, key: usize, val: Val) {
    node.set_key(i, key);
    match val {
        Val::Rec(r) => node.set_rec(i, r),
        Val::Kid(k) => node.set_kid(i, k),
    }
}

/// Inserts at `pos` into a node with `len < B` entries.
fn insert_at(node: &Node, pos: usize, key: usize, val: Val, leaf: bool) {
    let len = node.len();
    for j in (pos..len).rev() {
        node.copy_entry(j + 1, node, j, leaf);
    }
    set_entry(node, pos, key, val);
    node.set_len(len + 1);
}

fn remove_at(node: &Node, pos: usize, leaf: bool) {
    let len = node.len();
    for j in pos + 1..len {
        node.copy_entry(j - 1, node, j, leaf);
    }
    node.clear_slot(len - 1);
    node.set_len(len - 1);
}

/// Writer access to one copy: its root and the node slab it allocates from.
pub(super) struct Tree<'a> {
    root: &'a Root,
    nodes: &'a mut Slab<Node>,
}

impl<'a> Tree<'a> {
    pub(super) fn new(root: &'a Root, nodes: &'a mut Slab<Node>) -> Self {
        Tree { root, nodes }
    }

    fn new_node(&mut self) -> (Ptr<Node>, &'a Node) {
        let (p, n) = Slab::alloc_ref(&mut self.nodes);
        n.reset();
        (p, n)
    }

    /// Inserts `(key, rec)` or, when `key` is present, replaces its record and returns the old one.
    pub(super) fn put(&mut self, key: usize, rec: Ptr<Record>) -> Option<Ptr<Record>> {
        let mut path = Path::new();
        let Some(leaf) = path.descend(self.root, key) else {
            self.plant(key, rec);
            return None;
        };
        let pos = leaf.rank(key);
        if pos > 0 && leaf.key(pos - 1) == key {
            let old = leaf.rec_ptr(pos - 1);
            leaf.set_rec(pos - 1, rec);
            return old;
        }
        self.insert_along(&path, leaf, pos, key, rec);
        None
    }

    /// Inserts the range `[lo, hi]` with record `rec` if no entry overlaps it, in one descent
    /// (the common case of an insert); returns false, changing nothing, otherwise.
    pub(super) fn insert_if_clear(&mut self, lo: usize, hi: usize, rec: Ptr<Record>) -> bool {
        let mut path = Path::new();
        let Some(leaf) = path.descend(self.root, hi) else {
            self.plant(lo, rec);
            return true;
        };
        // The floor of `hi` is the only entry that could overlap: if it starts below `lo` and
        // ends before it, no key lies in `[lo, hi]`, so `lo` goes right after it, in this leaf.
        let pos = leaf.rank(hi);
        if pos > 0 {
            let k = leaf.key(pos - 1);
            let size = leaf.rec(pos - 1).map_or(0, |r| r.size());
            if k >= lo || lo - k < size {
                return false;
            }
        }
        self.insert_along(&path, leaf, pos, lo, rec);
        true
    }

    /// First entry of an empty tree.
    fn plant(&mut self, key: usize, rec: Ptr<Record>) {
        let (p, n) = self.new_node();
        set_entry(n, 0, key, Val::Rec(rec));
        n.set_len(1);
        self.root.set(p, 0);
    }

    /// Inserts at `pos` of `leaf` (reached through `path`), splitting full nodes upwards.
    fn insert_along(
        &mut self,
        path: &Path<'a>,
        leaf: &'a Node,
        pos: usize,
        key: usize,
        rec: Ptr<Record>,
    ) {
        let root = self.root;
        let (mut node, mut pos, mut key, mut val) = (leaf, pos, key, Val::Rec(rec));
        let mut level = path.height;
        loop {
            let leaf = level == path.height;
            if node.len() < B {
                insert_at(node, pos, key, val, leaf);
                return;
            }
            // Split the full node: the upper half moves to a new right sibling.
            let (rp, right) = self.new_node();
            let half = B / 2;
            for j in half..B {
                right.copy_entry(j - half, node, j, leaf);
                node.clear_slot(j);
            }
            node.set_len(half);
            right.set_len(B - half);
            if pos <= half {
                insert_at(node, pos, key, val, leaf);
            } else {
                insert_at(right, pos - half, key, val, leaf);
            }
            let sep = right.key(0);
            if !leaf {
                right.set_key(0, 0);
            }
            if level == 0 {
                let old = root.node_ptr().expect("a split node is in the tree");
                let (np, top) = self.new_node();
                set_entry(top, 0, 0, Val::Kid(old));
                set_entry(top, 1, sep, Val::Kid(rp));
                top.set_len(2);
                root.set(np, path.height + 1);
                return;
            }
            level -= 1;
            node = path.node(level);
            pos = path.idx(level) + 1;
            key = sep;
            val = Val::Kid(rp);
        }
    }

    /// Removes `key`; returns its record (which stays intact until the caller frees it).
    pub(super) fn remove(&mut self, key: usize) -> Option<(Ptr<Record>, &'a Record)> {
        let root = self.root;
        let mut path = Path::new();
        let leaf = path.descend(root, key)?;
        let r = leaf.rank(key);
        if r == 0 || leaf.key(r - 1) != key {
            return None;
        }
        let rec = (leaf.rec_ptr(r - 1)?, leaf.rec(r - 1)?);
        remove_at(leaf, r - 1, true);
        self.rebalance(&path, leaf);
        if r == 1 {
            fix_separator(root, key);
        }
        Some(rec)
    }

    /// Restores the minimum occupancy from `node` (the leaf that lost an entry) upwards, then drops
    /// root levels with a single child.
    fn rebalance(&mut self, path: &Path<'a>, mut node: &'a Node) {
        let root = self.root;
        let mut level = path.height;
        while level > 0 && node.len() < MIN {
            let leaf = level == path.height;
            let parent = path.node(level - 1);
            let ci = path.idx(level - 1);
            let sep = if ci > 0 { ci } else { 1 };
            let left = parent.kid(sep - 1).expect("sibling exists");
            let right = parent.kid(sep).expect("sibling exists");
            let (ll, rl) = (left.len(), right.len());
            if !leaf {
                // Give `right` a real first key so entries can move like leaf entries.
                right.set_key(0, parent.key(sep));
            }
            if ll + rl <= MERGE_MAX {
                for j in 0..rl {
                    left.copy_entry(ll + j, right, j, leaf);
                }
                left.set_len(ll + rl);
                let rp = parent.kid_ptr(sep).expect("sibling exists");
                remove_at(parent, sep, false);
                self.nodes.free(rp);
                node = parent;
                level -= 1;
                continue;
            }
            let want = (ll + rl) / 2;
            if ll < want {
                let m = want - ll;
                for j in 0..m {
                    left.copy_entry(ll + j, right, j, leaf);
                }
                for j in m..rl {
                    right.copy_entry(j - m, right, j, leaf);
                }
                for j in rl - m..rl {
                    right.clear_slot(j);
                }
            } else {
                let m = ll - want;
                for j in (0..rl).rev() {
                    right.copy_entry(j + m, right, j, leaf);
                }
                for j in 0..m {
                    right.copy_entry(j, left, want + j, leaf);
                    left.clear_slot(want + j);
                }
            }
            left.set_len(want);
            right.set_len(ll + rl - want);
            parent.set_key(sep, right.key(0));
            if !leaf {
                right.set_key(0, 0);
            }
            break;
        }
        if level > 0 {
            return;
        }
        while root.height() > 0 {
            let top = root.node().expect("non-empty tree");
            if top.len() > 1 {
                break;
            }
            let old = root.node_ptr().expect("non-empty tree");
            root.set(top.kid_ptr(0).expect("root has a child"), root.height() - 1);
            self.nodes.free(old);
        }
    }
}

/// After removing `key` from the front of a leaf, the separator that named it (if any) must name
/// the leaf's new smallest start.
fn fix_separator(root: &Root, key: usize) {
    let Some(mut node) = root.node() else { return };
    let height = root.height();
    for level in 0..height {
        let i = node.rank(key).saturating_sub(1);
        let child = node.kid(i).expect("internal entry has a child");
        if i > 0 && node.key(i) == key {
            let mut m = child;
            for _ in level + 1..height {
                m = m.kid(0).expect("internal entry has a child");
            }
            node.set_key(i, m.key(0));
            return;
        }
        node = child;
    }
}

/// Checks every structural invariant of one copy; returns its entries in order (start, record
/// address) and its node count (tests only).
#[cfg(test)]
pub(super) fn check(root: &Root) -> (Vec<(usize, usize)>, usize) {
    let mut out = Vec::new();
    let mut nodes = 0;
    if let Some(top) = root.node() {
        check_node(top, root.height(), true, None, None, &mut out, &mut nodes);
    }
    (out, nodes)
}

#[cfg(test)]
fn check_node(
    node: &Node,
    below: usize,
    is_root: bool,
    lo: Option<usize>,
    hi: Option<usize>,
    out: &mut Vec<(usize, usize)>,
    nodes: &mut usize,
) {
    *nodes += 1;
    let len = node.len();
    assert!(is_root || len >= MIN, "underfull node: {len}");
    assert!(
        !is_root || below == 0 || len >= 2,
        "internal root with one child"
    );
    for j in len..B {
        assert_eq!(node.key(j), usize::MAX, "sentinel missing");
    }
    if below == 0 {
        for i in 0..len {
            let k = node.key(i);
            if i > 0 {
                assert!(node.key(i - 1) < k, "leaf keys not sorted");
            }
            assert!(
                lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h),
                "key outside bounds"
            );
            if i == 0 {
                assert!(lo.is_none_or(|l| k == l), "separator not exact");
            }
            out.push((k, node.rec_ptr(i).expect("record").as_mut_ptr() as usize));
        }
        return;
    }
    assert_eq!(node.key(0), 0, "internal keys[0] must be 0");
    for i in 0..len {
        if i > 1 {
            assert!(node.key(i - 1) < node.key(i), "separators not sorted");
        }
        let clo = if i == 0 { lo } else { Some(node.key(i)) };
        let chi = if i + 1 < len {
            Some(node.key(i + 1))
        } else {
            hi
        };
        check_node(
            node.kid(i).expect("child"),
            below - 1,
            false,
            clo,
            chi,
            out,
            nodes,
        );
    }
}
