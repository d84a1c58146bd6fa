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
    /// `VcMap.at`'s answers by (VC, source x GPUs + destination); asked only under the
    /// `destination` policy (under the others a packet's VC is its kind's).
    ats: Memo<i64>,
    by_destination: bool,
    /// GPUs in the system (the key's stride).
    gpus: i64,
}

impl PacketBook {
    pub(crate) fn new(py: Python<'_>, pk: Py<PyAny>, vcmap: Py<PyAny>, gpus: i64) -> PyResult<Self> {
        let by_destination = vcmap.bind(py).getattr("by_destination")?.extract::<bool>()?;
        Ok(PacketBook {
            pk,
            vcmap,
            wires: Memo::new(),
            vcs: Memo::new(),
            ats: Memo::new(),
            by_destination,
            gpus: gpus.max(1),
        })
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

    /// The VC of a packet from GPU `src` to GPU `dst` (-1: a switch or a multicast)
    /// whose kind, class and stream give VC `vc`: `VcMap.at`'s answer, remembered.
    pub(crate) fn at(&mut self, py: Python<'_>, vc: i64, src: i64, dst: i64) -> PyResult<i64> {
        if !self.by_destination || src < 0 || dst < 0 {
            return Ok(vc);
        }
        let (vcmap, n) = (&self.vcmap, self.gpus);
        self.ats.get((vc, src * n + dst), || {
            vcmap.bind(py).call_method1("at", (vc, src, dst, n))?.extract()
        })
    }

    /// [`Self::vc`] of a packet from GPU `src` to GPU `dst`.
    pub(crate) fn vc_to(&mut self, py: Python<'_>, kind: i64, stream: i64, src: i64, dst: i64) -> PyResult<i64> {
        let vc = self.vc(py, kind, stream)?;
        self.at(py, vc, src, dst)
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pk)?;
        visit.call(&self.vcmap)
    }
}
