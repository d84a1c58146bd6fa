//! The reduce warps of NCCL's staged NVLS AllReduce (`cais.kernels.nvls_staged`) for
//! one step of one channel on its head GPU: `multimem.ld_reduce` each piece of the
//! head's chunk, keeping at most a window of bytes in flight, and `multimem.st` each
//! sum into every GPU's broadcast buffer as it comes back.
//!
//! This is the loop the TB program would otherwise run in Python, one callback per
//! piece; which pieces, where the sums go and what follows the step stay the kernel's.

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::completion::{Assembly, Completion};
use crate::engine::unit::{Event, Handler, UnitRef};
use crate::engine::wait::Signal;
use crate::hw::gpu::{Carry, Endpoint, Op};
use crate::hw::kinds;
use crate::hw::sm_port::SmPort;

/// One piece of the head's chunk: the stripes its `multimem.ld_reduce` goes out as
/// (one train per transfer unit and chip), the region it reads (for functional mode's
/// data), where its sum goes (the broadcast buffer's region, and the stripes of its
/// `multimem.st`), and its bytes.
struct Piece {
    region: Py<PyAny>,
    loads: Py<PyList>,
    out: Py<PyAny>,
    stores: Py<PyList>,
    nbytes: i64,
    /// Its sum, once it is back (functional mode).
    data: Option<Py<PyAny>>,
}

/// The reduce warps of one step (see the module): the step's pieces go out as
/// `multimem.ld_reduce` in order while the bytes in flight admit them, a soft limit
/// (a piece is admitted whenever nothing is in flight, as `cais.kernels.common.Window`
/// does); when a piece's sum is back its bytes are given back first (the next pieces go
/// out), then the sum goes out as `multimem.st` through the SM's store port, then it
/// counts towards `reduced`, which fires when every piece's has gone out.
#[pyclass(module = "cais._core", frozen)]
pub struct ReduceStream {
    st: GilCell<ReduceStreamState>,
}

/// The mutable state of a [`ReduceStream`] (see there), borrowed while holding the GIL.
pub(crate) struct ReduceStreamState {
    gpu: Py<Endpoint>,
    port: Py<SmPort>,
    /// The kernel's stream (its VC), and the GPUs a `multimem.st` lands on.
    stream: i64,
    copies: i64,
    pieces: Vec<Piece>,
    limit: i64,
    /// Bytes in flight, and the next piece to issue.
    used: i64,
    next: usize,
    /// Pieces whose sum has not gone out yet.
    left: usize,
    /// Functional mode: `assemble(region, stripes, parts)` puts a piece's sum together
    /// from its trains' data, `split(data, region, stripes)` cuts it for the stores;
    /// None in timing mode.
    functional: Option<(Py<PyAny>, Py<PyAny>)>,
    /// Fired once every piece's sum has gone out (taken when it fires).
    reduced: Option<Py<Signal>>,
    started: bool,
}

unit!(ReduceStream, ReduceStreamState);

impl ReduceStream {
    /// Issue the pieces the window admits, in order.
    fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        loop {
            let mut me = slf.st();
            let index = me.next;
            let Some(piece) = me.pieces.get(index) else {
                return Ok(());
            };
            let nbytes = piece.nbytes;
            if me.used > 0 && me.used + nbytes > me.limit {
                return Ok(()); // a sum coming back resumes it
            }
            let loads = piece.loads.clone_ref(py);
            let region = piece.region.clone_ref(py);
            me.used += nbytes;
            me.next += 1;
            let (gpu, stream) = (me.gpu.clone_ref(py), me.stream);
            let assemble = me.functional.as_ref().map(|(a, _)| a.clone_ref(py));
            drop(me);
            let count = loads.bind(py).len() as i64;
            let piece = Py::new(
                py,
                ReducedPiece {
                    stream: slf.clone().unbind(),
                    index,
                },
            )?;
            let done = match assemble {
                None => Completion::of_stream_request(py, count, UnitRef::new(piece), nbytes)?,
                Some(assemble) => {
                    let assembly = Assembly {
                        region,
                        pieces: loads.clone_ref(py).into_any(),
                        assemble,
                    };
                    let placed = piece.clone_ref(py).into_any();
                    Completion::of_stream_item(py, count, placed, assembly, UnitRef::new(piece), nbytes, None)?
                }
            };
            let op = Op {
                kind: kinds::MC_LDRED_REQ,
                dst: -1,
                stream,
                tag: -1,
                expect: 0,
                quorum: 0,
            };
            Endpoint::issue_stripes(gpu.bind(py), &op, loads.bind(py), done.into_any(), Carry::loads())?;
        }
    }

    /// A piece's sum is back: its bytes are free for the next pieces.
    fn release(slf: &Bound<'_, Self>, nbytes: i64) -> PyResult<()> {
        slf.st().used -= nbytes;
        ReduceStream::advance(slf)
    }

    /// ... then it goes out to every GPU, and counts in.
    fn reduced(slf: &Bound<'_, Self>, index: usize) -> PyResult<()> {
        let py = slf.py();
        let (gpu, port, stream, stores, count, parts) = {
            let mut me = slf.st();
            let copies = me.copies;
            let split = me.functional.as_ref().map(|(_, s)| s.clone_ref(py));
            let piece = &mut me.pieces[index];
            let stores = piece.stores.clone_ref(py);
            let count = stores.bind(py).len() as i64 * copies;
            let parts = match (split, piece.data.take()) {
                (Some(split), Some(data)) => Some((split, data, piece.out.clone_ref(py))),
                _ => None,
            };
            (
                me.gpu.clone_ref(py),
                me.port.clone_ref(py),
                me.stream,
                stores,
                count,
                parts,
            )
        };
        let data = match parts {
            None => None,
            Some((split, data, out)) => {
                let cut = split.bind(py).call1((data, out, stores.bind(py)))?;
                (!cut.is_none()).then(|| cut.cast_into::<PyList>()).transpose()?
            }
        };
        let done = Completion::counter(py, count)?;
        let op = Op {
            kind: kinds::MC_STORE,
            dst: -1,
            stream,
            tag: -1,
            expect: 0,
            quorum: 0,
        };
        let carry = Carry {
            loads: false,
            port: Some(port.into_bound(py)),
            data,
            fences: None,
            encoding: 1.0,
        };
        Endpoint::issue_stripes(gpu.bind(py), &op, stores.bind(py), done.into_any(), carry)?;
        let fire = {
            let mut me = slf.st();
            me.left -= 1;
            if me.left == 0 {
                me.reduced.take()
            } else {
                None
            }
        };
        match fire {
            Some(sig) => {
                let now = gpu.get().st(py).now(py);
                Signal::fire_now(sig.bind(py), now, py.None())
            }
            None => Ok(()),
        }
    }
}

