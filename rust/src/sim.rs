//! The event loop: integer picosecond time and a heap of timed actions.
//!
//! An action is either a Python call (a TB program's wake-up, a hardware unit's
//! callback) or one of the engine's own (a channel's arbitration, a train's
//! arrival), which run here without entering the interpreter.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};

use crate::channel::{Channel, Sink};
use crate::gpu::Endpoint;
use crate::merge::MergeUnit;
use crate::train::Train;
use crate::wait::Process;

/// Events between two looks at the interpreter's pending signals (Ctrl-C).
const SIGNAL_CHECK_EVERY: i64 = 4096;

/// What an event does when its time comes.
pub(crate) enum Action {
    /// `fn(*args)`, a Python callable.
    Call(Py<PyAny>, Py<PyTuple>),
    /// A channel's arbiter runs (stale unless its generation is current).
    Arbitrate(Py<Channel>, u64),
    /// A train's tail reaches the far end of a channel, which delivers it.
    Arrive(Py<Channel>, Py<Train>, Sink),
    /// A GPU's memory has read what a request asks for: it responds.
    Respond(Py<Endpoint>, Py<Train>),
    /// A GPU's input buffers may take the requests they hold.
    DrainHeld(Py<Endpoint>),
    /// A CAIS merge unit's idle timer.
    Expire(Py<MergeUnit>),
    /// A TB program resumes after a delay it yielded.
    Step(Py<Process>),
}

pub(crate) struct Event {
    time: i64,
    seq: u64,
    action: Action,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so that the max-heap pops the earliest (time, then schedule order).
    fn cmp(&self, other: &Self) -> Ordering {
        other.time.cmp(&self.time).then_with(|| other.seq.cmp(&self.seq))
    }
}

/// A discrete-event simulator. Time is an integer number of picoseconds.
///
/// Events scheduled for the same time run in the order they were scheduled, so a
/// run is deterministic.
#[pyclass(module = "cais._core")]
pub struct Simulator {
    #[pyo3(get)]
    pub(crate) now: i64,
    queue: BinaryHeap<Event>,
    seq: u64,
    /// Events run so far.
    #[pyo3(get, set)]
    events: i64,
    /// Called as `tick(now, events)` every `tick_every` events (a progress report);
    /// None: the loop does not look.
    #[pyo3(get, set)]
    tick: Option<Py<PyAny>>,
    #[pyo3(get, set)]
    tick_every: i64,
}

impl Simulator {
    /// Schedule an action at `time`, which must not be in the past.
    pub(crate) fn schedule(&mut self, time: i64, action: Action) -> PyResult<()> {
        if time < self.now {
            return Err(PyValueError::new_err(format!(
                "event scheduled in the past: {time} < {}",
                self.now
            )));
        }
        self.push(time, action);
        Ok(())
    }

    /// Schedule an action at `time` (the caller has checked it is not in the past).
    pub(crate) fn push(&mut self, time: i64, action: Action) {
        self.seq += 1;
        self.queue.push(Event {
            time,
            seq: self.seq,
            action,
        });
    }
}

fn dispatch(py: Python<'_>, action: Action) -> PyResult<()> {
    match action {
        Action::Call(f, args) => {
            f.bind(py).call1(args.bind(py))?;
        }
        Action::Arbitrate(ch, generation) => Channel::arbitrate(ch.bind(py), generation)?,
        Action::Arrive(ch, train, deliver) => {
            let payload = train.borrow(py).payload;
            ch.borrow_mut(py).delivered_payload += payload;
            deliver.deliver(train.into_bound(py))?;
        }
        Action::Respond(gpu, req) => Endpoint::respond(gpu.bind(py), req.into_bound(py))?,
        Action::DrainHeld(gpu) => Endpoint::drain_held(gpu.bind(py))?,
        Action::Expire(unit) => MergeUnit::expire(unit.bind(py))?,
        Action::Step(p) => Process::step(p.bind(py), py.None())?,
    }
    Ok(())
}

