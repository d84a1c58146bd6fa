//! What a GPU's TBs have asked their peers for and may share: an L2 that keeps peer
//! reads, a TB cluster's multicast, a staged block. A load whose (scope, home, region)
//! is here joins the one asked for first instead of going out.

use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::GilCell;
use crate::engine::wait::Signal;
use crate::hw::region::Region;

/// A load's key: its scope (which TBs share it), its home GPU and its region, with a
/// hash of all three made once (from the region's [`region_hash`], which a plan's load
/// keeps), so that a key is hashed and compared without entering the interpreter. The region is held by address: the table keeps it alive
/// beside its line, and a lookup's key borrows the region it asks about. Two regions
/// are compared by their fields, and their names by content only when all else
/// agrees and they are not the same string object.
#[derive(Clone, Copy)]
struct LineKey {
    scope: i64,
    home: i64,
    hash: u64,
    region: *const Region,
}

impl LineKey {
    /// The key of `region` (whose [`region_hash`] is `hash`) under `scope` and `home`.
    fn of(scope: i64, home: i64, region: &Bound<'_, Region>, hash: u64) -> LineKey {
        let mut h = rustc_hash::FxHasher::default();
        (scope, home, hash).hash(&mut h);
        LineKey {
            scope,
            home,
            hash: h.finish(),
            region: region.get() as *const Region,
        }
    }
}

/// A hash of a region's buffer name (the string's own, cached hash) and its fields:
/// equal regions have equal ones. Never 0, so that a holder may keep 0 for "not made".
pub(crate) fn region_hash(region: &Bound<'_, Region>) -> PyResult<u64> {
    let r = region.get();
    let mut h = rustc_hash::FxHasher::default();
    r.buffer.bind(region.py()).hash()?.hash(&mut h);
    (r.start, r.count, r.elem_bytes, r.rows, r.stride).hash(&mut h);
    Ok(h.finish() | 1)
}

impl Hash for LineKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for LineKey {
    fn eq(&self, other: &Self) -> bool {
        if (self.scope, self.home, self.hash) != (other.scope, other.home, other.hash) {
            return false;
        }
        if self.region == other.region {
            return true;
        }
        // SAFETY: both regions are alive (a stored key's is held beside its line, a
        // lookup's by its caller), and a `KeptLines` is only looked into with the GIL
        // held (its map sits in a `GilCell`).
        let (a, b) = unsafe { (&*self.region, &*other.region) };
        if (a.start, a.count, a.elem_bytes, a.rows, a.stride) != (b.start, b.count, b.elem_bytes, b.rows, b.stride) {
            return false;
        }
        let (x, y) = (a.buffer.as_ptr(), b.buffer.as_ptr());
        // SAFETY: as above; both are `str` objects.
        x == y || unsafe { pyo3::ffi::PyUnicode_Compare(x, y) == 0 }
    }
}

impl Eq for LineKey {}

// SAFETY: the region is only read with the GIL held (see `PartialEq`).
unsafe impl Send for LineKey {}

/// The loads a GPU's TBs have asked for and may share (see the module), each a signal
/// that fires with its data: one table per GPU and kernel, filled by its TBs' load
/// streams (`LoadStream`). Its length is the number of loads that went out.
#[pyclass(module = "cais._core", frozen)]
pub struct KeptLines {
    lines: GilCell<Lines>,
}

/// Each load's line, with the region its key points to.
type Lines = HashMap<LineKey, (Py<Region>, Py<Signal>)>;

impl KeptLines {
    /// The line asked for under (`scope`, `home`, `region`), if any; `hash` is the
    /// region's [`region_hash`].
    pub(crate) fn get(&self, scope: i64, home: i64, region: &Bound<'_, Region>, hash: u64) -> Option<Py<Signal>> {
        let (py, key) = (region.py(), LineKey::of(scope, home, region, hash));
        self.lines.borrow(py).get(&key).map(|(_, line)| line.clone_ref(py))
    }

    /// Enter `line` under (`scope`, `home`, `region`), whose [`region_hash`] is `hash`.
    pub(crate) fn insert(&self, scope: i64, home: i64, region: &Bound<'_, Region>, hash: u64, line: Py<Signal>) {
        let (py, key) = (region.py(), LineKey::of(scope, home, region, hash));
        match self.lines.borrow_mut(py).entry(key) {
            // the region its key points to stays beside it
            Entry::Occupied(mut e) => e.get_mut().1 = line,
            Entry::Vacant(e) => {
                e.insert((region.clone().unbind(), line));
            }
        }
    }
}

#[pymethods]
impl KeptLines {
    #[new]
    fn new() -> Self {
        KeptLines {
            lines: GilCell::default(),
        }
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.lines.borrow(py).len()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(lines) = self.lines.during_gc() else {
            return Ok(());
        };
        for (region, line) in lines.values() {
            visit.call(region)?;
            visit.call(line)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut lines) = self.lines.during_gc_mut() {
            lines.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyo3::types::PyString;

    #[test]
    fn a_line_is_found_by_the_value_of_its_key() {
        Python::initialize();
        Python::attach(|py| {
            let region = |name: &str, start: i64| {
                let r = Region::make(PyString::new(py, name).unbind(), start, 64, 2, 1, 0);
                Bound::new(py, r).unwrap()
            };
            let kept = KeptLines::new();
            let line = Py::new(py, Signal::blank(py)).unwrap();
            let first = region("weights", 128);
            let hash = |r: &Bound<'_, Region>| region_hash(r).unwrap();
            kept.insert(0, 1, &first, hash(&first), line.clone_ref(py));
            drop(first); // the table keeps the region its key points to
                         // another string object of the same name: the same key
            let same = region("weights", 128);
            let found = |scope, home, r: &Bound<'_, Region>| kept.get(scope, home, r, hash(r));
            assert!(found(0, 1, &same).is_some_and(|l| l.is(&line)));
            assert!(found(1, 1, &same).is_none(), "another scope");
            assert!(found(0, 2, &same).is_none(), "another home");
            assert!(found(0, 1, &region("weights", 192)).is_none(), "another start");
            assert!(found(0, 1, &region("weighty", 128)).is_none(), "another buffer");
            assert_eq!(kept.__len__(py), 1);
        });
    }
}
