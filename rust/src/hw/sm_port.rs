//! An SM's load/store path: the rate at which it pushes the data it stores.

use pyo3::prelude::*;

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::sim::Simulator;
use crate::engine::unit::{unexpected, Begun, Event, Handler};
use crate::engine::wait::Process;

/// The load/store path of one SM: data it stores leaves at most at `ps_per_byte`
/// (the SM's copy bandwidth), so a store's train has its head when the SM starts
/// pushing it and its tail when the SM has pushed all of it.
#[pyclass(module = "cais._core", frozen)]
pub struct SmPort {
    st: GilCell<SmPortState>,
}

/// The mutable state of a [`SmPort`] (see there), borrowed while holding the GIL.
pub(crate) struct SmPortState {
    pub ps_per_byte: f64,
    pub free_at: i64,
}

unit!(SmPort, SmPortState);

impl SmPortState {
    /// (head, tail) of `nbytes` pushed from `now` on.
    pub(crate) fn push_at(&mut self, now: i64, nbytes: i64) -> (i64, i64) {
        let head = now.max(self.free_at);
        self.free_at = head + (nbytes as f64 * self.ps_per_byte).round_ties_even() as i64;
        (head, self.free_at)
    }
}

impl Handler for SmPort {
    fn on_event(_slf: &Bound<'_, Self>, _ev: Event<'_, '_>) -> PyResult<()> {
        Err(unexpected("SmPort"))
    }

    /// A TB's plan waits until its SM has pushed out what it stores (a TB's SM is
    /// not free before).
    fn begin(
        slf: &Bound<'_, Self>,
        sim: &Bound<'_, Simulator>,
        _args: [i64; 3],
        _process: &Bound<'_, Process>,
    ) -> PyResult<Begun> {
        let now = sim.get().now();
        let free_at = slf.st().free_at;
        Ok(if free_at > now {
            Begun::Sleep(free_at - now)
        } else {
            Begun::Go
        })
    }
}

#[pymethods]
impl SmPort {
    #[new]
    fn new(ps_per_byte: f64) -> Self {
        SmPort::from(SmPortState {
            ps_per_byte,
            free_at: 0,
        })
    }

    /// (head, tail) of `nbytes` pushed from `now` on.
    fn push(&self, py: Python<'_>, now: i64, nbytes: i64) -> (i64, i64) {
        let mut me = self.st(py);
        me.push_at(now, nbytes)
    }
}

properties!(SmPort {
    ps_per_byte: f64, set set_ps_per_byte;
    free_at: i64, set set_free_at;
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sm_port_pushes_back_to_back_and_rounds_half_to_even() {
        let mut port = SmPortState {
            ps_per_byte: 0.5,
            free_at: 0,
        };
        assert_eq!(port.push_at(10, 4), (10, 12));
        assert_eq!(port.push_at(11, 1), (12, 12)); // 0.5 ps rounds to 0
        assert_eq!(port.push_at(11, 3), (12, 14)); // 1.5 ps rounds to 2
        assert_eq!(port.push_at(100, 0), (100, 100));
    }
}
