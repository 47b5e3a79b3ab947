//! Unit tests of node tokens and their checks: liveness, dependencies, edges, forgetting
//! nodes and whole graphs, over a tree state built without a driver.

use super::*;
use crate::driver::graph::CondRecord;

fn raw(n: usize) -> sys::CUgraphNode {
    n as sys::CUgraphNode
}

fn fresh1(tree: &mut TreeState, graph: u64, raw: sys::CUgraphNode) -> GraphNode {
    fresh(tree, graph, raw, &[], Owners::new(), &mut Vec::new())
}

#[test]
fn a_registered_node_checks_out() {
    let mut tree = TreeState::default();
    let a = fresh1(&mut tree, 1, raw(0x100));
    assert_eq!(check(&tree, 1, &a).unwrap(), raw(0x100));
    // Seeing it again (e.g. in `nodes()`) gives the same token.
    assert_eq!(token(&mut tree, 1, raw(0x100)), a);
}

#[test]
fn a_node_of_another_graph_is_foreign() {
    let mut tree = TreeState::default();
    let a = fresh1(&mut tree, 1, raw(0x100));
    assert!(matches!(check(&tree, 2, &a), Err(Error::ForeignNode)));
    let b = fresh1(&mut tree, 2, raw(0x200));
    assert!(matches!(
        check_edge(&tree, 1, &a, &b),
        Err(Error::ForeignNode)
    ));
}

#[test]
fn a_destroyed_node_stays_destroyed_even_if_its_address_is_reused() {
    let mut tree = TreeState::default();
    let old = fresh1(&mut tree, 1, raw(0x100));
    let _ = forget(&mut tree, 1, &old);
    assert!(matches!(check(&tree, 1, &old), Err(Error::DestroyedNode)));
    let new = fresh1(&mut tree, 1, raw(0x100));
    assert_ne!(old, new);
    assert!(check(&tree, 1, &new).is_ok());
    assert!(matches!(check(&tree, 1, &old), Err(Error::DestroyedNode)));
    let other = fresh1(&mut tree, 1, raw(0x300));
    assert!(matches!(
        check_edge(&tree, 1, &old, &other),
        Err(Error::DestroyedNode)
    ));
}

#[test]
fn slots_of_forgotten_nodes_are_reused_and_old_tokens_stay_destroyed() {
    let mut tree = TreeState::default();
    let mut old = Vec::new();
    for round in 0..100usize {
        let a = fresh1(&mut tree, 1, raw(0x1000 + round));
        let b = fresh1(&mut tree, 1, raw(0x9000 + round));
        assert!(check(&tree, 1, &a).is_ok() && check(&tree, 1, &b).is_ok());
        let _ = forget(&mut tree, 1, &a);
        let _ = forget(&mut tree, 1, &b);
        old.push(a);
        old.push(b);
    }
    // Two slots served all 200 nodes; none of the old tokens passes.
    let live = fresh1(&mut tree, 1, raw(0x100));
    assert!(old
        .iter()
        .all(|t| matches!(check(&tree, 1, t), Err(Error::DestroyedNode))));
    assert!(check(&tree, 1, &live).is_ok());
    // Forgetting a stale token does not touch the live node that reuses its slot.
    let _ = forget(&mut tree, 1, &old[0]);
    let _ = forget(&mut tree, 1, &old[1]);
    assert!(check(&tree, 1, &live).is_ok());
    // Looking nodes up by address after that finds the live one only.
    assert_eq!(token(&mut tree, 1, raw(0x100)), live);
    let seen = token(&mut tree, 1, raw(0x1000));
    assert_ne!(seen, old[0]);
    assert!(check(&tree, 1, &seen).is_ok());
}

