//! The event loop: integer picosecond time and a heap of timed actions.
//!
//! An action is either a Python call (a TB program's wake-up, a unit's Python
//! callback), one of the engine's own (a channel's arbitration, a train's arrival, a
//! process's step), or a unit's own timed event, handed to it through the engine's
//! seam ([`super::unit`]); all but the first run here without entering the
//! interpreter.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{GilCell, Unit};
use super::channel::{Channel, Sink};
use super::train::{Train, TrainState};
use super::unit::{Event as UnitEvent, UnitRef};
use super::wait::Process;

/// Events between two looks at the interpreter's pending signals (Ctrl-C).
const SIGNAL_CHECK_EVERY: i64 = 4096;

/// What an event does when its time comes.
pub(crate) enum Action {
    /// `fn(*args)`, a Python callable.
    Call(Py<PyAny>, Py<PyTuple>),
    /// A channel's arbiter runs (stale unless its generation is current); the
    /// addresses of the train it will likely start, for a prefetch.
    Arbitrate(Py<Channel>, u64, Likely),
    /// A train's tail reaches the far end of a channel, which delivers it.
    Arrive(Py<Channel>, Py<Train>, Sink),
    /// A TB program resumes after a delay it yielded.
    Step(Py<Process>),
    /// A unit's own event (`Event::Due`): which of its own, and the train it concerns.
    Due(UnitRef, u8, Option<Py<Train>>),
}

/// The kinds of [`Action`], as `Simulator.events_by_kind` names them.
const KINDS: [&str; 5] = ["call", "arbitrate", "arrive", "step", "due"];

impl Action {
    /// Ask the memory system for the objects this action will touch first (a
    /// prefetch: a hint that changes no result). On a large machine an event costs
    /// mostly its misses in the cache: the train, the channel and the unit it reaches
    /// were last touched thousands of events earlier.
    #[inline]
    fn prefetch(&self) {
        match self {
            Action::Call(f, _) => prefetch(f.as_ptr() as *const u8, 1),
            Action::Arbitrate(ch, _, likely) => {
                prefetch(ch.as_ptr() as *const u8, CHANNEL_LINES);
                prefetch(likely.queued, QUEUED_LINES);
                prefetch(likely.train, TRAIN_LINES);
            }
            Action::Arrive(ch, train, deliver) => {
                prefetch(train.as_ptr() as *const u8, TRAIN_LINES);
                prefetch(ch.as_ptr() as *const u8, CHANNEL_LINES);
                if let Sink::Unit(unit) = deliver {
                    prefetch(unit.as_ptr(), UNIT_LINES);
                }
            }
            Action::Step(p) => prefetch(p.as_ptr() as *const u8, UNIT_LINES),
            Action::Due(unit, _, train) => {
                prefetch(unit.as_ptr(), UNIT_LINES);
                if let Some(t) = train {
                    prefetch(t.as_ptr() as *const u8, TRAIN_LINES);
                }
            }
        }
    }

    /// Its index in [`KINDS`].
    #[inline]
    fn kind(&self) -> usize {
        match self {
            Action::Call(..) => 0,
            Action::Arbitrate(..) => 1,
            Action::Arrive(..) => 2,
            Action::Step(..) => 3,
            Action::Due(..) => 4,
        }
    }
}

/// Cache lines prefetched of a train (its object: header, cell and fields), of a
/// channel and of a unit (the start of its state).
const TRAIN_LINES: usize = 4;
const CHANNEL_LINES: usize = 6;
const UNIT_LINES: usize = 4;
/// Cache lines prefetched of a train's entry in a channel's VC queue.
const QUEUED_LINES: usize = 2;

/// Where the train an arbitration will likely start lives when it is armed: its entry
/// at the head of a VC's queue and its object (null: none). Only ever prefetched, never
/// read: by the arbitration's time another VC may win, or the train may have gone.
#[derive(Clone, Copy)]
pub(crate) struct Likely {
    pub(crate) queued: *const u8,
    pub(crate) train: *const u8,
}

impl Likely {
    pub(crate) const NONE: Likely = Likely {
        queued: std::ptr::null(),
        train: std::ptr::null(),
    };
}

