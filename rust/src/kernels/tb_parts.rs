//! What the core's TB factories share: a TB's registrations with its TB groups, and
//! answers asked of Python once per index (an SM, a busy-SM count, a row tile) and kept.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::GilCell;
use crate::engine::unit::UnitRef;
use crate::engine::wait::{PlanStep, Signal};
use crate::hw::gpu::Endpoint;
use crate::hw::interleave::Interleave;

/// The TB groups a kernel's TBs register with, as `RemoteAccess.sync_groups` describes
/// them: per sync point (0: before the TB's work, 1: before its first remote access),
/// `(base, per TB, members)` or None; TB `t` registers with group `base + t * per` at
/// the chip its address maps to. `early_access`: the pre-access registration goes out
/// when the TB starts and the TB waits for its release only before its first remote
/// access (its latency overlapped with the mainloop, CAIS §III-B.2); else the TB
/// registers there and waits at once.
pub(crate) struct TbSyncs {
    pub(crate) gpu: Py<Endpoint>,
    pub(crate) interleave: Py<Interleave>,
    pub(crate) syncs: [Option<(i64, i64, i64)>; 2],
    pub(crate) early_access: bool,
}

impl TbSyncs {
    /// TB `t`'s registration at sync point `phase`, if it has one and it is made where
    /// the TB waits (not `early_access`'s pre-access one).
    pub(crate) fn step(&self, py: Python<'_>, t: i64, phase: usize) -> Option<PlanStep> {
        if phase == 1 && self.early_access {
            return None;
        }
        let (chip, group, members) = self.group(py, t, phase)?;
        Some(PlanStep::Begin(
            UnitRef::new(self.gpu.clone_ref(py)),
            [chip, group, members],
        ))
    }

    /// With `early_access`, TB `t`'s pre-access registration, made now (as the TB
    /// starts): the signal of its release, which the TB waits for before its first
    /// remote access (`PlanStep::Sync`).
    pub(crate) fn register_early(&self, py: Python<'_>, t: i64) -> PyResult<Option<Py<Signal>>> {
        if !self.early_access {
            return Ok(None);
        }
        let Some((chip, group, members)) = self.group(py, t, 1) else {
            return Ok(None);
        };
        Endpoint::group_sync(self.gpu.bind(py), chip, group, members).map(Some)
    }

    /// TB `t`'s group at sync point `phase`: (chip, group, members).
    fn group(&self, py: Python<'_>, t: i64, phase: usize) -> Option<(i64, i64, i64)> {
        let (base, per, members) = self.syncs[phase]?;
        let group = base + t * per;
        Some((self.interleave.borrow(py).chip_of(group), group, members))
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.gpu)?;
        visit.call(&self.interleave)
    }
}

/// Answers of Python kept by index: `ask` is asked for index `i` once.
pub(crate) struct Asked<T> {
    pub(crate) ask: Py<PyAny>,
    values: Vec<Option<T>>,
}

impl<T> Asked<T> {
    pub(crate) fn new(ask: Py<PyAny>) -> Self {
        Asked {
            ask,
            values: Vec::new(),
        }
    }

    /// The answer for `i`, if asked already.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.values.get(i).and_then(Option::as_ref)
    }

    /// Keep the answer for `i`.
    pub(crate) fn put(&mut self, i: usize, value: T) {
        if self.values.len() <= i {
            self.values.resize_with(i + 1, || None);
        }
        self.values[i] = Some(value);
    }

    /// Show the collector `ask` and, with `each`, every answer kept.
    pub(crate) fn visit(
        &self,
        visit: &PyVisit<'_>,
        each: impl Fn(&T, &PyVisit<'_>) -> Result<(), PyTraverseError>,
    ) -> Result<(), PyTraverseError> {
        visit.call(&self.ask)?;
        self.values.iter().flatten().try_for_each(|v| each(v, visit))
    }

    pub(crate) fn clear(&mut self) {
        self.values.clear();
    }
}

/// The answer for `i` of the `Asked` that `field` picks in `cell`'s state: kept, or
/// asked of Python (`ask` calls it) while the state is not borrowed, then kept;
/// `copy` hands out a new reference to a kept one.
pub(crate) fn ask_once<S, T>(
    py: Python<'_>,
    cell: &GilCell<S>,
    field: fn(&mut S) -> &mut Asked<T>,
    i: usize,
    ask: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    copy: impl Fn(&T) -> T,
) -> PyResult<T> {
    if let Some(v) = field(&mut cell.borrow_mut(py)).get(i) {
        return Ok(copy(v));
    }
    let f = field(&mut cell.borrow_mut(py)).ask.clone_ref(py);
    let v = ask(f.bind(py))?;
    let out = copy(&v);
    field(&mut cell.borrow_mut(py)).put(i, v);
    Ok(out)
}

/// A mainloop's HBM phase with `busy` SMs busy, as a plan's step: `phases.of(busy)` of
/// the `Asked` that `field` picks, asked of Python once per count.
pub(crate) fn phase_step<S>(
    py: Python<'_>,
    cell: &GilCell<S>,
    field: fn(&mut S) -> &mut Asked<Py<PyAny>>,
    busy: usize,
) -> PyResult<PlanStep> {
    let ask = |f: &Bound<'_, PyAny>| Ok(f.call_method1("of", (busy,))?.unbind());
    Ok(PlanStep::Pace(ask_once(py, cell, field, busy, ask, |p| {
        p.clone_ref(py)
    })?))
}
