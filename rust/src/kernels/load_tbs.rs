//! A remote-loading GEMM's thread blocks made in the core (`kernels/remote_gemm.py`'s
//! `load_gemm`, timing mode: an AG-GEMM, a weight gradient over token-sharded
//! activations): each TB's plan is its TB-group syncs, the operands it waits for, its
//! mainloop's HBM phase, its remote loads as a stream, and the compute left after the
//! last has landed, put together here when the dispatcher places the TB, without
//! entering Python. Python is entered once per tile plan (the first TB to take it
//! builds its loads, which the GPUs and the tiles that load the same operand blocks
//! share), once per busy-SM count (the mainloop's phase) and once per row tile (the
//! signals its operands wait for).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{unit, GilCell, Unit};
use crate::engine::unit::UnitRef;
use crate::engine::wait::{ByteBound, Countdown, PlanStep, Signal, TbPlan};
use crate::hw::gpu::Endpoint;
use crate::hw::interleave::Interleave;
use crate::isa::kept::KeptLines;
use crate::isa::stream::{LoadPlan, LoadStream};
use crate::kernels::core_tb::CoreTb;
use crate::kernels::tb_parts::{ask_once, phase_step, Asked, TbSyncs};
use crate::kernels::tile_plans::TilePlans;

/// A remote-loading GEMM's TBs on one GPU (see the module's docs). `syncs`: the TB
/// groups a TB registers with ([`TbSyncs`]); `ready(i)`: the signals a TB of row tile
/// `i` waits for before loading; `phases.of(busy)`: the mainloop's HBM phase, which it
/// times itself; `window`: the bytes of loads an SM's TB keeps in flight, under the
/// GPU's `bound`; `kind`, `quorum`, `assemble`, `kept`: how the loads go out
/// (`LoadStream`); `build(key, 0, 0)`: a tile plan (a `LoadPlan`) and how many TBs take
/// it, shared through `tiles`; `rest`: `(num, den)`, the fraction of the mainloop's
/// compute left after its last load has landed.
#[pyclass(module = "cais._core", frozen)]
pub struct LoadTbs {
    st: GilCell<LoadTbsState>,
}

pub(crate) struct LoadTbsState {
    syncs: TbSyncs,
    src: i64,
    ready: Asked<Vec<Py<Signal>>>,
    phases: Asked<Py<PyAny>>,
    window: i64,
    bound: Py<ByteBound>,
    kind: i64,
    quorum: i64,
    assemble: Py<PyAny>,
    kept: Option<Py<KeptLines>>,
    tiles: Py<TilePlans>,
    build: Py<PyAny>,
    rest: (i64, i64),
}

unit!(LoadTbs, LoadTbsState);

impl LoadTbs {
    /// The TB `[t, i, key, scope]`: the `t`-th launched, of row tile `i`, taking tile
    /// plan `key` in load scope `scope`; placed with `busy` SMs busy.
    pub(crate) fn plan(&self, py: Python<'_>, [t, i, key, scope]: [i64; 4], busy: usize) -> PyResult<TbPlan> {
        let i = usize::try_from(i).map_err(|_| PyValueError::new_err(format!("row tile {i} is negative")))?;
        let mut steps = Vec::with_capacity(8);
        let early = self.st(py).syncs.register_early(py, t)?;
        steps.extend(self.st(py).syncs.step(py, t, 0));
        let ready = ask_once(
            py,
            &self.st,
            |s| &mut s.ready,
            i,
            |f| f.call1((i,))?.extract(),
            |v| v.iter().map(|s| s.clone_ref(py)).collect(),
        )?;
        steps.extend(ready.into_iter().map(PlanStep::Wait));
        steps.push(PlanStep::Mark);
        steps.push(phase_step(py, &self.st, |s| &mut s.phases, busy)?);
        let (tiles, build) = {
            let me = self.st(py);
            (me.tiles.clone_ref(py), me.build.clone_ref(py))
        };
        let plan = tiles.get().take(py, (key, 0, 0), &build)?;
        steps.extend(self.st(py).syncs.step(py, t, 1));
        steps.extend(early.map(PlanStep::Sync));
        let me = self.st(py);
        let loads = plan.bind(py).cast::<LoadPlan>()?.get().loads(Some(me.src)) as i64;
        let arrived = Py::new(py, Countdown::new(py, loads))?;
        let window = Py::new(py, ByteBound::new(me.bound.get().st(py).sim.clone_ref(py), me.window)?)?;
        let stream = LoadStream::new(
            me.syncs.gpu.clone_ref(py),
            me.kind,
            plan.bind(py),
            window,
            me.bound.clone_ref(py),
            arrived.clone_ref(py),
            me.assemble.clone_ref(py),
            me.quorum,
            me.kept.as_ref().map(|k| k.clone_ref(py)),
            Some(scope),
            Some(me.src),
        )?;
        let (num, den) = me.rest;
        drop(me);
        steps.push(PlanStep::Begin(UnitRef::new(Py::new(py, stream)?), [0; 3]));
        if loads > 0 {
            steps.push(PlanStep::Wait(arrived.bind(py).as_super().clone().unbind()));
        }
        steps.push(PlanStep::Rest(if loads > 0 { num } else { 0 }, den));
        Ok(TbPlan::of_steps(steps))
    }
}

