//! One direction of a link: a serialising server with virtual channels.
//!
//! The network does not move flits one by one: it moves *trains*, a run of
//! packets that travel together (a transfer unit). A train is forwarded
//! cut-through: the next hop may start sending it as soon as its head has
//! arrived, and cannot finish before its tail has arrived. So a train of many
//! packets costs one serialisation per link it crosses, not one per hop, as for
//! wormhole/virtual cut-through flit switching.

use std::collections::VecDeque;
use std::sync::Arc;

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{properties, unit, GilCell, Unit, UnitState};
use super::credits::{true_div, Credits};
use super::sim::{Action, Clock, Likely, Simulator};
use super::train::{Fanout, Train};
use super::unit::{unexpected, Event, Handler, UnitRef};

/// Not computed since the VC's head train or its credits changed.
const UNKNOWN: i64 = -1;
/// Not before more credits come back.
const BLOCKED: i64 = 1 << 62;

/// Where a channel delivers a train: a unit (a switch chip's or a GPU's input port),
/// bound when the train is sent, or any Python callable `deliver(train)`.
pub(crate) enum Sink {
    Unit(UnitRef),
    Call(Py<PyAny>),
}

impl Sink {
    /// A registered unit given as the far end (its input port), or a callable.
    pub(crate) fn of(deliver: &Bound<'_, PyAny>) -> Sink {
        match UnitRef::of(deliver) {
            Some(unit) => Sink::Unit(unit),
            None => Sink::Call(deliver.clone().unbind()),
        }
    }

    pub(crate) fn clone_ref(&self, py: Python<'_>) -> Sink {
        match self {
            Sink::Unit(u) => Sink::Unit(u.clone_ref(py)),
            Sink::Call(f) => Sink::Call(f.clone_ref(py)),
        }
    }

    pub(crate) fn deliver(&self, train: Bound<'_, Train>) -> PyResult<()> {
        match self {
            Sink::Unit(u) => u.on_event(train.py(), Event::Arrived(train)),
            Sink::Call(f) => f.bind(train.py()).call1((train,)).map(|_| ()),
        }
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Sink::Unit(u) => u.visit(visit),
            Sink::Call(f) => visit.call(f),
        }
    }
}

/// Whom a channel tells when a train goes on the wire: nobody, a unit (told
/// `Event::Started` with the argument it gave: a switch chip whose input buffer the
/// train leaves, a GPU whose read response it is, a merge unit whose lines it frees),
/// or any Python callable `on_start(train, start, finish)`.
pub(crate) enum Hook {
    None,
    Unit(UnitRef, (u32, u32)),
    Call(Py<PyAny>),
}

/// What waits for the wire: a train, or a switch chip's copy of an input train
/// (`entry`), made when it goes on the wire (`Fanout`) for the GPU at the channel's far
/// end (`copies_to`).
enum Cargo {
    Train(Py<Train>),
    Copy { entry: Py<Train>, fanout: Arc<Fanout> },
}

impl ChannelState {
    /// The train `cargo` is, made now if it is a copy (from the pool of kept trains).
    fn train_of<'py>(&mut self, py: Python<'py>, cargo: Cargo) -> PyResult<Bound<'py, Train>> {
        match cargo {
            Cargo::Train(t) => Ok(t.into_bound(py)),
            Cargo::Copy { entry, fanout } => {
                self.copies += 1;
                let dst = self.copies_to;
                let sim = &self.sim;
                let state = fanout.make(py, &entry.get().st(py), dst);
                let t = sim.get().new_train(py, state)?;
                t.get().st(py).parent = Some(entry.into_any());
                Ok(t)
            }
        }
    }
}

impl Cargo {
    /// Its wire bytes and when its head is there (a queued train is not changed).
    fn wire_head(&self, py: Python<'_>) -> (i64, i64) {
        match self {
            Cargo::Train(t) => {
                let t = t.get().st(py);
                (t.wire, t.head)
            }
            Cargo::Copy { fanout, .. } => (fanout.wire, fanout.head),
        }
    }

    /// The object its start reads first (for a prefetch).
    fn address(&self) -> *const u8 {
        match self {
            Cargo::Train(t) => t.as_ptr() as *const u8,
            Cargo::Copy { entry, .. } => entry.as_ptr() as *const u8,
        }
    }
}

