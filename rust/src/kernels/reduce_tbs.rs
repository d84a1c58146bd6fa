//! A GEMM-RS kernel's thread blocks made in the core (`kernels/remote_gemm.py`'s
//! `reduce_gemm`, timing mode, no closing fence): each TB's plan is its TB-group syncs,
//! its mainloop's HBM phase, its epilogue's reductions as a stream and its SM's port,
//! put together here when the dispatcher places the TB, without entering Python. A
//! tile's epilogue plan is made here too, by the first GPU to run the tile, and shared;
//! Python is entered once per busy-SM count (the mainloop's phase) and once per SM (its
//! slots and port).

use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{unit, GilCell, Unit};
use crate::engine::unit::UnitRef;
use crate::engine::wait::{ByteBound, PlanStep, TbPlan};
use crate::hw::gpu::Endpoint;
use crate::hw::interleave::Interleave;
use crate::hw::sm_port::SmPort;
use crate::isa::red_form::RedForm;
use crate::isa::stream::{RedPlan, RedStream};
use crate::kernels::core_tb::CoreTb;
use crate::kernels::tb_parts::{ask_once, phase_step, Asked, TbSyncs};
use crate::kernels::tile_plans::TilePlans;

/// A GEMM-RS kernel's TBs on one GPU (see the module's docs). `syncs`: the TB groups
/// a TB registers with ([`TbSyncs`]); `phases.of(busy)` gives the mainloop's HBM
/// phase; `sm_state(sm)` an SM's `(window, bound, port, piece)`; a tile's epilogue
/// plan (a [`RedPlan`], whose own block the owner adds locally) is made here, shared
/// through `tiles` by the `users` GPUs that run the tile, as `form` says, from the
/// tile's rows and columns of the `reduced` tensor (buffer, rows an owner, columns;
/// the GEMM's `shape`: M, N and the tile's BM, BN), the block of `skip` unsent.
#[pyclass(module = "cais._core", frozen)]
pub struct ReduceTbs {
    st: GilCell<ReduceTbsState>,
}

type SmState = (Py<ByteBound>, Py<ByteBound>, Py<SmPort>, i64);

pub(crate) struct ReduceTbsState {
    syncs: TbSyncs,
    src: i64,
    phases: Asked<Py<PyAny>>,
    per_sm: Asked<SmState>,
    tiles: Py<TilePlans>,
    epilogue: Epilogue,
    /// Tile plans this factory made (the others it took from `tiles`).
    plans_made: i64,
}

/// What a GEMM-RS tile's epilogue plan is made of (`ReduceTbs`).
struct Epilogue {
    form: Py<RedForm>,
    reduced: (Py<PyString>, i64, i64),
    shape: (i64, i64, i64, i64),
    elem_bytes: i64,
    users: i64,
    skip: Option<i64>,
}

unit!(ReduceTbs, ReduceTbsState);

impl ReduceTbs {
    /// The TB `[t, i, j, _]`: the `t`-th launched, of tile (i, j); placed on `sm` with
    /// `busy` SMs busy.
    pub(crate) fn plan(&self, py: Python<'_>, [t, i, j, _]: [i64; 4], sm: usize, busy: usize) -> PyResult<TbPlan> {
        let mut steps = Vec::with_capacity(5);
        let early = self.st(py).syncs.register_early(py, t)?;
        steps.extend(self.st(py).syncs.step(py, t, 0));
        steps.push(phase_step(py, &self.st, |s| &mut s.phases, busy)?);
        steps.extend(self.st(py).syncs.step(py, t, 1));
        steps.extend(early.map(PlanStep::Sync));
        let (window, bound, port, piece) = ask_once(
            py,
            &self.st,
            |s| &mut s.per_sm,
            sm,
            |f| f.call1((sm,))?.extract(),
            |s| (s.0.clone_ref(py), s.1.clone_ref(py), s.2.clone_ref(py), s.3),
        )?;
        let (tiles, gpu, src) = {
            let me = self.st(py);
            (me.tiles.clone_ref(py), me.syncs.gpu.clone_ref(py), me.src)
        };
        let red = tiles.get().take_with(py, (i, j, piece), || {
            let mut me = self.st(py);
            me.plans_made += 1;
            let e = &me.epilogue;
            let (m, n, bm, bn) = e.shape;
            // the tile's rows and columns (GemmShape.rows, .cols)
            let rows = (i * bm, bm.min(m - i * bm));
            let cols = (j * bn, bn.min(n - j * bn));
            let (il, form) = (me.syncs.interleave.bind(py), e.form.bind(py));
            let plan = RedPlan::tile_of(py, il, form, &e.reduced, rows, cols, e.elem_bytes, piece, e.skip)?;
            Ok((Py::new(py, plan)?.into_any(), e.users))
        })?;
        let stream = RedStream::new(py, gpu, red.bind(py), window, bound, port.clone_ref(py), Some(src))?;
        steps.push(PlanStep::Begin(UnitRef::new(Py::new(py, stream)?), [0; 3]));
        steps.push(PlanStep::Begin(UnitRef::new(port), [0; 3]));
        Ok(TbPlan::of_steps(steps))
    }
}

#[pymethods]
impl ReduceTbs {
    #[new]
    #[pyo3(signature = (gpu, src, interleave, syncs, phases, sm_state, tiles, form, reduced, shape, elem_bytes,
                        users, skip = None, early_access = false))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        gpu: Py<Endpoint>,
        src: i64,
        interleave: Py<Interleave>,
        syncs: [Option<(i64, i64, i64)>; 2],
        phases: Py<PyAny>,
        sm_state: Py<PyAny>,
        tiles: Py<TilePlans>,
        form: Py<RedForm>,
        reduced: (Py<PyString>, i64, i64),
        shape: (i64, i64, i64, i64),
        elem_bytes: i64,
        users: i64,
        skip: Option<i64>,
        early_access: bool,
    ) -> Self {
        ReduceTbs::from(ReduceTbsState {
            syncs: TbSyncs {
                gpu,
                interleave,
                syncs,
                early_access,
            },
            src,
            phases: Asked::new(phases),
            per_sm: Asked::new(sm_state),
            tiles,
            epilogue: Epilogue {
                form,
                reduced,
                shape,
                elem_bytes,
                users,
                skip,
            },
            plans_made: 0,
        })
    }

    /// Tile plans this factory made (the GPUs that run a tile share its plan: the
    /// first to take it makes it).
    #[getter]
    fn plans_made(&self, py: Python<'_>) -> i64 {
        self.st(py).plans_made
    }

    /// The kernel's TBs, the `t`-th of tile `tiles[t]` = (i, j), in launch order: what
    /// the dispatcher runs.
    fn tbs(slf: &Bound<'_, Self>, tiles: Vec<(i64, i64)>) -> Vec<CoreTb> {
        let kernel = slf.as_unbound();
        let py = slf.py();
        (0i64..)
            .zip(tiles)
            .map(|(t, (i, j))| CoreTb::reduce(kernel.clone_ref(py), [t, i, j, 0]))
            .collect()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        me.syncs.visit(&visit)?;
        me.phases.visit(&visit, |p, v| v.call(p))?;
        me.per_sm.visit(&visit, |(w, b, port, _), v| {
            v.call(w)?;
            v.call(b)?;
            v.call(port)
        })?;
        visit.call(&me.tiles)?;
        visit.call(&me.epilogue.form)?;
        visit.call(&me.epilogue.reduced.0)
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.phases.clear();
            me.per_sm.clear();
        }
    }
}