#[test]
fn a_node_holds_its_owners_until_it_is_forgotten_and_snapshots_hold_them_longer() {
    use std::sync::Arc;
    let mut tree = TreeState::default();
    let buf: Owner = Arc::new(7u32);
    let body_buf: Owner = Arc::new(8u32);
    let watch = Arc::downgrade(&buf);
    let watch_body = Arc::downgrade(&body_buf);
    let mut released = Vec::new();
    let a = fresh(
        &mut tree,
        1,
        raw(0x100),
        &[],
        [buf].into_iter().collect(),
        &mut released,
    );
    // A conditional node in graph 1 whose body is graph 5, with a node that uses `body_buf`.
    let c = fresh1(&mut tree, 1, raw(0x200));
    tree.conditionals
        .insert((1, 0x200), CondRecord::with_bodies(&[5]));
    let _ = fresh(
        &mut tree,
        5,
        raw(0x300),
        &[],
        [body_buf].into_iter().collect(),
        &mut released,
    );
    assert!(released.is_empty());
    // An exec made now holds both.
    let exec_keep = tree.snapshot();
    let dropped = forget(&mut tree, 1, &a);
    assert_eq!(dropped.len(), 1);
    drop(dropped);
    assert!(watch.upgrade().is_some(), "the snapshot still holds it");
    let dropped = forget(&mut tree, 1, &c);
    assert_eq!(
        dropped.len(),
        1,
        "the body's node went with its conditional node"
    );
    drop(dropped);
    assert!(watch_body.upgrade().is_some());
    assert!(tree.snapshot().is_empty(), "the tree holds nothing now");
    drop(exec_keep);
    assert!(watch.upgrade().is_none() && watch_body.upgrade().is_none());
}

#[test]
fn a_value_shared_by_nodes_lives_until_the_last_of_them_goes() {
    use std::sync::Arc;
    let mut tree = TreeState::default();
    let module = Arc::new(5u32);
    let watch = Arc::downgrade(&module);
    let (a, b, c) = {
        let mut add = |at: usize| {
            let shared = SharedRef::new(&module);
            fresh(
                &mut tree,
                1,
                raw(at),
                &[shared],
                Owners::new(),
                &mut Vec::new(),
            )
        };
        (add(0x100), add(0x200), add(0x300))
    };
    drop(module);
    assert_eq!(Arc::strong_count(&watch.upgrade().unwrap()), 2, "held once");
    let seen = |tree: &TreeState, n: &GraphNode| {
        tree.nodes
            .owners_of(1, n.raw, n.serial)
            .map_or(0, |o| o.count())
    };
    assert_eq!(seen(&tree, &a), 1, "each node lists what it uses");
    // An exec made now holds it; destroying nodes does not take it from the exec.
    let exec_keep = tree.snapshot();
    drop(forget(&mut tree, 1, &a));
    drop(exec_keep);
    assert!(watch.upgrade().is_some(), "two nodes still use it");
    drop(forget(&mut tree, 1, &b));
    assert!(watch.upgrade().is_some(), "one node still uses it");
    // Replacing the last user's owners hands the value back with the old owners; putting
    // them back holds it again.
    let old = tree
        .nodes
        .replace_owners(1, c.raw, c.serial, Owners::new())
        .expect("a live node");
    assert_eq!(old.len(), 1);
    let undone = tree.nodes.replace_owners(1, c.raw, c.serial, old);
    assert!(undone.is_some_and(|o| o.is_empty()));
    assert!(watch.upgrade().is_some(), "held by the node again");
    drop(forget(&mut tree, 1, &c));
    assert!(
        watch.upgrade().is_none(),
        "released with the last node using it"
    );
    assert!(tree.snapshot().is_empty());
}