/// A train waiting for the wire, with whom to tell when it starts and arrives. Its
/// size is what a deep queue costs in memory and cache lines (on 36 GPUs of `nvl72`
/// a million wait at once), so its wire bytes and head time are read from the cargo
/// when the arbiter needs them, and its serialisation time is worked out again.
struct Queued {
    cargo: Cargo,
    deliver: Sink,
    on_start: Hook,
}

// one cache line a waiting train (measured: 32 bytes more cost a 36-GPU nvl72 run 5-8 %)
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Queued>() == 64);

/// A train on the wire behind the one whose arrival is queued: when its tail
/// arrives (`arrive`) and the schedule order reserved for its arrival when it started.
struct Flight {
    train: Py<Train>,
    deliver: Sink,
    arrive: i64,
    seq: u64,
}

/// One direction of a port: trains are serialised onto the wire one at a time at
/// `ps_per_byte`, then arrive `latency_ps` later. Trains waiting for the wire sit
/// in one FIFO per virtual channel; the arbiter serves the VCs round-robin,
/// skipping a VC whose head train has no credits at the receiving buffer
/// (`credits`; None: an infinite buffer). A VC whose buffer is far too small for
/// the credit round trip cannot stream faster than its capacity per round trip
/// (`credit_rtt_ps`), as with flit-level credits.
///
/// `send(train, deliver, on_start)`: `on_start(train, start, finish)` runs when the
/// train is put on the wire (its first and last byte leave at those times);
/// `deliver(train)` when its tail reaches the far end.
///
/// Statistics: trains, payload and wire bytes sent, and busy time, for utilisation;
/// `copies`, how many of the trains were a switch chip's copies, made as they went on
/// the wire (a multicast's or an `ld_reduce`'s fan-out: `Fanout`).
#[pyclass(module = "cais._core", subclass, frozen)]
pub struct Channel {
    st: GilCell<ChannelState>,
}

/// A channel's state (`Channel`'s docs).
pub(crate) struct ChannelState {
    sim: Py<Simulator>,
    clock: Clock,
    name: String,
    ps_per_byte: f64,
    latency_ps: i64,
    free_at: i64,
    queues: Vec<VecDeque<Queued>>,
    rr: usize,
    /// VCs with waiting trains, ascending.
    active: Vec<usize>,
    queued: i64,
    /// Generation of the one pending arbitration (older ones are stale).
    generation: u64,
    /// When the pending arbitration runs (-1: none pending).
    armed_at: i64,
    trains: i64,
    payload_bytes: i64,
    wire_bytes: i64,
    busy_ps: i64,
    pub(crate) delivered_payload: i64,
    /// Trains it carried that a switch chip offered as copies to be made (`Fanout`),
    /// and the GPU they went to (the switch's port at the far end; all go there).
    copies: i64,
    copies_to: i64,
    /// (start, finish, wire bytes) of every train, when recording (a recorder sets
    /// `timeline` to a list; it reads back as a new list of what was recorded).
    timeline: Option<Vec<(i64, i64, i64)>>,
    credits: Option<Py<Credits>>,
    credit_rtt_ps: i64,
    /// Per VC: when its head train has credits (UNKNOWN or BLOCKED).
    ready: Vec<i64>,
    /// Whether the arrival of a train on the wire is in the simulator's queue, and
    /// the trains on the wire behind it, in order. A wire delivers in the order it
    /// sends (a train cannot finish before the one ahead of it), so only its next
    /// arrival needs a place in the queue: the others wait here with the schedule
    /// order reserved when they started, and each is queued when the one ahead
    /// arrives, to run exactly when it would have. (Thousands of probes and flags
    /// can be on one wire's latency at once: on 72 GPUs the queue held about a
    /// million arrivals.)
    arriving: bool,
    in_flight: VecDeque<Flight>,
    /// Serialisation time per byte: the wire's, or, if the buffer is smaller than
    /// the credit round trip needs, at most its capacity per round trip.
    ser_ps_per_byte: f64,
}

impl ChannelState {
    /// How long `wire` bytes take to serialise (`ser_ps_per_byte`).
    #[inline]
    fn ser(&self, wire: i64) -> i64 {
        (wire as f64 * self.ser_ps_per_byte + 0.5) as i64
    }

    fn now(&self, py: Python<'_>) -> i64 {
        let _ = py;
        self.clock.now()
    }

