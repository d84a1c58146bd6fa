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
    /// `Some(VCs per set)` under the `destination` policy (`VcMap`: a bulk request's
    /// VC by its destination's place among the sender's peers; read requests and flags
    /// keep theirs).
    per_destination: Option<i64>,
    /// The request VCs read requests and flags keep under `destination`.
    kept: (i64, i64),
    /// The request VCs bulk requests spread over, by destination, under `destination`.
    bulk: Vec<i64>,
    /// GPUs in the system (a destination's place among a sender's peers is modulo this).
    gpus: i64,
}

impl PacketBook {
    pub(crate) fn new(py: Python<'_>, pk: Py<PyAny>, vcmap: Py<PyAny>, gpus: i64) -> PyResult<Self> {
        let map = vcmap.bind(py);
        let half = map.getattr("half")?.extract::<i64>()?;
        let per_destination = if map.getattr("by_destination")?.extract::<bool>()? {
            Some(half)
        } else {
            None
        };
        let kept = (
            map.getattr("load_vc")?.extract::<i64>()?,
            map.getattr("sync_vc")?.extract::<i64>()?,
        );
        let bulk = map.getattr("bulk_vcs")?.extract::<Vec<i64>>()?;
        Ok(PacketBook {
            pk,
            vcmap,
            wires: Memo::new(),
            vcs: Memo::new(),
            per_destination,
            kept,
            bulk,
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
    /// whose kind, class and stream give VC `vc` (`VcMap.at`).
    pub(crate) fn at(&self, vc: i64, src: i64, dst: i64) -> i64 {
        let Some(half) = self.per_destination else {
            return vc;
        };
        if dst < 0 || src < 0 {
            return vc;
        }
        let peer = (dst - src - 1).rem_euclid(self.gpus);
        if vc >= half {
            half + peer % half
        } else if vc == self.kept.0 || vc == self.kept.1 || self.bulk.is_empty() {
            vc
        } else {
            self.bulk[(peer as usize) % self.bulk.len()]
        }
    }

    /// [`Self::vc`] of a packet from GPU `src` to GPU `dst`.
    pub(crate) fn vc_to(&mut self, py: Python<'_>, kind: i64, stream: i64, src: i64, dst: i64) -> PyResult<i64> {
        let vc = self.vc(py, kind, stream)?;
        Ok(self.at(vc, src, dst))
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.pk)?;
        visit.call(&self.vcmap)
    }
}
