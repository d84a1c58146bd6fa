//! A GEMM-RS kernel's thread blocks made in the core (`kernels/remote_gemm.py`'s
//! `reduce_gemm`, timing mode, no closing fence): each TB's plan is its TB-group syncs,
//! its mainloop's HBM phase, its epilogue's reductions as a stream and its SM's port,
//! put together here when the dispatcher places the TB, without entering Python. Python
//! is entered once per tile (the first GPU to run it builds its epilogue plan, which
//! the GPUs share), once per busy-SM count (the mainloop's phase) and once per SM (its
//! slots and port).

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{unit, GilCell, Unit};
use crate::engine::unit::UnitRef;
use crate::engine::wait::{ByteBound, PlanStep, TbPlan};
use crate::hw::gpu::Endpoint;
use crate::hw::interleave::Interleave;
use crate::hw::sm_port::SmPort;
use crate::isa::stream::{RedPlan, RedStream};

/// The tiles' epilogue plans of one GEMM, shared by the GPUs that run it: a tile's plan
/// is built by the first GPU that takes it and dropped when the last has (`users`).
#[pyclass(module = "cais._core", frozen)]
pub struct TilePlans {
    st: GilCell<TilePlansState>,
}

pub(crate) struct TilePlansState {
    users: i64,
    plans: HashMap<(i64, i64, i64), (Py<RedPlan>, i64)>,
}

unit!(TilePlans, TilePlansState);

#[pymethods]
impl TilePlans {
    /// Plans that `users` GPUs each take once.
    #[new]
    fn new(users: i64) -> Self {
        TilePlans::from(TilePlansState {
            users,
            plans: HashMap::default(),
        })
    }

    /// Plans built and not yet taken by every GPU.
    fn __len__(&self, py: Python<'_>) -> usize {
        self.st(py).plans.len()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        for (plan, _) in me.plans.values() {
            visit.call(plan)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.plans.clear();
        }
    }
}

/// A GEMM-RS kernel's TBs on one GPU (see the module's docs). `syncs[phase]`: the TB
/// group a TB registers with before its work (0) and before its first remote access
/// (1), as `(base, per TB, members)`: TB `t` registers with group `base + t * per` at
/// the chip its address maps to (`interleave`); None: no registration. `phases.of(busy)`
/// gives the mainloop's HBM phase; `sm_state(sm)` an SM's `(window, bound, port,
/// piece)`; `build(i, j, piece)` a tile's epilogue plan; `add` the own rows' local add.
#[pyclass(module = "cais._core", frozen)]
pub struct ReduceTbs {
    st: GilCell<ReduceTbsState>,
}

type SmState = (Py<ByteBound>, Py<ByteBound>, Py<SmPort>, i64);

pub(crate) struct ReduceTbsState {
    gpu: Py<Endpoint>,
    src: i64,
    interleave: Py<Interleave>,
    syncs: [Option<(i64, i64, i64)>; 2],
    phases: Py<PyAny>,
    by_busy: Vec<Option<Py<PyAny>>>,
    sm_state: Py<PyAny>,
    per_sm: Vec<Option<SmState>>,
    tiles: Py<TilePlans>,
    build: Py<PyAny>,
    add: Py<PyAny>,
}

unit!(ReduceTbs, ReduceTbsState);

impl ReduceTbs {
    /// The TB of tile (i, j), the `t`-th launched, placed on `sm` with `busy` SMs busy.
    fn plan(&self, py: Python<'_>, t: i64, i: i64, j: i64, sm: usize, busy: usize) -> PyResult<TbPlan> {
        let mut steps = Vec::with_capacity(5);
        self.sync(py, &mut steps, t, 0);
        let phase = self.phase(py, busy)?;
        steps.push(PlanStep::Pace(phase));
        self.sync(py, &mut steps, t, 1);
        let (window, bound, port, piece) = self.sm(py, sm)?;
        let red = self.tile(py, i, j, piece)?;
        let (gpu, src, add) = {
            let me = self.st(py);
            (me.gpu.clone_ref(py), me.src, me.add.clone_ref(py))
        };
        let stream = RedStream::new(
            py,
            gpu,
            red.bind(py).as_any(),
            window,
            bound,
            port.clone_ref(py),
            Some(src),
            Some(add),
        )?;
        steps.push(PlanStep::Begin(UnitRef::new(Py::new(py, stream)?), [0; 3]));
        steps.push(PlanStep::Begin(UnitRef::new(port), [0; 3]));
        Ok(TbPlan::of_steps(steps))
    }

    /// TB `t`'s registration with its group of `phase`, if it has one.
    fn sync(&self, py: Python<'_>, steps: &mut Vec<PlanStep>, t: i64, phase: usize) {
        let me = self.st(py);
        if let Some((base, per, members)) = me.syncs[phase] {
            let group = base + t * per;
            let chip = me.interleave.borrow(py).chip_of(group);
            steps.push(PlanStep::Begin(
                UnitRef::new(me.gpu.clone_ref(py)),
                [chip, group, members],
            ));
        }
    }