    /// Arbitrate at `at`, unless an arbitration is already due by then.
    fn arm(&mut self, py: Python<'_>, this: &Bound<'_, Channel>, at: i64) -> PyResult<()> {
        if 0 <= self.armed_at && self.armed_at <= at {
            return Ok(());
        }
        self.armed_at = at;
        self.generation += 1;
        let likely = self.likely();
        self.sim.get().push(
            py,
            at,
            Action::Arbitrate(this.clone().unbind(), self.generation, likely),
        )
    }

    /// Where the train the next arbitration would start as things stand lives: the
    /// head of the first VC with trains at or after the round-robin pointer.
    fn likely(&self) -> Likely {
        let n = self.active.len();
        if n == 0 {
            return Likely::NONE;
        }
        let first = self.active.partition_point(|&v| v < self.rr);
        let vc = self.active[if first == n { 0 } else { first }];
        match self.queues[vc].front() {
            Some(q) => Likely {
                queued: q as *const Queued as *const u8,
                train: q.cargo.address(),
            },
            None => Likely::NONE,
        }
    }

    /// The earliest start the credits allow the VC's head train (no earlier than the
    /// wire is free and its head is there; possibly in the past: a train is cut
    /// through as soon as it could have gone), or BLOCKED.
    fn when_ready(&mut self, py: Python<'_>, vc: usize) -> i64 {
        let cr = self.credits.as_ref().expect("a channel with credits");
        let mut c = cr.get().st(py);
        let (wire, head) = self.queues[vc][0].cargo.wire_head(py);
        let fp = c.footprint_of(wire);
        let ready = if c.has_free(vc, fp) {
            0
        } else {
            let lower = self.free_at.max(head);
            c.earliest_at(vc, fp, self.ser(wire), lower).unwrap_or(BLOCKED)
        };
        self.ready[vc] = ready;
        ready
    }

    /// Arbitrate again when the wire is free and some VC's head has credits (if
    /// none can have them before more come back, `credits_back` arms it).
    fn arm_next(&mut self, py: Python<'_>, this: &Bound<'_, Channel>, now: i64) -> PyResult<()> {
        let free_at = self.free_at;
        if self.credits.is_none() {
            return self.arm(py, this, free_at.max(now));
        }
        let mut soonest = BLOCKED;
        for i in 0..self.active.len() {
            let vc = self.active[i];
            let mut t = self.ready[vc];
            if t == UNKNOWN {
                t = self.when_ready(py, vc);
            }
            if t < soonest {
                soonest = t;
                if t <= free_at {
                    break;
                }
            }
        }
        if soonest < BLOCKED {
            let t = soonest.max(free_at);
            self.arm(py, this, t.max(now))?;
        }
        Ok(())
    }
}

unit!(Channel, ChannelState);

impl Channel {
    /// The wire is free: serve the first VC at or after the round-robin pointer
    /// whose head train has credits, then move the pointer past it.
    pub(crate) fn arbitrate(slf: &Bound<'_, Channel>, generation: u64) -> PyResult<()> {
        let py = slf.py();
        let (queued, now) = {
            let mut me = slf.get().st(py);
            if generation != me.generation {
                return Ok(());
            }
            me.armed_at = -1;
            let now = me.now(py);
            if me.free_at > now {
                let at = me.free_at;
                me.arm(py, slf, at)?;
                return Ok(());
            }
            let n_active = me.active.len();
            let first = if n_active == 1 {
                0
            } else {
                me.active.partition_point(|&v| v < me.rr)
            };
            let mut pick: Option<usize> = None;
            let mut credit_t = 0;
            for j in 0..n_active {
                let at = first + j; // below 2 * n_active: one subtraction wraps it
                let vc = me.active[if at >= n_active { at - n_active } else { at }];
                if me.credits.is_none() {
                    pick = Some(vc);
                    break;
                }
                let mut t = me.ready[vc];
                if t == UNKNOWN {
                    t = me.when_ready(py, vc);
                }
                if t <= now {
                    pick = Some(vc);
                    credit_t = t;
                    break;
                }
            }
            let Some(pick) = pick else {
                me.arm_next(py, slf, now)?;
                return Ok(());
            };
            let q = me.queues[pick].pop_front().expect("an active VC has a train");
            me.ready[pick] = UNKNOWN;
            if me.queues[pick].is_empty() {
                let at = me.active.iter().position(|&v| v == pick).expect("active");
                me.active.remove(at);
            }
            me.rr = if pick + 1 == me.queues.len() { 0 } else { pick + 1 };
            me.queued -= 1;
            let train = me.train_of(py, q.cargo)?;
            let ser = me.ser(train.st().wire);
            ((train, q.deliver, q.on_start, ser, credit_t), now)
        };
        let ((train, deliver, on_start, ser, credit_t), now) = (queued, now);
        Channel::start(slf, train, deliver, on_start, ser, credit_t)?;
        let mut me = slf.get().st(py);
        if me.queued > 0 {
            me.arm_next(py, slf, now)?;
        }
        Ok(())
    }

