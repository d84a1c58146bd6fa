//! A GPU's thread-block dispatcher: it puts the TBs of launched kernels on free SMs,
//! one TB per SM, as Hopper's TB scheduler does without stream priorities.
//!
//! Kernels are served in the order they became dispatchable (launch time plus launch
//! overhead), a higher `priority` first when some kernel has one (a CUDA stream
//! priority; equal ones in that order); each takes every free SM it may use (its SM
//! set) before the next is looked at, and TBs run to completion (no preemption).
//! Dispatching waits for the end of the instant, so TBs that finish together free
//! their SMs before new ones start (waves). A kernel's `tbs[i](sm, busy)` (Python)
//! makes what its SM runs (`engine::wait::Process`): a generator, or a `TbPlan`; the
//! dispatcher takes it out of the list as it starts the TB (None is left in its place).
//!
//! Launch on ready: a kernel may hold some TBs back (`gates`, per TB the number of
//! gates still shut: the data or flags its first step waits for, a TB-group release).
//! Such a TB is not placed on an SM until its last gate opens (`open`); within a kernel
//! TBs are placed in the order they became ready (at launch: in index order), as a
//! hardware scheduler with a ready queue would. Each kernel keeps the SM time its TBs
//! held SMs (`tb_ps`) and the part of it they spent waiting (`tb_wait_ps`, as each
//! process counts it), set on the kernel when it ends.

use std::collections::VecDeque;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::sim::{Action, Simulator};
use crate::engine::unit::{unexpected, Event, Handler, UnitRef};
use crate::engine::wait::{Process, Signal};

/// The dispatcher's own timed event: the end of an instant in which SMs freed or a
/// kernel became dispatchable.
const DISPATCH: u8 = 0;

/// A set of SMs, as bits (SM i: bit i of word i / 64).
#[derive(Clone)]
struct SmSet(Vec<u64>);

impl SmSet {
    fn empty(sms: usize) -> Self {
        SmSet(vec![0; sms.div_ceil(64).max(1)])
    }

    fn full(sms: usize) -> Self {
        let mut set = SmSet::empty(sms);
        for sm in 0..sms {
            set.insert(sm);
        }
        set
    }

    fn insert(&mut self, sm: usize) {
        if sm / 64 >= self.0.len() {
            self.0.resize(sm / 64 + 1, 0);
        }
        self.0[sm / 64] |= 1 << (sm % 64);
    }

    fn remove(&mut self, sm: usize) {
        self.0[sm / 64] &= !(1 << (sm % 64));
    }

    /// The lowest-numbered SM in both this set and `mask` (None: `mask` is every SM).
    fn lowest(&self, mask: Option<&SmSet>) -> Option<usize> {
        for (w, &bits) in self.0.iter().enumerate() {
            let usable = match mask {
                None => bits,
                Some(m) => bits & m.0.get(w).copied().unwrap_or(0),
            };
            if usable != 0 {
                return Some(w * 64 + usable.trailing_zeros() as usize);
            }
        }
        None
    }

    fn count(&self) -> i64 {
        self.0.iter().map(|w| w.count_ones() as i64).sum()
    }
}

/// A launched kernel with TBs to run or running.
struct KernelSlot {
    /// The Python kernel: its `started_at` and `finished_at` are set here.
    kernel: Py<PyAny>,
    name: String,
    tbs: Py<PyList>,
    count: usize,
    /// The TBs ready to start, in the order they became ready; per TB the gates still
    /// shut (empty: none was gated); how many TBs have been placed, and are running.
    ready: VecDeque<usize>,
    shut: Vec<u32>,
    placed: usize,
    running: usize,
    /// SM time its TBs held SMs, and the part they spent waiting (picoseconds).
    tb_ps: i64,
    waited: i64,
    /// The SMs it may use (None: every SM).
    mask: Option<SmSet>,
    priority: i64,
    /// Whether its TBs' HBM phases are timed against the GPU's share.
    hbm_phases: bool,
    done: Py<Signal>,
    /// Fired when its last TB has been placed on an SM (None: nobody asked).
    placed_all: Option<Py<Signal>>,
    started: bool,
}