// SAFETY: the addresses are hints for a prefetch, never dereferenced.
unsafe impl Send for Likely {}
unsafe impl Sync for Likely {}

/// Ask for the `lines` cache lines from `ptr` (a hint: no fault, no result changes;
/// null asks for nothing).
#[inline(always)]
fn prefetch(ptr: *const u8, lines: usize) {
    if ptr.is_null() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    for i in 0..lines {
        // SAFETY: a prefetch reads nothing the program sees and does not fault
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr.wrapping_add(i * 64) as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, lines);
}

/// An event's place in the queue, one 16-byte key the heap moves (not the action):
/// time << 64 | schedule order << 24 | the slot of its action. One comparison orders
/// by time, then schedule order (no two events share one); the slot rides along.
struct Event {
    key: u128,
}

/// Bits of an event's key that hold its action's slot, and so the most events that
/// may wait in the queue at once (16,777,216); the schedule order has the other 40.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const MAX_SEQ: u64 = (1 << (64 - SLOT_BITS)) - 1;

impl Event {
    fn new(time: i64, seq: u64, slot: u32) -> Self {
        Event {
            key: (time as u128) << 64 | ((seq << SLOT_BITS) | slot as u64) as u128,
        }
    }

    fn time(&self) -> i64 {
        (self.key >> 64) as i64
    }

    fn slot(&self) -> usize {
        (self.key as u64 & SLOT_MASK) as usize
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
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
        other.key.cmp(&self.key)
    }
}

/// The simulator's present time, shared with the units that read it (a read is one
/// load, with no borrow of the simulator); only the event loop advances it.
#[derive(Clone, Default)]
pub(crate) struct Clock(Arc<AtomicI64>);

impl Clock {
    pub(crate) fn now(&self) -> i64 {
        self.0.load(AtomicOrdering::Relaxed)
    }

    fn set(&self, time: i64) {
        self.0.store(time, AtomicOrdering::Relaxed);
    }
}

/// A discrete-event simulator. Time is an integer number of picoseconds.
///
/// Events scheduled for the same time run in the order they were scheduled, so a
/// run is deterministic.
#[pyclass(module = "cais._core", frozen)]
pub struct Simulator {
    clock: Clock,
    q: GilCell<Queue>,
}

/// The simulator's queue of events and its counters.
struct Queue {
    heap: BinaryHeap<Event>,
    /// The actions of queued events, by slot; `free`: slots not in use.
    actions: Vec<Option<Action>>,
    free: Vec<u32>,
    seq: u64,
    /// Events run so far, and by kind ([`KINDS`]; counted as they are taken out).
    events: i64,
    by_kind: [i64; KINDS.len()],
    /// Called as `tick(now, events)` every `tick_every` events (a progress report);
    /// None: the loop does not look.
    tick: Option<Py<PyAny>>,
    tick_every: i64,
    /// Trains that reached the end of their way with nobody else holding them, their
    /// fields cleared, for the units to fill again (`new_train`). Not capped: it never
    /// holds more objects than were trains at once (a cap of 4,096 made a 16-GPU
    /// `nvl72` NVLS layer allocate 1.26 M trains instead of 0.43 M, each a tracked
    /// object for the cyclic collector; docs/core.md); emptied when `run` finds the
    /// queue empty.
    spare: Vec<Py<Train>>,
    /// The heap's root is the event that ran last (its action taken): the next event
    /// queued takes its place with one sift down, where popping it and pushing the
    /// new one would each walk the heap; the next `pop` removes it if none came.
    vacant: bool,
}

impl Queue {
    /// Queue an action at `time`. Refused (the queue unchanged) past what a key
    /// holds: 2^24 events waiting at once, or 2^40 scheduled in one run.
    fn push(&mut self, time: i64, action: Action) -> PyResult<()> {
        let seq = self.reserve()?;
        self.push_as(time, seq, action)
    }

    /// The schedule order of an event to be queued later (`push_as`).
    #[inline]
    fn reserve(&mut self) -> PyResult<u64> {
        if self.seq >= MAX_SEQ {
            return Err(too_many_scheduled());
        }
        self.seq += 1;
        Ok(self.seq)
    }

