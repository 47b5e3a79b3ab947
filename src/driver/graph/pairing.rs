//! How `cuGraphExecUpdate` pairs the nodes of an update's source with those of the graph an exec
//! was instantiated from, reproduced so that an exec can take per-node updates named by nodes of
//! its latest update's source (see `docs/design/definitions.md`, "Per-node updates").
//!
//! The CUDA programming guide ("Whole Graph Update") pairs the sink nodes (nodes no other node
//! runs after) in an order of its own — the order in which they became sinks, which node adds,
//! edge removals and capture ends decide and the driver does not report — then, from each pair,
//! their dependencies in the order the edges were made (the order the driver lists them in).
//! [`pair`] does not guess the sinks' order: it pairs each sink with the sink of the same
//! *signature* (its type and, recursively, its dependencies' signatures in order), and makes no
//! pairing where two sinks of a graph share a signature, since the driver could then pair them
//! either way. From the sinks on the pairing is forced, and it is checked to be a pairing of the
//! whole graphs (same count, same types, each node paired once, each pair's dependency lists
//! paired position by position). A successful update means the driver found such a pairing, and
//! where sinks' signatures differ there is only one: [`pair`]'s is the driver's.

use cudarc::driver::sys;

use super::node_list as list;
use crate::error::Result;

/// A graph's structure as the driver lists it.
#[derive(Debug, Default)]
pub(crate) struct Shape {
    /// The nodes, in the driver's listing order.
    pub(crate) nodes: Vec<usize>,
    /// Each node's type (`cuGraphNodeGetType`'s raw value).
    types: Vec<u32>,
    /// Each node's dependencies, as indices into `nodes`, in edge order.
    deps: Vec<Vec<u32>>,
}

impl Shape {
    /// Reads `graph`'s nodes, their types and dependencies (one `cuGraphGetNodes` pair, then a
    /// type and a dependency list per node).
    ///
    /// # Safety
    /// `graph` is live and its tree locked for the whole call.
    pub(crate) unsafe fn read(graph: sys::CUgraph) -> Result<Shape> {
        // SAFETY: `graph` is live and locked (the caller's promise); `p` is null or has room
        // for `*n` nodes.
        let nodes = list(|p, n| unsafe { super::get_nodes(graph, p, n) })?;
        let index: super::IdMap<usize, u32> = nodes
            .iter()
            .enumerate()
            .map(|(i, &n)| (n as usize, i as u32))
            .collect();
        let mut types = Vec::with_capacity(nodes.len());
        let mut deps = Vec::with_capacity(nodes.len());
        for &node in &nodes {
            // SAFETY: `node` is a live node of the locked graph, listed just now.
            types.push(unsafe { super::node_type(node) }?);
            // SAFETY: as above; `p` is null or has room for `*n` nodes.
            let d = list(|p, n| unsafe { super::node_dependencies(node, p, n) })?;
            // A dependency outside the listing cannot happen (edges stay within a graph); it
            // is marked so that no pairing is made.
            deps.push(
                d.iter()
                    .map(|&x| index.get(&(x as usize)).copied().unwrap_or(u32::MAX))
                    .collect(),
            );
        }
        Ok(Shape {
            nodes: nodes.into_iter().map(|n| n as usize).collect(),
            types,
            deps,
        })
    }

    /// A shape from its parts (the pairing's unit tests).
    #[cfg(test)]
    pub(crate) fn from_parts(types: Vec<u32>, deps: Vec<Vec<u32>>) -> Shape {
        Shape {
            nodes: (0..types.len()).collect(),
            types,
            deps,
        }
    }

    /// The nodes no other node runs after, in listing order.
    fn sinks(&self) -> Vec<u32> {
        let mut has_dependent = vec![false; self.nodes.len()];
        for d in self.deps.iter().flatten() {
            if let Some(slot) = has_dependent.get_mut(*d as usize) {
                *slot = true;
            }
        }
        (0..self.nodes.len() as u32)
            .filter(|&i| !has_dependent[i as usize])
            .collect()
    }
}

/// Structural signatures, interned: two nodes get the same id when their types are equal and so,
/// in order, are their dependencies' signatures — across every shape signed by one interner.
#[derive(Default)]
struct Signatures {
    ids: std::collections::HashMap<(u32, Vec<u32>), u32>,
}

impl Signatures {
    /// Each node's signature in `shape`; `None` where a dependency is outside the listing or
    /// the dependencies form a cycle (neither happens in a driver's graph).
    fn of(&mut self, shape: &Shape) -> Option<Vec<u32>> {
        const UNSET: u32 = u32::MAX;
        let n = shape.nodes.len();
        let mut sig = vec![UNSET; n];
        let mut on_stack = vec![false; n];
        // Depth first, without recursion: (node, how many of its dependencies were visited).
        let mut stack: Vec<(usize, usize)> = Vec::new();
        for root in 0..n {
            if sig[root] != UNSET {
                continue;
            }
            stack.push((root, 0));
            on_stack[root] = true;
            while let Some(top) = stack.len().checked_sub(1) {
                let (v, i) = stack[top];
                let deps = &shape.deps[v];
                if let Some(&d) = deps.get(i) {
                    stack[top].1 += 1;
                    let d = d as usize;
                    if d >= n || on_stack[d] {
                        return None;
                    }
                    if sig[d] == UNSET {
                        on_stack[d] = true;
                        stack.push((d, 0));
                    }
                } else {
                    let key = (
                        shape.types[v],
                        deps.iter().map(|&d| sig[d as usize]).collect(),
                    );
                    let next = self.ids.len() as u32;
                    sig[v] = *self.ids.entry(key).or_insert(next);
                    on_stack[v] = false;
                    stack.pop();
                }
            }
        }
        Some(sig)
    }
}