/// One GPU's TB dispatcher (the module's docs); `hbm`: the share that times the HBM
/// phases of kernels with `hbm_phases`; `slowdown`: factor on the compute delays of
/// its TBs (a straggler); `tb_log`: (kernel, SM, start, end) of every TB when set to
/// a list (None: not recorded).
#[pyclass(module = "cais._core", frozen)]
pub struct TbDispatcher {
    st: GilCell<TbDispatcherState>,
}

/// The mutable state of a [`TbDispatcher`] (see there), borrowed while holding the GIL.
pub(crate) struct TbDispatcherState {
    sim: Py<Simulator>,
    sms: usize,
    free: SmSet,
    busy: i64,
    tbs_finished: i64,
    /// Launched kernels by id (None once finished), and the ids free for reuse.
    slots: Vec<Option<KernelSlot>>,
    spare: Vec<usize>,
    /// Kernels with TBs not yet placed, in the order they became dispatchable.
    queue: Vec<usize>,
    prioritised: bool,
    pending: bool,
    hbm: Option<UnitRef>,
    slowdown: f64,
    tb_log: Option<Vec<(String, i64, i64, i64)>>,
}

unit!(TbDispatcher, TbDispatcherState);

impl TbDispatcherState {
    fn slot(&mut self, id: usize) -> &mut KernelSlot {
        self.slots[id].as_mut().expect("a live kernel")
    }
}

impl TbDispatcher {
    /// Dispatch at the end of the current instant (once however often asked).
    fn request(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let mut me = slf.st();
        if me.pending {
            return Ok(());
        }
        me.pending = true;
        let sim = me.sim.clone_ref(py);
        drop(me);
        let s = sim.get();
        s.push(py, s.now(), Action::Due(UnitRef::of_bound(slf), DISPATCH, None))
    }

    /// Place TBs on the free SMs, kernel by kernel, then start their programs.
    fn dispatch(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (starts, busy, now, placed) = {
            let mut me = slf.st();
            me.pending = false;
            let mut order = me.queue.clone();
            if me.prioritised {
                let slots = &me.slots;
                let priority = |id: &usize| -slots[*id].as_ref().expect("queued").priority;
                order.sort_by_key(priority); // stable: launch order among equal priorities
            }
            let mut starts: Vec<(usize, usize, usize)> = Vec::new();
            let mut free = std::mem::replace(&mut me.free, SmSet::empty(0));
            let mut emptied: Vec<usize> = Vec::new();
            for id in order {
                let k = me.slot(id);
                while let Some(&index) = k.ready.front() {
                    let Some(sm) = free.lowest(k.mask.as_ref()) else {
                        break;
                    };
                    free.remove(sm);
                    k.ready.pop_front();
                    starts.push((id, sm, index));
                    k.placed += 1;
                    k.running += 1;
                }
                if k.placed == k.count {
                    emptied.push(id);
                }
            }
            me.queue.retain(|id| !emptied.contains(id));
            me.busy = me.sms as i64 - free.count();
            me.free = free;
            let now = me.sim.get().now();
            let placed: Vec<Py<Signal>> = emptied.iter().filter_map(|&id| me.slot(id).placed_all.take()).collect();
            (starts, me.busy, now, placed)
        };
        for (id, sm, index) in starts {
            let (kernel, program, hbm, first, sim, slowdown) = {
                let mut me = slf.st();
                let (sim, slowdown) = (me.sim.clone_ref(py), me.slowdown);
                let hbm = me.hbm.as_ref().map(|h| h.clone_ref(py));
                let k = me.slot(id);
                let first = !k.started;
                k.started = true;
                // taken out of the kernel's list (which keeps its length, the kernel's TB
                // count): what the TB's factory holds is freed once it has made the TB,
                // not with the kernel, and never walked by the cyclic collector after
                let tbs = k.tbs.bind(py);
                let program = tbs.get_item(index)?.unbind();
                tbs.set_item(index, py.None())?;
                let hbm = if k.hbm_phases { hbm } else { None };
                (k.kernel.clone_ref(py), program, hbm, first, sim, slowdown)
            };
            if first {
                kernel.bind(py).setattr("started_at", now)?;
            }
            // a TB the core makes is planned without a Python call or a plan object
            let planned = match UnitRef::of(program.bind(py)) {
                Some(unit) => unit.plan(py, sm, busy as usize)?,
                None => None,
            };
            let gen = match planned {
                Some(plan) => Ok(plan.into_steps()),
                None => Err(program.bind(py).call1((sm, busy))?.unbind()),
            };
            // the process times the program's HBM phases against this GPU's share and
            // stretches its compute delays by the GPU's slowdown; its end frees the SM
            let then = (UnitRef::of_bound(slf), [id as i64, sm as i64, now]);
            Process::spawn_then(py, &sim, gen, then, hbm, slowdown)?;
        }
        for sig in placed {
            Signal::fire_now(sig.bind(py), now, py.None())?;
        }
        Ok(())
    }