    /// Put the train on the wire: at the earliest when the wire is free, its head is
    /// there and (`not_before`) its credits allow.
    fn start(
        slf: &Bound<'_, Channel>,
        train: Bound<'_, Train>,
        deliver: Sink,
        on_start: Hook,
        ser: i64,
        not_before: i64,
    ) -> PyResult<()> {
        let py = slf.py();
        let (start, finish, pkt) = {
            let mut me = slf.get().st(py);
            let now = me.now(py);
            let t = train.st();
            let start = me.free_at.max(t.head).max(not_before);
            let pkt = (t.packet_wire as f64 * me.ps_per_byte + 0.5) as i64;
            let mut finish = start + ser;
            let tail = t.tail + pkt;
            if tail > finish {
                finish = tail;
            }
            if finish < now {
                finish = now; // cannot finish in the past: everything is known only from now on
            }
            me.free_at = finish;
            me.trains += 1;
            me.payload_bytes += t.payload;
            me.wire_bytes += t.wire;
            me.busy_ps += ser;
            let wire = t.wire;
            if let Some(tl) = me.timeline.as_mut() {
                tl.push((start, finish, wire));
            }
            (start, finish, pkt)
        };
        match on_start {
            // before the train's buffer fields change hands
            Hook::None => {}
            Hook::Unit(unit, arg) => unit.on_event(
                py,
                Event::Started {
                    train: &train,
                    start,
                    finish,
                    arg: (arg.0 as i64, arg.1 as usize),
                },
            )?,
            Hook::Call(cb) => {
                cb.call1(py, (&train, start, finish))?;
            }
        }
        let mut me = slf.get().st(py);
        let lat = me.latency_ps;
        let mut t = train.st();
        if let Some(cr) = &me.credits {
            let mut c = cr.get().st(py);
            let fp = c.footprint_of(t.wire);
            let vc = t.vc as usize;
            if c.drains_kind(t.kind) {
                c.stream_at(vc, fp, start + lat, finish + lat); // consumed as it arrives
            } else {
                c.take_at(vc, fp, start + lat);
            }
            t.fp = fp;
        }
        let credits = me.credits.as_ref().map(|c| c.clone_ref(py));
        if let Some(old) = std::mem::replace(&mut t.credits, credits) {
            drop(old.into_bound(py)); // the buffer it left: no thread-local read, as for a `Py`
        }
        t.head = start + pkt + lat;
        let arrive = finish + lat;
        t.tail = arrive;
        drop(t);
        let seq = me.sim.get().reserve(py)?;
        if me.arriving {
            me.in_flight.push_back(Flight {
                train: train.unbind(),
                deliver,
                arrive,
                seq,
            });
            return Ok(());
        }
        me.arriving = true;
        me.sim.get().push_as(
            py,
            arrive,
            seq,
            Action::Arrive(slf.clone().unbind(), train.unbind(), deliver),
        )
    }

    /// A train's tail reached the far end (its arrival ran): count its payload and
    /// queue the arrival of the next train on the wire, if any.
    pub(crate) fn arrived(slf: &Bound<'_, Channel>, payload: i64) -> PyResult<()> {
        let py = slf.py();
        let mut me = slf.get().st(py);
        me.delivered_payload += payload;
        match me.in_flight.pop_front() {
            None => {
                me.arriving = false;
                Ok(())
            }
            Some(f) => me.sim.get().push_as(
                py,
                f.arrive,
                f.seq,
                Action::Arrive(slf.clone().unbind(), f.train, f.deliver),
            ),
        }
    }

