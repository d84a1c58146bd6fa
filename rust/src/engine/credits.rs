//! Credit-based flow control for one input buffer, as its sender sees it.
//!
//! The receiving end of a channel has one buffer per virtual channel (VC) of
//! `capacity` bytes. The sender holds a credit per byte of free space: it may put a
//! train on the wire only if the credits cover it, and credits come back when the
//! receiver has passed the train on (its departure), one latency later.
//!
//! Trains are coarser than flits, so two rules make train-level credits behave like
//! flit-level ones (docs/fabric-model.md, "Flow control"):
//!
//! * A train *streams* through the buffer: it needs credits for its bytes as they
//!   go out on the wire, not all at once, and the credits of an earlier train come
//!   back progressively, as a linear *ramp* over that train's departure. A sender
//!   may start a train at time `s` when the credits returned by every `t` in its
//!   serialisation window cover the part of it sent by `t`.
//! * A train holds at most `capacity` bytes of the buffer (its *footprint*): a
//!   train longer than the buffer streams through it cut-through.
//!
//! Arithmetic: the start time is solved in IEEE doubles in the same order of
//! operations as the reference Python model, and integer quotients are rounded
//! correctly as Python's `int / int` is, so both give the same picoseconds.

use std::collections::VecDeque;

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyFrozenSet;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{properties, unit, GilCell, Unit};
use super::unit::{Event, UnitRef};

/// A ramp of returning credits: from `a` to `b` (ps), `n` bytes in all, linearly.
type Ramp = (i64, i64, i64);

const EXACT: i128 = 1 << 53;

/// `num / den` correctly rounded, as Python's true division of two ints.
pub(crate) fn true_div(num: i128, den: i128) -> f64 {
    if num.abs() <= EXACT && den.abs() <= EXACT {
        // both exact (through i64: one instruction each, where i128 -> f64 is a
        // library call); one IEEE rounding
        return (num as i64) as f64 / (den as i64) as f64;
    }
    Python::attach(|py| {
        let n = num.into_pyobject(py).expect("int");
        n.div(den).and_then(|q| q.extract::<f64>()).expect("int / int")
    })
}

/// Whom to wake, with the VC, when credits are given back.
pub(crate) enum Waiter {
    None,
    /// A unit (the channel that sends into this buffer: its arbiter looks again),
    /// told `Event::CreditsBack`.
    Unit(UnitRef),
    /// Any Python callable `fn(vc)`.
    Call(Py<PyAny>),
}

/// The credit counters of one receiving input port (a switch port or a GPU's
/// NVLink endpoint), per VC: free bytes, returns still in flight, and a wake-up
/// for the channel that waits on them.
///
/// Statistics: `peak` (bytes held per VC) and, when a recorder sets `log` to a
/// list, every occupancy change as `(time_ps, vc, delta_bytes)`.
#[pyclass(module = "cais._core", frozen)]
pub struct Credits {
    st: GilCell<CreditsState>,
}

/// The mutable state of a [`Credits`] (see there), borrowed while holding the GIL.
pub(crate) struct CreditsState {
    name: String,
    vcs: usize,
    pub(crate) capacity: i64,
    return_ps: i64,
    /// A receiver that consumes every train (`drains`), or trains of some kinds
    /// (`drain_kinds`), as they arrive lets the sender schedule the return when it
    /// sends; if it must hold such a train after all, it reclaims the credits
    /// (hold) and gives them back when it consumes it.
    drains: bool,
    drain_kinds: Vec<i64>,
    free: Vec<i64>,
    ramps: Vec<VecDeque<Ramp>>,
    /// Bytes in ramps, per VC.
    ramped: Vec<i64>,
    held: Vec<i64>,
    peak: Vec<i64>,
    /// (time, vc, delta bytes) of every occupancy change, when recording (set to a
    /// list to record; it reads back as a new list of what was recorded).
    log: Option<Vec<(i64, usize, i64)>>,
    waiter: Waiter,
}

unit!(Credits, CreditsState);

