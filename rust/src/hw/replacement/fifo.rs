//! First in, first out: the session opened first goes first, however recently it
//! was accessed.

use std::collections::BTreeSet;

use super::{AccessOrder, Replacement};

/// Open sessions in the order they opened (session ids grow with each one).
#[derive(Default)]
pub(crate) struct Fifo {
    open: BTreeSet<i64>,
}

impl Replacement for Fifo {
    fn open(&mut self, sid: i64) {
        self.open.insert(sid);
    }

    fn touch(&mut self, _sid: i64) {}

    fn close(&mut self, sid: i64) {
        self.open.remove(&sid);
    }

    fn victim(&self, _by_access: &AccessOrder) -> Option<i64> {
        self.open.first().copied()
    }
}