    /// Offer a train whose head is available at `train.head` and tail at
    /// `train.tail`.
    pub(crate) fn offer(slf: &Bound<'_, Self>, train: Bound<'_, Train>, deliver: Sink, on_start: Hook) -> PyResult<()> {
        let (vc, wire, head) = {
            let t = train.st();
            (t.vc, t.wire, t.head)
        };
        Channel::enqueue(slf, Cargo::Train(train.unbind()), vc, wire, head, deliver, on_start)
    }

    /// Offer a switch chip's copy for `dst` (the GPU at this channel's far end: every
    /// copy it carries goes there) of its input train `entry`, described by `fanout`;
    /// it is made when it goes on the wire.
    pub(crate) fn offer_copy(
        slf: &Bound<'_, Self>,
        entry: &Bound<'_, Train>,
        fanout: &Arc<Fanout>,
        dst: i64,
        deliver: Sink,
        on_start: Hook,
    ) -> PyResult<()> {
        {
            let mut me = slf.get().st(slf.py());
            debug_assert!(
                me.copies_to < 0 || me.copies_to == dst,
                "a channel's copies go to one GPU"
            );
            me.copies_to = dst;
        }
        let vc = entry.st().vc;
        let cargo = Cargo::Copy {
            entry: entry.clone().unbind(),
            fanout: fanout.clone(),
        };
        Channel::enqueue(slf, cargo, vc, fanout.wire, fanout.head, deliver, on_start)
    }

    /// Put `cargo` (VC `vc`, `wire` bytes, its head available at `head`) on the wire
    /// now if the wire is free, nothing waits and its credits allow; else queue it.
    fn enqueue(
        slf: &Bound<'_, Self>,
        cargo: Cargo,
        vc: i64,
        wire: i64,
        head: i64,
        deliver: Sink,
        on_start: Hook,
    ) -> PyResult<()> {
        let py = slf.py();
        let mut me = slf.get().st(py);
        let now = me.now(py);
        if vc < 0 || vc as usize >= me.queues.len() {
            return Err(PyIndexError::new_err(format!(
                "{}: VC {vc} out of range 0..{}",
                me.name,
                me.queues.len()
            )));
        }
        let vc = vc as usize;
        let ser = me.ser(wire);
        if me.queued == 0 && me.free_at <= now {
            let not_before = match &me.credits {
                None => Some(0),
                Some(cr) => {
                    let mut c = cr.get().st(py);
                    let fp = c.footprint_of(wire);
                    if c.has_free(vc, fp) {
                        Some(0)
                    } else {
                        let lower = me.free_at.max(head);
                        c.earliest_at(vc, fp, ser, lower).filter(|&t| t <= now)
                    }
                }
            };
            if let Some(t) = not_before {
                let train = me.train_of(py, cargo)?;
                drop(me);
                return Channel::start(slf, train, deliver, on_start, ser, t);
            }
        }
        if me.queues[vc].is_empty() {
            let at = me.active.partition_point(|&v| v < vc);
            me.active.insert(at, vc);
            me.ready[vc] = UNKNOWN;
        }
        me.queues[vc].push_back(Queued {
            cargo,
            deliver,
            on_start,
        });
        me.queued += 1;
        if me.queues[vc].len() == 1 {
            me.arm_next(py, slf, now)?;
        }
        Ok(())
    }

    /// Credits are coming back to VC `vc` of the receiving buffer: its head train
    /// may go sooner.
    pub(crate) fn credits_back(slf: &Bound<'_, Channel>, vc: usize) -> PyResult<()> {
        let py = slf.py();
        let mut me = slf.get().st(py);
        if vc >= me.queues.len() || me.queues[vc].is_empty() {
            return Ok(());
        }
        let free_at = me.free_at;
        let known = me.ready[vc];
        if known != UNKNOWN && known <= free_at {
            return Ok(()); // it goes when the wire is free; more credits change nothing
        }
        let now = me.now(py);
        if 0 <= me.armed_at && me.armed_at <= free_at.max(now) {
            me.ready[vc] = UNKNOWN; // an arbitration is due when the wire frees: it will look
            return Ok(());
        }
        let t = me.when_ready(py, vc);
        if t < BLOCKED {
            let t = t.max(free_at);
            me.arm(py, slf, t.max(now))?;
        }
        Ok(())
    }
}

impl Handler for Channel {
    /// The buffer it sends into gives credits back (it is the buffer's waiter).
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            Event::CreditsBack(vc) => Channel::credits_back(slf, vc),
            _ => Err(unexpected("Channel")),
        }
    }
}

