//! A GPU's HBM as a shared resource (`cais.hw.hbm` has the model): the kernel phases
//! TB programs yield ([`HbmPhase`]), timed together at the instant they start against
//! the calibrated supply, and the bytes the fabric and copy engines move through HBM,
//! counted per window and turned into a rate.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit};
use crate::engine::sim::{Action, Simulator};
use crate::engine::unit::{unexpected, Event, Handler, Paced, UnitRef};
use crate::engine::wait::{slowed, Process, Signal};

/// Relative: float sums of rates that equal the supply do not count as over it.
const SLACK: f64 = 1e-6;

/// What a TB yields for a compute phase that also streams HBM: `ps` is its time with
/// the HBM to itself, `nbytes` what it reads and writes there meanwhile.
/// `overlapped`: the program times the phase itself (a GEMM mainloop that runs beside
/// its own remote loads): it is sent the phase's time, stretched by the share,
/// instead of sleeping it. The process that runs the program times it
/// (`Process`'s `hbm`).
#[pyclass(module = "cais._core", frozen, eq)]
#[derive(PartialEq)]
pub struct HbmPhase {
    #[pyo3(get)]
    pub(crate) ps: i64,
    #[pyo3(get)]
    pub(crate) nbytes: f64,
    #[pyo3(get)]
    pub(crate) overlapped: bool,
}

#[pymethods]
impl HbmPhase {
    #[new]
    #[pyo3(signature = (ps, nbytes, overlapped = false))]
    fn new(ps: i64, nbytes: f64, overlapped: bool) -> Self {
        HbmPhase { ps, nbytes, overlapped }
    }

    fn __repr__(&self) -> String {
        let overlapped = if self.overlapped { "True" } else { "False" };
        format!(
            "HbmPhase(ps={}, nbytes={:?}, overlapped={overlapped})",
            self.ps, self.nbytes
        )
    }
}

/// One GPU's HBM: `bytes_per_ps` of achievable bandwidth (the calibrated effective
/// figure), shared in proportion when the users together ask for more.
///
/// Kernel phases (`request`): those starting at one instant are timed together at
/// its end; each takes `ps * demand / supply` when the demand (their own rates, the
/// rates of the phases still running and the stream rate) exceeds the supply, its
/// time alone otherwise. Streams (`stream`): counted, not timed; their rate is the
/// last complete window of `window_ps`. `enabled=False` turns the sharing off (every
/// phase takes its time alone, nothing is counted); `streams_yield`: the memory
/// controller serves the SMs first (T3's MCA), so phases do not see streams.
#[pyclass(module = "cais._core", frozen)]
pub struct HbmShare {
    st: GilCell<HbmShareState>,
}

/// Who waits for a phase's time: a signal (a Python caller's `request`), or the
/// process whose program yielded the phase, resumed with the time.
pub(crate) enum Timed {
    Signal(Py<Signal>),
    Process(Py<Process>),
}

/// The mutable state of a [`HbmShare`] (see there), borrowed while holding the GIL.
pub(crate) struct HbmShareState {
    supply: f64,
    window: i64,
    enabled: bool,
    streams_yield: bool,
    /// Index of the current stream window.
    bucket: i64,
    bucket_bytes: f64,
    /// Bytes in the last complete window.
    prev_bytes: f64,
    /// Total counted (a statistic).
    stream_bytes: f64,
    /// (end, order) and rate of the running kernel phases, earliest end first.
    ends: BinaryHeap<(Reverse<(i64, u64)>, RateBits)>,
    seq: u64,
    kernel_rate: f64,
    /// Phases starting this instant: (time alone, bytes, their signal).
    pending: Vec<(i64, f64, Timed)>,
    /// The list the last instant's phases were timed in, emptied, for the next one.
    spare: Vec<(i64, f64, Timed)>,
    phases: i64,
    stretched: i64,
    added_ps: i64,
    /// Instants at which demand exceeded the supply, and what asked for it there,
    /// summed in units of the supply: phases starting, phases running, streams.
    saturated: i64,
    saturated_demand: [f64; 3],
}

/// A rate in the heap of running phases (ordered by its bits only to satisfy the
/// heap: the (end, order) key before it is unique).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct RateBits(u64);

unit!(HbmShare, HbmShareState);

impl HbmShareState {
    fn new(supply: f64, window: i64, enabled: bool, streams_yield: bool) -> Self {
        HbmShareState {
            supply,
            window,
            enabled,
            streams_yield,
            bucket: 0,
            bucket_bytes: 0.0,
            prev_bytes: 0.0,
            stream_bytes: 0.0,
            ends: BinaryHeap::new(),
            seq: 0,
            kernel_rate: 0.0,
            pending: Vec::new(),
            spare: Vec::new(),
            phases: 0,
            stretched: 0,
            added_ps: 0,
            saturated: 0,
            saturated_demand: [0.0; 3],
        }
    }

    /// Bytes per ps of stream traffic, over the last complete window.
    fn rate(&mut self, now: i64) -> f64 {
        self.roll(now);
        self.prev_bytes / self.window as f64
    }

