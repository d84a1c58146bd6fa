//! TB programs and what they wait on: a [`Process`] runs a program (a Python
//! generator), which yields a one-shot [`Signal`], a [`Countdown`] of arrivals, or a
//! delay; a [`ByteBound`] (exported as `Bound`) bounds bytes in flight, granted in
//! request order.
//!
//! These run once per request a TB makes, so they are compiled; the programs stay
//! Python. Waiters run in the order they were registered, at the moment the signal
//! fires: a waiting process is resumed natively, any other waiter is a Python
//! callable.

use std::collections::VecDeque;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{properties, unit, GilCell, Unit, UnitState};
use super::sim::{Action, Simulator};
use super::unit::{Event, Paced, UnitRef};

/// Whom a signal wakes: a process waiting on it, a Python callable `fn(value)`, or
/// a unit (a stream whose next request waits for this grant), told `Event::Fired`.
enum Waiter {
    Resume(Py<Process>),
    Call(Py<PyAny>),
    Unit(UnitRef),
}

impl Waiter {
    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Waiter::Resume(p) => visit.call(p),
            Waiter::Call(f) => visit.call(f),
            Waiter::Unit(u) => u.visit(visit),
        }
    }
}

/// A one-shot event: programs and callbacks wait on it until it fires once, with a
/// value (`value`) at a time (`time`).
#[pyclass(module = "cais._core", subclass, frozen)]
pub struct Signal {
    st: GilCell<SignalState>,
}

/// The mutable state of a [`Signal`] (see there), borrowed while holding the GIL.
pub(crate) struct SignalState {
    fired: bool,
    value: Py<PyAny>,
    time: Option<i64>,
    waiters: Vec<Waiter>,
}

unit!(Signal, SignalState);

impl Signal {
    pub(crate) fn blank(py: Python<'_>) -> Signal {
        Signal::from(SignalState {
            fired: false,
            value: py.None(),
            time: None,
            waiters: Vec::new(),
        })
    }

    /// Fire: every waiter runs with the value, in the order they came.
    pub(crate) fn fire_now(slf: &Bound<'_, Self>, now: i64, value: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let waiters = {
            let mut me = slf.st();
            if me.fired {
                return Err(PyRuntimeError::new_err("signal fired twice"));
            }
            me.fired = true;
            me.value = value.clone_ref(py);
            me.time = Some(now);
            std::mem::take(&mut me.waiters)
        };
        for w in waiters {
            match w {
                Waiter::Resume(p) => Process::step(p.bind(py), value.clone_ref(py))?,
                Waiter::Call(f) => {
                    f.call1(py, (value.clone_ref(py),))?;
                }
                Waiter::Unit(u) => u.on_event(py, Event::Fired)?,
            }
        }
        Ok(())
    }
}

impl Signal {
    /// Tell `unit` when the signal fires (it has not).
    pub(crate) fn wait_unit(slf: &Bound<'_, Self>, unit: UnitRef) {
        slf.st().waiters.push(Waiter::Unit(unit));
    }
}

#[pymethods]
impl Signal {
    #[new]
    fn new(py: Python<'_>) -> Self {
        Signal::blank(py)
    }

    /// Run `fn(value)` when the signal fires (now, if it has).
    pub(crate) fn on_fire(slf: &Bound<'_, Self>, r#fn: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let value = {
            let mut me = slf.st();
            if !me.fired {
                me.waiters.push(Waiter::Call(r#fn));
                return Ok(());
            }
            me.value.clone_ref(py)
        };
        r#fn.call1(py, (value,))?;
        Ok(())
    }

    /// Fire at `sim`'s present time with `value`.
    #[pyo3(signature = (sim, value = None))]
    fn fire(slf: &Bound<'_, Self>, sim: &Bound<'_, Simulator>, value: Option<Py<PyAny>>) -> PyResult<()> {
        let now = sim.get().now();
        Signal::fire_now(slf, now, value.unwrap_or_else(|| slf.py().None()))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.value)?;
        for w in me.waiters.iter() {
            w.visit(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&self, py: Python<'_>) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.value = py.None();
            me.waiters.clear();
        }
    }
}

properties!(Signal {
    fired: bool;
    value: Py<PyAny>;
    time: Option<i64>;
});

/// A signal that fires when `count` arrivals have been reported (a completion
/// counter, like a TB-done counter or an NVLS reduction's response counter).
#[pyclass(module = "cais._core", extends = Signal, subclass, frozen)]
pub struct Countdown {
    st: GilCell<CountdownState>,
}

/// The mutable state of a [`Countdown`] (see there), borrowed while holding the GIL.
pub(crate) struct CountdownState {
    remaining: i64,
}

unit!(Countdown, CountdownState);

#[pymethods]
impl Countdown {
    #[new]
    fn new(py: Python<'_>, count: i64) -> (Self, Signal) {
        (Countdown::from(CountdownState { remaining: count }), Signal::blank(py))
    }