impl Credits {
    /// The train holding `fp` bytes of VC `vc` left the buffer between `t0` and
    /// `t1`; its credits reach the sender `return_ps` later, progressively.
    pub(crate) fn give_back_at(
        slf: &Bound<'_, Self>,
        vc: i64,
        fp: i64,
        t0: i64,
        t1: i64,
        notify: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let waiter = {
            let mut me = slf.get().st(py);
            let v = me.check_vc(vc)?;
            me.held[v] -= fp;
            me.log_change(t1, v, -fp);
            let a = t0 + me.return_ps;
            let b = t1 + me.return_ps;
            me.ramps[v].push_back((a, if b <= a { a + 1 } else { b }, fp));
            me.ramped[v] += fp;
            if me.ramps[v].len() > 4 && me.ramps[v][0].1 <= t0 {
                me.fold(v, t0); // keep the list short
            }
            if !notify {
                return Ok(());
            }
            match &me.waiter {
                Waiter::None => return Ok(()),
                Waiter::Unit(u) => Waiter::Unit(u.clone_ref(py)),
                Waiter::Call(f) => Waiter::Call(f.clone_ref(py)),
            }
        };
        match waiter {
            Waiter::Unit(u) => u.tell(py, Event::CreditsBack(vc as usize)),
            Waiter::Call(f) => f.call1(py, (vc,)).map(|_| ()),
            Waiter::None => Ok(()),
        }
    }
}

impl CreditsState {
    /// The counters of a buffer of `capacity` bytes per VC, all free.
    pub(crate) fn with(
        name: String,
        vcs: usize,
        capacity: i64,
        return_ps: i64,
        drains: bool,
        mut drain_kinds: Vec<i64>,
    ) -> Self {
        drain_kinds.sort_unstable();
        CreditsState {
            name,
            vcs,
            capacity,
            return_ps,
            drains,
            drain_kinds,
            free: vec![capacity; vcs],
            ramps: (0..vcs).map(|_| VecDeque::new()).collect(),
            ramped: vec![0; vcs],
            held: vec![0; vcs],
            peak: vec![0; vcs],
            log: None,
            waiter: Waiter::None,
        }
    }

    fn check_vc(&self, vc: i64) -> PyResult<usize> {
        if vc < 0 || vc as usize >= self.vcs {
            return Err(PyIndexError::new_err(format!(
                "{}: VC {vc} out of range 0..{}",
                self.name, self.vcs
            )));
        }
        Ok(vc as usize)
    }

    pub(crate) fn footprint_of(&self, wire: i64) -> i64 {
        wire.min(self.capacity)
    }

    pub(crate) fn drains_kind(&self, kind: i64) -> bool {
        self.drains || self.drain_kinds.contains(&kind)
    }

    pub(crate) fn has_free(&self, vc: usize, fp: i64) -> bool {
        self.free[vc] >= fp
    }

    /// The earliest start >= `now` (a lower bound, which may lie in the past) at
    /// which a train of footprint `fp` serialised over `ser_ps` has credits all
    /// along, or None if the returns scheduled so far can never cover it.
    pub(crate) fn earliest_at(&mut self, vc: usize, fp: i64, ser_ps: i64, now: i64) -> Option<i64> {
        if self.free[vc] >= fp {
            return Some(now);
        }
        if self.ramps[vc].front().is_some_and(|r| r.1 <= now) {
            self.fold(vc, now);
            if self.free[vc] >= fp {
                return Some(now);
            }
        }
        if self.free[vc] + self.ramped[vc] < fp {
            return None;
        }
        Some(self.solve(vc, fp, ser_ps, now))
    }

