//! What the core asks of the packet format: a kind's wire size and VC, from the
//! Python `Packetizer` and `VcMap` (`cais.hw.packets`, where every kind is
//! described once), remembered after the first question.

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// The packetizer and VC map of a unit of the core, with their answers remembered.
pub(crate) struct PacketBook {
    pk: Py<PyAny>,
    vcmap: Py<PyAny>,
    wires: HashMap<(i64, i64), (i64, i64)>,
    vcs: HashMap<(i64, i64), i64>,
    /// The last answer of each, looked at before the map (a GPU's trains come in runs
    /// of one kind and size).
    last_wire: ((i64, i64), (i64, i64)),
    last_vc: ((i64, i64), i64),
}

impl PacketBook {
    pub(crate) fn new(pk: Py<PyAny>, vcmap: Py<PyAny>) -> Self {
        PacketBook {
            pk,
            vcmap,
            wires: HashMap::default(),
            vcs: HashMap::default(),
            last_wire: ((-1, -1), (0, 0)),
            last_vc: ((-1, -1), 0),
        }
    }

    /// (wire bytes of the whole train, wire bytes of its last packet) for `nbytes`
    /// of `kind`.
    pub(crate) fn wire(&mut self, py: Python<'_>, kind: i64, nbytes: i64) -> PyResult<(i64, i64)> {
        let key = (kind, nbytes);
        if self.last_wire.0 == key {
            return Ok(self.last_wire.1);
        }
        let got = match self.wires.get(&key) {
            Some(&hit) => hit,
            None => {
                let got: (i64, i64) = self.pk.bind(py).call_method1("wire", key)?.extract()?;
                self.wires.insert(key, got);
                got
            }
        };
        self.last_wire = (key, got);
        Ok(got)
    }

    /// The VC of `kind` issued by a kernel on `stream` (0: untagged traffic).
    pub(crate) fn vc(&mut self, py: Python<'_>, kind: i64, stream: i64) -> PyResult<i64> {
        let key = (kind, stream);
        if self.last_vc.0 == key {
            return Ok(self.last_vc.1);
        }
        let vc = match self.vcs.get(&key) {
            Some(&vc) => vc,
            None => {
                let vc: i64 = self
                    .vcmap
                    .bind(py)
                    .call_method1("vc", (kind, py.None(), stream))?
                    .extract()?;
                self.vcs.insert(key, vc);
                vc
            }
        };
        self.last_vc = (key, vc);
        Ok(vc)
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pk)?;
        visit.call(&self.vcmap)
    }
}