    /// `n` more arrivals; fire at the last (calling the object's own `fire`).
    #[pyo3(signature = (sim, n = 1))]
    pub(crate) fn arrive(slf: &Bound<'_, Self>, sim: &Bound<'_, Simulator>, n: i64) -> PyResult<()> {
        let left = {
            let mut me = slf.st();
            me.remaining -= n;
            me.remaining
        };
        if left < 0 {
            return Err(PyRuntimeError::new_err("countdown went below zero"));
        }
        if left == 0 {
            if slf.get_type().is(slf.py().get_type::<Countdown>()) {
                let now = sim.get().now(); // released before the waiters run
                Signal::fire_now(slf.as_super(), now, slf.py().None())?;
            } else {
                slf.call_method1("fire", (sim,))?; // a subclass may refine it
            }
        }
        Ok(())
    }
}

properties!(Countdown {
    remaining: i64;
});

/// At most `limit` bytes outstanding; `acquire` grants in FIFO order. Real memory
/// systems bound what an issuer keeps outstanding by a fixed number of tracking
/// entries (MSHRs, request tables): a request that finds them full waits, and
/// waiting requests are served first come, first served. This is that, in bytes:
/// nothing is ever admitted past the limit, not even a first request, so a caller
/// must cut its requests to at most `limit` bytes each. (`cais.kernels.common.Window`,
/// the Python kernels' per-TB window, is the other byte bound, and differs on purpose:
/// a soft limit that admits any request when nothing is in flight, one owner and no
/// queue; its docstring says why it stays apart.)
#[pyclass(module = "cais._core", name = "Bound", frozen)]
pub struct ByteBound {
    st: GilCell<ByteBoundState>,
}

/// The mutable state of a [`ByteBound`] (see there), borrowed while holding the GIL.
pub(crate) struct ByteBoundState {
    pub(crate) sim: Py<Simulator>,
    pub(crate) limit: i64,
    used: i64,
    peak: i64,
    /// Requests that had to queue.
    waited: i64,
    queue: VecDeque<(i64, Py<Signal>)>,
}

unit!(ByteBound, ByteBoundState);

impl ByteBoundState {
    /// Take `nbytes`: None when granted now, else a signal that fires once they are
    /// granted (and taken). Requests larger than the limit are a caller's bug.
    pub(crate) fn acquire(&mut self, py: Python<'_>, nbytes: i64) -> PyResult<Option<Py<Signal>>> {
        if nbytes > self.limit {
            return Err(PyValueError::new_err(format!(
                "a request of {nbytes} B exceeds its bound of {} B: cut it first",
                self.limit
            )));
        }
        if self.queue.is_empty() && self.used + nbytes <= self.limit {
            self.take(nbytes);
            return Ok(None);
        }
        self.waited += 1;
        let sig = Py::new(py, Signal::blank(py))?;
        self.queue.push_back((nbytes, sig.clone_ref(py)));
        Ok(Some(sig))
    }

    fn take(&mut self, nbytes: i64) {
        self.used += nbytes;
        self.peak = self.peak.max(self.used);
    }
}

#[pymethods]
impl ByteBound {
    #[new]
    fn new(sim: Py<Simulator>, limit: i64) -> PyResult<Self> {
        if limit <= 0 {
            return Err(PyValueError::new_err(format!(
                "bound limit must be positive, got {limit}"
            )));
        }
        Ok(ByteBound::from(ByteBoundState {
            sim,
            limit,
            used: 0,
            peak: 0,
            waited: 0,
            queue: VecDeque::new(),
        }))
    }

    /// Take `nbytes`: None when granted now, else a signal that fires once they are
    /// granted (and taken). Requests larger than the limit are a caller's bug.
    pub(crate) fn acquire(&self, py: Python<'_>, nbytes: i64) -> PyResult<Option<Py<Signal>>> {
        self.st(py).acquire(py, nbytes)
    }