    /// Closed form of the earliest covered start. With A(t) the credits returned by
    /// t (non-decreasing, piecewise linear) and T the first time A reaches `fp`, the
    /// train needs A(t) >= fp (t - s) / ser on its window, which holds wherever t >= T
    /// and otherwise reads s >= h(t) = t - A(t) ser / fp. So the start is
    /// max(lower, T - ser, max of h over [lower, T)), and h, piecewise linear, peaks
    /// at a breakpoint of A.
    fn solve(&self, vc: usize, fp: i64, ser: i64, lower: i64) -> i64 {
        let ramps = &self.ramps[vc];
        let free = self.free[vc];
        let k = if fp != 0 {
            true_div(ser as i128, fp as i128)
        } else {
            0.0
        };
        let lower_f = lower as f64;
        if ramps.len() == 1 {
            // the common case, in closed form
            let (a, b, n) = ramps[0];
            let level: f64 = if lower >= b {
                (free + n) as f64
            } else if lower > a {
                free as f64 + true_div(n as i128 * (lower - a) as i128, (b - a) as i128)
            } else {
                free as f64
            };
            if level >= fp as f64 {
                return lower;
            }
            let reach = a as f64 + true_div((fp - free) as i128 * (b - a) as i128, n as i128);
            let last = if a > lower { a as f64 - free as f64 * k } else { lower_f };
            let start = lower_f.max(reach - ser as f64).max(lower_f - level * k).max(last);
            return ceil_ps(start);
        }
        let mut level = free as f64; // A(lower)
        for &(a, b, n) in ramps.iter() {
            if lower >= b {
                level += n as f64;
            } else if lower > a {
                level += true_div(n as i128 * (lower - a) as i128, (b - a) as i128);
            }
        }
        if level >= fp as f64 {
            return lower;
        }
        let mut slope = 0.0_f64; // dA/dt just after lower
        let mut changes: Vec<(i64, f64)> = Vec::with_capacity(2 * ramps.len()); // (time, slope change)
        for &(a, b, n) in ramps.iter() {
            if lower < b {
                let rate = true_div(n as i128, (b - a) as i128);
                if lower > a {
                    slope += rate;
                } else {
                    changes.push((a, rate));
                }
                changes.push((b, -rate));
            }
        }
        let mut best = lower_f - level * k; // h(lower)
        changes.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)));
        let mut t = lower;
        let mut reach: Option<f64> = None;
        for &(when, delta) in changes.iter() {
            if slope > 0.0 && level + slope * (when - t) as f64 >= fp as f64 {
                reach = Some(t as f64 + (fp as f64 - level) / slope); // T: A(T) = fp in this segment
                break;
            }
            level += slope * (when - t) as f64;
            t = when;
            let h = t as f64 - level * k;
            if h > best {
                best = h;
            }
            slope += delta;
        }
        let reach = reach.unwrap_or(t as f64); // reached at the last breakpoint
        ceil_ps(lower_f.max(reach - ser as f64).max(best))
    }

    /// Move ramps that have fully returned by `now` into the free count. Ramps are
    /// kept in the order they were given back, which is nearly the order they end
    /// in; one that ends early behind a later one is folded a little late (its
    /// credits only count as they ramp, which is conservative).
    fn fold(&mut self, vc: usize, now: i64) {
        let mut got = 0;
        let ramps = &mut self.ramps[vc];
        while ramps.front().is_some_and(|r| r.1 <= now) {
            got += ramps.pop_front().expect("front").2;
        }
        self.free[vc] += got;
        self.ramped[vc] -= got;
    }

    fn log_change(&mut self, time: i64, vc: usize, delta: i64) {
        if let Some(log) = self.log.as_mut() {
            log.push((time, vc, delta));
        }
    }

    pub(crate) fn take_at(&mut self, vc: usize, fp: i64, arrive_ps: i64) {
        self.free[vc] -= fp; // may go below zero: returns in flight cover it (earliest checked)
        let held = self.held[vc] + fp;
        self.held[vc] = held;
        if held > self.peak[vc] {
            self.peak[vc] = held;
        }
        self.log_change(arrive_ps, vc, fp);
    }

    pub(crate) fn stream_at(&mut self, vc: usize, fp: i64, head_ps: i64, tail_ps: i64) {
        if fp > self.peak[vc] {
            self.peak[vc] = fp; // it is held on its own: what is held drains as it comes
        }
        self.free[vc] -= fp;
        self.log_change(head_ps, vc, fp);
        self.log_change(tail_ps, vc, -fp);
        let a = head_ps + self.return_ps;
        let b = tail_ps + self.return_ps;
        self.ramps[vc].push_back((a, if b > a { b } else { a + 1 }, fp));
        self.ramped[vc] += fp;
        if self.ramps[vc].len() > 4 && self.ramps[vc][0].1 <= head_ps {
            self.fold(vc, head_ps);
        }
    }
}