#[pymethods]
impl ReduceStream {
    /// `pieces`: `(region, loads, out, stores)` each, in issue order: the region a
    /// `multimem.ld_reduce` reads and its stripes (`Isa.stripes`), the region its sum
    /// is stored to and that store's stripes; `limit`: the bytes kept in flight (a soft
    /// limit); `port`: the SM's store path; `stream`: the kernel's stream; `copies`: the
    /// GPUs a `multimem.st` lands on. Functional mode: `assemble(region, stripes,
    /// parts)` and `split(data, region, stripes)` (`cais.isa`); None in timing mode.
    #[new]
    #[pyo3(signature = (gpu, pieces, limit, port, stream, copies, assemble = None, split = None))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        py: Python<'_>,
        gpu: Py<Endpoint>,
        pieces: &Bound<'_, PyList>,
        limit: i64,
        port: Py<SmPort>,
        stream: i64,
        copies: i64,
        assemble: Option<Py<PyAny>>,
        split: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces.iter() {
            let (region, loads, dst, stores): (
                Bound<'_, PyAny>,
                Bound<'_, PyList>,
                Bound<'_, PyAny>,
                Bound<'_, PyList>,
            ) = p.extract()?;
            let nbytes: i64 = region.getattr("nbytes")?.extract()?;
            out.push(Piece {
                region: region.unbind(),
                loads: loads.unbind(),
                out: dst.unbind(),
                stores: stores.unbind(),
                nbytes,
                data: None,
            });
        }
        let left = out.len();
        Ok(ReduceStream::from(ReduceStreamState {
            gpu,
            port,
            stream,
            copies,
            pieces: out,
            limit,
            used: 0,
            next: 0,
            left,
            functional: assemble.zip(split),
            reduced: Some(Py::new(py, Signal::blank(py))?),
            started: false,
        }))
    }

    /// Issue what the window admits now (the rest follows as sums come back); return
    /// the signal that fires once every piece's sum has gone out.
    fn start(slf: &Bound<'_, Self>) -> PyResult<Py<Signal>> {
        let py = slf.py();
        let reduced = {
            let mut me = slf.st();
            if me.started {
                return Err(pyo3::exceptions::PyRuntimeError::new_err("a reduce stream starts once"));
            }
            me.started = true;
            me.reduced.as_ref().expect("not started").clone_ref(py)
        };
        if slf.st().pieces.is_empty() {
            let now = slf.st().gpu.get().st(py).now(py);
            slf.st().reduced = None;
            Signal::fire_now(reduced.bind(py), now, py.None())?;
            return Ok(reduced);
        }
        ReduceStream::advance(slf)?;
        Ok(reduced)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        visit.call(&me.port)?;
        visit.call(&me.reduced)?;
        if let Some((assemble, split)) = &me.functional {
            visit.call(assemble)?;
            visit.call(split)?;
        }
        for p in &me.pieces {
            visit.call(&p.region)?;
            visit.call(&p.loads)?;
            visit.call(&p.out)?;
            visit.call(&p.stores)?;
            visit.call(&p.data)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.pieces.clear();
            me.functional = None;
            me.reduced = None;
        }
    }
}

properties!(ReduceStream {
    /// Pieces issued so far.
    next: usize;
    /// Bytes in flight.
    used: i64;
});

/// One piece of a [`ReduceStream`] in flight: its completion tells it when the sum is
/// back (its bytes, then, after the data is placed, the store) and, in functional mode,
/// hands it the sum.
#[pyclass(module = "cais._core", frozen)]
pub struct ReducedPiece {
    stream: Py<ReduceStream>,
    index: usize,
}

impl Handler for ReducedPiece {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        let me = slf.get();
        let stream = me.stream.bind(slf.py());
        match ev {
            Event::Acked(nbytes) => ReduceStream::release(stream, nbytes),
            Event::Landed => ReduceStream::reduced(stream, me.index),
            _ => Err(crate::engine::unit::unexpected("ReducedPiece")),
        }
    }
}

#[pymethods]
impl ReducedPiece {
    /// The piece's sum, put together (functional mode).
    fn __call__(&self, py: Python<'_>, data: Py<PyAny>) {
        self.stream.get().st(py).pieces[self.index].data = Some(data);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.stream)
    }
}