#[pymethods]
impl LoadTbs {
    #[new]
    #[pyo3(signature = (gpu, src, interleave, syncs, ready, phases, window, bound, kind, quorum, assemble, kept,
                        tiles, build, rest, early_access = false))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        gpu: Py<Endpoint>,
        src: i64,
        interleave: Py<Interleave>,
        syncs: [Option<(i64, i64, i64)>; 2],
        ready: Py<PyAny>,
        phases: Py<PyAny>,
        window: i64,
        bound: Py<ByteBound>,
        kind: i64,
        quorum: i64,
        assemble: Py<PyAny>,
        kept: Option<Py<KeptLines>>,
        tiles: Py<TilePlans>,
        build: Py<PyAny>,
        rest: (i64, i64),
        early_access: bool,
    ) -> PyResult<Self> {
        if rest.1 <= 0 || rest.0 < 0 {
            return Err(PyValueError::new_err(format!(
                "a rest's fraction must be num >= 0 over den > 0, got {}/{}",
                rest.0, rest.1
            )));
        }
        Ok(LoadTbs::from(LoadTbsState {
            syncs: TbSyncs {
                gpu,
                interleave,
                syncs,
                early_access,
            },
            src,
            ready: Asked::new(ready),
            phases: Asked::new(phases),
            window,
            bound,
            kind,
            quorum,
            assemble,
            kept,
            tiles,
            build,
            rest,
        }))
    }

    /// The kernel's TBs in launch order: the `t`-th of row tile `rows[t]`, taking tile
    /// plan `keys[t]` in load scope `scopes[t]`: what the dispatcher runs.
    fn tbs(slf: &Bound<'_, Self>, rows: Vec<i64>, keys: Vec<i64>, scopes: Vec<i64>) -> PyResult<Vec<CoreTb>> {
        if keys.len() != rows.len() || scopes.len() != rows.len() {
            return Err(PyValueError::new_err(
                "LoadTbs.tbs: rows, keys and scopes differ in length",
            ));
        }
        let kernel = slf.as_unbound();
        let py = slf.py();
        Ok((0i64..)
            .zip(rows.into_iter().zip(keys).zip(scopes))
            .map(|(t, ((i, key), scope))| CoreTb::load(kernel.clone_ref(py), [t, i, key, scope]))
            .collect())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        me.syncs.visit(&visit)?;
        me.ready
            .visit(&visit, |signals, v| signals.iter().try_for_each(|s| v.call(s)))?;
        me.phases.visit(&visit, |p, v| v.call(p))?;
        visit.call(&me.bound)?;
        visit.call(&me.assemble)?;
        if let Some(kept) = &me.kept {
            visit.call(kept)?;
        }
        visit.call(&me.tiles)?;
        visit.call(&me.build)
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.ready.clear();
            me.phases.clear();
        }
    }
}