/// Integer picoseconds, rounded up (as the reference: `int(s) + (s > int(s))`).
fn ceil_ps(start: f64) -> i64 {
    let whole = start as i64;
    whole + i64::from(start > whole as f64)
}

#[pymethods]
impl Credits {
    #[new]
    #[pyo3(signature = (name, vcs, capacity, return_ps, drains = false, drain_kinds = None))]
    fn new(
        name: String,
        vcs: usize,
        capacity: i64,
        return_ps: i64,
        drains: bool,
        drain_kinds: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if capacity <= 0 {
            return Err(PyValueError::new_err(format!(
                "{name}: buffer capacity must be positive, got {capacity}"
            )));
        }
        let mut kinds: Vec<i64> = Vec::new();
        if let Some(k) = drain_kinds {
            for item in k.try_iter()? {
                kinds.push(item?.extract()?);
            }
        }
        Ok(Credits {
            st: GilCell::new(CreditsState::with(name, vcs, capacity, return_ps, drains, kinds)),
        })
    }

    #[getter]
    fn drain_kinds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyFrozenSet>> {
        let me = self.st(py);
        PyFrozenSet::new(py, &me.drain_kinds)
    }

    /// Bytes of the buffer a train of `wire` bytes holds.
    fn footprint(&self, py: Python<'_>, wire: i64) -> i64 {
        let me = self.st(py);
        me.footprint_of(wire)
    }

    /// The earliest start time >= `now` (a lower bound, which may lie in the past)
    /// at which a train of footprint `fp` serialised over `ser_ps` has credits all
    /// along, or None if the returns scheduled so far can never cover it.
    fn earliest(&self, py: Python<'_>, vc: i64, fp: i64, ser_ps: i64, now: i64) -> PyResult<Option<i64>> {
        let mut me = self.st(py);
        let vc = me.check_vc(vc)?;
        Ok(me.earliest_at(vc, fp, ser_ps, now))
    }

    /// A train of footprint `fp` starts on the wire; its head reaches the buffer at
    /// `arrive_ps`.
    fn take(&self, py: Python<'_>, vc: i64, fp: i64, arrive_ps: i64) -> PyResult<()> {
        let mut me = self.st(py);
        let vc = me.check_vc(vc)?;
        me.take_at(vc, fp, arrive_ps);
        Ok(())
    }

    /// A train of footprint `fp` starts towards a receiver that drains it as it
    /// arrives (head at `head_ps`, tail at `tail_ps`): take its credits and schedule
    /// their return at once (`take` + `give_back` in one step).
    fn stream(&self, py: Python<'_>, vc: i64, fp: i64, head_ps: i64, tail_ps: i64) -> PyResult<()> {
        let mut me = self.st(py);
        let vc = me.check_vc(vc)?;
        me.stream_at(vc, fp, head_ps, tail_ps);
        Ok(())
    }

    /// A draining receiver keeps a train after all (from `now`): take back the
    /// credits its sender scheduled to return (they come back with `give_back`).
    fn hold(&self, py: Python<'_>, vc: i64, fp: i64, now: i64) -> PyResult<()> {
        self.take(py, vc, fp, now)
    }

    /// The train holding `fp` bytes of VC `vc` left the buffer between `t0` and
    /// `t1`; its credits reach the sender `return_ps` later, progressively.
    #[pyo3(signature = (vc, fp, t0, t1, notify = true))]
    fn give_back(slf: &Bound<'_, Self>, vc: i64, fp: i64, t0: i64, t1: i64, notify: bool) -> PyResult<()> {
        Credits::give_back_at(slf, vc, fp, t0, t1, notify)
    }

    /// Count the ramps that have fully returned by `now` as free (a test's look
    /// at the end of a run).
    fn _fold(&self, py: Python<'_>, vc: i64, now: i64) -> PyResult<()> {
        let mut me = self.st(py);
        let vc = me.check_vc(vc)?;
        me.fold(vc, now);
        Ok(())
    }

