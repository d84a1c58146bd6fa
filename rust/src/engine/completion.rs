//! What an ISA operation waits for: one completion for all the trains it was cut
//! into.
//!
//! An operation (`ld`, `ld.cais`, `red.cais`, a store) is cut into one train per
//! transfer unit and switch chip; each train carries the operation's [`Completion`]
//! as its `done`, and the core counts the trains in as they complete without
//! entering Python. The operation's own callback runs once, when the last is in: a
//! load's with the data reassembled from its pieces (functional mode) or None, any
//! other's with no argument.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{properties, unit, GilCell, Unit, UnitState};
use super::sim::{Clock, Simulator};
use super::train::{obj, opt_ref, Train};
use super::unit::{Event, UnitRef};
use super::wait::{Countdown, Process, Signal};

/// A completion counter over an operation's trains. `done` runs when `count` have
/// completed: as `done(data)` for a load (`assemble` given: the data of every piece,
/// by start element, put together by `assemble(region, pieces, parts)`, or None when
/// some piece carried none), else as `done()`.
#[pyclass(module = "cais._core", frozen, freelist = 4096)]
pub struct Completion {
    st: GilCell<CompletionState>,
}

/// The mutable state of a [`Completion`] (see there), borrowed while holding the GIL.
pub(crate) struct CompletionState {
    left: i64,
    done: Py<PyAny>,
    region: Py<PyAny>,
    pieces: Py<PyAny>,
    assemble: Py<PyAny>,
    /// A load's pieces that carried data, by start element.
    parts: Option<Py<PyDict>>,
    with_data: i64,
    /// The unit that issued this request (a stream), if one did, and the request's
    /// bytes: told when it is in (`Event::Acked`, then `Event::Landed` after the
    /// callback).
    stream: Option<(UnitRef, i64)>,
    /// A line of loads that joined this one (a GPU's kept lines), fired with the data
    /// once the issuing stream has it (after `Event::Landed`), at the clock's time.
    line: Option<(Py<Signal>, Clock)>,
}

unit!(Completion, CompletionState);

/// How a load's data is put back together: its `region`, the `pieces` its trains
/// carry, and the function that assembles them (`cais.isa._assemble`).
pub(crate) struct Assembly {
    pub region: Py<PyAny>,
    pub pieces: Py<PyAny>,
    pub assemble: Py<PyAny>,
}

impl Completion {
    /// One of the operation's trains has completed.
    pub(crate) fn arrive(slf: &Bound<'_, Self>, train: Option<&Bound<'_, Train>>) -> PyResult<()> {
        let py = slf.py();
        let (finished, gather) = {
            let mut me = slf.st();
            let gather = !me.assemble.is_none(py);
            if let (true, Some(train)) = (gather, train) {
                let data = opt_ref(&train.st().data, py);
                if let Some(data) = data {
                    let start: i64 = obj(&train.st().addr, py).bind(py).getattr("start")?.extract()?;
                    let parts = me.parts.get_or_insert_with(|| PyDict::new(py).unbind());
                    parts.bind(py).set_item(start, data)?;
                    me.with_data += 1;
                }
            }
            me.left -= 1;
            (me.left == 0, gather)
        };
        if !finished {
            return Ok(());
        }
        let stream = slf.st().stream.as_ref().map(|(s, n)| (s.clone_ref(py), *n));
        match stream {
            None => Completion::call_done(slf, gather, false).map(|_| ()),
            Some((stream, nbytes)) => {
                // as a TB's mainloop does: room back first, then the data, then the count
                stream.on_event(py, Event::Acked(nbytes))?;
                let line = slf.st().line.take();
                let data = Completion::call_done(slf, gather, line.is_some())?;
                stream.on_event(py, Event::Landed)?;
                match line {
                    // then the loads that joined it have the data
                    Some((line, clock)) => Signal::fire_now(line.bind(py), clock.now(), data),
                    None => Ok(()),
                }
            }
        }
    }

