//! A GEMM's tile plans shared by the thread blocks that take them: the GPUs that run
//! the GEMM (its tiles are the same on each), and for a mainloop the tiles that load
//! the same operand blocks.

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{unit, GilCell, Unit};

/// A GEMM's tile plans, each built by the first TB that takes it (Python, once) and
/// dropped when its last taker has (memory): the builder says how many TBs take it.
/// Keyed by three ints the kernel chooses (a tile and its request piece, say).
#[pyclass(module = "cais._core", frozen)]
pub struct TilePlans {
    st: GilCell<TilePlansState>,
}

pub(crate) struct TilePlansState {
    plans: HashMap<(i64, i64, i64), (Py<PyAny>, i64)>,
}

unit!(TilePlans, TilePlansState);

impl TilePlans {
    /// The plan of `key`: kept, or `build(key...)`, which returns it and how many TBs
    /// take it (this one included); dropped at its last take.
    pub(crate) fn take(&self, py: Python<'_>, key: (i64, i64, i64), build: &Py<PyAny>) -> PyResult<Py<PyAny>> {
        self.take_with(py, key, || build.bind(py).call1(key)?.extract())
    }

    /// `take`, the plan built by the core's `build()` (it returns the plan and how
    /// many TBs take it).
    pub(crate) fn take_with(
        &self,
        py: Python<'_>,
        key: (i64, i64, i64),
        build: impl FnOnce() -> PyResult<(Py<PyAny>, i64)>,
    ) -> PyResult<Py<PyAny>> {
        let found = self.st(py).plans.get(&key).map(|(p, _)| p.clone_ref(py));
        let plan = match found {
            Some(p) => p,
            None => {
                let (p, takes) = build()?;
                self.st(py).plans.insert(key, (p.clone_ref(py), takes));
                p
            }
        };
        let mut me = self.st(py);
        let left = {
            let entry = me.plans.get_mut(&key).expect("a tile's plan just found or built");
            entry.1 -= 1;
            entry.1
        };
        if left <= 0 {
            me.plans.remove(&key); // every TB that takes it has (memory)
        }
        Ok(plan)
    }
}

#[pymethods]
impl TilePlans {
    #[new]
    fn new() -> Self {
        TilePlans::from(TilePlansState {
            plans: HashMap::default(),
        })
    }

    /// Plans built and not yet taken by every TB.
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