    fn roll(&mut self, now: i64) {
        let b = now.div_euclid(self.window);
        if b != self.bucket {
            self.prev_bytes = if b == self.bucket + 1 { self.bucket_bytes } else { 0.0 };
            self.bucket = b;
            self.bucket_bytes = 0.0;
        }
    }

    pub(crate) fn count(&mut self, now: i64, nbytes: f64) {
        if !self.enabled || nbytes <= 0.0 {
            return;
        }
        self.roll(now);
        self.bucket_bytes += nbytes;
        self.stream_bytes += nbytes;
    }

    /// Bytes per ps asked for by kernel phases running at `now`.
    fn kernel_rate(&mut self, now: i64) -> f64 {
        while let Some((Reverse((end, _)), rate)) = self.ends.peek() {
            if *end > now {
                break;
            }
            self.kernel_rate -= f64::from_bits(rate.0);
            self.ends.pop();
        }
        if self.ends.is_empty() {
            self.kernel_rate = 0.0; // no drift from float sums
        }
        self.kernel_rate
    }

    /// Time the phases starting at `now` together: (time, bytes, who waits) each,
    /// in the list they were pending in.
    fn resolve(&mut self, now: i64) -> Vec<(i64, f64, Timed)> {
        let spare = std::mem::take(&mut self.spare);
        let mut batch = std::mem::replace(&mut self.pending, spare);
        let rate_of = |ps: i64, nbytes: f64| if ps > 0 { nbytes / ps as f64 } else { 0.0 };
        let streams = if self.streams_yield { 0.0 } else { self.rate(now) };
        let starting = batch.iter().fold(0.0, |a, &(ps, nbytes, _)| a + rate_of(ps, nbytes));
        let running = self.kernel_rate(now);
        let factor = (starting + running + streams) / self.supply;
        let over = factor > 1.0 + SLACK;
        if over {
            self.saturated += 1;
            for (i, part) in [starting, running, streams].into_iter().enumerate() {
                self.saturated_demand[i] += part / self.supply;
            }
        }
        for phase in batch.iter_mut() {
            let (ps, rate) = (phase.0, rate_of(phase.0, phase.1));
            let took = if over {
                (ps as f64 * factor).round_ties_even() as i64
            } else {
                ps
            };
            if rate > 0.0 {
                self.seq += 1;
                self.ends
                    .push((Reverse((now + took, self.seq)), RateBits(rate.to_bits())));
                self.kernel_rate += rate;
            }
            self.phases += 1;
            if took > ps {
                self.stretched += 1;
                self.added_ps += took - ps;
            }
            phase.0 = took;
        }
        batch
    }
}

impl HbmShare {
    /// Whether phases are shared (off: each takes its time alone).
    pub(crate) fn enabled(&self, py: Python<'_>) -> bool {
        self.st(py).enabled
    }

    /// A phase that starts now, takes `ps` alone and moves `nbytes`: the signal fires
    /// at the end of this instant with its time (`HbmShare`'s docs).
    pub(crate) fn phase(
        slf: &Bound<'_, Self>,
        sim: &Bound<'_, Simulator>,
        ps: i64,
        nbytes: f64,
        timed: Timed,
    ) -> PyResult<()> {
        let py = slf.py();
        let first = {
            let mut me = slf.get().st(py);
            me.pending.push((ps, nbytes, timed));
            me.pending.len() == 1
        };
        if first {
            let s = sim.get();
            s.push(py, s.now(), Action::Due(UnitRef::of_bound(slf), 0, None))?;
        }
        Ok(())
    }

    /// The end of the instant: time the phases that started in it.
    pub(crate) fn resolve(slf: &Bound<'_, Self>, sim: &Bound<'_, Simulator>) -> PyResult<()> {
        let py = slf.py();
        let now = sim.get().now();
        let mut timed = slf.get().st(py).resolve(now);
        for (took, _, who) in timed.drain(..) {
            let took = took.into_pyobject(py)?.into_any().unbind();
            match who {
                Timed::Signal(sig) => Signal::fire_now(sig.bind(py), now, took)?,
                Timed::Process(p) => Process::step(&p.into_bound(py), took)?,
            }
        }
        slf.get().st(py).spare = timed; // emptied: the next instant's list
        Ok(())
    }
}

impl Handler for HbmShare {
    /// The end of an instant in which phases started.
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            Event::Due { sim, .. } => HbmShare::resolve(slf, sim),
            _ => Err(unexpected("HbmShare")),
        }
    }

    /// The share paces the kernel phases ([`HbmPhase`]) a TB program yields: timed at
    /// their real duration (the program's, stretched by its GPU's `slowdown`) against
    /// the others starting at this instant, or at their own when sharing is off.
    fn pace(
        slf: &Bound<'_, Self>,
        sim: &Bound<'_, Simulator>,
        yielded: &Bound<'_, PyAny>,
        slowdown: f64,
        process: &Bound<'_, Process>,
    ) -> PyResult<Paced> {
        let Ok(ph) = yielded.cast::<HbmPhase>() else {
            return Ok(Paced::NotMine);
        };
        let ph = ph.get();
        if slf.get().enabled(slf.py()) && ph.ps > 0 && ph.nbytes > 0.0 {
            let ps = slowed(slowdown, ph.ps);
            HbmShare::phase(slf, sim, ps, ph.nbytes, Timed::Process(process.clone().unbind()))?;
            return Ok(Paced::Held(ph.overlapped));
        }
        Ok(if ph.overlapped {
            Paced::Value(ph.ps)
        } else {
            Paced::Sleep(ph.ps)
        })
    }
}