    /// A TB of kernel `id` ended on `sm`: its SM is free; the kernel is done with its
    /// last TB.
    fn ended(slf: &Bound<'_, Self>, id: usize, sm: usize, start: i64, waited: i64) -> PyResult<()> {
        let py = slf.py();
        let finished = {
            let mut me = slf.st();
            let now = me.sim.get().now();
            me.tbs_finished += 1;
            me.free.insert(sm);
            me.busy -= 1;
            let k = me.slot(id);
            k.running -= 1;
            k.tb_ps += now - start;
            k.waited += waited;
            let last = k.running == 0 && k.placed == k.count;
            let name = me.tb_log.is_some().then(|| me.slot(id).name.clone());
            if let (Some(log), Some(name)) = (me.tb_log.as_mut(), name) {
                log.push((name, sm as i64, start, now));
            }
            if last {
                let k = me.slots[id].take().expect("a live kernel");
                me.spare.push(id);
                Some((k.kernel, k.done, now, k.tb_ps, k.waited))
            } else {
                None
            }
        };
        if let Some((kernel, done, now, tb_ps, waited)) = finished {
            let kernel = kernel.bind(py);
            kernel.setattr("tb_ps", tb_ps)?;
            kernel.setattr("tb_wait_ps", waited)?;
            kernel.setattr("finished_at", now)?;
            Signal::fire_now(done.bind(py), now, py.None())?;
        }
        TbDispatcher::request(slf)
    }
}

impl Handler for TbDispatcher {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            Event::Due { what: DISPATCH, .. } => TbDispatcher::dispatch(slf),
            // a TB's program ended: [its kernel's slot, its SM, when it started]
            Event::Ended {
                args: [id, sm, start],
                waited,
            } => TbDispatcher::ended(slf, id as usize, sm as usize, start, waited),
            _ => Err(unexpected("TbDispatcher")),
        }
    }
}

#[pymethods]
impl TbDispatcher {
    #[new]
    #[pyo3(signature = (sim, sms, hbm = None, slowdown = 1.0))]
    fn new(sim: Py<Simulator>, sms: usize, hbm: Option<Bound<'_, PyAny>>, slowdown: f64) -> PyResult<Self> {
        let hbm = match hbm {
            Some(h) => Some(UnitRef::expect(&h, "a pacer (an HbmShare)")?),
            None => None,
        };
        Ok(TbDispatcher::from(TbDispatcherState {
            sim,
            sms,
            free: SmSet::full(sms),
            busy: 0,
            tbs_finished: 0,
            slots: Vec::new(),
            spare: Vec::new(),
            queue: Vec::new(),
            prioritised: false,
            pending: false,
            hbm,
            slowdown,
            tb_log: None,
        }))
    }