    /// Give `nbytes` back; grant the waiting requests that now fit, in order.
    pub(crate) fn release(slf: &Bound<'_, Self>, nbytes: i64) -> PyResult<()> {
        let py = slf.py();
        {
            let mut me = slf.st();
            me.used -= nbytes;
            if me.used < 0 {
                return Err(PyRuntimeError::new_err("bound released more than was taken"));
            }
        }
        loop {
            let (sig, now) = {
                let mut me = slf.st();
                match me.queue.front() {
                    Some(&(n, _)) if me.used + n <= me.limit => {
                        let (n, sig) = me.queue.pop_front().expect("a waiting request");
                        me.take(n);
                        let now = me.sim.get().now();
                        (sig, now)
                    }
                    _ => return Ok(()),
                }
            };
            Signal::fire_now(sig.bind(py), now, py.None())?;
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        for (_, s) in me.queue.iter() {
            visit.call(s)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.queue.clear();
        }
    }
}

properties!(ByteBound {
    sim: Py<Simulator>;
    limit: i64;
    used: i64;
    peak: i64;
    waited: i64;
});

/// Runs a generator as a simulated program (a thread block's control flow). The
/// generator yields an `int` (sleep that many picoseconds) or a [`Signal`] (wait until
/// it fires; the signal's value is sent back into the generator). `done` fires when
/// the generator returns.
#[pyclass(module = "cais._core", frozen)]
pub struct Process {
    st: GilCell<ProcessState>,
}

/// The mutable state of a [`Process`] (see there), borrowed while holding the GIL.
pub(crate) struct ProcessState {
    sim: Py<Simulator>,
    gen: Py<PyAny>,
    done: Py<Signal>,
    /// The unit that times the values of its own the program yields (`Handler::pace`):
    /// the GPU's HBM share, which times kernel phases (None: it yields none).
    hbm: Option<UnitRef>,
    /// Factor on the compute delays the program yields (a straggler GPU; 1: none).
    slowdown: f64,
    /// Waiting for the HBM share to time a phase: whether the program times it itself.
    phase: Option<bool>,
}

unit!(Process, ProcessState);

/// What a program's `send` gave back.
enum Sent<'py> {
    Yielded(Bound<'py, PyAny>),
    Returned,
}

/// `gen.send(value)`, without raising StopIteration when the program ends.
fn send<'py>(gen: &Bound<'py, PyAny>, value: Py<PyAny>) -> PyResult<Sent<'py>> {
    let py = gen.py();
    let mut result: *mut pyo3::ffi::PyObject = std::ptr::null_mut();
    // SAFETY: `gen` and `value` are live objects and the GIL is held; PyIter_Send
    // borrows `value` and hands back a new reference (or NULL with an error set).
    let status = unsafe { pyo3::ffi::PyIter_Send(gen.as_ptr(), value.as_ptr(), &mut result) };
    match status {
        pyo3::ffi::PySendResult::PYGEN_NEXT => {
            // SAFETY: a new reference on PYGEN_NEXT.
            Ok(Sent::Yielded(unsafe { Bound::from_owned_ptr(py, result) }))
        }
        pyo3::ffi::PySendResult::PYGEN_RETURN => {
            // SAFETY: the return value is a new reference; dropped at once.
            drop(unsafe { Bound::from_owned_ptr(py, result) });
            Ok(Sent::Returned)
        }
        _ => Err(PyErr::fetch(py)),
    }
}

/// A compute delay a program yielded, stretched by its GPU's slowdown.
pub(crate) fn slowed(slowdown: f64, delay: i64) -> i64 {
    if slowdown == 1.0 {
        delay
    } else {
        (delay as f64 * slowdown).round_ties_even() as i64
    }
}

impl Process {
    /// Run the program `gen` (from now, if `start`), its HBM phases paced by `hbm`
    /// and its compute delays stretched by `slowdown`.
    pub(crate) fn spawn(
        py: Python<'_>,
        sim: &Py<Simulator>,
        gen: Py<PyAny>,
        start: bool,
        hbm: Option<UnitRef>,
        slowdown: f64,
    ) -> PyResult<Py<Process>> {
        let done = Py::new(py, Signal::blank(py))?;
        let p = Py::new(
            py,
            Process::from(ProcessState {
                sim: sim.clone_ref(py),
                gen,
                done,
                hbm,
                slowdown,
                phase: None,
            }),
        )?;
        if start {
            let s = sim.get();
            let now = s.now();
            s.schedule(py, now, Action::Step(p.clone_ref(py)))?;
        }
        Ok(p)
    }