    /// A load of `nbytes` that `stream` issued as `count` trains, its data put
    /// together as `assembly` says; `placed` (or None) gets the data, and then `line`
    /// (the loads that joined it), if any, fires with it.
    pub(crate) fn of_stream_item(
        py: Python<'_>,
        count: i64,
        placed: Py<PyAny>,
        assembly: Assembly,
        stream: UnitRef,
        nbytes: i64,
        line: Option<(Py<Signal>, Clock)>,
    ) -> PyResult<Py<Completion>> {
        let Assembly {
            region,
            pieces,
            assemble,
        } = assembly;
        let c = Completion::new(py, count, Some(placed), Some(region), Some(pieces), Some(assemble));
        {
            let mut st = c.st(py);
            st.stream = Some((stream, nbytes));
            st.line = line;
        }
        Py::new(py, c)
    }

    /// A request of `nbytes` that `stream` issued as `count` trains, with no callback
    /// of its own.
    pub(crate) fn of_stream_request(
        py: Python<'_>,
        count: i64,
        stream: UnitRef,
        nbytes: i64,
    ) -> PyResult<Py<Completion>> {
        let c = Completion::new(py, count, None, None, None, None);
        c.st(py).stream = Some((stream, nbytes));
        Py::new(py, c)
    }

    /// A counter over `count` trains with no callback of its own (a multicast store
    /// whose copies nobody waits for).
    pub(crate) fn counter(py: Python<'_>, count: i64) -> PyResult<Py<Completion>> {
        Py::new(py, Completion::new(py, count, None, None, None, None))
    }

    /// The operation's callback, with its data put together for a load (also when
    /// there is no callback but the data is wanted: `keep`); the data it had.
    fn call_done(slf: &Bound<'_, Self>, gather: bool, keep: bool) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let me = slf.st();
        let done = me.done.clone_ref(py);
        if done.is_none(py) && !keep {
            return Ok(py.None());
        }
        if !gather {
            drop(me);
            if !done.is_none(py) {
                done.call0(py)?;
            }
            return Ok(py.None());
        }
        let count = me.pieces.bind(py).len()? as i64;
        let data = match &me.parts {
            Some(parts) if me.with_data == count && parts.bind(py).len() as i64 == count => {
                let (region, pieces, assemble, parts) = (
                    me.region.clone_ref(py),
                    me.pieces.clone_ref(py),
                    me.assemble.clone_ref(py),
                    parts.clone_ref(py),
                );
                drop(me);
                assemble.call1(py, (region, pieces, parts))?
            }
            _ => {
                drop(me);
                py.None()
            }
        };
        if !done.is_none(py) {
            done.call1(py, (data.clone_ref(py),))?;
        }
        Ok(data)
    }
}

/// The issuer's completion of `train` at `now`, if it has one: counted in natively
/// when it is a [`Completion`], fired (with None) when it is a [`Signal`] a TB program
/// waits on, resumed (with None) when it is the [`Process`] of a TB that waits for the
/// train itself, else called as `train.done(train)`.
pub(crate) fn complete(train: &Bound<'_, Train>, now: i64) -> PyResult<()> {
    let py = train.py();
    let Some(done) = opt_ref(&train.st().done, py) else {
        return Ok(());
    };
    let done = done.into_bound(py);
    if let Ok(c) = done.cast::<Completion>() {
        return Completion::arrive(c, Some(train));
    }
    if let Ok(sig) = done.cast::<Signal>() {
        return Signal::fire_now(sig, now, py.None());
    }
    if let Ok(process) = done.cast::<Process>() {
        return Process::step(process, py.None()); // a TB waiting for this train itself
    }
    if let Ok(each) = done.cast::<ArrivePerGpu>() {
        return ArrivePerGpu::arrive(each, train);
    }
    done.call1((train,)).map(|_| ())
}

