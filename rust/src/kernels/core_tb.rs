//! One thread block of a kernel whose TB plans the core makes: what the dispatcher calls.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::unit::{unexpected, Event, Handler};
use crate::engine::wait::{PlanStep, TbPlan};
use crate::kernels::load_tbs::LoadTbs;
use crate::kernels::reduce_tbs::ReduceTbs;

/// The factory a TB's plan comes from: a remote GEMM's, or none for a TB that is one
/// HBM phase (a GPU-local kernel's even grid, `kernels/local.py`, in timing mode).
enum Factory {
    Load(Py<LoadTbs>),
    Reduce(Py<ReduceTbs>),
    Phase(Py<PyAny>),
}

/// One TB of a kernel whose TB plans the core makes ([`LoadTbs`], [`ReduceTbs`], or a
/// TB that is one HBM phase, `CoreTb.phase`): called with `(sm, busy)` when the
/// dispatcher places it, its factory puts the TB's plan together. `args`: what the
/// factory knows the TB by (its launch index, then its tile, or its row tile, tile plan
/// and load scope).
#[pyclass(module = "cais._core", frozen)]
pub struct CoreTb {
    factory: Factory,
    args: [i64; 4],
}

impl CoreTb {
    pub(crate) fn load(kernel: Py<LoadTbs>, args: [i64; 4]) -> Self {
        CoreTb {
            factory: Factory::Load(kernel),
            args,
        }
    }

    pub(crate) fn reduce(kernel: Py<ReduceTbs>, args: [i64; 4]) -> Self {
        CoreTb {
            factory: Factory::Reduce(kernel),
            args,
        }
    }
}

impl CoreTb {
    /// The TB's plan, placed on `sm` with `busy` SMs busy (what the dispatcher asks for
    /// without a Python call).
    pub(crate) fn plan(&self, py: Python<'_>, sm: usize, busy: usize) -> PyResult<TbPlan> {
        match &self.factory {
            Factory::Load(kernel) => kernel.get().plan(py, self.args, busy),
            Factory::Reduce(kernel) => kernel.get().plan(py, self.args, sm, busy),
            Factory::Phase(phase) => Ok(TbPlan::of_steps(vec![PlanStep::Pace(phase.clone_ref(py))])),
        }
    }
}

impl Handler for CoreTb {
    fn on_event(_slf: &Bound<'_, Self>, _ev: Event<'_, '_>) -> PyResult<()> {
        Err(unexpected("CoreTb"))
    }

    fn plan(slf: &Bound<'_, Self>, sm: usize, busy: usize) -> PyResult<Option<TbPlan>> {
        slf.get().plan(slf.py(), sm, busy).map(Some)
    }
}

#[pymethods]
impl CoreTb {
    /// A TB that is the HBM phase `phase` (an `HbmPhase`, timed by its GPU's share), the
    /// same for every TB of its kernel (one object may stand for all of them).
    #[staticmethod]
    fn phase(phase: Py<PyAny>) -> Self {
        CoreTb {
            factory: Factory::Phase(phase),
            args: [0; 4],
        }
    }

    fn __call__(&self, py: Python<'_>, sm: usize, busy: usize) -> PyResult<TbPlan> {
        self.plan(py, sm, busy)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.factory {
            Factory::Load(kernel) => visit.call(kernel),
            Factory::Reduce(kernel) => visit.call(kernel),
            Factory::Phase(phase) => visit.call(phase),
        }
    }
}