    /// The signal that fires when the program returns.
    pub(crate) fn done_signal(&self, py: Python<'_>) -> Py<Signal> {
        self.st(py).done.clone_ref(py)
    }

    /// Resume the program after `delay` (its own units: stretched here).
    fn sleep(slf: &Bound<'_, Self>, sim: &Py<Simulator>, slowdown: f64, delay: i64) -> PyResult<()> {
        let py = slf.py();
        let s = sim.get();
        let time = s.now() + slowed(slowdown, delay);
        s.schedule(py, time, Action::Step(slf.clone().unbind()))
    }

    /// Send `value` into the program and follow it to its next wait.
    pub(crate) fn step(slf: &Bound<'_, Self>, value: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let (gen, sim, done, hbm, slowdown, phase) = {
            let mut me = slf.st();
            (
                me.gen.clone_ref(py),
                me.sim.clone_ref(py),
                me.done.clone_ref(py),
                me.hbm.as_ref().map(|h| h.clone_ref(py)),
                me.slowdown,
                me.phase.take(),
            )
        };
        let gen = gen.into_bound(py);
        let mut value = value;
        if let Some(overlapped) = phase {
            // the HBM share has timed the phase (at its real duration): in the program's units
            let took: i64 = value.extract(py)?;
            let took = if slowdown == 1.0 {
                took
            } else {
                (took as f64 / slowdown).round_ties_even() as i64
            };
            if !overlapped {
                return Process::sleep(slf, &sim, slowdown, took);
            }
            value = took.into_pyobject(py)?.into_any().unbind(); // the program times it: hand it the time
        }
        loop {
            let waited = match send(&gen, value)? {
                Sent::Yielded(w) => w,
                Sent::Returned => {
                    let now = sim.get().now();
                    return Signal::fire_now(done.bind(py), now, py.None());
                }
            };
            if let Ok(sig) = waited.cast::<Signal>() {
                let mut s = sig.st();
                if s.fired {
                    value = s.value.clone_ref(py);
                    continue;
                }
                s.waiters.push(Waiter::Resume(slf.clone().unbind()));
                return Ok(());
            }
            if waited.is_instance_of::<PyInt>() {
                let delay: i64 = waited.extract()?;
                return Process::sleep(slf, &sim, slowdown, delay);
            }
            if let Some(h) = hbm.as_ref() {
                match h.pace(sim.bind(py), &waited, slowdown)? {
                    Paced::NotMine => {}
                    Paced::Wait(timed, overlapped) => {
                        // timed at its real duration, known at the end of this instant
                        slf.st().phase = Some(overlapped);
                        timed.get().st(py).waiters.push(Waiter::Resume(slf.clone().unbind()));
                        return Ok(());
                    }
                    Paced::Sleep(ps) => return Process::sleep(slf, &sim, slowdown, ps),
                    Paced::Value(ps) => {
                        value = ps.into_pyobject(py)?.into_any().unbind();
                        continue;
                    }
                }
            }
            let allowed = if hbm.is_some() {
                "an int delay, a Signal or an HbmPhase"
            } else {
                "an int delay or a Signal (an HbmPhase only in a kernel with hbm_phases)"
            };
            return Err(PyTypeError::new_err(format!(
                "a program may yield {allowed}, not {}",
                waited.get_type().name()?
            )));
        }
    }
}

#[pymethods]
impl Process {
    #[new]
    #[pyo3(signature = (sim, gen, start = true, hbm = None, slowdown = 1.0))]
    fn new(
        py: Python<'_>,
        sim: Py<Simulator>,
        gen: Py<PyAny>,
        start: bool,
        hbm: Option<Bound<'_, PyAny>>,
        slowdown: f64,
    ) -> PyResult<Py<Process>> {
        let hbm = match hbm {
            Some(h) => Some(UnitRef::expect(&h, "a pacer (an HbmShare)")?),
            None => None,
        };
        Process::spawn(py, &sim, gen, start, hbm, slowdown)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        visit.call(&me.gen)?;
        visit.call(&me.done)?;
        if let Some(h) = &me.hbm {
            h.visit(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&self, py: Python<'_>) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.gen = py.None();
        }
    }
}

properties!(Process {
    sim: Py<Simulator>;
    done: Py<Signal>;
});