    /// Make `kernel` dispatchable now: its `tbs` (TB programs), the SMs it may use
    /// (`sms`; None: every SM), its `priority`, whether its TBs' HBM phases are timed
    /// (`hbm_phases`), and `done`, fired when its last TB ends; `gates`, per TB, the
    /// gates still shut before it may be placed (None: none; each opened by `open`).
    /// Its `started_at` and `finished_at` are set when its first TB starts and its last
    /// ends, `tb_ps` and `tb_wait_ps` then too; `placed`, if given, fires when its last
    /// TB has been placed. Returns the kernel's id, for `open`.
    #[pyo3(signature = (kernel, name, tbs, sms, priority, hbm_phases, done, gates = None, placed = None))]
    #[allow(clippy::too_many_arguments)] // the Python method's parameters
    fn enqueue(
        slf: &Bound<'_, Self>,
        kernel: Py<PyAny>,
        name: String,
        tbs: Bound<'_, PyList>,
        sms: Option<Vec<usize>>,
        priority: i64,
        hbm_phases: bool,
        done: Py<Signal>,
        gates: Option<Vec<u32>>,
        placed: Option<Py<Signal>>,
    ) -> PyResult<usize> {
        let count = tbs.len();
        let shut = gates.unwrap_or_default();
        if !shut.is_empty() && shut.len() != count {
            return Err(PyValueError::new_err(format!(
                "{name}: {} gate counts for {count} TBs",
                shut.len()
            )));
        }
        let ready: VecDeque<usize> = (0..count).filter(|&i| shut.get(i).copied().unwrap_or(0) == 0).collect();
        let id = {
            let mut me = slf.st();
            let mask = sms.map(|list| {
                let mut set = SmSet::empty(me.sms);
                for sm in list {
                    set.insert(sm);
                }
                set
            });
            let slot = KernelSlot {
                kernel,
                name,
                count,
                tbs: tbs.unbind(),
                ready,
                shut,
                placed: 0,
                running: 0,
                tb_ps: 0,
                waited: 0,
                mask,
                priority,
                hbm_phases,
                done,
                placed_all: placed,
                started: false,
            };
            let id = match me.spare.pop() {
                Some(id) => {
                    me.slots[id] = Some(slot);
                    id
                }
                None => {
                    me.slots.push(Some(slot));
                    me.slots.len() - 1
                }
            };
            me.queue.push(id);
            if priority != 0 {
                me.prioritised = true;
            }
            id
        };
        TbDispatcher::request(slf)?;
        Ok(id)
    }

    /// One of the gates of TB `index` of kernel `id` has opened; at its last, the TB is
    /// ready to be placed.
    fn open(slf: &Bound<'_, Self>, id: usize, index: usize) -> PyResult<()> {
        {
            let mut me = slf.st();
            let Some(k) = me.slots.get_mut(id).and_then(Option::as_mut) else {
                return Err(PyValueError::new_err(format!(
                    "no launched kernel {id} to open a TB of"
                )));
            };
            let Some(left) = k.shut.get_mut(index).filter(|n| **n > 0) else {
                return Err(PyValueError::new_err(format!(
                    "{}: TB {index} has no gate shut",
                    k.name
                )));
            };
            *left -= 1;
            if *left > 0 {
                return Ok(());
            }
            k.ready.push_back(index);
        }
        TbDispatcher::request(slf)
    }

    /// Kernels with TBs not yet placed on an SM.
    #[getter]
    fn queued(&self, py: Python<'_>) -> usize {
        self.st(py).queue.len()
    }

    /// What was recorded (None: not recording); set a list to start recording (what
    /// to start from), None to stop.
    #[getter]
    fn tb_log(&self, py: Python<'_>) -> Option<Vec<(String, i64, i64, i64)>> {
        self.st(py).tb_log.clone()
    }

    #[setter]
    fn set_tb_log(&self, py: Python<'_>, log: Option<Vec<(String, i64, i64, i64)>>) {
        self.st(py).tb_log = log;
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        if let Some(h) = &me.hbm {
            h.visit(&visit)?;
        }
        for k in me.slots.iter().flatten() {
            visit.call(&k.kernel)?;
            visit.call(&k.tbs)?;
            visit.call(&k.done)?;
            if let Some(p) = &k.placed_all {
                visit.call(p)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.slots.clear();
            me.queue.clear();
        }
    }
}

properties!(TbDispatcher {
    /// SMs running a TB.
    busy: i64;
    /// TBs that have ended.
    tbs_finished: i64;
    slowdown: f64, set set_slowdown;
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sm_set_gives_its_lowest_sm_within_a_mask() {
        let mut free = SmSet::full(132);
        assert_eq!(free.count(), 132);
        assert_eq!(free.lowest(None), Some(0));
        free.remove(0);
        free.remove(1);
        assert_eq!(free.lowest(None), Some(2));
        let mut mask = SmSet::empty(132);
        mask.insert(70);
        mask.insert(1);
        assert_eq!(free.lowest(Some(&mask)), Some(70), "SM 1 is busy");
        free.remove(70);
        assert_eq!(free.lowest(Some(&mask)), None);
        free.insert(1);
        assert_eq!(free.lowest(Some(&mask)), Some(1));
        assert_eq!(free.count(), 130);
    }
}
