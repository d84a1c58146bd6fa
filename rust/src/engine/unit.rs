//! The engine's one seam to what is built on it: a unit outside the engine (a switch
//! chip, a GPU's endpoint, a merge unit, a stream of requests) is a [`Handler`], and
//! the engine holds it as a [`UnitRef`]: the Python object and the handler's
//! functions, monomorphised for its type. The engine tells a unit what happened
//! ([`Event`]) without knowing what the unit is; the units name the engine, never the
//! reverse.
//!
//! A unit that Python hands to the engine (the far end of `Channel.send`, a process's
//! pacer, a buffer's waiter) is recognised by the types registered at module load
//! ([`register`], called by `lib.rs`, the one place that knows every unit).

use std::marker::PhantomData;
use std::sync::OnceLock;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::{PyClass, PyTraverseError, PyVisit};

use super::sim::Simulator;
use super::train::Train;
use super::wait::{Process, Signal, TbPlan};

/// What the engine tells a unit.
pub(crate) enum Event<'a, 'py> {
    /// A time the unit scheduled for itself has come: `what` says which of its own
    /// events (its numbering), `train` the train it concerns, if any.
    Due {
        sim: &'a Bound<'py, Simulator>,
        what: u8,
        train: Option<Bound<'py, Train>>,
    },
    /// A train's tail has reached the unit (it is the far end of a channel).
    Arrived(Bound<'py, Train>),
    /// A train the unit queued on a channel went on the wire: its first and last byte
    /// leave at `start` and `finish`; `arg` is what the unit gave with it.
    Started {
        train: &'a Bound<'py, Train>,
        start: i64,
        finish: i64,
        arg: (i64, usize),
    },
    /// A signal the unit waited on has fired.
    Fired,
    /// A program the unit started has ended; `args` are what the unit gave with it,
    /// `waited` the time it spent waiting for data, flags or TB-group syncs on its SM
    /// (picoseconds; `Process`'s docs say which waits count).
    Ended { args: [i64; 3], waited: i64 },
    /// Credits of VC `vc` are coming back to the buffer the unit sends into.
    CreditsBack(usize),
    /// A request of `nbytes` that the unit issued is complete (every train in),
    /// before the request's own callback runs.
    Acked(i64),
    /// ... and after it.
    Landed,
}

/// What a process's pacer made of a value its program yielded (`Handler::pace`).
pub(crate) enum Paced {
    /// Not a value this pacer times.
    NotMine,
    /// The pacer holds the process and resumes it with the time taken; `true`: the
    /// program times it itself (it is sent the time), else it sleeps it.
    Held(bool),
    /// Sleep this long (the program's own units).
    Sleep(i64),
    /// Send the program this value (a time) at once.
    Value(i64),
}

/// What a unit did when a TB's plan reached it (`Handler::begin`).
pub(crate) enum Begun {
    /// The plan goes on at once.
    Go,
    /// The plan waits for the signal.
    Wait(Py<Signal>),
    /// The unit holds the process and resumes it (with None) when it may go on.
    Held,
    /// The plan sleeps this long (the program's own units).
    Sleep(i64),
}

/// A unit the engine calls back.
pub(crate) trait Handler: PyClass + Sync {
    /// Something happened to the unit (see [`Event`]).
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()>;

    /// A value the program of `process` yielded that the engine does not know (an int
    /// delay or a signal it knows), with the process's `slowdown`; for a unit that
    /// paces programs.
    fn pace(
        slf: &Bound<'_, Self>,
        sim: &Bound<'_, Simulator>,
        yielded: &Bound<'_, PyAny>,
        slowdown: f64,
        process: &Bound<'_, Process>,
    ) -> PyResult<Paced> {
        let _ = (slf, sim, yielded, slowdown, process);
        Ok(Paced::NotMine)
    }

    /// A TB's plan (`engine::wait::TbPlan`) has reached a step this unit carries out
    /// (a stream starts, a GPU registers with a TB group), with the step's `args`;
    /// for a unit that plans name.
    fn begin(
        slf: &Bound<'_, Self>,
        sim: &Bound<'_, Simulator>,
        args: [i64; 3],
        process: &Bound<'_, Process>,
    ) -> PyResult<Begun> {
        let _ = (sim, args, process);
        let ty = slf
            .as_any()
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        Err(PyTypeError::new_err(format!("a TB plan cannot begin a {ty}")))
    }

    /// For a TB program the core makes: its plan, placed on SM `sm` with `busy` SMs
    /// busy (None: the unit is not one; the program is called as any other).
    fn plan(slf: &Bound<'_, Self>, sm: usize, busy: usize) -> PyResult<Option<TbPlan>> {
        let _ = (slf, sm, busy);
        Ok(None)
    }
}

/// The event `ev` was not one the unit takes: a bug in the core.
#[cold]
pub(crate) fn unexpected(unit: &str) -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(format!("{unit}: an event it does not take"))
}

type OnEvent = for<'a, 'py> fn(&Bound<'py, PyAny>, Event<'a, 'py>) -> PyResult<()>;
type Pace = for<'py> fn(
    &Bound<'py, PyAny>,
    &Bound<'py, Simulator>,
    &Bound<'py, PyAny>,
    f64,
    &Bound<'py, Process>,
) -> PyResult<Paced>;
type Begin = for<'py> fn(&Bound<'py, PyAny>, &Bound<'py, Simulator>, [i64; 3], &Bound<'py, Process>) -> PyResult<Begun>;
type Plan = for<'py> fn(&Bound<'py, PyAny>, usize, usize) -> PyResult<Option<TbPlan>>;

