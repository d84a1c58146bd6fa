//! Least recently used: the session accessed longest ago goes first (the paper's
//! merging table, and the default).

use super::{AccessOrder, Replacement};

/// The merge unit's own order of access decides (it keeps one for its idle timer), so
/// the policy keeps nothing.
pub(crate) struct Lru;

impl Replacement for Lru {
    fn open(&mut self, _sid: i64) {}

    fn touch(&mut self, _sid: i64) {}

    fn close(&mut self, _sid: i64) {}

    fn victim(&self, by_access: &AccessOrder) -> Option<i64> {
        by_access.first()
    }
}
