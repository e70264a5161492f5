//! The recurrent-state slots of a hybrid model's cache: handed out with a sequence's first
//! reservation and back on drop, snapshots planned at block boundaries and keyed on commit,
//! prefix hits and forks cut back to the last snapshot, and snapshots evicted with their
//! blocks.

use met_cache::{KvCache, KvLayout, OutOfBlocks, PagedKvCache, StateLayout, StateSizing};
use met_kernels::{CpuBackend, DType};

const BLOCK: usize = 4;

fn layout() -> KvLayout {
    let state = StateLayout {
        num_layers: 2,
        conv: [6, 3],
        conv_dtype: DType::F32,
        recurrent: [2, 3, 3],
        recurrent_dtype: DType::F32,
    };
    KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 2, dtype: DType::F32, state: Some(state) }
}

fn cache(blocks: usize, sequences: usize, snapshots: usize, interval: usize) -> PagedKvCache {
    let sizing = StateSizing { sequences, snapshots, interval, rollback: 2 };
    PagedKvCache::with_states(&[&CpuBackend::new()], layout(), BLOCK, blocks, true, Some(sizing)).unwrap()
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).collect()
}

#[test]
fn pools_hold_every_slot_of_every_recurrent_layer() {
    // 3 sequences with 2 rollback slots each, and 2 snapshots.
    let c = cache(8, 3, 2, 1);
    let pools = c.pools(0);
    assert_eq!(pools.state(1).0.dims(), [11, 6, 3]);
    assert_eq!(pools.state(1).1.dims(), [11, 2, 3, 3]);
    assert_eq!(pools.state_pools().len(), 4);
    let usage = c.state_usage().unwrap();
    assert_eq!((usage.sequence_slots, usage.snapshot_slots, usage.rollback), (3, 2, 2));
    assert_eq!(usage.bytes, 11 * layout().state.unwrap().bytes_per_slot());
}

#[test]
fn a_layout_with_state_needs_slots_and_one_without_refuses_them() {
    let b = CpuBackend::new();
    assert!(PagedKvCache::new(&b, layout(), BLOCK, 8, true).is_err());
    let plain = KvLayout { state: None, ..layout() };
    let sizing = StateSizing { sequences: 1, snapshots: 0, interval: 0, rollback: 0 };
    assert!(PagedKvCache::with_states(&[&b], plain, BLOCK, 8, true, Some(sizing)).is_err());
    let none = StateSizing { sequences: 0, ..sizing };
    assert!(PagedKvCache::with_states(&[&b], layout(), BLOCK, 8, true, Some(none)).is_err());
}

#[test]
fn a_sequence_holds_one_slot_from_its_first_reservation_until_it_drops() {
    let c = cache(8, 2, 0, 0);
    let mut a = c.new_sequence();
    assert_eq!(a.state_slot(), None);
    c.reserve(&mut a, 3).unwrap();
    let slot = a.state_slot().unwrap();
    c.reserve(&mut a, 9).unwrap();
    assert_eq!(a.state_slot(), Some(slot), "growing keeps the slot");
    let mut b = c.new_sequence();
    c.reserve(&mut b, 1).unwrap();
    assert_ne!(b.state_slot(), Some(slot));
    assert_eq!(c.state_usage().unwrap().sequences_held, 2);
    drop(a);
    assert_eq!(c.state_usage().unwrap().sequences_held, 1);
}

#[test]
fn running_out_of_slots_takes_no_blocks() {
    let c = cache(8, 1, 0, 0);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 4).unwrap();
    let mut b = c.new_sequence();
    let free = c.num_free_blocks();
    assert!(matches!(c.reserve(&mut b, 4), Err(OutOfBlocks { .. })));
    assert_eq!(c.num_free_blocks(), free);
    assert_eq!(b.state_slot(), None);
    drop(a);
    c.reserve(&mut b, 4).unwrap();
    assert!(b.state_slot().is_some());
}

#[test]
fn running_out_of_blocks_keeps_no_slot() {
    let c = cache(2, 2, 0, 0);
    let mut a = c.new_sequence();
    assert!(c.reserve(&mut a, 3 * BLOCK).is_err());
    assert_eq!(a.state_slot(), None);
    assert_eq!(c.state_usage().unwrap().sequences_held, 0);
}

#[test]
fn snapshots_are_planned_at_boundaries_and_keyed_on_commit() {
    let c = cache(16, 2, 8, 2);
    let t = tokens(21);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 21).unwrap();
    let at: Vec<usize> = a.planned_snapshots().iter().map(|p| p.0).collect();
    assert_eq!(at, [8, 16], "every 2 blocks of 4");
    c.commit(&mut a, &t, 12);
    assert_eq!(a.planned_snapshots().len(), 1, "the snapshot at 8 is keyed");
    assert_eq!(c.state_usage().unwrap().snapshots_cached, 1);
    c.commit(&mut a, &t, 21);
    assert!(a.planned_snapshots().is_empty());
    assert_eq!(c.state_usage().unwrap().snapshots_cached, 2);
}

#[test]
fn a_prefix_hit_stops_at_the_last_snapshot_and_restores_it() {
    let c = cache(16, 2, 8, 2);
    let t = tokens(21);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 21).unwrap();
    let snapshot_at_16 = a.planned_snapshots()[1].1;
    c.commit(&mut a, &t, 21);
    let mut b = c.new_sequence();
    // All five full blocks are cached, but the state is known only after blocks 2 and 4.
    assert_eq!(c.match_prefix(&mut b, &t, 20), 16);
    assert_eq!(b.state_restore(), Some((snapshot_at_16, 16)));
    let mut short = c.new_sequence();
    assert_eq!(c.match_prefix(&mut short, &t, 15), 8);
    assert_eq!(short.state_restore().map(|r| r.1), Some(8));
}

