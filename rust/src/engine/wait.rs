//! TB programs and what they wait on: a [`Process`] runs a program, either a Python
//! generator, which yields a one-shot [`Signal`], a [`Countdown`] of arrivals, or a
//! delay, or a [`TbPlan`], the same kinds of steps (and steps the units it names carry
//! out) listed once by Python and executed here; a [`ByteBound`] (exported as `Bound`)
//! bounds bytes in flight, granted in request order.
//!
//! These run once per request a TB makes, so they are compiled. Waiters run in the
//! order they were registered, at the moment the signal fires: a waiting process is
//! resumed natively, any other waiter is a Python callable.

use std::collections::VecDeque;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{properties, unit, GilCell, Unit, UnitState};
use super::sim::{Action, Simulator};
use super::unit::{Begun, Event, Paced, UnitRef};

/// Whom a signal wakes: a process waiting on it, a Python callable `fn(value)`, or a
/// countdown that counts one arrival (a load that joined one asked for first: its
/// TB's loads in).
enum Waiter {
    Resume(Py<Process>),
    Call(Py<PyAny>),
    Count(Py<Countdown>, Py<Simulator>),
}

impl Waiter {
    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Waiter::Resume(p) => visit.call(p),
            Waiter::Call(f) => visit.call(f),
            Waiter::Count(c, sim) => {
                visit.call(c)?;
                visit.call(sim)
            }
        }
    }
}

/// A signal's waiters, in the order they came. Most signals have one (a TB's process,
/// a stream, a joined load), which is kept in place: no list is allocated for it.
#[derive(Default)]
struct Waiters {
    first: Option<Waiter>,
    rest: Vec<Waiter>,
}

impl Waiters {
    fn push(&mut self, w: Waiter) {
        if self.first.is_none() {
            self.first = Some(w);
        } else {
            self.rest.push(w);
        }
    }

    fn iter(&self) -> std::iter::Chain<std::option::Iter<'_, Waiter>, std::slice::Iter<'_, Waiter>> {
        self.first.iter().chain(self.rest.iter())
    }

    fn into_iter(self) -> std::iter::Chain<std::option::IntoIter<Waiter>, std::vec::IntoIter<Waiter>> {
        self.first.into_iter().chain(self.rest)
    }