    /// Who to wake (with the VC) when credits are given back: the channel that
    /// sends here, or any callable.
    fn on_return(&self, py: Python<'_>, waiter: &Bound<'_, PyAny>) {
        let mut me = self.st(py);
        me.waiter = match UnitRef::of(waiter) {
            Some(unit) => Waiter::Unit(unit),
            None => Waiter::Call(waiter.clone().unbind()),
        };
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        match &me.waiter {
            Waiter::Unit(u) => u.visit(&visit)?,
            Waiter::Call(f) => visit.call(f)?,
            Waiter::None => {}
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.log = None;
            me.waiter = Waiter::None;
        }
    }
}

properties!(Credits {
    name: String;
    vcs: usize;
    capacity: i64;
    return_ps: i64;
    drains: bool;
    free: Vec<i64>;
    ramped: Vec<i64>;
    held: Vec<i64>;
    peak: Vec<i64>;
    /// What was recorded (None: not recording); set a list to start recording (what to
    /// start from), None to stop.
    log: Option<Vec<(i64, usize, i64)>>, set set_log;
});

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(capacity: i64) -> CreditsState {
        CreditsState::with("t".into(), 1, capacity, 0, false, vec![])
    }

    #[test]
    fn quotients_round_as_python_does() {
        assert_eq!(true_div(1, 3), 1.0 / 3.0);
        // beyond 2**53 the quotient is still correctly rounded: (2**60 + 1) / 1 is 2**60
        Python::initialize();
        assert_eq!(true_div((1i128 << 60) + 1, 1), (1u64 << 60) as f64);
        assert_eq!(true_div((1i128 << 60) * 3 + 1, 3), (1u64 << 60) as f64);
    }

    #[test]
    fn starts_round_up_to_whole_picoseconds() {
        assert_eq!(ceil_ps(10.0), 10);
        assert_eq!(ceil_ps(10.2), 11);
        assert_eq!(ceil_ps(-2.5), -2);
    }

    #[test]
    fn free_credits_start_at_once_and_missing_ones_never() {
        let mut c = buffer(1000);
        assert_eq!(c.earliest_at(0, 600, 600, 50), Some(50));
        c.free[0] = 100; // 900 bytes held, nothing returning
        assert_eq!(c.earliest_at(0, 600, 600, 50), None);
    }

    #[test]
    fn one_ramp_is_solved_in_closed_form() {
        // 1000 bytes return linearly over [100, 1100]: 1 byte/ps. A train of 500 B
        // serialised in 250 ps (2 B/ps) needs the returns to keep ahead of it,
        // A(t) = t - 100 >= 2 (t - s) until they reach 500 B at T = 600: s = T - 250.
        let mut c = buffer(1000);
        c.free[0] = 0;
        c.ramps[0].push_back((100, 1100, 1000));
        c.ramped[0] = 1000;
        assert_eq!(c.earliest_at(0, 500, 250, 0), Some(350));
        // a slow train (1000 ps for 500 B) only needs to start after the ramp does
        assert_eq!(c.earliest_at(0, 500, 1000, 0), Some(100));
    }

    #[test]
    fn several_ramps_give_the_same_start_as_their_sum() {
        // two ramps that together return 1 B/ps over [100, 1100] behave as one
        let mut split = buffer(1000);
        split.free[0] = 0;
        split.ramps[0].extend([(100, 1100, 500), (100, 1100, 500)]);
        split.ramped[0] = 1000;
        let mut one = buffer(1000);
        one.free[0] = 0;
        one.ramps[0].push_back((100, 1100, 1000));
        one.ramped[0] = 1000;
        for (fp, ser) in [(500, 250), (500, 1000), (1000, 10), (300, 90)] {
            assert_eq!(
                split.earliest_at(0, fp, ser, 0),
                one.earliest_at(0, fp, ser, 0),
                "fp {fp} ser {ser}"
            );
        }
    }

    #[test]
    fn returned_ramps_fold_into_free_credits() {
        let mut c = buffer(1000);
        c.free[0] = 0;
        c.ramps[0].push_back((100, 200, 400));
        c.ramped[0] = 400;
        assert_eq!(c.earliest_at(0, 400, 10, 300), Some(300));
        assert_eq!((c.free[0], c.ramped[0], c.ramps[0].len()), (400, 0, 0));
    }
}
