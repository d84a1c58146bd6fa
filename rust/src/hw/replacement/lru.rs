//! Least recently used: the session accessed longest ago goes first (the paper's
//! merging table, and the default).

use super::{AccessOrder, Replacement};

/// Sessions in order of last access.
#[derive(Default)]
pub(crate) struct Lru {
    order: AccessOrder,
}

impl Replacement for Lru {
    fn open(&mut self, sid: i64) {
        self.order.touch(sid);
    }

    fn touch(&mut self, sid: i64) {
        self.order.touch(sid);
    }

    fn close(&mut self, sid: i64) {
        self.order.remove(sid);
    }

    fn victim(&self) -> Option<i64> {
        self.order.first()
    }
}
