//! What the core asks of the packet format: a kind's wire size and VC, from the
//! Python `Packetizer` and `VcMap` (`cais.hw.packets`, where every kind is
//! described once), remembered after the first question.

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// Answers by key, remembered after the first question, the last one looked at before
/// the map (a GPU's trains come in runs of one kind and size).
struct Memo<V> {
    map: HashMap<(i64, i64), V>,
    last: Option<((i64, i64), V)>,
}

impl<V: Copy> Memo<V> {
    fn new() -> Self {
        Memo {
            map: HashMap::default(),
            last: None,
        }
    }

    /// The answer for `key`: remembered, or `ask()`'s.
    fn get(&mut self, key: (i64, i64), ask: impl FnOnce() -> PyResult<V>) -> PyResult<V> {
        if let Some((k, v)) = self.last {
            if k == key {
                return Ok(v);
            }
        }
        let v = match self.map.get(&key) {
            Some(&v) => v,
            None => {
                let v = ask()?;
                self.map.insert(key, v);
                v
            }
        };
        self.last = Some((key, v));
        Ok(v)
    }
}

/// The packetizer and VC map of a unit of the core, with their answers remembered.
pub(crate) struct PacketBook {
    pk: Py<PyAny>,
    vcmap: Py<PyAny>,
    wires: Memo<(i64, i64)>,
    vcs: Memo<i64>,
}

impl PacketBook {
    pub(crate) fn new(pk: Py<PyAny>, vcmap: Py<PyAny>) -> Self {
        PacketBook {
            pk,
            vcmap,
            wires: Memo::new(),
            vcs: Memo::new(),
        }
    }

    /// (wire bytes of the whole train, wire bytes of its last packet) for `nbytes`
    /// of `kind`.
    pub(crate) fn wire(&mut self, py: Python<'_>, kind: i64, nbytes: i64) -> PyResult<(i64, i64)> {
        let pk = &self.pk;
        self.wires.get((kind, nbytes), || {
            pk.bind(py).call_method1("wire", (kind, nbytes))?.extract()
        })
    }

    /// The VC of `kind` issued by a kernel on `stream` (0: untagged traffic).
    pub(crate) fn vc(&mut self, py: Python<'_>, kind: i64, stream: i64) -> PyResult<i64> {
        let vcmap = &self.vcmap;
        self.vcs.get((kind, stream), || {
            vcmap.bind(py).call_method1("vc", (kind, py.None(), stream))?.extract()
        })
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pk)?;
        visit.call(&self.vcmap)
    }
}