    /// The mainloop's HBM phase with `busy` SMs busy (asked of Python once per count).
    fn phase(&self, py: Python<'_>, busy: usize) -> PyResult<Py<PyAny>> {
        if let Some(Some(p)) = self.st(py).by_busy.get(busy) {
            return Ok(p.clone_ref(py));
        }
        let phases = self.st(py).phases.clone_ref(py);
        let p = phases.bind(py).call_method1("of", (busy,))?.unbind();
        let mut me = self.st(py);
        if me.by_busy.len() <= busy {
            me.by_busy.resize_with(busy + 1, || None);
        }
        me.by_busy[busy] = Some(p.clone_ref(py));
        Ok(p)
    }

    /// SM `sm`'s window, bound, port and request piece (asked of Python once per SM).
    fn sm(&self, py: Python<'_>, sm: usize) -> PyResult<SmState> {
        let clone = |s: &SmState| (s.0.clone_ref(py), s.1.clone_ref(py), s.2.clone_ref(py), s.3);
        if let Some(Some(s)) = self.st(py).per_sm.get(sm) {
            return Ok(clone(s));
        }
        let f = self.st(py).sm_state.clone_ref(py);
        let s: SmState = f.bind(py).call1((sm,))?.extract()?;
        let mut me = self.st(py);
        if me.per_sm.len() <= sm {
            me.per_sm.resize_with(sm + 1, || None);
        }
        me.per_sm[sm] = Some(clone(&s));
        Ok(s)
    }

    /// Tile (i, j)'s epilogue plan with request pieces of `piece` bytes: built by the
    /// first GPU that takes it, dropped once every GPU has.
    fn tile(&self, py: Python<'_>, i: i64, j: i64, piece: i64) -> PyResult<Py<RedPlan>> {
        let tiles = self.st(py).tiles.clone_ref(py);
        let key = (i, j, piece);
        let found = tiles.get().st(py).plans.get(&key).map(|(p, _)| p.clone_ref(py));
        let plan = match found {
            Some(p) => p,
            None => {
                let build = self.st(py).build.clone_ref(py);
                let p: Py<RedPlan> = build.bind(py).call1((i, j, piece))?.extract()?;
                let mut t = tiles.get().st(py);
                let users = t.users;
                t.plans.insert(key, (p.clone_ref(py), users));
                p
            }
        };
        let mut t = tiles.get().st(py);
        let left = {
            let entry = t.plans.get_mut(&key).expect("a tile's plan just found or built");
            entry.1 -= 1;
            entry.1
        };
        if left == 0 {
            t.plans.remove(&key); // every GPU running the GEMM has it (memory)
        }
        Ok(plan)
    }
}

#[pymethods]
impl ReduceTbs {
    #[new]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        gpu: Py<Endpoint>,
        src: i64,
        interleave: Py<Interleave>,
        syncs: [Option<(i64, i64, i64)>; 2],
        phases: Py<PyAny>,
        sm_state: Py<PyAny>,
        tiles: Py<TilePlans>,
        build: Py<PyAny>,
        add: Py<PyAny>,
    ) -> Self {
        ReduceTbs::from(ReduceTbsState {
            gpu,
            src,
            interleave,
            syncs,
            phases,
            by_busy: Vec::new(),
            sm_state,
            per_sm: Vec::new(),
            tiles,
            build,
            add,
        })
    }

    /// The kernel's TB of tile (i, j), launched `t`-th: what the dispatcher calls.
    fn tb(slf: &Bound<'_, Self>, t: i64, i: i64, j: i64) -> ReduceTb {
        ReduceTb {
            kernel: slf.clone().unbind(),
            t,
            i,
            j,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        visit.call(&me.interleave)?;
        visit.call(&me.phases)?;
        for p in me.by_busy.iter().flatten() {
            visit.call(p)?;
        }
        visit.call(&me.sm_state)?;
        for (w, b, port, _) in me.per_sm.iter().flatten() {
            visit.call(w)?;
            visit.call(b)?;
            visit.call(port)?;
        }
        visit.call(&me.tiles)?;
        visit.call(&me.build)?;
        visit.call(&me.add)
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.by_busy.clear();
            me.per_sm.clear();
        }
    }
}

/// One TB of a [`ReduceTbs`] kernel: called with `(sm, busy)` when the dispatcher
/// places it, it returns the TB's plan.
#[pyclass(module = "cais._core", frozen)]
pub struct ReduceTb {
    kernel: Py<ReduceTbs>,
    t: i64,
    i: i64,
    j: i64,
}

#[pymethods]
impl ReduceTb {
    fn __call__(&self, py: Python<'_>, sm: usize, busy: usize) -> PyResult<TbPlan> {
        self.kernel.get().plan(py, self.t, self.i, self.j, sm, busy)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.kernel)
    }
}