    fn clear(&mut self) {
        self.first = None;
        self.rest.clear();
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
    waiters: Waiters,
}

unit!(Signal, SignalState);

impl Signal {
    pub(crate) fn blank(py: Python<'_>) -> Signal {
        Signal::from(SignalState {
            fired: false,
            value: py.None(),
            time: None,
            waiters: Waiters::default(),
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
        for w in waiters.into_iter() {
            match w {
                Waiter::Resume(p) => Process::step(p.bind(py), value.clone_ref(py))?,
                Waiter::Call(f) => {
                    f.call1(py, (value.clone_ref(py),))?;
                }
                Waiter::Count(c, sim) => Countdown::arrive(c.bind(py), sim.bind(py), 1)?,
            }
        }
        Ok(())
    }
}

impl Signal {
    /// Count one arrival into `count` when the signal fires (now, if it has).
    pub(crate) fn count_into(slf: &Bound<'_, Self>, count: Py<Countdown>, sim: Py<Simulator>) -> PyResult<()> {
        {
            let mut me = slf.st();
            if !me.fired {
                me.waiters.push(Waiter::Count(count, sim));
                return Ok(());
            }
        }
        Countdown::arrive(count.bind(slf.py()), sim.bind(slf.py()), 1)
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
    pub(crate) fn new(py: Python<'_>, count: i64) -> (Self, Signal) {
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
    queue: VecDeque<(i64, Grantee)>,
}

/// Who waits for a grant: a signal (a Python caller's `acquire`), or a unit told
/// `Event::Fired` (a stream whose next request waits for room).
enum Grantee {
    Signal(Py<Signal>),
    Unit(UnitRef),
}

unit!(ByteBound, ByteBoundState);

impl ByteBoundState {
    /// Take `nbytes`: None when granted now, else a signal that fires once they are
    /// granted (and taken). Requests larger than the limit are a caller's bug.
    pub(crate) fn acquire(&mut self, py: Python<'_>, nbytes: i64) -> PyResult<Option<Py<Signal>>> {
        if self.grant_now(nbytes)? {
            return Ok(None);
        }
        self.waited += 1;
        let sig = Py::new(py, Signal::blank(py))?;
        self.queue.push_back((nbytes, Grantee::Signal(sig.clone_ref(py))));
        Ok(Some(sig))
    }

    /// Take `nbytes` for `unit`: true when granted now, else false, and the unit is told
    /// `Event::Fired` once they are granted (and taken).
    pub(crate) fn acquire_for(&mut self, nbytes: i64, unit: impl FnOnce() -> UnitRef) -> PyResult<bool> {
        if self.grant_now(nbytes)? {
            return Ok(true);
        }
        self.waited += 1;
        self.queue.push_back((nbytes, Grantee::Unit(unit())));
        Ok(false)
    }

    /// Take `nbytes` now if nothing waits and they fit (true), else not (false).
    /// Requests larger than the limit are a caller's bug.
    fn grant_now(&mut self, nbytes: i64) -> PyResult<bool> {
        if nbytes > self.limit {
            return Err(PyValueError::new_err(format!(
                "a request of {nbytes} B exceeds its bound of {} B: cut it first",
                self.limit
            )));
        }
        if self.queue.is_empty() && self.used + nbytes <= self.limit {
            self.take(nbytes);
            return Ok(true);
        }
        Ok(false)
    }

    fn take(&mut self, nbytes: i64) {
        self.used += nbytes;
        self.peak = self.peak.max(self.used);
    }
}

#[pymethods]
impl ByteBound {
    #[new]
    pub(crate) fn new(sim: Py<Simulator>, limit: i64) -> PyResult<Self> {
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
            let (who, now) = {
                let mut me = slf.st();
                match me.queue.front() {
                    Some(&(n, _)) if me.used + n <= me.limit => {
                        let (n, who) = me.queue.pop_front().expect("a waiting request");
                        me.take(n);
                        let now = me.sim.get().now();
                        (who, now)
                    }
                    _ => return Ok(()),
                }
            };
            match who {
                Grantee::Signal(sig) => Signal::fire_now(sig.bind(py), now, py.None())?,
                Grantee::Unit(unit) => unit.tell(py, Event::Fired)?,
            }
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        for (_, who) in me.queue.iter() {
            match who {
                Grantee::Signal(sig) => visit.call(sig)?,
                Grantee::Unit(unit) => unit.visit(&visit)?,
            }
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

/// One step of a [`TbPlan`].
pub(crate) enum PlanStep {
    /// Wait until the signal fires (at once if it has).
    Wait(Py<Signal>),
    /// Wait for a TB-group release (a signal), counted as a sync wait wherever it comes.
    Sync(Py<Signal>),
    /// Sleep this long (the program's units: stretched by its GPU's slowdown).
    Sleep(i64),
    /// A value for the process's pacer (an HBM phase), as a program would yield it;
    /// the time of a phase the program times itself becomes the plan's `compute`.
    Pace(Py<PyAny>),
    /// A unit carries out a step (`Handler::begin`) with these arguments.
    Begin(UnitRef, [i64; 3]),
    /// Call the Python callable (functional mode: what a TB does with its data).
    Call(Py<PyAny>),
    /// Note the time as the plan's `start`.
    Mark,
    /// A mainloop's rest: sleep until `max(start + compute, now + compute * num // den)`
    /// (the last K-slice's compute after the last load; `num` 0: until `start + compute`).
    Rest(i64, i64),
    /// A step already executed.
    Taken,
}

impl PlanStep {
    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            PlanStep::Wait(s) | PlanStep::Sync(s) => visit.call(s),
            PlanStep::Pace(v) | PlanStep::Call(v) => visit.call(v),
            PlanStep::Begin(u, _) => u.visit(visit),
            _ => Ok(()),
        }
    }
}

/// A thread block's program as a plan the core executes: its waits, sleeps, HBM
/// phases and the steps units carry out (a stream of loads or reductions starts, a TB
/// registers with its TB group), and in functional mode the Python calls that move its
/// data, in order, listed once by the kernel (Python) when the TB is placed on its SM. A kernel's TB factory returns one instead of a generator
/// where its control flow is a fixed sequence (issue 40, part 1); a [`Process`] then
/// runs it without entering Python. A plan runs once.
#[pyclass(module = "cais._core", frozen)]
pub struct TbPlan {
    st: GilCell<TbPlanState>,
}

/// The mutable state of a [`TbPlan`] (see there), borrowed while holding the GIL.
pub(crate) struct TbPlanState {
    steps: Vec<PlanStep>,
    taken: bool,
}

unit!(TbPlan, TbPlanState);

impl TbPlan {
    /// A plan of these steps (a TB factory of the core makes it whole).
    pub(crate) fn of_steps(steps: Vec<PlanStep>) -> TbPlan {
        TbPlan::from(TbPlanState { steps, taken: false })
    }

    /// Its steps, for a process the core starts itself (never a Python object).
    pub(crate) fn into_steps(self) -> Vec<PlanStep> {
        self.st.into_inner().steps
    }

    fn add(&self, py: Python<'_>, step: PlanStep) -> PyResult<()> {
        let mut me = self.st(py);
        if me.taken {
            return Err(PyRuntimeError::new_err("a TB plan that runs takes no more steps"));
        }
        me.steps.push(step);
        Ok(())
    }
}

#[pymethods]
impl TbPlan {
    #[new]
    fn new() -> Self {
        TbPlan::from(TbPlanState {
            steps: Vec::new(),
            taken: false,
        })
    }

    /// Wait until `signal` fires.
    fn wait(&self, py: Python<'_>, signal: Py<Signal>) -> PyResult<()> {
        self.add(py, PlanStep::Wait(signal))
    }

    /// Wait until `signal`, a TB group's release, fires (counted as a sync wait).
    fn wait_sync(&self, py: Python<'_>, signal: Py<Signal>) -> PyResult<()> {
        self.add(py, PlanStep::Sync(signal))
    }

    /// Sleep `ps` picoseconds (stretched by the GPU's slowdown, as a yielded delay).
    fn sleep(&self, py: Python<'_>, ps: i64) -> PyResult<()> {
        self.add(py, PlanStep::Sleep(ps))
    }

    /// An HBM phase, timed by the GPU's HBM share as if the program yielded it; the
    /// time of one the program times itself (overlapped) is the plan's `compute`.
    fn phase(&self, py: Python<'_>, phase: Py<PyAny>) -> PyResult<()> {
        self.add(py, PlanStep::Pace(phase))
    }

    /// `unit` carries out its step (a stream starts; a GPU's endpoint registers with TB
    /// group `b` of `c` members at chip `a`), and the plan waits as the unit says.
    #[pyo3(signature = (unit, a = 0, b = 0, c = 0))]
    fn begin(&self, unit: &Bound<'_, PyAny>, a: i64, b: i64, c: i64) -> PyResult<()> {
        let py = unit.py();
        let unit = UnitRef::expect(unit, "a unit a TB plan can begin (a stream, an endpoint, an SM port)")?;
        self.add(py, PlanStep::Begin(unit, [a, b, c]))
    }

    /// Call `fn()` (what the TB does with its data, in functional mode).
    fn call(&self, py: Python<'_>, r#fn: Py<PyAny>) -> PyResult<()> {
        self.add(py, PlanStep::Call(r#fn))
    }

    /// Note the time: the mainloop's start, for `rest`.
    fn mark(&self, py: Python<'_>) -> PyResult<()> {
        self.add(py, PlanStep::Mark)
    }

    /// Sleep until `max(start + compute, now + compute * num // den)`, where `start` is
    /// the last `mark` and `compute` the last self-timed phase's time.
    fn rest(&self, py: Python<'_>, num: i64, den: i64) -> PyResult<()> {
        if den <= 0 || num < 0 {
            return Err(PyValueError::new_err(format!(
                "a rest's fraction must be num >= 0 over den > 0, got {num}/{den}"
            )));
        }
        self.add(py, PlanStep::Rest(num, den))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.st(py).steps.len()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        for step in &me.steps {
            step.visit(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.steps.clear();
        }
    }
}

/// A plan a process runs: its steps, the next one, and the times `Mark` and a
/// self-timed phase noted.
struct PlanRun {
    steps: Vec<PlanStep>,
    pc: usize,
    start: i64,
    compute: i64,
}

impl PlanRun {
    /// A run of `steps` from the first.
    fn of(steps: Vec<PlanStep>) -> PlanRun {
        PlanRun {
            steps,
            pc: 0,
            start: 0,
            compute: 0,
        }
    }
}

/// What a process runs: a Python generator, or a plan.
enum Program {
    Gen(Py<PyAny>),
    Plan(PlanRun),
}

/// Runs a program (a thread block's control flow): a generator that yields an `int`
/// (sleep that many picoseconds) or a [`Signal`] (wait until it fires; the signal's
/// value is sent back into the generator), or a [`TbPlan`]. `done` fires when the
/// generator returns or the plan's last step is done (a process the core starts for a
/// unit that is told instead, `then`, has none: Python's None). It counts the time it
/// waits, told to `then` at its end: waits for signals before its work begins (its
/// first sleep, HBM phase or mark), a thread block holding its SM for its data or
/// flags, and TB-group syncs wherever they come.
#[pyclass(module = "cais._core", frozen)]
pub struct Process {
    st: GilCell<ProcessState>,
}

/// The mutable state of a [`Process`] (see there), borrowed while holding the GIL.
pub(crate) struct ProcessState {
    sim: Py<Simulator>,
    program: Program,
    done: Option<Py<Signal>>,
    /// The unit told `Event::Ended(args)` when the program ends (a TB's dispatcher).
    then: Option<(UnitRef, [i64; 3])>,
    /// The unit that times the values of its own the program yields (`Handler::pace`):
    /// the GPU's HBM share, which times kernel phases (None: it yields none).
    hbm: Option<UnitRef>,
    /// Factor on the compute delays the program yields (a straggler GPU; 1: none).
    slowdown: f64,
    /// Waiting for the HBM share to time a phase: whether the program times it itself.
    phase: Option<bool>,
    /// When a wait that counts as waiting began (None: not in one), the time such waits
    /// took so far, and whether the program has started its work (a sleep, an HBM
    /// phase, a mark): waits for signals before that count, and TB-group syncs anywhere.
    blocked: Option<i64>,
    waited: i64,
    worked: bool,
}

unit!(Process, ProcessState);

/// What a program's `send` gave back.
enum Sent<'py> {
    Yielded(Bound<'py, PyAny>),
    Returned,
}

/// `gen.send(value)`, without raising StopIteration when the program ends.
fn send<'py>(gen: &Bound<'py, PyAny>, value: Bound<'py, PyAny>) -> PyResult<Sent<'py>> {
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
    /// Run the program `gen`, a generator or a [`TbPlan`] (from now, if `start`), its HBM phases paced by `hbm`
    /// and its compute delays stretched by `slowdown`; `done` fires when it ends.
    pub(crate) fn spawn(
        py: Python<'_>,
        sim: &Py<Simulator>,
        gen: Py<PyAny>,
        start: bool,
        hbm: Option<UnitRef>,
        slowdown: f64,
    ) -> PyResult<Py<Process>> {
        let program = Process::program_of(py, gen)?;
        let done = Some(Py::new(py, Signal::blank(py))?);
        Process::launch(py, sim, program, done, None, start, hbm, slowdown)
    }

    /// Run `gen` (a generator, a [`TbPlan`] object, or with `steps` a plan's steps) from
    /// now, as `spawn` does, and tell the unit `then` `Event::Ended(args)` when it ends (no
    /// `done` signal: nothing else waits for it).
    pub(crate) fn spawn_then(
        py: Python<'_>,
        sim: &Py<Simulator>,
        gen: Result<Vec<PlanStep>, Py<PyAny>>,
        then: (UnitRef, [i64; 3]),
        hbm: Option<UnitRef>,
        slowdown: f64,
    ) -> PyResult<Py<Process>> {
        let program = match gen {
            Ok(steps) => Program::Plan(PlanRun::of(steps)),
            Err(gen) => Process::program_of(py, gen)?,
        };
        Process::launch(py, sim, program, None, Some(then), true, hbm, slowdown)
    }

    /// What `gen` runs: its steps if it is a [`TbPlan`] (which runs once), else it is a
    /// generator.
    fn program_of(py: Python<'_>, gen: Py<PyAny>) -> PyResult<Program> {
        Ok(match gen.bind(py).cast::<TbPlan>() {
            Ok(plan) => {
                let mut p = plan.st();
                if p.taken {
                    return Err(PyRuntimeError::new_err("a TB plan runs once"));
                }
                p.taken = true;
                Program::Plan(PlanRun::of(std::mem::take(&mut p.steps)))
            }
            Err(_) => Program::Gen(gen),
        })
    }

    #[allow(clippy::too_many_arguments)] // a process's parts
    fn launch(
        py: Python<'_>,
        sim: &Py<Simulator>,
        program: Program,
        done: Option<Py<Signal>>,
        then: Option<(UnitRef, [i64; 3])>,
        start: bool,
        hbm: Option<UnitRef>,
        slowdown: f64,
    ) -> PyResult<Py<Process>> {
        let p = Py::new(
            py,
            Process::from(ProcessState {
                sim: sim.clone_ref(py),
                program,
                done,
                then,
                hbm,
                slowdown,
                phase: None,
                blocked: None,
                waited: 0,
                worked: false,
            }),
        )?;
        if start {
            let s = sim.get();
            let now = s.now();
            s.schedule(py, now, Action::Step(p.clone_ref(py)))?;
        }
        Ok(p)
    }

    /// The program has ended: `done` fires, or the unit that started it is told.
    fn finish(slf: &Bound<'_, Self>, now: i64) -> PyResult<()> {
        let py = slf.py();
        let (done, then, waited) = {
            let mut me = slf.st();
            (me.done.as_ref().map(|d| d.clone_ref(py)), me.then.take(), me.waited)
        };
        if let Some(done) = done {
            Signal::fire_now(done.bind(py), now, py.None())?;
        }
        match then {
            Some((unit, args)) => unit.tell(py, Event::Ended { args, waited }),
            None => Ok(()),
        }
    }

    /// Resume the program after `delay` (its own units: stretched here).
    fn sleep(slf: &Bound<'_, Self>, sim: &Py<Simulator>, slowdown: f64, delay: i64) -> PyResult<()> {
        let py = slf.py();
        let s = sim.get();
        let time = s.now() + slowed(slowdown, delay);
        s.schedule(py, time, Action::Step(slf.clone().unbind()))
    }

    /// The program now waits: counted as waiting if it is a TB-group sync (`sync`) or
    /// comes before the program's work began (a wait for its data or flags).
    fn block(slf: &Bound<'_, Self>, sim: &Bound<'_, Simulator>, sync: bool) {
        let mut me = slf.st();
        if sync || !me.worked {
            me.blocked = Some(sim.get().now());
        }
    }

    /// Wait on `sig`: its value if it has fired (go on), else None (the process is
    /// resumed when it fires).
    fn wait_on(slf: &Bound<'_, Self>, sig: &Bound<'_, Signal>) -> Option<Py<PyAny>> {
        let mut s = sig.st();
        if s.fired {
            return Some(s.value.clone_ref(slf.py()));
        }
        s.waiters.push(Waiter::Resume(slf.clone().unbind()));
        None
    }

    /// Hand `value` to the pacer `hbm`: None if it is not one the pacer times;
    /// `Some(Some(ps))` when the program is to be sent the time `ps` at once;
    /// `Some(None)` when the process now waits or sleeps.
    fn pace(
        slf: &Bound<'_, Self>,
        hbm: &UnitRef,
        sim: &Py<Simulator>,
        value: &Bound<'_, PyAny>,
        slowdown: f64,
    ) -> PyResult<Option<Option<i64>>> {
        let py = slf.py();
        Ok(match hbm.pace(sim.bind(py), value, slowdown, slf)? {
            Paced::NotMine => None,
            Paced::Held(overlapped) => {
                // timed at its real duration, known at the end of this instant, when
                // the pacer resumes it with the time
                slf.st().phase = Some(overlapped);
                Some(None)
            }
            Paced::Sleep(ps) => {
                Process::sleep(slf, sim, slowdown, ps)?;
                Some(None)
            }
            Paced::Value(ps) => Some(Some(ps)),
        })
    }

    /// The plan the process runs (it runs one).
    fn plan(me: &mut ProcessState) -> &mut PlanRun {
        match &mut me.program {
            Program::Plan(run) => run,
            Program::Gen(_) => unreachable!("a generator's process has no plan"),
        }
    }

    /// Execute the plan's steps up to its next wait, or its end.
    fn run_plan(slf: &Bound<'_, Self>, sim: &Py<Simulator>, hbm: Option<&UnitRef>, slowdown: f64) -> PyResult<()> {
        let py = slf.py();
        let s = sim.bind(py);
        loop {
            let step = {
                let mut me = slf.st();
                let run = Process::plan(&mut me);
                match run.steps.get_mut(run.pc) {
                    Some(step) => {
                        run.pc += 1;
                        std::mem::replace(step, PlanStep::Taken)
                    }
                    None => {
                        drop(me);
                        let now = s.get().now();
                        return Process::finish(slf, now);
                    }
                }
            };
            if matches!(
                step,
                PlanStep::Sleep(_) | PlanStep::Pace(_) | PlanStep::Mark | PlanStep::Rest(..)
            ) {
                slf.st().worked = true;
            }
            match step {
                PlanStep::Wait(sig) => {
                    if Process::wait_on(slf, sig.bind(py)).is_none() {
                        Process::block(slf, s, false);
                        return Ok(());
                    }
                }
                PlanStep::Sync(sig) => {
                    if Process::wait_on(slf, sig.bind(py)).is_none() {
                        Process::block(slf, s, true);
                        return Ok(());
                    }
                }
                PlanStep::Sleep(ps) => return Process::sleep(slf, sim, slowdown, ps),
                PlanStep::Pace(value) => {
                    let Some(h) = hbm else {
                        return Err(PyTypeError::new_err(
                            "a TB plan's HBM phase needs a kernel with hbm_phases",
                        ));
                    };
                    match Process::pace(slf, h, sim, value.bind(py), slowdown)? {
                        None => {
                            return Err(PyTypeError::new_err(format!(
                                "a TB plan's phase must be an HbmPhase, not {}",
                                value.bind(py).get_type().name()?
                            )))
                        }
                        Some(Some(ps)) => Process::plan(&mut slf.st()).compute = ps,
                        Some(None) => return Ok(()),
                    }
                }
                PlanStep::Begin(unit, args) => match unit.begin(s, args, slf)? {
                    Begun::Go => {}
                    Begun::Held => {
                        Process::block(slf, s, true); // a TB-group sync: the release resumes it
                        return Ok(());
                    }
                    Begun::Wait(sig) => {
                        if Process::wait_on(slf, sig.bind(py)).is_none() {
                            return Ok(());
                        }
                    }
                    Begun::Sleep(ps) => return Process::sleep(slf, sim, slowdown, ps),
                },
                PlanStep::Call(f) => {
                    f.call0(py)?;
                }
                PlanStep::Mark => {
                    let now = s.get().now();
                    Process::plan(&mut slf.st()).start = now;
                }
                PlanStep::Rest(num, den) => {
                    let now = s.get().now();
                    let (start, compute) = {
                        let mut me = slf.st();
                        let run = Process::plan(&mut me);
                        (run.start, run.compute)
                    };
                    // as Python's floor division would compute it
                    let tail = (compute as i128 * num as i128).div_euclid(den as i128) as i64;
                    let end = (start + compute).max(now + tail);
                    if end > now {
                        return Process::sleep(slf, sim, slowdown, end - now);
                    }
                }
                PlanStep::Taken => unreachable!("a plan's step runs once"),
            }
        }
    }

    /// Send `value` into the program and follow it to its next wait.
    pub(crate) fn step(slf: &Bound<'_, Self>, value: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let (gen, sim, hbm, slowdown, phase) = {
            let mut me = slf.st();
            if let Some(since) = me.blocked.take() {
                me.waited += me.sim.get().now() - since;
            }
            (
                match &me.program {
                    Program::Gen(g) => Some(g.clone_ref(py)),
                    Program::Plan(_) => None,
                },
                // bound, as is the value: dropped without PyO3's thread-local read
                me.sim.clone_ref(py).into_bound(py),
                me.hbm.as_ref().map(|h| h.clone_ref(py)),
                me.slowdown,
                me.phase.take(),
            )
        };
        let mut value = value.into_bound(py);
        if let Some(overlapped) = phase {
            // the HBM share has timed the phase (at its real duration): in the program's units
            let took: i64 = value.extract()?;
            let took = if slowdown == 1.0 {
                took
            } else {
                (took as f64 / slowdown).round_ties_even() as i64
            };
            if !overlapped {
                return Process::sleep(slf, sim.as_unbound(), slowdown, took);
            }
            // the program times it: hand it the time
            if gen.is_none() {
                Process::plan(&mut slf.st()).compute = took;
            }
            value = took.into_pyobject(py)?.into_any();
        }
        let Some(gen) = gen else {
            return Process::run_plan(slf, sim.as_unbound(), hbm.as_ref(), slowdown);
        };
        let gen = gen.into_bound(py);
        loop {
            let waited = match send(&gen, value)? {
                Sent::Yielded(w) => w,
                Sent::Returned => {
                    let now = sim.get().now();
                    return Process::finish(slf, now);
                }
            };
            if let Ok(sig) = waited.cast::<Signal>() {
                match Process::wait_on(slf, sig) {
                    Some(v) => {
                        value = v.into_bound(py);
                        continue;
                    }
                    None => {
                        Process::block(slf, &sim, false);
                        return Ok(());
                    }
                }
            }
            slf.st().worked = true; // a delay or an HBM phase: its work has begun
            if waited.is_instance_of::<PyInt>() {
                let delay: i64 = waited.extract()?;
                return Process::sleep(slf, sim.as_unbound(), slowdown, delay);
            }
            if let Some(h) = hbm.as_ref() {
                match Process::pace(slf, h, sim.as_unbound(), &waited, slowdown)? {
                    None => {}
                    Some(Some(ps)) => {
                        value = ps.into_pyobject(py)?.into_any();
                        continue;
                    }
                    Some(None) => return Ok(()),
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
        match &me.program {
            Program::Gen(g) => visit.call(g)?,
            Program::Plan(run) => {
                for step in &run.steps {
                    step.visit(&visit)?;
                }
            }
        }
        visit.call(&me.done)?;
        if let Some((unit, _)) = &me.then {
            unit.visit(&visit)?;
        }
        if let Some(h) = &me.hbm {
            h.visit(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&self, py: Python<'_>) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.program = Program::Gen(py.None());
        }
    }
}

properties!(Process {
    sim: Py<Simulator>;
    done: Option<Py<Signal>>;
});