#[test]
fn the_owners_index_names_what_each_node_uses_in_the_chunk() {
    use std::sync::Arc;
    let mut tree = TreeState::default();
    let module = Arc::new(7u32);
    let (buf_a, buf_b) = (Arc::new(1u64), Arc::new(2u64));
    let own: Owner = Arc::new(3u16);
    let more: Owner = Arc::new(4u16);
    // a: module + buf_a (two shared entries); b: module + buf_b; c: module, buf_a and two
    // owners of its own (the second buffer and its owners out of line); d: nothing.
    let a = fresh(
        &mut tree,
        1,
        raw(0x100),
        &[SharedRef::new(&module), SharedRef::new(&buf_a)],
        Owners::new(),
        &mut Vec::new(),
    );
    let b = fresh(
        &mut tree,
        2,
        raw(0x200),
        &[SharedRef::new(&module), SharedRef::new(&buf_b)],
        Owners::new(),
        &mut Vec::new(),
    );
    let c = fresh(
        &mut tree,
        1,
        raw(0x300),
        &[SharedRef::new(&module), SharedRef::new(&buf_a)],
        [own.clone(), more.clone()].into_iter().collect(),
        &mut Vec::new(),
    );
    let _d = fresh1(&mut tree, 1, raw(0x400));
    let check = |tree: &mut TreeState| {
        let (chunk, index) = tree.nodes.owners_chunk_indexed().expect("owners");
        let used = |g: u64, n: &GraphNode| -> Vec<usize> {
            let &(_, start, len) = index
                .nodes
                .iter()
                .find(|(k, _, _)| *k == (g, n.raw))
                .expect("the node is indexed");
            index.uses[start as usize..(start + len) as usize]
                .iter()
                .map(|&u| Arc::as_ptr(&chunk[u as usize]) as *const () as usize)
                .collect()
        };
        let addr = |o: &dyn std::any::Any| o as *const dyn std::any::Any as *const () as usize;
        let (m, ba, bb) = (addr(&*module), addr(&*buf_a), addr(&*buf_b));
        let mut got = used(1, &a);
        got.sort();
        let mut want = vec![m, ba];
        want.sort();
        assert_eq!(got, want, "a");
        let mut got = used(2, &b);
        got.sort();
        let mut want = vec![m, bb];
        want.sort();
        assert_eq!(got, want, "b");
        let mut got = used(1, &c);
        got.sort();
        let mut want = vec![m, ba, addr(&*own), addr(&*more)];
        want.sort();
        assert_eq!(got, want, "c");
        assert_eq!(index.nodes.len(), 3, "a node using nothing is not listed");
    };
    check(&mut tree);
    // Still right after the chunk is made again around a forgotten node's freed entries.
    drop(forget(&mut tree, 2, &b));
    let (chunk, index) = tree.nodes.owners_chunk_indexed().expect("owners");
    assert!(index.uses.iter().all(|&u| (u as usize) < chunk.len()));
    assert_eq!(index.nodes.len(), 2);
    let gone = Arc::as_ptr(&buf_b) as *const ();
    assert!(!chunk
        .iter()
        .any(|o| std::ptr::eq(Arc::as_ptr(o) as *const (), gone)));
}

#[test]
fn replacing_a_nodes_owners_leaves_older_snapshots_alone_and_can_be_undone() {
    use std::sync::Arc;
    let mut tree = TreeState::default();
    let old: Owner = Arc::new(1u32);
    let new: Owner = Arc::new(2u32);
    let (watch_old, watch_new) = (Arc::downgrade(&old), Arc::downgrade(&new));
    let a = fresh(
        &mut tree,
        1,
        raw(0x100),
        &[],
        [old].into_iter().collect(),
        &mut Vec::new(),
    );
    let exec_keep = tree.snapshot();
    let replaced = tree
        .nodes
        .replace_owners(1, a.raw, a.serial, [new].into_iter().collect())
        .expect("a live node");
    drop(replaced);
    assert!(watch_old.upgrade().is_some(), "the older snapshot holds it");
    let now = tree.snapshot();
    assert_eq!(now.iter().map(|c| c.len()).sum::<usize>(), 1);
    assert!(Arc::ptr_eq(&now[0][0], &watch_new.upgrade().unwrap()));
    drop((exec_keep, now));
    assert!(watch_old.upgrade().is_none());
    // Undo: the old owners back, the new ones returned.
    let back: Owner = Arc::new(3u32);
    let undone = tree
        .nodes
        .replace_owners(1, a.raw, a.serial, [back].into_iter().collect())
        .unwrap();
    let returned = tree
        .nodes
        .replace_owners(1, a.raw, a.serial, undone)
        .unwrap();
    assert_eq!(returned.len(), 1);
    drop(returned);
    assert!(watch_new.upgrade().is_some(), "the node holds `new` again");
    // A dead token replaces nothing.
    let _ = forget(&mut tree, 1, &a);
    assert!(tree
        .nodes
        .replace_owners(1, a.raw, a.serial, Owners::new())
        .is_none());
    assert!(watch_new.upgrade().is_none());
}

#[test]
fn nodes_know_the_epoch_they_were_made_at() {
    let mut tree = TreeState::default();
    let before = fresh1(&mut tree, 1, raw(0x100));
    // A capture ended at epoch 0; an exec is instantiated (epoch 1).
    tree.captured_epoch = tree.epoch;
    tree.epoch += 1;
    let exec_epoch = tree.epoch;
    let after = fresh1(&mut tree, 1, raw(0x200));
    // A node the capture made, listed only now.
    let captured = token(&mut tree, 1, raw(0x300));
    let born = |t: &TreeState, n: &GraphNode| t.nodes.born(n.graph, n.raw, n.serial);
    assert!(born(&tree, &before).unwrap() < exec_epoch);
    assert!(born(&tree, &captured).unwrap() < exec_epoch);
    assert!(born(&tree, &after).unwrap() >= exec_epoch);
    // While a capture records, a node listed then counts as made now.
    tree.add_capture(9, 1);
    let during = token(&mut tree, 1, raw(0x400));
    assert!(born(&tree, &during).unwrap() >= exec_epoch);
    let _ = forget(&mut tree, 1, &before);
    assert_eq!(born(&tree, &before), None);
    assert!(tree.nodes.knows_graph(1) && !tree.nodes.knows_graph(2));
}