#[pymethods]
impl HbmShare {
    #[new]
    #[pyo3(signature = (bytes_per_ps, window_ps, enabled = true, streams_yield = false))]
    fn new(bytes_per_ps: f64, window_ps: i64, enabled: bool, streams_yield: bool) -> PyResult<Self> {
        if bytes_per_ps <= 0.0 || window_ps <= 0 {
            return Err(PyValueError::new_err("HBM bandwidth and window must be positive"));
        }
        Ok(HbmShare::from(HbmShareState::new(
            bytes_per_ps,
            window_ps,
            enabled,
            streams_yield,
        )))
    }

    /// A phase that starts now, takes `ps` alone and moves `nbytes`. The returned
    /// signal fires at the end of this instant with the phase's time: `ps` stretched
    /// by demand / supply when demand exceeds supply. Phases that start at the same
    /// instant (a wave of tiles) are timed together, so they see the same demand.
    fn request(slf: &Bound<'_, Self>, sim: &Bound<'_, Simulator>, ps: i64, nbytes: f64) -> PyResult<Py<Signal>> {
        let py = slf.py();
        let sig = Py::new(py, Signal::blank(py))?;
        HbmShare::phase(slf, sim, ps, nbytes, Timed::Signal(sig.clone_ref(py)))?;
        Ok(sig)
    }

    /// Bytes per ps asked for by kernel phases running at `now`.
    fn kernel_rate(&self, py: Python<'_>, now: i64) -> f64 {
        self.st(py).kernel_rate(now)
    }

    /// `nbytes` moved through HBM by the fabric side at `now`.
    fn stream(&self, py: Python<'_>, now: i64, nbytes: f64) {
        self.st(py).count(now, nbytes);
    }

    /// Bytes per ps of stream traffic, over the last complete window.
    fn stream_rate(&self, py: Python<'_>, now: i64) -> f64 {
        self.st(py).rate(now)
    }

    #[getter(enabled)]
    fn py_enabled(&self, py: Python<'_>) -> bool {
        self.enabled(py)
    }

    #[setter]
    fn set_enabled(&self, py: Python<'_>, value: bool) {
        self.st(py).enabled = value;
    }

    /// What asked at those instants, in units of the supply: [starting, running, streams].
    #[getter]
    fn saturated_demand<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.st(py).saturated_demand)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        for (_, _, who) in &me.pending {
            match who {
                Timed::Signal(sig) => visit.call(sig)?,
                Timed::Process(p) => visit.call(p)?,
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.pending.clear();
        }
    }
}

properties!(HbmShare {
    /// Achievable bandwidth, bytes per ps.
    supply: f64;
    streams_yield: bool;
    window: i64;
    stream_bytes: f64;
    /// Phases timed.
    phases: i64;
    /// Phases that took longer than alone.
    stretched: i64;
    /// Time added to phases, summed.
    added_ps: i64;
    /// Instants at which the demand exceeded the supply.
    saturated: i64;
});

#[cfg(test)]
mod tests {
    use super::*;

    fn streams() -> HbmShareState {
        HbmShareState::new(1.0, 1000, true, false)
    }

    #[test]
    fn the_rate_is_the_last_complete_window() {
        let mut h = streams();
        h.count(100, 500.0);
        h.count(900, 300.0);
        assert_eq!(h.rate(999), 0.0); // the window is not complete yet
        assert_eq!(h.rate(1500), 0.8); // 800 B over the 1000 ps window [0, 1000)
        assert_eq!(h.rate(3000), 0.0); // a window with nothing in between
        assert_eq!(h.stream_bytes, 800.0);
    }

    #[test]
    fn nothing_is_counted_when_disabled() {
        let mut h = streams();
        h.enabled = false;
        h.count(100, 500.0);
        assert_eq!((h.stream_bytes, h.rate(1500)), (0.0, 0.0));
    }

    #[test]
    fn running_phases_leave_the_demand_when_they_end() {
        let mut h = streams();
        h.seq = 2;
        h.ends.push((Reverse((500, 1)), RateBits(0.25f64.to_bits())));
        h.ends.push((Reverse((800, 2)), RateBits(0.5f64.to_bits())));
        h.kernel_rate = 0.75;
        assert_eq!(h.kernel_rate(499), 0.75);
        assert_eq!(h.kernel_rate(500), 0.5); // the first has ended
        assert_eq!(h.kernel_rate(900), 0.0); // both: exactly zero
        assert!(h.ends.is_empty());
    }
}
