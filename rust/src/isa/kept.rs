//! What a GPU's TBs have asked their peers for and may share: an L2 that keeps peer
//! reads, a TB cluster's multicast, a staged block. A load whose (scope, home, region)
//! is here joins the one asked for first instead of going out.

use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::GilCell;
use crate::engine::wait::Signal;
use crate::hw::region::Region;

/// A region as part of a [`KeptLines`] key: its fields, and its buffer's name with
/// that name's hash (Python's, which the string keeps), so that a key is hashed and
/// compared without entering the interpreter (names are compared by content only
/// when two keys agree on everything else and are not the same string object).
pub(crate) struct RegionKey {
    buffer: Py<PyString>,
    buffer_hash: isize,
    fields: [i64; 5],
}

impl RegionKey {
    pub(crate) fn of(region: &Bound<'_, Region>) -> PyResult<RegionKey> {
        let r = region.get();
        let buffer = r.buffer.bind(region.py());
        Ok(RegionKey {
            buffer_hash: buffer.hash()?,
            buffer: buffer.clone().unbind(),
            fields: [r.start, r.count, r.elem_bytes, r.rows, r.stride],
        })
    }
}

/// A load's key: its scope (which TBs share it), its home GPU and its region (its
/// buffer's name by address: the table keeps the name alive beside its line, and a
/// lookup's key borrows the name of the region it asks about).
#[derive(Clone, Copy)]
struct LineKey {
    scope: i64,
    home: i64,
    buffer_hash: isize,
    fields: [i64; 5],
    buffer: *mut pyo3::ffi::PyObject,
}

impl LineKey {
    fn of(scope: i64, home: i64, region: &RegionKey) -> LineKey {
        LineKey {
            scope,
            home,
            buffer_hash: region.buffer_hash,
            fields: region.fields,
            buffer: region.buffer.as_ptr(),
        }
    }
}

impl Hash for LineKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.scope, self.home, self.buffer_hash, self.fields).hash(state);
    }
}

impl PartialEq for LineKey {
    fn eq(&self, other: &Self) -> bool {
        if (self.scope, self.home, self.buffer_hash, self.fields)
            != (other.scope, other.home, other.buffer_hash, other.fields)
        {
            return false;
        }
        if self.buffer == other.buffer {
            return true;
        }
        // SAFETY: both are live `str` objects (a stored key's name is held beside its
        // line, a lookup's by the region it asks about), and a `KeptLines` is only
        // looked into with the GIL held (its map sits in a `GilCell`).
        unsafe { pyo3::ffi::PyUnicode_Compare(self.buffer, other.buffer) == 0 }
    }
}

// SAFETY: the pointer is only followed with the GIL held (see `PartialEq`).
unsafe impl Send for LineKey {}

impl Eq for LineKey {}

/// The loads a GPU's TBs have asked for and may share (see the module), each a signal
/// that fires with its data: one table per GPU and kernel, filled by its TBs' load
/// streams (`LoadStream`). Its length is the number of loads that went out.
#[pyclass(module = "cais._core", frozen)]
pub struct KeptLines {
    lines: GilCell<Lines>,
}

/// Each load's line, with the buffer name its key points to.
type Lines = HashMap<LineKey, (Py<PyString>, Py<Signal>)>;

impl KeptLines {
    /// The line asked for under (`scope`, `home`, `region`), if any.
    pub(crate) fn get(&self, py: Python<'_>, scope: i64, home: i64, region: &RegionKey) -> Option<Py<Signal>> {
        let key = LineKey::of(scope, home, region);
        self.lines.borrow(py).get(&key).map(|(_, line)| line.clone_ref(py))
    }

    /// Enter `line` under (`scope`, `home`, `region`).
    pub(crate) fn insert(&self, py: Python<'_>, scope: i64, home: i64, region: &RegionKey, line: Py<Signal>) {
        let key = LineKey::of(scope, home, region);
        match self.lines.borrow_mut(py).entry(key) {
            // the name its key points to stays beside it
            Entry::Occupied(mut e) => e.get_mut().1 = line,
            Entry::Vacant(e) => {
                e.insert((region.buffer.clone_ref(py), line));
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
        for (buffer, line) in lines.values() {
            visit.call(buffer)?;
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

    #[test]
    fn a_line_is_found_by_the_value_of_its_key() {
        Python::initialize();
        Python::attach(|py| {
            let region = |name: &str, start: i64| {
                let r = Region::make(PyString::new(py, name).unbind(), start, 64, 2, 1, 0);
                RegionKey::of(&Bound::new(py, r).unwrap()).unwrap()
            };
            let kept = KeptLines::new();
            let line = Py::new(py, Signal::blank(py)).unwrap();
            let first = region("weights", 128);
            kept.insert(py, 0, 1, &first, line.clone_ref(py));
            // another string object of the same name: the same key
            let same = region("weights", 128);
            assert!(!same.buffer.is(&first.buffer), "two string objects");
            assert!(kept.get(py, 0, 1, &same).is_some_and(|l| l.is(&line)));
            assert!(kept.get(py, 1, 1, &same).is_none(), "another scope");
            assert!(kept.get(py, 0, 2, &same).is_none(), "another home");
            assert!(kept.get(py, 0, 1, &region("weights", 192)).is_none(), "another start");
            assert!(kept.get(py, 0, 1, &region("weighty", 128)).is_none(), "another buffer");
            assert_eq!(kept.__len__(py), 1);
        });
    }
}
