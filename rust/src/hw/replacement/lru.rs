//! Least recently used: the session accessed longest ago goes first (the paper's
//! merging table, and the default).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use super::Replacement;

/// Sessions in order of last access.
#[derive(Default)]
pub(crate) struct Lru {
    /// Order of last access -> session (first: least recently used).
    order: BTreeMap<u64, i64>,
    /// Session -> its place in `order`.
    place: HashMap<i64, u64>,
    seq: u64,
}

impl Replacement for Lru {
    fn open(&mut self, sid: i64) {
        self.touch(sid);
    }

    fn touch(&mut self, sid: i64) {
        self.seq += 1;
        if let Some(old) = self.place.insert(sid, self.seq) {
            self.order.remove(&old);
        }
        self.order.insert(self.seq, sid);
    }

    fn close(&mut self, sid: i64) {
        if let Some(old) = self.place.remove(&sid) {
            self.order.remove(&old);
        }
    }

    fn victim(&self) -> Option<i64> {
        self.order.values().next().copied()
    }
}
