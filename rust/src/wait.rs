//! What TB programs wait on: a one-shot [`Signal`], a [`Countdown`] of arrivals, and
//! a [`ByteBound`] on bytes in flight granted in request order (exported as `Bound`).
//!
//! A TB program (a Python generator run by `cais.engine.Process`) yields a signal
//! and is resumed by the callback it registers; these run once per request a TB
//! makes, so they are compiled. Callbacks stay Python callables, called in the order
//! they were registered, at the moment the signal fires.

use std::collections::VecDeque;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::sim::Simulator;

/// A one-shot event: programs and callbacks wait on it until it fires once, with a
/// value (`value`) at a time (`time`).
#[pyclass(module = "cais._core", subclass)]
pub struct Signal {
    #[pyo3(get)]
    fired: bool,
    #[pyo3(get)]
    value: Py<PyAny>,
    #[pyo3(get)]
    time: Option<i64>,
    waiters: Vec<Py<PyAny>>,
}

impl Signal {
    fn blank(py: Python<'_>) -> Signal {
        Signal {
            fired: false,
            value: py.None(),
            time: None,
            waiters: Vec::new(),
        }
    }

    /// Fire: every waiter runs with the value, in the order they came.
    pub(crate) fn fire_now(slf: &Bound<'_, Self>, now: i64, value: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let waiters = {
            let mut me = slf.borrow_mut();
            if me.fired {
                return Err(PyRuntimeError::new_err("signal fired twice"));
            }
            me.fired = true;
            me.value = value.clone_ref(py);
            me.time = Some(now);
            std::mem::take(&mut me.waiters)
        };
        for f in waiters {
            f.call1(py, (value.clone_ref(py),))?;
        }
        Ok(())
    }
}

#[pymethods]
impl Signal {
    #[new]
    fn new(py: Python<'_>) -> Self {
        Signal::blank(py)
    }

    /// Run `fn(value)` when the signal fires (now, if it has).
    fn on_fire(slf: &Bound<'_, Self>, r#fn: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let value = {
            let mut me = slf.borrow_mut();
            if !me.fired {
                me.waiters.push(r#fn);
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
        let now = sim.borrow().now;
        Signal::fire_now(slf, now, value.unwrap_or_else(|| slf.py().None()))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.value)?;
        for w in self.waiters.iter() {
            visit.call(w)?;
        }
        Ok(())
    }

    fn __clear__(&mut self, py: Python<'_>) {
        self.value = py.None();
        self.waiters.clear();
    }
}

/// A signal that fires when `count` arrivals have been reported (a completion
/// counter, like a TB-done counter or an NVLS reduction's response counter).
#[pyclass(module = "cais._core", extends = Signal, subclass)]
pub struct Countdown {
    #[pyo3(get)]
    remaining: i64,
}

#[pymethods]
impl Countdown {
    #[new]
    fn new(py: Python<'_>, count: i64) -> (Self, Signal) {
        (Countdown { remaining: count }, Signal::blank(py))
    }

    /// `n` more arrivals; fire at the last (calling the object's own `fire`).
    #[pyo3(signature = (sim, n = 1))]
    fn arrive(slf: &Bound<'_, Self>, sim: &Bound<'_, Simulator>, n: i64) -> PyResult<()> {
        let left = {
            let mut me = slf.borrow_mut();
            me.remaining -= n;
            me.remaining
        };
        if left < 0 {
            return Err(PyRuntimeError::new_err("countdown went below zero"));
        }
        if left == 0 {
            if slf.get_type().is(slf.py().get_type::<Countdown>()) {
                let now = sim.borrow().now; // released before the waiters run
                Signal::fire_now(slf.as_super(), now, slf.py().None())?;
            } else {
                slf.call_method1("fire", (sim,))?; // a subclass may refine it
            }
        }
        Ok(())
    }
}

/// At most `limit` bytes outstanding; `acquire` grants in FIFO order. Real memory
/// systems bound what an issuer keeps outstanding by a fixed number of tracking
/// entries (MSHRs, request tables): a request that finds them full waits, and
/// waiting requests are served first come, first served. This is that, in bytes:
/// nothing is ever admitted past the limit, not even a first request, so a caller
/// must cut its requests to at most `limit` bytes each.
#[pyclass(module = "cais._core", name = "Bound")]
pub struct ByteBound {
    #[pyo3(get)]
    sim: Py<Simulator>,
    #[pyo3(get)]
    limit: i64,
    #[pyo3(get)]
    used: i64,
    #[pyo3(get)]
    peak: i64,
    /// Requests that had to queue.
    #[pyo3(get)]
    waited: i64,
    queue: VecDeque<(i64, Py<Signal>)>,
}

impl ByteBound {
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
        Ok(ByteBound {
            sim,
            limit,
            used: 0,
            peak: 0,
            waited: 0,
            queue: VecDeque::new(),
        })
    }

    /// Take `nbytes`: None when granted now, else a signal that fires once they are
    /// granted (and taken). Requests larger than the limit are a caller's bug.
    fn acquire(&mut self, py: Python<'_>, nbytes: i64) -> PyResult<Option<Py<Signal>>> {
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

    /// Give `nbytes` back; grant the waiting requests that now fit, in order.
    fn release(slf: &Bound<'_, Self>, nbytes: i64) -> PyResult<()> {
        let py = slf.py();
        {
            let mut me = slf.borrow_mut();
            me.used -= nbytes;
            if me.used < 0 {
                return Err(PyRuntimeError::new_err("bound released more than was taken"));
            }
        }
        loop {
            let (sig, now) = {
                let mut me = slf.borrow_mut();
                match me.queue.front() {
                    Some(&(n, _)) if me.used + n <= me.limit => {
                        let (n, sig) = me.queue.pop_front().expect("a waiting request");
                        me.take(n);
                        let now = me.sim.borrow(py).now;
                        (sig, now)
                    }
                    _ => return Ok(()),
                }
            };
            Signal::fire_now(sig.bind(py), now, py.None())?;
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.sim)?;
        for (_, s) in self.queue.iter() {
            visit.call(s)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.queue.clear();
    }
}
