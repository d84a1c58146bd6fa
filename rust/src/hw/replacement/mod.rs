//! Which session a CAIS merge unit evicts when a new one needs lines: the unit's
//! replacement policy (`switch.merge.replacement` in the system config).
//!
//! A policy sees sessions open, get accessed and end, and names the victim; it knows
//! nothing else of the unit. The unit evicts the victim (a Reduction's partial sum goes
//! home), or, if the victim still waits for its data (Load-Wait), marks it to end once
//! its data is out and lets the new request bypass. The idle timer is not the policy's:
//! the unit keeps sessions in order of last access for it whatever the policy.
//!
//! A new policy is a file here implementing [`Replacement`] and its line in
//! [`POLICIES`]; the config accepts the names this registry lists
//! (`cais._core.replacement_policies`), so nothing on the Python side names it.

mod fifo;
mod lru;
mod order;

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

pub(crate) use fifo::Fifo;
pub(crate) use lru::Lru;
pub(crate) use order::AccessOrder;

/// A replacement policy over a merge unit's open sessions (by session id; ids grow
/// with each session opened). The unit keeps its open sessions in order of last access
/// for its idle timer and hands that order to `victim`: a policy that evicts by it
/// (LRU) keeps nothing of its own.
pub(crate) trait Replacement: Send {
    /// Session `sid` opened.
    fn open(&mut self, sid: i64);
    /// Session `sid` was accessed: a request merged into it, or its data came.
    fn touch(&mut self, sid: i64);
    /// Session `sid` ended (flushed, closed or evicted).
    fn close(&mut self, sid: i64);
    /// The session to evict first, if any is open; `by_access`: the open sessions,
    /// accessed longest ago first.
    fn victim(&self, by_access: &AccessOrder) -> Option<i64>;
}

/// A policy's constructor.
type Make = fn() -> Box<dyn Replacement>;

/// Every policy, by the name the config gives it; the first is the default.
pub(crate) const POLICIES: &[(&str, Make)] = &[("lru", || Box::new(Lru)), ("fifo", || Box::new(Fifo::default()))];

/// The names of the policies, in registry order.
pub(crate) fn names() -> Vec<&'static str> {
    POLICIES.iter().map(|(name, _)| *name).collect()
}

/// The policy called `name` in the config.
pub(crate) fn by_name(name: &str) -> PyResult<Box<dyn Replacement>> {
    match POLICIES.iter().find(|(n, _)| *n == name) {
        Some((_, make)) => Ok(make()),
        None => Err(PyValueError::new_err(format!(
            "switch.merge.replacement: expected one of {}; got {name:?}",
            names().join(", ")
        ))),
    }
}

/// The replacement policies a merge unit can run, by the names the config takes
/// (`switch.merge.replacement`), the default first.
#[pyo3::pyfunction]
pub fn replacement_policies() -> Vec<&'static str> {
    names()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Open 1, 2, 3; touch 1; the victim, then after it ends, the next (the order of
    /// access kept as a merge unit keeps it).
    fn victims(mut p: Box<dyn Replacement>) -> Vec<i64> {
        let mut by_access = AccessOrder::default();
        for sid in 1..=3 {
            by_access.touch(sid);
            p.open(sid);
        }
        by_access.touch(1);
        p.touch(1);
        let mut out = Vec::new();
        while let Some(v) = p.victim(&by_access) {
            out.push(v);
            by_access.remove(v);
            p.close(v);
        }
        out
    }

    #[test]
    fn lru_evicts_the_least_recently_used_and_fifo_the_oldest() {
        assert_eq!(victims(by_name("lru").unwrap()), vec![2, 3, 1]);
        assert_eq!(victims(by_name("fifo").unwrap()), vec![1, 2, 3]);
        assert!(by_name("mru").is_err());
        assert_eq!(names(), vec!["lru", "fifo"]);
    }
}