    /// Queue an action at `time` with the schedule order `seq` reserved for it.
    #[inline]
    fn push_as(&mut self, time: i64, seq: u64, action: Action) -> PyResult<()> {
        debug_assert!(time >= 0, "times are not negative");
        let slot = match self.free.pop() {
            Some(slot) => {
                self.actions[slot as usize] = Some(action);
                slot
            }
            None => {
                if self.actions.len() > SLOT_MASK as usize {
                    return Err(too_many_waiting());
                }
                self.actions.push(Some(action));
                (self.actions.len() - 1) as u32
            }
        };
        let e = Event::new(time, seq, slot);
        if self.vacant {
            self.vacant = false;
            *self.heap.peek_mut().expect("a vacant root") = e; // sifts down when dropped
        } else {
            self.heap.push(e);
        }
        Ok(())
    }

    /// Remove the vacant root, if there is one: the heap holds only waiting events.
    fn settle(&mut self) {
        if self.vacant {
            self.vacant = false;
            self.heap.pop();
        }
    }

    /// The earliest event (its time and action), if any is due by `until`.
    fn pop(&mut self, until: Option<i64>) -> Option<(i64, Action)> {
        self.settle();
        let e = self.heap.peek()?;
        let (time, slot) = (e.time(), e.slot());
        if until.is_some_and(|u| time > u) {
            return None;
        }
        self.vacant = true; // it stays at the root until the next event is queued
        let action = self.actions[slot].take().expect("a queued event has its action");
        self.free.push(slot as u32);
        self.by_kind[action.kind()] += 1;
        self.look_ahead();
        Some((time, action))
    }

    /// Prefetch for the events to come while this one runs: what the next event's
    /// action touches (its slot was asked for one event earlier), and the slot of the
    /// one after it (the earlier of the root's children). An event queued meanwhile
    /// may come first instead; the hints are then wasted, nothing else.
    #[inline]
    fn look_ahead(&self) {
        // the root is the event about to run (vacant): the next is the earlier of its
        // children, and the one after it one of their children
        let heap = self.heap.as_slice();
        let earlier = |i: usize| match (heap.get(i), heap.get(i + 1)) {
            (Some(a), Some(b)) => Some((if a.key < b.key { i } else { i + 1 }, if a.key < b.key { a } else { b })),
            (Some(a), None) => Some((i, a)),
            _ => None,
        };
        let Some((at, next)) = earlier(1) else {
            return;
        };
        if let Some(action) = &self.actions[next.slot()] {
            action.prefetch();
        }
        if let Some((_, e)) = earlier(2 * at + 1) {
            // a slot may straddle two lines
            prefetch(self.actions.as_ptr().wrapping_add(e.slot()) as *const u8, 2);
        }
    }
}

/// The error of a run that schedules more events than a key's order holds.
#[cold]
fn too_many_scheduled() -> PyErr {
    PyValueError::new_err(format!("a simulation schedules at most {MAX_SEQ} events"))
}

/// The error of a queue asked to hold more events than a key's slot holds.
#[cold]
fn too_many_waiting() -> PyErr {
    PyValueError::new_err(format!(
        "at most {} events may wait in the queue at once",
        SLOT_MASK + 1
    ))
}

impl Simulator {
    /// The present time (picoseconds).
    pub(crate) fn now(&self) -> i64 {
        self.clock.now()
    }

    /// The clock, for a unit that reads the time often.
    pub(crate) fn clock(&self) -> Clock {
        self.clock.clone()
    }

    /// Schedule an action at `time`, which must not be in the past.
    pub(crate) fn schedule(&self, py: Python<'_>, time: i64, action: Action) -> PyResult<()> {
        let now = self.now();
        if time < now {
            return Err(PyValueError::new_err(format!(
                "event scheduled in the past: {time} < {now}"
            )));
        }
        self.push(py, time, action)
    }

