//! A TB mainloop's remote loads, issued by the core in the order the TB planned them.

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::cell::{unit, GilCell, Unit, UnitState};
use crate::completion::Completion;
use crate::gpu::Endpoint;
use crate::region::region_bytes;
use crate::wait::{ByteBound, Countdown, Signal};

/// One planned load: its home GPU, its region and that region's stripes (one train
/// per transfer unit and chip), and what to call with its data (functional mode).
struct Item {
    home: i64,
    region: Py<PyAny>,
    stripes: Py<PyList>,
    placed: Py<PyAny>,
    nbytes: i64,
}

/// The remote loads of one TB's mainloop, issued in order as the TB issues them:
/// each takes room for its bytes in the SM's request window and then in its GPU's
/// bound on outstanding remote requests (at most each bound's limit: a load larger
/// than a bound takes all of it), waiting first come, first served while either is
/// full; then it goes out (`ld`, or `ld.cais` with `quorum`). When its data is in,
/// it gives its room back, hands the data to `placed` (functional mode) and counts
/// into `arrived`, which the TB waits on.
///
/// This is the loop a TB program would otherwise run in Python, one resumption per
/// load; the TB's plan (which loads, in which order, from whom) stays the kernel's.
#[pyclass(module = "cais._core", frozen)]
pub struct LoadStream {
    st: GilCell<LoadStreamState>,
}

/// The mutable state of a [`LoadStream`] (see there), borrowed while holding the GIL.
pub(crate) struct LoadStreamState {
    gpu: Py<Endpoint>,
    kind: i64,
    quorum: i64,
    items: Vec<Item>,
    /// The next load to issue, and how many of its two grants it holds.
    next: usize,
    held: usize,
    /// The SM's window, then the GPU's bound.
    bounds: [Py<ByteBound>; 2],
    arrived: Py<Countdown>,
    assemble: Py<PyAny>,
    /// Loads issued so far.
    issued: usize,
}

unit!(LoadStream, LoadStreamState);

impl LoadStream {
    /// Issue what the bounds admit, in order; stop at the first load that must wait
    /// (its grant resumes the stream).
    fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        loop {
            let me = slf.st();
            if me.next >= me.items.len() {
                return Ok(());
            }
            if me.held < 2 {
                let bound = me.bounds[me.held].clone_ref(py);
                let want = me.items[me.next].nbytes;
                drop(me);
                let granted = {
                    let mut b = bound.get().st(py);
                    let n = want.min(b.limit);
                    b.acquire(py, n)?
                };
                match granted {
                    None => slf.st().held += 1,
                    Some(sig) => {
                        Signal::wait_stream(sig.bind(py), slf.clone().unbind());
                        return Ok(());
                    }
                }
                continue;
            }
            let index = me.next;
            let item = &me.items[index];
            let (gpu, kind, home, quorum) = (me.gpu.clone_ref(py), me.kind, item.home, me.quorum);
            let stripes = item.stripes.clone_ref(py);
            let done = Completion::of_stream_item(
                py,
                stripes.bind(py).len() as i64,
                item.placed.clone_ref(py),
                item.region.clone_ref(py),
                stripes.clone_ref(py).into_any(),
                me.assemble.clone_ref(py),
                slf.clone().unbind(),
            )?;
            drop(me);
            {
                let mut me = slf.st();
                me.next += 1;
                me.held = 0;
                me.issued += 1;
            }
            Endpoint::issue_loads(gpu.bind(py), kind, home, stripes.bind(py), done.into_any(), quorum)?;
        }
    }

    /// A bound granted the waiting load its room: on to the next grant, or out.
    pub(crate) fn granted(slf: &Bound<'_, Self>) -> PyResult<()> {
        slf.st().held += 1;
        LoadStream::advance(slf)
    }

    /// A load's data is in: give its room back to both bounds, first-come waiters
    /// first (the SM's window, then the GPU's bound).
    pub(crate) fn release(slf: &Bound<'_, Self>, nbytes: i64) -> PyResult<()> {
        let py = slf.py();
        let bounds = {
            let me = slf.st();
            [me.bounds[0].clone_ref(py), me.bounds[1].clone_ref(py)]
        };
        for bound in bounds {
            let n = nbytes.min(bound.get().st(py).limit);
            ByteBound::release(bound.bind(py), n)?;
        }
        Ok(())
    }

    /// ... and count it into what the TB waits on.
    pub(crate) fn landed(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (arrived, window) = {
            let me = slf.st();
            (me.arrived.clone_ref(py), me.bounds[0].clone_ref(py))
        };
        let sim = window.get().st(py).sim.clone_ref(py);
        Countdown::arrive(arrived.bind(py), sim.bind(py), 1)
    }
}

#[pymethods]
impl LoadStream {
    /// `loads`: (home, region, stripes, placed) each, in issue order (`placed`: a
    /// callable taking the load's data, or None); `window`, `bound`: the SM's and the
    /// GPU's bounds; `arrived`: counts the loads in; `assemble(region, stripes,
    /// parts)`: puts a load's data together from its stripes' (functional mode).
    #[new]
    #[pyo3(signature = (gpu, kind, loads, window, bound, arrived, assemble, quorum = 0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        gpu: Py<Endpoint>,
        kind: i64,
        loads: &Bound<'_, PyList>,
        window: Py<ByteBound>,
        bound: Py<ByteBound>,
        arrived: Py<Countdown>,
        assemble: Py<PyAny>,
        quorum: i64,
    ) -> PyResult<Self> {
        let mut items = Vec::with_capacity(loads.len());
        for load in loads.iter() {
            let (home, region, stripes, placed): (i64, Bound<'_, PyAny>, Bound<'_, PyList>, Bound<'_, PyAny>) =
                load.extract()?;
            items.push(Item {
                home,
                nbytes: region_bytes(&region)?,
                region: region.unbind(),
                stripes: stripes.unbind(),
                placed: placed.unbind(),
            });
        }
        Ok(LoadStream::from(LoadStreamState {
            gpu,
            kind,
            quorum,
            items,
            next: 0,
            held: 0,
            bounds: [window, bound],
            arrived,
            assemble,
            issued: 0,
        }))
    }

    /// Issue the loads the bounds admit now; the rest follow as room frees.
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        LoadStream::advance(slf)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        for b in &me.bounds {
            visit.call(b)?;
        }
        visit.call(&me.arrived)?;
        visit.call(&me.assemble)?;
        for item in &me.items {
            visit.call(&item.region)?;
            visit.call(&item.stripes)?;
            visit.call(&item.placed)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.items.clear();
        }
    }

    #[getter]
    fn issued(&self, py: Python<'_>) -> usize {
        self.st(py).issued
    }
}