#[pymethods]
impl Channel {
    #[new]
    #[pyo3(signature = (sim, name, ps_per_byte, latency_ps, vcs = 1, record_timeline = false, credits = None,
                        credit_rtt_ps = 0))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        py: Python<'_>,
        sim: Py<Simulator>,
        name: String,
        ps_per_byte: f64,
        latency_ps: i64,
        vcs: usize,
        record_timeline: bool,
        credits: Option<Py<Credits>>,
        credit_rtt_ps: i64,
    ) -> PyResult<Self> {
        let mut ser_ps_per_byte = ps_per_byte;
        if let Some(cr) = &credits {
            let per_rtt = true_div(credit_rtt_ps as i128, cr.get().st(py).capacity as i128);
            if per_rtt > ps_per_byte {
                ser_ps_per_byte = per_rtt;
            }
        }
        let timeline = if record_timeline { Some(Vec::new()) } else { None };
        let clock = sim.get().clock();
        Ok(Channel {
            st: GilCell::new(ChannelState {
                clock,
                sim,
                name,
                ps_per_byte,
                latency_ps,
                free_at: 0,
                queues: (0..vcs).map(|_| VecDeque::new()).collect(),
                rr: 0,
                active: Vec::new(),
                queued: 0,
                generation: 0,
                armed_at: -1,
                trains: 0,
                payload_bytes: 0,
                wire_bytes: 0,
                busy_ps: 0,
                delivered_payload: 0,
                copies: 0,
                copies_to: -1,
                timeline,
                credits,
                credit_rtt_ps,
                ready: vec![UNKNOWN; vcs],
                arriving: false,
                in_flight: VecDeque::new(),
                ser_ps_per_byte,
            }),
        })
    }

    /// Offer a train whose head is available at `train.head` and tail at
    /// `train.tail`; `deliver` is a switch chip (its input port) or a callable.
    #[pyo3(signature = (train, deliver, on_start = None))]
    fn send(
        slf: &Bound<'_, Self>,
        train: Bound<'_, Train>,
        deliver: &Bound<'_, PyAny>,
        on_start: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hook = match on_start {
            None => Hook::None,
            Some(f) => Hook::Call(f),
        };
        Channel::offer(slf, train, Sink::of(deliver), hook)
    }

    /// (vc, trains waiting, waiting for credits) for every VC with trains queued.
    fn waiting(&self, py: Python<'_>) -> Vec<(usize, usize, bool)> {
        let me = self.st(py);
        me.active
            .iter()
            .map(|&vc| (vc, me.queues[vc].len(), me.ready[vc] == BLOCKED))
            .collect()
    }

    /// Fraction of `span_ps` the wire was busy.
    fn utilisation(&self, py: Python<'_>, span_ps: i64) -> f64 {
        if span_ps > 0 {
            true_div(self.st(py).busy_ps as i128, span_ps as i128)
        } else {
            0.0
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let me = self.st(py);
        format!("Channel({:?}, free_at={}, queued={})", me.name, me.free_at, me.queued)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        visit.call(&me.credits)?;
        for q in me.queues.iter() {
            for e in q.iter() {
                match &e.cargo {
                    Cargo::Train(t) => visit.call(t)?,
                    Cargo::Copy { entry, .. } => visit.call(entry)?,
                }
                e.deliver.visit(&visit)?;
                match &e.on_start {
                    Hook::None => {}
                    Hook::Unit(u, _) => u.visit(&visit)?,
                    Hook::Call(f) => visit.call(f)?,
                }
            }
        }
        for f in me.in_flight.iter() {
            visit.call(&f.train)?;
            f.deliver.visit(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.timeline = None;
            me.credits = None;
            for q in me.queues.iter_mut() {
                q.clear();
            }
            me.in_flight.clear();
        }
    }
}

properties!(Channel {
    /// What was recorded (None: not recording); set a list to start recording (what to
    /// start from), None to stop.
    timeline: Option<Vec<(i64, i64, i64)>>, set set_timeline;
    credits: Option<Py<Credits>>;
    name: String;
    ps_per_byte: f64;
    latency_ps: i64;
    free_at: i64;
    trains: i64;
    payload_bytes: i64;
    wire_bytes: i64;
    busy_ps: i64;
    delivered_payload: i64;
    copies: i64;
    credit_rtt_ps: i64;
});