/// A unit's functions, for its type.
pub(crate) struct Vt {
    on_event: OnEvent,
    pace: Pace,
    begin: Begin,
    plan: Plan,
    is: fn(&Bound<'_, PyAny>) -> bool,
}

struct VtOf<T>(PhantomData<T>);

impl<T: Handler> VtOf<T> {
    const VT: Vt = Vt {
        on_event: on_event_of::<T>,
        pace: pace_of::<T>,
        begin: begin_of::<T>,
        plan: plan_of::<T>,
        is: is_of::<T>,
    };
}

fn on_event_of<'py, T: Handler>(obj: &Bound<'py, PyAny>, ev: Event<'_, 'py>) -> PyResult<()> {
    // SAFETY: a `UnitRef` with this table is made only from a `Py<T>` (`UnitRef::new`)
    // or an object that is an instance of `T` (`UnitRef::of`).
    T::on_event(unsafe { obj.cast_unchecked::<T>() }, ev)
}

fn pace_of<'py, T: Handler>(
    obj: &Bound<'py, PyAny>,
    sim: &Bound<'py, Simulator>,
    yielded: &Bound<'py, PyAny>,
    slowdown: f64,
    process: &Bound<'py, Process>,
) -> PyResult<Paced> {
    // SAFETY: as in `on_event_of`.
    T::pace(unsafe { obj.cast_unchecked::<T>() }, sim, yielded, slowdown, process)
}

fn begin_of<'py, T: Handler>(
    obj: &Bound<'py, PyAny>,
    sim: &Bound<'py, Simulator>,
    args: [i64; 3],
    process: &Bound<'py, Process>,
) -> PyResult<Begun> {
    // SAFETY: as in `on_event_of`.
    T::begin(unsafe { obj.cast_unchecked::<T>() }, sim, args, process)
}

fn plan_of<T: Handler>(obj: &Bound<'_, PyAny>, sm: usize, busy: usize) -> PyResult<Option<TbPlan>> {
    // SAFETY: as in `on_event_of`.
    T::plan(unsafe { obj.cast_unchecked::<T>() }, sm, busy)
}

fn is_of<T: Handler>(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<T>()
}

/// The type of a unit, for [`register`].
pub(crate) fn kind<T: Handler>() -> &'static Vt {
    &VtOf::<T>::VT
}

static KNOWN: OnceLock<Vec<&'static Vt>> = OnceLock::new();

/// The unit types a Python object handed to the engine may be, in the order they are
/// tried (the most frequent first). Set once, when the module loads.
pub(crate) fn register(kinds: Vec<&'static Vt>) {
    let _ = KNOWN.set(kinds);
}

/// A unit as the engine holds it.
pub(crate) struct UnitRef {
    obj: Py<PyAny>,
    vt: &'static Vt,
}

impl UnitRef {
    #[inline]
    pub(crate) fn new<T: Handler>(unit: Py<T>) -> UnitRef {
        UnitRef {
            obj: unit.into_any(),
            vt: kind::<T>(),
        }
    }

    #[inline]
    pub(crate) fn of_bound<T: Handler>(unit: &Bound<'_, T>) -> UnitRef {
        UnitRef::new(unit.clone().unbind())
    }

    /// `obj` as a unit of a registered type, if it is one.
    pub(crate) fn of(obj: &Bound<'_, PyAny>) -> Option<UnitRef> {
        let vt = KNOWN.get()?.iter().find(|vt| (vt.is)(obj))?;
        Some(UnitRef {
            obj: obj.clone().unbind(),
            vt,
        })
    }

    /// `obj` as a unit, or a type error naming `what` it should be.
    pub(crate) fn expect(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<UnitRef> {
        UnitRef::of(obj).ok_or_else(|| {
            let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            PyTypeError::new_err(format!("expected {what}, got {ty}"))
        })
    }

    #[inline]
    pub(crate) fn on_event(&self, py: Python<'_>, ev: Event<'_, '_>) -> PyResult<()> {
        (self.vt.on_event)(self.obj.bind(py), ev)
    }

    /// Tell the unit `ev` and let this reference go (a one-off reference: dropped as
    /// a `Bound`, with no check of the thread's state, as a `Py` would make).
    #[inline]
    pub(crate) fn tell(self, py: Python<'_>, ev: Event<'_, '_>) -> PyResult<()> {
        let obj = self.obj.into_bound(py);
        (self.vt.on_event)(&obj, ev)
    }

    pub(crate) fn pace(
        &self,
        sim: &Bound<'_, Simulator>,
        yielded: &Bound<'_, PyAny>,
        slowdown: f64,
        process: &Bound<'_, Process>,
    ) -> PyResult<Paced> {
        (self.vt.pace)(self.obj.bind(sim.py()), sim, yielded, slowdown, process)
    }

    pub(crate) fn begin(
        &self,
        sim: &Bound<'_, Simulator>,
        args: [i64; 3],
        process: &Bound<'_, Process>,
    ) -> PyResult<Begun> {
        (self.vt.begin)(self.obj.bind(sim.py()), sim, args, process)
    }

    /// Its plan as a TB program the core makes (`Handler::plan`).
    pub(crate) fn plan(&self, py: Python<'_>, sm: usize, busy: usize) -> PyResult<Option<TbPlan>> {
        (self.vt.plan)(self.obj.bind(py), sm, busy)
    }

    pub(crate) fn clone_ref(&self, py: Python<'_>) -> UnitRef {
        UnitRef {
            obj: self.obj.clone_ref(py),
            vt: self.vt,
        }
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.obj)
    }

    /// The unit's object, for a prefetch of its memory.
    #[inline]
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.obj.as_ptr() as *const u8
    }
}