#[test]
fn without_snapshots_a_hybrid_cache_never_hits() {
    let c = cache(16, 2, 0, 2);
    let t = tokens(21);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 21).unwrap();
    assert!(a.planned_snapshots().is_empty());
    c.commit(&mut a, &t, 21);
    let mut b = c.new_sequence();
    assert_eq!(c.match_prefix(&mut b, &t, 20), 0);
    assert_eq!(b.state_restore(), None);
    assert!(b.block_ids().is_empty());
}

#[test]
fn forks_share_up_to_the_last_snapshot() {
    let c = cache(16, 3, 8, 2);
    let t = tokens(14);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 14).unwrap();
    c.commit(&mut a, &t, 14);
    let fork = c.fork(&a, 13);
    assert_eq!(fork.capacity(), 8, "blocks 0..2 end at the snapshot at 8; block 2 has none");
    assert_eq!(fork.state_restore().map(|r| r.1), Some(8));
    assert_eq!(fork.state_slot(), None, "a fork takes its own slot when it reserves");
}

#[test]
fn evicting_a_block_frees_its_snapshot() {
    let c = cache(4, 2, 4, 1);
    let t = tokens(8);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 8).unwrap();
    c.commit(&mut a, &t, 8);
    drop(a);
    assert_eq!(c.state_usage().unwrap().snapshots_cached, 2);
    // Taking every block evicts both cached blocks and their snapshots.
    let mut b = c.new_sequence();
    c.reserve(&mut b, 16).unwrap();
    assert_eq!(c.state_usage().unwrap().snapshots_cached, 0);
    let mut again = c.new_sequence();
    assert_eq!(c.match_prefix(&mut again, &t, 7), 0);
}

#[test]
fn a_full_snapshot_pool_takes_back_snapshots_nobody_holds() {
    let c = cache(16, 2, 1, 1);
    let first = tokens(5);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 5).unwrap();
    c.commit(&mut a, &first, 5);
    drop(a);
    let second: Vec<u32> = (100..105).collect();
    let mut b = c.new_sequence();
    c.reserve(&mut b, 5).unwrap();
    assert_eq!(b.planned_snapshots().len(), 1, "the only snapshot slot was taken back");
    c.commit(&mut b, &second, 5);
    let mut hit = c.new_sequence();
    assert_eq!(c.match_prefix(&mut hit, &second, 4), 4);
    let mut miss = c.new_sequence();
    assert_eq!(c.match_prefix(&mut miss, &first, 4), 0);
}

#[test]
fn dropping_a_sequence_returns_its_planned_snapshots() {
    let c = cache(16, 1, 3, 1);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 12).unwrap();
    assert_eq!(a.planned_snapshots().len(), 3);
    drop(a);
    let mut b = c.new_sequence();
    c.reserve(&mut b, 12).unwrap();
    assert_eq!(b.planned_snapshots().len(), 3, "all three slots came back");
}

#[test]
fn truncating_returns_snapshots_past_the_cut() {
    let c = cache(16, 1, 3, 1);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 12).unwrap();
    a.truncate(5);
    assert_eq!(a.planned_snapshots().iter().map(|p| p.0).collect::<Vec<_>>(), [4]);
}

#[test]
fn a_speculative_step_rolls_back_to_the_copy_at_the_cut() {
    let c = cache(16, 2, 0, 0);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 12).unwrap();
    // The step computes tokens 9..12; it may keep 10, 11 or all 12 of them.
    assert!(c.allow_rollback(&mut a, 9, 12));
    let copies: Vec<usize> = a.rollback_snapshots().iter().map(|r| r.0).collect();
    assert_eq!(copies, [10, 11]);
    let at_10 = a.rollback_snapshots()[0].1;
    a.truncate(10);
    assert_eq!(a.state_restore(), Some((at_10, 10)));
    assert!(a.rollback_snapshots().is_empty());
    // Keeping every token needs no copy.
    assert!(c.allow_rollback(&mut a, 10, 12));
    a.truncate(12);
    assert_eq!(a.state_restore(), Some((at_10, 10)), "unchanged: the restore at 10 is spent once it runs");
}

#[test]
fn a_step_longer_than_the_rollback_slots_is_refused() {
    let c = cache(16, 2, 0, 0);
    let mut a = c.new_sequence();
    c.reserve(&mut a, 12).unwrap();
    assert!(!c.allow_rollback(&mut a, 8, 12), "3 copies, 2 rollback slots");
    assert!(a.rollback_snapshots().is_empty());
}

#[test]
fn rollback_slots_are_each_sequences_own() {
    let c = cache(16, 2, 0, 0);
    let (mut a, mut b) = (c.new_sequence(), c.new_sequence());
    c.reserve(&mut a, 4).unwrap();
    c.reserve(&mut b, 4).unwrap();
    assert!(c.allow_rollback(&mut a, 1, 4) && c.allow_rollback(&mut b, 1, 4));
    let slots = |s: &met_cache::SequenceBlocks| s.rollback_snapshots().iter().map(|r| r.1).collect::<Vec<_>>();
    let (sa, sb) = (slots(&a), slots(&b));
    assert!(sa.iter().all(|s| !sb.contains(s)), "{sa:?} {sb:?}");
    assert!(sa.iter().chain(&sb).all(|&s| s != a.state_slot().unwrap() && s != b.state_slot().unwrap()));
    assert_eq!(c.pools(0).state(0).0.dims()[0], 2 * 3, "2 sequences with 2 rollback slots each");
}