/// Pairs `new`'s nodes with `old`'s as the module docs say: entry `i` is the index in `old` of
/// `new`'s node `i`. `None` where the two graphs are not paired whole this way, or where two
/// sinks of one graph share a signature (the driver's pairing of them cannot be known).
pub(crate) fn pair(old: &Shape, new: &Shape) -> Option<Vec<u32>> {
    let n = new.nodes.len();
    if old.nodes.len() != n {
        return None;
    }
    let (old_sinks, new_sinks) = (old.sinks(), new.sinks());
    if old_sinks.len() != new_sinks.len() {
        return None;
    }
    let mut signatures = Signatures::default();
    let (old_sig, new_sig) = (signatures.of(old)?, signatures.of(new)?);
    let mut sink_by_sig: std::collections::HashMap<u32, u32> = old_sinks
        .iter()
        .map(|&s| (old_sig[s as usize], s))
        .collect();
    if sink_by_sig.len() != old_sinks.len() {
        return None;
    }
    const NONE: u32 = u32::MAX;
    let mut to_old = vec![NONE; n];
    let mut to_new = vec![NONE; n];
    let mut work: Vec<(u32, u32)> = Vec::with_capacity(n);
    // Pairs `a` (new) with `b` (old); false if either is paired with another node already or
    // their types differ. Each pair is queued once.
    let mut link = |a: u32, b: u32, work: &mut Vec<(u32, u32)>| -> bool {
        let (ai, bi) = (a as usize, b as usize);
        if ai >= n || bi >= n || new.types[ai] != old.types[bi] {
            return false;
        }
        match (to_old[ai], to_new[bi]) {
            (NONE, NONE) => {
                to_old[ai] = b;
                to_new[bi] = a;
                work.push((a, b));
                true
            }
            (x, y) => x == b && y == a,
        }
    };
    for &a in &new_sinks {
        // A signature no old sink has, or one a second new sink took already: no pairing.
        let b = sink_by_sig.remove(&new_sig[a as usize])?;
        if !link(a, b, &mut work) {
            return None;
        }
    }
    while let Some((a, b)) = work.pop() {
        let (da, db) = (&new.deps[a as usize], &old.deps[b as usize]);
        if da.len() != db.len() {
            return None;
        }
        for (&x, &y) in da.iter().zip(db) {
            if !link(x, y, &mut work) {
                return None;
            }
        }
    }
    // Every node runs before some sink, so every node is paired; checked all the same.
    to_old.iter().all(|&b| b != NONE).then_some(to_old)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(types: &[u32], deps: &[&[u32]]) -> Shape {
        Shape::from_parts(types.to_vec(), deps.iter().map(|d| d.to_vec()).collect())
    }

    #[test]
    fn a_chain_pairs_in_order() {
        let old = shape(&[1, 2, 1], &[&[], &[0], &[1]]);
        assert_eq!(pair(&old, &old), Some(vec![0, 1, 2]));
    }

    #[test]
    fn nodes_listed_in_another_order_pair_by_structure() {
        // old: 0 -> 1 -> 2; new lists the same chain as 2, 0, 1 (new 1 is the head).
        let old = shape(&[0, 1, 2], &[&[], &[0], &[1]]);
        let new = shape(&[2, 0, 1], &[&[2], &[], &[1]]);
        assert_eq!(pair(&old, &new), Some(vec![2, 0, 1]));
    }

    #[test]
    fn dependencies_pair_in_edge_order() {
        // A join of two kernels (type 1) fed by a memset (2) and a memcpy (3): the join's
        // dependency order decides which kernel pairs with which.
        let old = shape(&[2, 3, 1, 1, 0], &[&[], &[], &[0], &[1], &[2, 3]]);
        let new = shape(&[2, 3, 1, 1, 0], &[&[], &[], &[0], &[1], &[3, 2]]);
        // The join's first dependency is new 3 (after the memcpy), paired with old 2 (after the
        // memset): the types under them differ, so there is no pairing.
        assert_eq!(pair(&old, &new), None);
        let new = shape(&[3, 2, 1, 1, 0], &[&[], &[], &[1], &[0], &[2, 3]]);
        assert_eq!(pair(&old, &new), Some(vec![1, 0, 2, 3, 4]));
    }

    #[test]
    fn different_graphs_do_not_pair() {
        let old = shape(&[1, 1], &[&[], &[0]]);
        assert_eq!(pair(&old, &shape(&[1], &[&[]])), None, "node count");
        assert_eq!(pair(&old, &shape(&[1, 2], &[&[], &[0]])), None, "a type");
        assert_eq!(pair(&old, &shape(&[1, 1], &[&[], &[]])), None, "sinks");
        let diamond = shape(&[0, 1, 1, 0], &[&[], &[0], &[0], &[1, 2]]);
        let shared = shape(&[0, 1, 1, 0], &[&[], &[0], &[], &[1, 2]]);
        assert_eq!(pair(&diamond, &shared), None, "a dependency count");
    }

    #[test]
    fn a_node_paired_twice_refuses_the_pairing() {
        // One sink s (type 2) after b0, b1 (type 1) and a source (type 0). In old, b0 runs
        // after a0, b1 after a1, and s's third dependency is a0; in new, both b's run after a0
        // and s's third dependency is a1. Counts, types and sinks agree, but new's a0 would
        // pair with old's a0 (through b0) after new's a1 took it (through s).
        let old = shape(&[0, 0, 1, 1, 2], &[&[], &[], &[0], &[1], &[2, 3, 0]]);
        let new = shape(&[0, 0, 1, 1, 2], &[&[], &[], &[0], &[0], &[2, 3, 1]]);
        assert_eq!(pair(&old, &new), None);
    }

    #[test]
    fn a_dependency_outside_the_listing_refuses_the_pairing() {
        let old = shape(&[0, 1], &[&[], &[0]]);
        let new = shape(&[0, 1], &[&[], &[u32::MAX]]);
        assert_eq!(pair(&old, &new), None);
    }

    #[test]
    fn sinks_pair_by_signature_not_by_listing_order() {
        // old lists a memset sink (2) before a kernel sink (1), each after its own source (0);
        // new lists them the other way round.
        let old = shape(&[0, 0, 2, 1], &[&[], &[], &[0], &[1]]);
        let new = shape(&[0, 0, 1, 2], &[&[], &[], &[0], &[1]]);
        assert_eq!(pair(&old, &new), Some(vec![1, 0, 3, 2]));
    }

    #[test]
    fn sinks_that_share_a_signature_are_not_paired() {
        // Two unconnected kernel nodes: the driver orders such sinks by when they became sinks
        // (an edge added and removed again can swap them), which no listing shows.
        let two = shape(&[1, 1], &[&[], &[]]);
        assert_eq!(pair(&two, &two), None);
        // The same under a common source: still two sinks alike.
        let fan = shape(&[0, 1, 1], &[&[], &[0], &[0]]);
        assert_eq!(pair(&fan, &fan), None);
        // Joined, they pair: the join's dependency order tells them apart.
        let joined = shape(&[0, 1, 1, 3], &[&[], &[0], &[0], &[1, 2]]);
        assert_eq!(pair(&joined, &joined), Some(vec![0, 1, 2, 3]));
    }

    #[test]
    fn a_cycle_is_not_paired() {
        let cycle = shape(&[1, 1], &[&[1], &[0]]);
        assert_eq!(pair(&cycle, &cycle), None);
    }

    proptest::proptest! {
        /// A graph paired with itself listed in any other order pairs each node with itself
        /// where its sinks' signatures differ (dependencies in edge order leave no choice), and
        /// not at all where two sinks share one.
        #[test]
        fn a_relisted_graph_pairs_node_for_node(
            edges in proptest::collection::vec(
                proptest::collection::vec(proptest::num::u32::ANY, 0..4), 1..24),
            types in proptest::collection::vec(0u32..3, 24),
            keys in proptest::collection::vec(proptest::num::u32::ANY, 24),
        ) {
            // Node i depends on earlier nodes only (a DAG), picked from the random words.
            let n = edges.len();
            let deps: Vec<Vec<u32>> = edges
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let mut d: Vec<u32> = if i == 0 {
                        Vec::new()
                    } else {
                        d.iter().map(|x| x % i as u32).collect()
                    };
                    let mut seen = std::collections::HashSet::new();
                    d.retain(|x| seen.insert(*x)); // one edge per pair of nodes, as in a graph
                    d
                })
                .collect();
            let old = Shape::from_parts(types[..n].to_vec(), deps.clone());
            // A new listing order, sorted by random keys: new node p is old node order[p].
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by_key(|&i| keys[i as usize]);
            let mut position = vec![0u32; n];
            for (p, &i) in order.iter().enumerate() {
                position[i as usize] = p as u32;
            }
            let new = Shape::from_parts(
                order.iter().map(|&i| types[i as usize]).collect(),
                order
                    .iter()
                    .map(|&i| deps[i as usize].iter().map(|&d| position[d as usize]).collect())
                    .collect(),
            );
            let sig = Signatures::default().of(&old).unwrap();
            let sinks = old.sinks();
            let distinct: std::collections::HashSet<u32> =
                sinks.iter().map(|&s| sig[s as usize]).collect();
            let expected = (distinct.len() == sinks.len()).then_some(order);
            proptest::prop_assert_eq!(pair(&old, &new), expected);
        }
    }
}