#[test]
fn a_self_edge_is_refused() {
    let mut tree = TreeState::default();
    let a = fresh1(&mut tree, 1, raw(0x100));
    assert!(matches!(
        check_edge(&tree, 1, &a, &a),
        Err(e) if e.refusal() == Some(Refusal::Order)
    ));
}

#[test]
fn destroying_a_conditional_node_kills_its_bodies() {
    let mut tree = TreeState::default();
    let c = fresh1(&mut tree, 1, raw(0x100));
    tree.conditionals
        .insert((1, 0x100), CondRecord::with_bodies(&[7, 8]));
    let _ = forget(&mut tree, 1, &c);
    assert!(tree.dead().contains(&7) && tree.dead().contains(&8));
}

#[test]
fn destroying_a_conditional_node_forgets_everything_nested_below_it() {
    // Graph 1: an IF node (body 2); body 2 holds an IF node (body 3) and a child-graph node
    // (graph 4); graph 4 holds an IF node (body 5); body 3 and graph 5 each hold a node.
    let mut tree = TreeState::default();
    let outer = fresh1(&mut tree, 1, raw(0x100));
    tree.conditionals
        .insert((1, 0x100), CondRecord::with_bodies(&[2]));
    let _ = fresh1(&mut tree, 2, raw(0x200));
    tree.conditionals
        .insert((2, 0x200), CondRecord::with_bodies(&[3]));
    let _ = fresh1(&mut tree, 2, raw(0x210));
    tree.embedded.insert((2, 0x210), 4);
    let _ = fresh1(&mut tree, 4, raw(0x400));
    tree.conditionals
        .insert((4, 0x400), CondRecord::with_bodies(&[5]));
    let deep = fresh1(&mut tree, 3, raw(0x300));
    let deeper = fresh1(&mut tree, 5, raw(0x500));
    let _ = forget(&mut tree, 1, &outer);
    for g in [2, 3, 4, 5] {
        assert!(tree.dead().contains(&g), "graph {g} is dead");
    }
    assert!(tree.conditionals.is_empty() && tree.embedded.is_empty());
    assert!(matches!(check(&tree, 3, &deep), Err(Error::DestroyedNode)));
    assert!(matches!(
        check(&tree, 5, &deeper),
        Err(Error::DestroyedNode)
    ));
}

#[test]
fn a_freed_graphs_place_and_a_freed_owner_entry_serve_new_nodes_only() {
    use std::sync::Arc;
    // Body 2 dies with its IF node; body 3, made next, takes its place in the table, and an
    // owner entry freed with body 2's node is reused by body 3's. Tokens of body 2 stay
    // dead, those of body 3 check out in body 3 only, and each owner is released once.
    let mut tree = TreeState::default();
    let cond = fresh1(&mut tree, 1, raw(0x100));
    tree.conditionals
        .insert((1, 0x100), CondRecord::with_bodies(&[2]));
    let first: Owner = Arc::new(1u8);
    let watch_first = Arc::downgrade(&first);
    let in_body = fresh(
        &mut tree,
        2,
        raw(0x200),
        &[],
        [first].into_iter().collect(),
        &mut Vec::new(),
    );
    let released = forget(&mut tree, 1, &cond);
    assert_eq!(released.len(), 1, "body 2's node's owner comes back");
    drop(released);
    assert!(watch_first.upgrade().is_none());
    let second: Owner = Arc::new(2u8);
    let watch_second = Arc::downgrade(&second);
    // The same address as the dead node, in the new body.
    let reborn = fresh(
        &mut tree,
        3,
        raw(0x200),
        &[],
        [second].into_iter().collect(),
        &mut Vec::new(),
    );
    assert!(matches!(
        check(&tree, 2, &in_body),
        Err(Error::DestroyedNode)
    ));
    assert!(check(&tree, 3, &reborn).is_ok());
    let as_body_2 = GraphNode { graph: 2, ..reborn };
    assert!(check(&tree, 2, &as_body_2).is_err());
    assert!(tree.nodes.knows_graph(3) && !tree.nodes.knows_graph(2));
    let owners: Vec<Owner> = tree
        .nodes
        .owners_of(3, reborn.raw, reborn.serial)
        .expect("a live node")
        .cloned()
        .collect();
    assert_eq!(owners.len(), 1);
    assert!(Arc::ptr_eq(&owners[0], &watch_second.upgrade().unwrap()));
    drop(owners);
    let _ = forget(&mut tree, 3, &reborn);
    assert!(watch_second.upgrade().is_none());
    assert!(tree.nodes.owners_of(3, reborn.raw, reborn.serial).is_none());
}

