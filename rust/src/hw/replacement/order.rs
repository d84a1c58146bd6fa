//! Sessions in order of last access, for the merge unit's idle timer and its LRU
//! policy: an access is O(1) (a stamp appended to a queue), where an ordered map
//! removed and reinserted the session on every merge.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

/// Ids in order of their last `touch`: a queue of (stamp, id) in stamp order, of which
/// only each id's latest stamp is live; the stale ones are skipped, dropped when they
/// reach the front, and swept out when they outnumber the live ones.
#[derive(Default)]
pub(crate) struct AccessOrder {
    queue: VecDeque<(u64, i64)>,
    live: HashMap<i64, u64>,
    stamp: u64,
}

impl AccessOrder {
    /// `id` was accessed (or first seen): it goes last.
    pub(crate) fn touch(&mut self, id: i64) {
        self.stamp += 1;
        let old = self.live.insert(id, self.stamp);
        self.queue.push_back((self.stamp, id));
        self.settle(old.map(|s| (s, id)));
    }

    /// `id` is gone.
    pub(crate) fn remove(&mut self, id: i64) {
        if let Some(s) = self.live.remove(&id) {
            self.settle(Some((s, id)));
        }
    }

    /// The id accessed longest ago.
    pub(crate) fn first(&self) -> Option<i64> {
        self.queue.front().map(|&(_, id)| id)
    }

    /// The ids, accessed longest ago first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        self.queue
            .iter()
            .filter(|&&(s, id)| self.is_live(s, id))
            .map(|&(_, id)| id)
    }

    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.live.clear();
    }

    fn is_live(&self, stamp: u64, id: i64) -> bool {
        self.live.get(&id) == Some(&stamp)
    }

    /// Keep the front live, and the queue at most about twice the live ids; `stale`:
    /// the entry that just went stale (only if it was the front can the front be).
    fn settle(&mut self, stale: Option<(u64, i64)>) {
        if stale.is_some() && self.queue.front() == stale.as_ref() {
            self.queue.pop_front();
            while let Some(&(s, id)) = self.queue.front() {
                if self.is_live(s, id) {
                    break;
                }
                self.queue.pop_front();
            }
        }
        if self.queue.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            self.queue.retain(|&(s, id)| live.get(&id) == Some(&s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_order_of_last_access_as_an_ordered_map_would() {
        let mut order = AccessOrder::default();
        let mut reference = std::collections::BTreeMap::new();
        let mut place = std::collections::HashMap::new();
        let mut seq = 0u64;
        let mut seed = 7u64;
        for step in 0..50_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let id = (seed >> 33) as i64 % 97;
            if step % 5 == 0 {
                order.remove(id);
                if let Some(old) = place.remove(&id) {
                    reference.remove(&old);
                }
            } else {
                order.touch(id);
                seq += 1;
                if let Some(old) = place.insert(id, seq) {
                    reference.remove(&old);
                }
                reference.insert(seq, id);
            }
            assert_eq!(order.first(), reference.values().next().copied());
            if step % 1000 == 0 {
                assert!(order.iter().eq(reference.values().copied()));
            }
        }
        assert!(order.queue.len() <= 2 * order.live.len() + 64, "stale stamps are swept");
        order.clear();
        assert_eq!(order.first(), None);
    }
}