    /// A train with `state`, for a unit of the core to send: a spare one if the
    /// simulator has one, else a new object. A train object costs its allocation,
    /// the cyclic collector's tracking and its release, more than a short hop's
    /// other work; most trains end where the core delivers them, so their objects are
    /// reused there (`recycle`). Which object a train is never changes a result.
    pub(crate) fn new_train<'py>(&self, py: Python<'py>, state: TrainState) -> PyResult<Bound<'py, Train>> {
        let spare = self.q.borrow_mut(py).spare.pop();
        match spare {
            Some(t) => {
                let t = t.into_bound(py);
                let blank = std::mem::replace(&mut *t.get().st(py), state);
                // `recycle` cleared it: it holds no reference, and dropping it would only
                // read PyO3's thread-local attach count for nothing
                std::mem::forget(blank);
                Ok(t)
            }
            None => Bound::new(py, Train::from(state)),
        }
    }

    /// Keep a delivered train's object for `new_train` if nothing else holds it (its
    /// fields cleared now, so that what they hold is released as it would have been).
    /// (The input train a switch chip's copy points at is not kept with its last copy:
    /// measured, that held more spare trains at a collective's peak, 78 against 74 MB on
    /// a 1 GiB staged NVLS AllReduce, for 0.4 % more instructions.)
    pub(crate) fn recycle(&self, py: Python<'_>, train: Bound<'_, Train>) {
        if train.get_refcnt() != 1 {
            return;
        }
        let held = train.get().st(py).take_held();
        held.release(py); // may run Python (a closure's last reference): no borrow is held
        self.q.borrow_mut(py).spare.push(train.unbind());
    }

    /// Schedule an action at `time` (the caller has checked it is not in the past).
    #[inline]
    pub(crate) fn push(&self, py: Python<'_>, time: i64, action: Action) -> PyResult<()> {
        self.q.borrow_mut(py).push(time, action)
    }

    /// The schedule order of an event that will be queued later with `push_as`: it
    /// runs where an event scheduled now would (before any scheduled after this call
    /// for the same time), however late it is queued, if queued before its time.
    #[inline]
    pub(crate) fn reserve(&self, py: Python<'_>) -> PyResult<u64> {
        self.q.borrow_mut(py).reserve()
    }

    /// Queue an action at `time` in the schedule order `seq` reserved for it.
    #[inline]
    pub(crate) fn push_as(&self, py: Python<'_>, time: i64, seq: u64, action: Action) -> PyResult<()> {
        self.q.borrow_mut(py).push_as(time, seq, action)
    }
}