#[test]
fn uses_counted_among_the_recent_values_release_each_value_with_its_last_node() {
    // Uses of the two values used last are counted beside them and added to the entries
    // later: values taking turns (three, so each leaves the recent two with uses pending)
    // must each go exactly when the last node using it goes, in any order.
    use std::sync::{Arc, Weak};
    let mut tree = TreeState::default();
    let values: Vec<Arc<u32>> = (0..3).map(Arc::new).collect();
    let watch: Vec<Weak<u32>> = values.iter().map(Arc::downgrade).collect();
    let mut nodes: Vec<(usize, GraphNode)> = Vec::new();
    for k in 0..60usize {
        // Runs of one value, then another: 0 0 0 1 1 2 0 ...
        let v = (k / 3 + k % 2) % 3;
        let shared = [SharedRef::new(&values[v])];
        let n = fresh(
            &mut tree,
            1,
            raw(0x1000 + k),
            &shared,
            Owners::new(),
            &mut Vec::new(),
        );
        nodes.push((v, n));
    }
    drop(values);
    // Forget value by value, checking each release: the first value (used last, with uses
    // pending) with nothing in between, the others with another value used between forgets.
    for (round, v) in [2usize, 0, 1].into_iter().enumerate() {
        let mine: Vec<GraphNode> = nodes
            .iter()
            .filter(|(w, _)| *w == v)
            .map(|(_, n)| *n)
            .collect();
        assert!(mine.len() > 1);
        for (i, n) in mine.iter().enumerate() {
            assert!(
                watch[v].upgrade().is_some(),
                "value {v} is held while {} of its nodes live",
                mine.len() - i
            );
            drop(forget(&mut tree, 1, n));
            if round == 0 {
                continue;
            }
            // Using another value between forgets moves the recent entries.
            let other = Arc::new(99u32);
            let t = fresh(
                &mut tree,
                1,
                raw(0x9000 + i),
                &[SharedRef::new(&other)],
                Owners::new(),
                &mut Vec::new(),
            );
            drop(forget(&mut tree, 1, &t));
        }
        assert!(
            watch[v].upgrade().is_none(),
            "value {v} went with its last node"
        );
    }
    assert!(tree.snapshot().is_empty(), "no entry is left behind");
}

#[test]
fn a_nodes_second_value_is_shared_snapshotted_and_released_like_its_first() {
    // Kernel nodes using a module and one buffer hold both through shared entries. A
    // snapshot (an exec) holds both; the buffer goes when the last node using it goes and no
    // snapshot holds it; replacing a node's owners hands back both uses.
    use std::sync::Arc;
    let mut tree = TreeState::default();
    let module = Arc::new(1u32);
    let buf = Arc::new(2u32);
    let (watch_module, watch_buf) = (Arc::downgrade(&module), Arc::downgrade(&buf));
    let (a, b) = {
        let mut add = |at: usize| {
            let shared = [SharedRef::new(&module), SharedRef::new(&buf)];
            fresh(
                &mut tree,
                1,
                raw(at),
                &shared,
                Owners::new(),
                &mut Vec::new(),
            )
        };
        (add(0x100), add(0x200))
    };
    drop((module, buf));
    assert_eq!(
        Arc::strong_count(&watch_buf.upgrade().unwrap()),
        2,
        "the buffer is held once for both nodes"
    );
    let listed: Vec<Owner> = tree
        .nodes
        .owners_of(1, a.raw, a.serial)
        .expect("a live node")
        .cloned()
        .collect();
    assert_eq!(listed.len(), 2, "a node lists its module and its buffer");
    drop(listed);
    let exec_keep = tree.snapshot();
    assert_eq!(exec_keep.iter().map(|c| c.len()).sum::<usize>(), 2);
    drop(forget(&mut tree, 1, &a));
    drop(forget(&mut tree, 1, &b));
    assert!(
        watch_buf.upgrade().is_some(),
        "the exec's snapshot holds it"
    );
    drop(exec_keep);
    assert!(watch_buf.upgrade().is_none() && watch_module.upgrade().is_none());
    assert!(tree.snapshot().is_empty(), "no entry is left behind");
    // Replacing: both uses come back as the old owners, and putting them back holds them.
    let module = Arc::new(3u32);
    let buf = Arc::new(4u32);
    let watch_buf = Arc::downgrade(&buf);
    let c = {
        let shared = [SharedRef::new(&module), SharedRef::new(&buf)];
        fresh(
            &mut tree,
            1,
            raw(0x300),
            &shared,
            Owners::new(),
            &mut Vec::new(),
        )
    };
    drop((module, buf));
    let old = tree
        .nodes
        .replace_owners(1, c.raw, c.serial, Owners::new())
        .expect("a live node");
    assert_eq!(old.len(), 2, "the module's use and the buffer's");
    assert!(tree.snapshot().is_empty(), "the node holds nothing now");
    let undone = tree.nodes.replace_owners(1, c.raw, c.serial, old);
    assert!(undone.is_some_and(|o| o.is_empty()));
    assert!(watch_buf.upgrade().is_some(), "held by the node again");
    drop(forget(&mut tree, 1, &c));
    assert!(watch_buf.upgrade().is_none());
}

