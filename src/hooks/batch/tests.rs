//! Batch writes and the grouping helper.

use super::write_order;

/// Many writes per object (past the length an unstable sort keeps equal keys in order by
/// luck), pairs of them to one slot: each object's run is by address, and the writes to one
/// slot stay in plan order.
#[test]
fn writes_to_one_slot_keep_plan_order() {
    let mut writes = Vec::new();
    for set in 0..2 {
        for slot in (0..40).rev() {
            let object = usize::from(slot >= 35);
            writes.push((object, 0x1000 + 8 * slot, set, set + 1));
        }
    }
    let (starts, order) = write_order(&writes, 3);
    assert_eq!(starts.as_slice(), [0, 70, 80, 80]);
    for i in 0..3 {
        let run = &order[starts[i]..starts[i + 1]];
        assert!(run.iter().all(|&k| writes[k].0 == i));
        for w in run.windows(2) {
            let (a, b) = (writes[w[0]], writes[w[1]]);
            assert!(
                a.1 < b.1 || (a.1 == b.1 && w[0] < w[1]),
                "{a:?} before {b:?}"
            );
        }
    }
}