/// A multicast flag's completion (`cais.isa.Isa.flag_multicast_counts`): each copy
/// that lands on GPU `g` arrives once on `counts[g]`, counted in the core without
/// entering Python (a Python callback would run once per copy).
#[pyclass(module = "cais._core", frozen)]
pub struct ArrivePerGpu {
    st: GilCell<ArrivePerGpuState>,
}

/// The state of an [`ArrivePerGpu`] (see there), borrowed while holding the GIL.
pub(crate) struct ArrivePerGpuState {
    sim: Option<Py<Simulator>>,
    counts: Vec<Py<Countdown>>,
}

unit!(ArrivePerGpu, ArrivePerGpuState);

impl ArrivePerGpu {
    /// A copy has landed on GPU `train.dst`.
    pub(crate) fn arrive(slf: &Bound<'_, Self>, train: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let dst = train.st().dst;
        let (sim, count) = {
            let me = slf.st();
            let count = usize::try_from(dst)
                .ok()
                .and_then(|g| me.counts.get(g))
                .ok_or_else(|| {
                    pyo3::exceptions::PyIndexError::new_err(format!(
                        "a flag landed on GPU {dst}, with {} countdowns",
                        me.counts.len()
                    ))
                })?;
            let sim = me
                .sim
                .as_ref()
                .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("ArrivePerGpu was cleared"))?;
            (sim.clone_ref(py), count.clone_ref(py))
        };
        Countdown::arrive(count.bind(py), sim.bind(py), 1)
    }
}

#[pymethods]
impl ArrivePerGpu {
    #[new]
    fn new(sim: Py<Simulator>, counts: Vec<Py<Countdown>>) -> Self {
        ArrivePerGpu::from(ArrivePerGpuState { sim: Some(sim), counts })
    }

    /// A copy has landed (as the core calls it): `counts[train.dst].arrive(sim)`.
    fn __call__(slf: &Bound<'_, Self>, train: Bound<'_, Train>) -> PyResult<()> {
        ArrivePerGpu::arrive(slf, &train)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        for c in &me.counts {
            visit.call(c)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.sim = None;
            me.counts.clear();
        }
    }
}

#[pymethods]
impl Completion {
    #[new]
    #[pyo3(signature = (count, done = None, region = None, pieces = None, assemble = None))]
    fn new(
        py: Python<'_>,
        count: i64,
        done: Option<Py<PyAny>>,
        region: Option<Py<PyAny>>,
        pieces: Option<Py<PyAny>>,
        assemble: Option<Py<PyAny>>,
    ) -> Self {
        let none = || py.None();
        Completion::from(CompletionState {
            left: count,
            done: done.unwrap_or_else(none),
            region: region.unwrap_or_else(none),
            pieces: pieces.unwrap_or_else(none),
            assemble: assemble.unwrap_or_else(none),
            parts: None,
            with_data: 0,
            stream: None,
            line: None,
        })
    }

    /// A train of the operation has completed (as the core calls it; anything but a
    /// train counts as one that carried no data).
    fn __call__(slf: &Bound<'_, Self>, train: Bound<'_, PyAny>) -> PyResult<()> {
        Completion::arrive(slf, train.cast::<Train>().ok())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.done)?;
        visit.call(&me.region)?;
        visit.call(&me.pieces)?;
        visit.call(&me.assemble)?;
        visit.call(&me.parts)?;
        if let Some((s, _)) = &me.stream {
            s.visit(&visit)?;
        }
        if let Some((line, _)) = &me.line {
            visit.call(line)?;
        }
        Ok(())
    }

    fn __clear__(&self, py: Python<'_>) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.done = py.None();
            me.region = py.None();
            me.pieces = py.None();
            me.assemble = py.None();
            me.parts = None;
            me.stream = None;
            me.line = None;
        }
    }
}

properties!(Completion {
    left: i64;
});