#[test]
fn a_graph_named_twice_among_the_dead_frees_its_place_once() {
    // Freed twice, body 2's place would go to both graphs made next: a token of one would
    // check out in the other, and forgetting one would forget the other's nodes.
    let mut tree = TreeState::default();
    let _ = fresh1(&mut tree, 1, raw(0x100));
    let _ = fresh1(&mut tree, 2, raw(0x200));
    drop(tree.nodes.remove_graphs(&[2, 2]));
    let in_3 = fresh1(&mut tree, 3, raw(0x300));
    let in_4 = fresh1(&mut tree, 4, raw(0x400));
    assert!(check(&tree, 3, &in_3).is_ok() && check(&tree, 4, &in_4).is_ok());
    drop(tree.nodes.remove_graphs(&[3]));
    assert!(check(&tree, 3, &in_3).is_err());
    assert!(
        check(&tree, 4, &in_4).is_ok(),
        "graph 4's node outlives graph 3"
    );
}

#[test]
fn a_cancelled_reservation_gives_back_what_it_held_and_its_slot() {
    // A node whose driver call failed: its slot was reserved with a module (shared) and a
    // buffer (its second shared entry), then cancelled. Both are released, the module only
    // once no other node uses it, and the slot serves the next node with a new serial.
    use std::sync::Arc;
    let mut tree = TreeState::default();
    let module = Arc::new(5u32);
    let buf = Arc::new(6u32);
    let (watch_module, watch_buf) = (Arc::downgrade(&module), Arc::downgrade(&buf));
    let shared = [SharedRef::new(&module), SharedRef::new(&buf)];
    let kept = fresh(
        &mut tree,
        1,
        raw(0x100),
        &shared[..1],
        Owners::new(),
        &mut Vec::new(),
    );
    let r = tree.nodes.reserve(1, &shared, Owners::new(), tree.epoch);
    let given_back = tree.nodes.cancel(r);
    assert_eq!(given_back.len(), 2, "the module's use and the buffer");
    drop(given_back);
    drop(buf);
    assert!(watch_buf.upgrade().is_none(), "no node uses the buffer");
    assert!(
        watch_module.upgrade().is_some(),
        "`kept` still uses the module"
    );
    let next = fresh1(&mut tree, 1, raw(0x200));
    assert_eq!(next.serial & 0xffff_ffff, 1, "the cancelled slot is reused");
    assert!(check(&tree, 1, &next).is_ok() && check(&tree, 1, &kept).is_ok());
    let stale = GraphNode {
        graph: 1,
        raw: 0,
        serial: next.serial ^ (1 << 32),
    };
    assert!(
        check(&tree, 1, &stale).is_err(),
        "a slot's old serial is dead"
    );
    let released = forget(&mut tree, 1, &kept);
    drop(released);
    drop(module);
    assert!(watch_module.upgrade().is_none());
}

#[test]
fn node_types_map_from_raw_values() {
    assert_eq!(NodeType::from_raw(0), NodeType::Kernel);
    assert_eq!(NodeType::from_raw(13), NodeType::Conditional);
    assert_eq!(NodeType::from_raw(99), NodeType::Other(99));
    assert_eq!(
        NodeType::from_raw(sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32),
        NodeType::MemFree
    );
}