fn dispatch(py: Python<'_>, sim: &Bound<'_, Simulator>, action: Action) -> PyResult<()> {
    match action {
        // each `Py` is bound before it is dropped: a `Bound` drops without reading
        // PyO3's thread-local attach count, as a `Py` would, once per event
        Action::Call(f, args) => {
            f.into_bound(py).call1(args.into_bound(py))?;
        }
        Action::Arbitrate(ch, generation, _) => Channel::arbitrate(&ch.into_bound(py), generation)?,
        Action::Arrive(ch, train, deliver) => {
            let train = train.into_bound(py);
            let ch = ch.into_bound(py);
            let payload = train.get().st(py).payload;
            Channel::arrived(&ch, payload)?; // the next train on its wire is queued
            deliver.deliver(train.clone())?;
            sim.get().recycle(py, train);
        }
        Action::Step(p) => Process::step(&p.into_bound(py), py.None())?,
        Action::Due(unit, what, train) => {
            let train = train.map(|t| t.into_bound(py));
            unit.on_event(
                py,
                UnitEvent::Due {
                    sim,
                    what,
                    train: train.clone(),
                },
            )?;
            if let Some(t) = train {
                sim.get().recycle(py, t);
            }
        }
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
            clock: Clock::default(),
            q: GilCell::new(Queue {
                heap: BinaryHeap::new(),
                actions: Vec::new(),
                free: Vec::new(),
                seq: 0,
                events: 0,
                by_kind: [0; KINDS.len()],
                tick: None,
                tick_every: Self::TICK_EVERY,
                spare: Vec::new(),
                vacant: false,
            }),
        }
    }

    /// Run `fn(*args)` at absolute time `time` (not before now).
    #[pyo3(signature = (time, r#fn, *args))]
    fn at(&self, py: Python<'_>, time: i64, r#fn: Py<PyAny>, args: Py<PyTuple>) -> PyResult<()> {
        self.schedule(py, time, Action::Call(r#fn, args))
    }

    /// Run `fn(*args)` `delay` picoseconds from now.
    #[pyo3(signature = (delay, r#fn, *args))]
    fn after(&self, py: Python<'_>, delay: i64, r#fn: Py<PyAny>, args: Py<PyTuple>) -> PyResult<()> {
        self.at(py, self.now() + delay, r#fn, args)
    }

    /// Events run so far.
    #[getter]
    fn events(&self, py: Python<'_>) -> i64 {
        self.q.borrow(py).events
    }

    #[setter]
    fn set_events(&self, py: Python<'_>, events: i64) {
        self.q.borrow_mut(py).events = events;
    }

    /// Events run so far by kind: a Python call, a channel's arbitration (its wire is
    /// free: the next train goes), a train's arrival at a channel's far end, a
    /// program's step after a delay, a unit's own timed event.
    #[getter]
    fn events_by_kind(&self, py: Python<'_>) -> std::collections::BTreeMap<&'static str, i64> {
        let q = self.q.borrow(py);
        KINDS.iter().copied().zip(q.by_kind).collect()
    }

    /// Called as `tick(now, events)` every `tick_every` events (a progress report);
    /// None: the loop does not look.
    #[getter]
    fn tick(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.q.borrow(py).tick.as_ref().map(|t| t.clone_ref(py))
    }

    #[setter]
    fn set_tick(&self, py: Python<'_>, tick: Option<Py<PyAny>>) {
        self.q.borrow_mut(py).tick = tick;
    }

    #[getter]
    fn tick_every(&self, py: Python<'_>) -> i64 {
        self.q.borrow(py).tick_every
    }

    #[setter]
    fn set_tick_every(&self, py: Python<'_>, every: i64) {
        self.q.borrow_mut(py).tick_every = every;
    }

    /// The present time (picoseconds).
    #[getter(now)]
    fn py_now(&self) -> i64 {
        self.now()
    }

    /// Events waiting in the queue.
    #[getter]
    fn pending(&self, py: Python<'_>) -> usize {
        let mut q = self.q.borrow_mut(py);
        q.settle();
        q.heap.len()
    }

    /// Time of the next event, None when nothing is scheduled.
    fn next_time(&self, py: Python<'_>) -> Option<i64> {
        let mut q = self.q.borrow_mut(py);
        q.settle();
        q.heap.peek().map(Event::time)
    }

    /// Process events until the queue is empty (or past `until`); return now.
    #[pyo3(signature = (until = None))]
    fn run(slf: &Bound<'_, Self>, until: Option<i64>) -> PyResult<i64> {
        let py = slf.py();
        let me = slf.get();
        let (tick, every) = {
            let q = me.q.borrow(py);
            (q.tick.as_ref().map(|t| t.clone_ref(py)), q.tick_every.max(1))
        };
        let mut count: i64 = 0;
        // the event counts at which the loop next looks for Ctrl-C and calls `tick`
        // (one comparison per event instead of a division)
        let mut next_look = SIGNAL_CHECK_EVERY.min(if tick.is_some() { every } else { i64::MAX });
        let (mut next_signal, mut next_tick) = (SIGNAL_CHECK_EVERY, every);
        let mut outcome = Ok(());
        loop {
            let Some((time, action)) = me.q.borrow_mut(py).pop(until) else {
                break;
            };
            me.clock.set(time);
            if let Err(err) = dispatch(py, slf, action) {
                outcome = Err(err);
                break;
            }
            count += 1;
            if count < next_look {
                continue;
            }
            if count == next_signal {
                // a stretch of the core's own events runs no Python: let Ctrl-C in
                next_signal += SIGNAL_CHECK_EVERY;
                if let Err(err) = py.check_signals() {
                    outcome = Err(err);
                    break;
                }
            }
            if let Some(t) = &tick {
                if count == next_tick {
                    next_tick += every;
                    let total = me.q.borrow(py).events + count;
                    if let Err(err) = t.call1(py, (time, total)) {
                        outcome = Err(err);
                        break;
                    }
                }
            }
            next_look = next_signal.min(if tick.is_some() { next_tick } else { i64::MAX });
        }
        let spare = {
            let mut q = me.q.borrow_mut(py);
            q.settle();
            q.events += count;
            // the queue ran dry: nothing is left to send, so the kept trains go now rather
            // than with the simulator (which a reference cycle may keep until the cyclic
            // collector's next full pass, while a sweep's worker runs its next point)
            if q.heap.is_empty() {
                std::mem::take(&mut q.spare)
            } else {
                Vec::new()
            }
        };
        drop(spare);
        outcome.map(|()| me.now())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(q) = self.q.during_gc() else {
            return Ok(());
        };
        visit.call(&q.tick)?;
        for t in &q.spare {
            visit.call(t)?;
        }
        for action in q.actions.iter().flatten() {
            match action {
                Action::Call(f, a) => {
                    visit.call(f)?;
                    visit.call(a)?;
                }
                Action::Arbitrate(c, ..) => visit.call(c)?,
                Action::Arrive(c, t, d) => {
                    visit.call(c)?;
                    visit.call(t)?;
                    d.visit(&visit)?;
                }
                Action::Step(p) => visit.call(p)?,
                Action::Due(u, _, t) => {
                    u.visit(&visit)?;
                    visit.call(t)?;
                }
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut q) = self.q.during_gc_mut() {
            q.tick = None;
            q.heap.clear();
            q.vacant = false;
            q.actions.clear();
            q.free.clear();
            q.spare.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_by_time_then_schedule_order_and_slots_are_reused() {
        Python::initialize();
        Python::attach(|py| {
            let sim = Simulator::new();
            let mut q = sim.q.borrow_mut(py);
            let call = |i: i64| Action::Call(py.None(), PyTuple::new(py, [i]).unwrap().unbind());
            for (i, time) in [10, 5, 10, 5, 0].into_iter().enumerate() {
                q.push(time, call(i as i64)).unwrap();
            }
            let mut order = Vec::new();
            while let Some((time, action)) = q.pop(None) {
                let Action::Call(_, args) = action else {
                    panic!("a call was queued")
                };
                order.push((time, args.bind(py).get_item(0).unwrap().extract::<i64>().unwrap()));
            }
            assert_eq!(order, vec![(0, 4), (5, 1), (5, 3), (10, 0), (10, 2)]);
            // what popped frees its slot: the next events reuse them
            q.push(20, call(5)).unwrap();
            q.push(30, call(6)).unwrap();
            assert_eq!(q.actions.len(), 5);
            assert!(q.pop(Some(19)).is_none(), "nothing is due by 19");
            assert_eq!(q.pop(Some(25)).map(|(t, _)| t), Some(20));
            assert_eq!(
                q.by_kind,
                [6, 0, 0, 0, 0],
                "each event counted by its kind as it is taken out"
            );
        });
    }

    #[test]
    fn an_event_queued_while_one_runs_takes_the_vacant_root_and_the_order_holds() {
        Python::initialize();
        Python::attach(|py| {
            let sim = Simulator::new();
            let mut q = sim.q.borrow_mut(py);
            let call = |i: i64| Action::Call(py.None(), PyTuple::new(py, [i]).unwrap().unbind());
            for (i, time) in [(0, 10), (1, 20), (2, 30), (3, 40)] {
                q.push(time, call(i)).unwrap();
            }
            let id = |a: Action| match a {
                Action::Call(_, args) => args.bind(py).get_item(0).unwrap().extract::<i64>().unwrap(),
                _ => panic!("a call was queued"),
            };
            let (t, a) = q.pop(None).unwrap();
            assert_eq!((t, id(a)), (10, 0));
            assert!(q.vacant && q.heap.len() == 4, "the event that ran stays at the root");
            // queued while it "runs": one later than some waiting, one earlier than all
            q.push(35, call(4)).unwrap();
            assert!(!q.vacant && q.heap.len() == 4, "the first takes the root's place");
            q.push(15, call(5)).unwrap();
            assert_eq!(q.heap.len(), 5);
            let mut order = Vec::new();
            while let Some((t, a)) = q.pop(None) {
                order.push((t, id(a)));
                if order.len() == 2 {
                    q.settle(); // as `pending` does: no event was queued, the root goes
                    assert!(!q.vacant && q.heap.len() == 3);
                }
            }
            assert_eq!(order, vec![(15, 5), (20, 1), (30, 2), (35, 4), (40, 3)]);
            assert!(q.heap.is_empty() && !q.vacant, "the last pop leaves nothing behind");
        });
    }

    #[test]
    fn an_event_queued_late_in_the_order_it_reserved_runs_where_it_would_have() {
        Python::initialize();
        Python::attach(|py| {
            let sim = Simulator::new();
            let call = |i: i64| Action::Call(py.None(), PyTuple::new(py, [i]).unwrap().unbind());
            let early = sim.reserve(py).unwrap(); // reserved first, queued last
            sim.push(py, 10, call(1)).unwrap();
            sim.push(py, 5, call(2)).unwrap();
            sim.push_as(py, 10, early, call(0)).unwrap();
            let mut q = sim.q.borrow_mut(py);
            let mut order = Vec::new();
            while let Some((time, action)) = q.pop(None) {
                let Action::Call(_, args) = action else {
                    panic!("a call was queued")
                };
                order.push((time, args.bind(py).get_item(0).unwrap().extract::<i64>().unwrap()));
            }
            assert_eq!(order, vec![(5, 2), (10, 0), (10, 1)]);
        });
    }

    #[test]
    fn a_delivered_train_nobody_else_holds_is_reused_cleared_and_a_held_one_is_not() {
        Python::initialize();
        Python::attach(|py| {
            let sim = Simulator::new();
            let mut state = TrainState::blank(64, 80, 80, 1, 0, 1);
            state.data = Some(PyTuple::new(py, [7]).unwrap().into_any().unbind());
            let first = sim.new_train(py, state).unwrap();
            let ptr = first.as_ptr();
            let held = first.clone();
            sim.recycle(py, first);
            assert_eq!(sim.q.borrow(py).spare.len(), 0, "a train someone holds is not reused");
            assert_eq!(held.get().st(py).payload, 64, "nor cleared");
            sim.recycle(py, held);
            assert_eq!(sim.q.borrow(py).spare.len(), 1, "the last holder's train is kept");
            let again = sim.new_train(py, TrainState::blank(8, 24, 24, 2, 3, 4)).unwrap();
            assert_eq!(again.as_ptr(), ptr, "and handed out again");
            let t = again.get().st(py);
            assert_eq!((t.payload, t.kind, t.src, t.dst), (8, 2, 3, 4));
            assert!(t.data.is_none(), "with nothing of its earlier life");
            assert_eq!(sim.q.borrow(py).spare.len(), 0);
        });
    }

    #[test]
    fn the_kept_trains_go_when_the_queue_runs_dry_and_not_before() {
        Python::initialize();
        Python::attach(|py| {
            let sim = Bound::new(py, Simulator::new()).unwrap();
            let me = sim.get();
            let trains: Vec<_> = (0..3)
                .map(|_| me.new_train(py, TrainState::blank(8, 24, 24, 2, 0, 1)).unwrap())
                .collect();
            for t in trains {
                me.recycle(py, t);
            }
            assert_eq!(me.q.borrow(py).spare.len(), 3);
            let noop = py.eval(c"lambda: None", None, None).unwrap().unbind();
            for time in [10, 20] {
                me.push(py, time, Action::Call(noop.clone_ref(py), PyTuple::empty(py).unbind()))
                    .unwrap();
            }
            Simulator::run(&sim, Some(15)).unwrap();
            assert_eq!(me.q.borrow(py).spare.len(), 3, "kept while events wait");
            Simulator::run(&sim, None).unwrap();
            assert_eq!(
                (me.now(), me.q.borrow(py).spare.len()),
                (20, 0),
                "let go once none is left"
            );
        });
    }
}