#[pymethods]
impl Simulator {
    #[classattr]
    const TICK_EVERY: i64 = 4096;

    #[new]
    fn new() -> Self {
        Simulator {
            now: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            events: 0,
            tick: None,
            tick_every: Self::TICK_EVERY,
        }
    }

    /// Run `fn(*args)` at absolute time `time` (not before now).
    #[pyo3(signature = (time, r#fn, *args))]
    fn at(&mut self, time: i64, r#fn: Py<PyAny>, args: Py<PyTuple>) -> PyResult<()> {
        self.schedule(time, Action::Call(r#fn, args))
    }

    /// Run `fn(*args)` `delay` picoseconds from now.
    #[pyo3(signature = (delay, r#fn, *args))]
    fn after(&mut self, delay: i64, r#fn: Py<PyAny>, args: Py<PyTuple>) -> PyResult<()> {
        self.at(self.now + delay, r#fn, args)
    }

    /// Time of the next event, None when nothing is scheduled.
    fn next_time(&self) -> Option<i64> {
        self.queue.peek().map(|e| e.time)
    }

    /// Process events until the queue is empty (or past `until`); return now.
    #[pyo3(signature = (until = None))]
    fn run(slf: &Bound<'_, Self>, until: Option<i64>) -> PyResult<i64> {
        let py = slf.py();
        let (tick, every) = {
            let me = slf.borrow();
            (me.tick.as_ref().map(|t| t.clone_ref(py)), me.tick_every.max(1))
        };
        let mut count: i64 = 0;
        let mut outcome = Ok(());
        loop {
            let (time, action) = {
                let mut me = slf.borrow_mut();
                match me.queue.peek() {
                    None => break,
                    Some(e) if until.is_some_and(|u| e.time > u) => break,
                    Some(_) => {}
                }
                let e = me.queue.pop().expect("peeked");
                me.now = e.time;
                (e.time, e.action)
            };
            if let Err(err) = dispatch(py, action) {
                outcome = Err(err);
                break;
            }
            count += 1;
            if count % SIGNAL_CHECK_EVERY == 0 {
                // a stretch of the core's own events runs no Python: let Ctrl-C in
                if let Err(err) = py.check_signals() {
                    outcome = Err(err);
                    break;
                }
            }
            if let Some(t) = &tick {
                if count % every == 0 {
                    let total = slf.borrow().events + count;
                    if let Err(err) = t.call1(py, (time, total)) {
                        outcome = Err(err);
                        break;
                    }
                }
            }
        }
        let mut me = slf.borrow_mut();
        me.events += count;
        outcome.map(|()| me.now)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.tick)?;
        for e in self.queue.iter() {
            match &e.action {
                Action::Call(f, a) => {
                    visit.call(f)?;
                    visit.call(a)?;
                }
                Action::Arbitrate(c, _) => visit.call(c)?,
                Action::Arrive(c, t, d) => {
                    visit.call(c)?;
                    visit.call(t)?;
                    d.visit(&visit)?;
                }
                Action::Respond(g, t) => {
                    visit.call(g)?;
                    visit.call(t)?;
                }
                Action::DrainHeld(g) => visit.call(g)?,
                Action::Expire(u) => visit.call(u)?,
                Action::Step(p) => visit.call(p)?,
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.tick = None;
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_by_time_then_schedule_order() {
        Python::initialize();
        Python::attach(|py| {
            let mut heap = BinaryHeap::new();
            let args = PyTuple::empty(py).unbind();
            for (time, seq) in [(10, 1), (5, 2), (10, 3), (5, 4), (0, 5)] {
                heap.push(Event {
                    time,
                    seq,
                    action: Action::Call(py.None(), args.clone_ref(py)),
                });
            }
            let order: Vec<(i64, u64)> = std::iter::from_fn(|| heap.pop().map(|e| (e.time, e.seq))).collect();
            assert_eq!(order, vec![(0, 5), (5, 2), (5, 4), (10, 1), (10, 3)]);
        });
    }
}
