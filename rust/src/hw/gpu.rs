//! A GPU's NVLink endpoint: what happens when a packet arrives, and its ports into
//! the fabric.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::channel::{Channel, Hook, Sink};
use crate::engine::completion::complete;
use crate::engine::credits::Credits;
use crate::engine::sim::{Action, Clock, Simulator};
use crate::engine::train::{obj, opt, opt_ref, Train, TrainState};
use crate::engine::unit::{unexpected, Begun, Event, Handler, UnitRef};
use crate::engine::wait::{Process, Signal};
use crate::hw::hbm::HbmShare;
use crate::hw::kinds::*;
use crate::hw::packets::PacketBook;
use crate::hw::params::{ps, SystemParams};
use crate::hw::region::region_bytes;
use crate::hw::sm_port::SmPort;
use crate::hw::switch::SwitchChip;

/// The endpoint's own timed events (`Event::Due`).
const RESPOND: u8 = 0;
const DRAIN_HELD: u8 = 1;

/// A GPU's NVLink endpoint. An input buffer per switch chip and VC, drained as
/// packets arrive: writes and reductions land in memory; read requests (plain,
/// NVLS pulls, `ld.cais`) are answered after `memory_latency_ps`, at most
/// `serve_bytes` at once (a request beyond that waits in its buffer, holding its
/// credits, and so does every train behind it); responses, deliveries and flags
/// call the issuer's completion (`train.done`). Signal words count what landed
/// (`red.cais` sums add their contributions once their data is in). Its ports:
/// one up channel per switch chip, bound by `connect` when the fabric is built.
///
/// A kind with a Python handler in `handlers` (returning whether it could take the
/// train) is served by it instead. `cais.hw.gpu.Gpu` adds the SMs and the TB
/// dispatcher.
#[pyclass(module = "cais._core", subclass, frozen)]
pub struct Endpoint {
    st: GilCell<EndpointState>,
}

/// The mutable state of a [`Endpoint`] (see there), borrowed while holding the GIL.
pub(crate) struct EndpointState {
    sim: Py<Simulator>,
    clock: Clock,
    index: i64,
    memory: Py<PyAny>,
    functional: bool,
    pk: Py<PyAny>,
    vcmap: Py<PyAny>,
    packets: PacketBook,
    memory_latency_ps: i64,
    serve_bytes: i64,
    /// Bytes of reads being served.
    serving: i64,
    /// Reads whose data is being read, in the order they are due (each `memory_latency_ps`
    /// after it came, so their times only grow), each with the schedule order reserved
    /// for its response when it came: only the first is in the simulator's queue, and
    /// it queues the next when it runs. The responses run exactly when they would if
    /// each were queued when its read came, and the queue stays small (tens of
    /// thousands of NVLS pulls can be in a GPU's memory at once on a large machine).
    reading: VecDeque<(i64, u64, Py<Train>)>,
    /// Whether the first of `reading` is in the simulator's queue.
    responding: bool,
    hbm: Option<Py<HbmShare>>,
    held: Vec<Vec<VecDeque<Py<Train>>>>,
    holding: i64,
    handlers: Py<PyDict>,
    signals: HashMap<i64, i64>,
    signal_waits: HashMap<i64, Vec<(i64, Py<PyAny>)>>,
    up: Vec<Py<Channel>>,
    switches: Vec<Py<SwitchChip>>,
    ack_flits: i64,
    /// Payload bytes this GPU put on the fabric.
    injected: i64,
}

unit!(Endpoint, EndpointState);

impl Endpoint {
    /// A train's tail has arrived from chip `train.chip`. The buffer drains as
    /// trains arrive (its sender already scheduled their credits' return); a train
    /// that cannot be taken yet is held, and so is every train behind it.
    pub(crate) fn receive_train(slf: &Bound<'_, Self>, train: Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (c, v) = {
            let me = slf.st();
            let t = train.st();
            let c = py_index(t.chip, me.held.len())?;
            (c, py_index(t.vc, me.held[c].len())?)
        };
        let busy = !slf.st().held[c][v].is_empty();
        if busy || !Endpoint::consume(slf, &train)? {
            let mut me = slf.st();
            let now = me.now(py);
            let (cr, vc, fp) = {
                let t = train.st();
                (t.credits.as_ref().map(|x| x.clone_ref(py)), t.vc, t.fp)
            };
            if let Some(cr) = cr {
                cr.get().st(py).take_at(vc as usize, fp, now); // hold: reclaim the scheduled return
            }
            me.held[c][v].push_back(train.unbind());
            me.holding += 1;
        }
        Ok(())
    }

    /// Take `train` out of the input buffer (false: it cannot be taken yet).
    fn consume(slf: &Bound<'_, Self>, train: &Bound<'_, Train>) -> PyResult<bool> {
        let py = slf.py();
        let kind = train.st().kind;
        let handler = handler(py, &slf.st().handlers, kind)?;
        if let Some(h) = handler {
            return h.call1((train,))?.is_truthy();
        }
        match kind {
            WRITE | RED | RED_CAIS => Endpoint::write(slf, train),
            READ_REQ | MC_PULL_REQ | LD_CAIS_REQ => Endpoint::read(slf, train),
            FLAG => Endpoint::flag(slf, train),
            _ => {
                let now = slf.st().now(py);
                complete(train, now)?; // responses, flags, acks, group releases: the issuer's completion
                Ok(true)
            }
        }
    }

    fn write(slf: &Bound<'_, Self>, train: &Bound<'_, Train>) -> PyResult<bool> {
        let py = slf.py();
        let (kind, payload, tag, count, src, fenced) = {
            let t = train.st();
            (t.kind, t.payload, t.tag, t.count, t.src, t.fence.is_some())
        };
        let (functional, memory, now) = {
            let me = slf.st();
            (me.functional, me.memory.clone_ref(py), me.now(py))
        };
        if functional {
            let t = train.st();
            let (addr, data) = (obj(&t.addr, py), obj(&t.data, py));
            drop(t);
            memory
                .bind(py)
                .call_method1(if kind == WRITE { "write" } else { "add" }, (addr, data))?;
        }
        // a reduction near memory reads, adds and writes back
        slf.st()
            .stream(py, now, if kind == WRITE { payload } else { 2 * payload });
        if kind == RED_CAIS && tag >= 0 {
            Endpoint::signal_word(slf, tag, count * payload)?; // after its data: the contributions it sums
        }
        let ack = {
            let me = slf.st();
            me.connected() && src >= 0 && (fenced || me.ack_flits != 0)
        };
        if ack {
            Endpoint::ack_write(slf, train)?;
        }
        complete(train, now)?;
        Ok(true)
    }

    /// A flag lands (the peer polling it sees it); a fence probe is answered.
    fn flag(slf: &Bound<'_, Self>, train: &Bound<'_, Train>) -> PyResult<bool> {
        let fenced = train.st().fence.is_some();
        if fenced && slf.st().connected() {
            Endpoint::ack_write(slf, train)?;
        }
        let now = slf.st().now(slf.py());
        complete(train, now)?;
        Ok(true)
    }

    fn read(slf: &Bound<'_, Self>, req: &Bound<'_, Train>) -> PyResult<bool> {
        let py = slf.py();
        let want = req.st().want;
        let mut me = slf.st();
        if me.serving != 0 && me.serving + want > me.serve_bytes {
            return Ok(false);
        }
        me.serving += want;
        let at = me.now(py) + me.memory_latency_ps;
        let seq = me.sim.get().reserve(py)?;
        if me.responding {
            me.reading.push_back((at, seq, req.clone().unbind()));
        } else {
            me.responding = true;
            let due = Action::Due(UnitRef::of_bound(slf), RESPOND, Some(req.clone().unbind()));
            me.sim.get().push_as(py, at, seq, due)?;
        }
        Ok(true)
    }

    /// A read's data is read: queue the next read's response (`reading`), then send
    /// this one's.
    fn read_done(slf: &Bound<'_, Self>, req: Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        {
            let mut me = slf.st();
            match me.reading.pop_front() {
                None => me.responding = false,
                Some((at, seq, next)) => {
                    let due = Action::Due(UnitRef::of_bound(slf), RESPOND, Some(next));
                    me.sim.get().push_as(py, at, seq, due)?;
                }
            }
        }
        Endpoint::respond(slf, req)
    }

    /// A read request's data is read: send the response.
    pub(crate) fn respond(slf: &Bound<'_, Self>, req: Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (req_kind, addr) = {
            let r = req.st();
            (r.kind, obj(&r.addr, py))
        };
        let kind = match req_kind {
            READ_REQ => READ_RESP,
            MC_PULL_REQ => MC_PULL_RESP,
            _ => LD_CAIS_RESP,
        };
        let nbytes = region_bytes(addr.bind(py))?;
        let resp = {
            let mut me = slf.st();
            let now = me.now(py);
            me.stream(py, now, nbytes);
            let (wire, last) = me.packets.wire(py, kind, nbytes)?;
            let to = req.st().src;
            let src = me.index;
            let vc = me.packets.vc_to(py, kind, 0, src, to)?;
            let data = if me.functional {
                me.memory.bind(py).call_method1("read", (&addr,))?.unbind()
            } else {
                py.None()
            };
            let r = req.st();
            let mut t = TrainState::blank(nbytes, wire, last, kind, me.index, r.src);
            t.chip = r.chip;
            t.addr = opt(addr, py);
            t.data = opt(data, py);
            t.done = opt_ref(&r.done, py);
            t.vc = vc;
            t.want = r.want;
            t.tag = r.tag;
            me.sim.get().new_train(py, t)?
        };
        Endpoint::inject_train(slf, resp, None, None, Hook::Unit(UnitRef::of_bound(slf), (0, 0)))
    }

    /// A response is on the wire: its bytes stop counting; held requests may go.
    pub(crate) fn served(slf: &Bound<'_, Self>, resp: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let want = resp.st().want;
        let mut me = slf.st();
        me.serving -= want;
        if me.holding != 0 {
            let now = me.now(py);
            me.sim
                .get()
                .push(py, now, Action::Due(UnitRef::of_bound(slf), DRAIN_HELD, None))?;
        }
        Ok(())
    }

    pub(crate) fn drain_held(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let now = slf.st().now(py);
        let chips = slf.st().held.len();
        for c in 0..chips {
            let vcs = slf.st().held[c].len();
            for v in 0..vcs {
                loop {
                    let front = match slf.st().held[c][v].front() {
                        None => break,
                        Some(t) => t.clone_ref(py).into_bound(py),
                    };
                    if !Endpoint::consume(slf, &front)? {
                        break;
                    }
                    {
                        let mut me = slf.st();
                        me.held[c][v].pop_front();
                        me.holding -= 1;
                    }
                    let (cr, vc, fp) = {
                        let t = front.st();
                        (t.credits.as_ref().map(|x| x.clone_ref(py)), t.vc, t.fp)
                    };
                    if let Some(cr) = cr {
                        Credits::give_back_at(cr.bind(py), vc, fp, now, now, true)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Send the write response of a delivered write back to its issuer (it calls the
    /// write's `fence` there).
    fn ack_write(slf: &Bound<'_, Self>, write: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let ack = {
            let mut me = slf.st();
            let w = write.st();
            let (wire, last) = me.packets.wire(py, WRITE_ACK, w.payload)?;
            let src = me.index;
            let vc = me.packets.vc_to(py, WRITE_ACK, 0, src, w.src)?;
            let mut t = TrainState::blank(0, wire, last, WRITE_ACK, me.index, w.src);
            t.chip = w.chip;
            t.done = opt_ref(&w.fence, py);
            t.vc = vc;
            me.sim.get().new_train(py, t)?
        };
        Endpoint::inject_train(slf, ack, None, None, Hook::None)
    }

    /// Put a train on this GPU's port to `train.chip` (head and tail default to now).
    pub(crate) fn inject_train(
        slf: &Bound<'_, Self>,
        train: Bound<'_, Train>,
        head: Option<i64>,
        tail: Option<i64>,
        on_start: Hook,
    ) -> PyResult<()> {
        let py = slf.py();
        let (channel, switch) = {
            let mut me = slf.st();
            if !me.connected() {
                return Err(PyRuntimeError::new_err(format!(
                    "gpu{} is not connected to a fabric",
                    me.index
                )));
            }
            let now = me.now(py);
            let mut t = train.st();
            t.head = head.unwrap_or(now);
            t.tail = tail.unwrap_or(t.head);
            me.injected += t.payload;
            let c = py_index(t.chip, me.up.len())?;
            (me.up[c].bind(py).clone(), me.switches[c].clone_ref(py))
        };
        Channel::offer(&channel, train, Sink::Unit(UnitRef::new(switch)), on_start)
    }

    /// Build the train `piece` of operation `op` and put it on this GPU's port to its
    /// chip, its head and tail at `head`/`tail` (default now; a store or reduction reads
    /// its payload from this GPU's HBM first).
    fn issue_train(slf: &Bound<'_, Self>, op: &Op, piece: Piece, head: Option<i64>, tail: Option<i64>) -> PyResult<()> {
        let py = slf.py();
        let kind = op.kind;
        let Piece {
            chip,
            addr,
            data,
            done,
            payload,
            nbytes,
            want,
            fence,
        } = piece;
        let train = {
            let mut me = slf.st();
            if payload != 0 && matches!(kind, WRITE | RED | MC_STORE | MC_RED | RED_CAIS) {
                let now = me.now(py);
                me.stream(py, now, payload); // the data is read from the issuer's HBM
            }
            let (wire, last) = me.packets.wire(py, kind, nbytes)?;
            let src = me.index;
            let vc = me.packets.vc_to(py, kind, op.stream, src, op.dst)?;
            let mut t = TrainState::blank(payload, wire, last, kind, me.index, op.dst);
            t.chip = chip;
            t.addr = addr;
            t.data = data;
            t.done = done;
            t.vc = vc;
            t.want = want;
            t.tag = op.tag;
            t.expect = op.expect;
            t.quorum = op.quorum;
            t.fence = fence;
            me.sim.get().new_train(py, t)?
        };
        Endpoint::inject_train(slf, train, head, tail, Hook::None)
    }

    /// Add `amount` to signal word `key`; run the waits it satisfies.
    pub(crate) fn signal_word(slf: &Bound<'_, Self>, key: i64, amount: i64) -> PyResult<()> {
        let py = slf.py();
        let ready = {
            let mut me = slf.st();
            let value = me.signals.get(&key).copied().unwrap_or(0) + amount;
            me.signals.insert(key, value);
            match me.signal_waits.get_mut(&key) {
                Some(waits) if waits.iter().any(|(target, _)| value >= *target) => {
                    let (ready, left): (Vec<_>, Vec<_>) = waits.drain(..).partition(|(target, _)| value >= *target);
                    *waits = left;
                    ready
                }
                _ => Vec::new(),
            }
        };
        for (_, f) in ready {
            f.call0(py)?;
        }
        Ok(())
    }
}

impl EndpointState {
    pub(crate) fn now(&self, py: Python<'_>) -> i64 {
        let _ = py;
        self.clock.now()
    }

    fn stream(&self, py: Python<'_>, now: i64, nbytes: i64) {
        if let Some(h) = &self.hbm {
            h.get().st(py).count(now, nbytes as f64);
        }
    }

    fn connected(&self) -> bool {
        !self.up.is_empty()
    }
}

/// What the trains of one ISA operation share: its kind, its destination, the
/// issuing kernel's stream (for the VC), its signal word or session (`tag`, -1: none),
/// and the requesters its merge session expects and the quorum that answers them.
pub(crate) struct Op {
    pub kind: i64,
    pub dst: i64,
    pub stream: i64,
    pub tag: i64,
    pub expect: i64,
    pub quorum: i64,
}

/// One train of an operation: the chip it crosses, its address (a region) and data,
/// its completion and its write response's (`fence`), the payload it carries, the
/// bytes its wire size is counted from and the bytes it asks for (`want`: a load).
struct Piece {
    chip: i64,
    addr: Option<Py<PyAny>>,
    data: Option<Py<PyAny>>,
    done: Option<Py<PyAny>>,
    payload: i64,
    nbytes: i64,
    want: i64,
    fence: Option<Py<PyAny>>,
}

/// What an operation's stripes carry: with `loads` each asks for its region's bytes
/// and carries none; else each carries them, pushed through the SM's `port` (if any)
/// and read from this GPU's HBM. `data`: each stripe's data (functional mode);
/// `fences`: each stripe's completion of its write response; `encoding`: wire bytes
/// per data byte of a protocol's line format.
pub(crate) struct Carry<'py> {
    pub loads: bool,
    pub port: Option<Bound<'py, SmPort>>,
    pub data: Option<Bound<'py, PyList>>,
    pub fences: Option<Bound<'py, PyList>>,
    pub encoding: f64,
}

impl Carry<'_> {
    /// A load's: no data, no port.
    pub(crate) fn loads() -> Self {
        Carry {
            loads: true,
            port: None,
            data: None,
            fences: None,
            encoding: 1.0,
        }
    }
}

impl Endpoint {
    /// A load's stripes (as [`Endpoint::issue_stripes`] takes them) to `home`,
    /// completing into `done`.
    pub(crate) fn issue_loads(
        slf: &Bound<'_, Self>,
        kind: i64,
        home: i64,
        stripes: &Bound<'_, PyList>,
        done: Py<PyAny>,
        quorum: i64,
    ) -> PyResult<()> {
        let op = Op {
            kind,
            dst: home,
            stream: 0,
            tag: -1,
            expect: 0,
            quorum,
        };
        Endpoint::issue_stripes(slf, &op, stripes, done, Carry::loads())
    }

    /// Operation `op` cut into `stripes`, a list of (region, chip), one train each,
    /// with `done` as each train's completion, carrying what `carry` says
    /// ([`Endpoint::issue_pieces`] from Python).
    pub(crate) fn issue_stripes(
        slf: &Bound<'_, Self>,
        op: &Op,
        stripes: &Bound<'_, PyList>,
        done: Py<PyAny>,
        carry: Carry<'_>,
    ) -> PyResult<()> {
        let py = slf.py();
        for (i, stripe) in stripes.iter().enumerate() {
            let stripe = stripe.cast::<PyTuple>()?;
            let region = stripe.get_item(0)?;
            let chip: i64 = stripe.get_item(1)?.extract()?;
            let raw = region_bytes(&region)?;
            let mut nbytes = raw;
            if carry.encoding != 1.0 {
                // a protocol's line format (LL, LL128): flags ride in the lines
                let scaled = (raw as f64 * carry.encoding * 1024.0) as i64;
                nbytes = -((-scaled).div_euclid(1024));
            }
            let (payload, want) = if carry.loads { (0, raw) } else { (raw, 0) };
            let (mut head, mut tail) = (None, None);
            if let Some(port) = carry.port.as_ref() {
                if payload != 0 {
                    // the SM pushes the data at its rate
                    let now = slf.st().now(py);
                    let (h, t) = port.st().push_at(now, payload);
                    (head, tail) = (Some(h), Some(t));
                }
            }
            let data = match carry.data.as_ref() {
                Some(d) => opt(d.get_item(i)?.unbind(), py),
                None => None,
            };
            let fence = match carry.fences.as_ref() {
                Some(f) => opt(f.get_item(i)?.unbind(), py),
                None => None,
            };
            let piece = Piece {
                chip,
                addr: opt(region.unbind(), py),
                data,
                done: opt(done.clone_ref(py), py),
                payload,
                nbytes,
                want,
                fence,
            };
            Endpoint::issue_train(slf, op, piece, head, tail)?;
        }
        Ok(())
    }
}

impl Handler for Endpoint {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            // a train from a switch chip reaches its input port
            Event::Arrived(train) => Endpoint::receive_train(slf, train),
            // a read response goes on the wire
            Event::Started { train, .. } => Endpoint::served(slf, train),
            Event::Due {
                what: RESPOND,
                train: Some(req),
                ..
            } => Endpoint::read_done(slf, req),
            Event::Due { what: DRAIN_HELD, .. } => Endpoint::drain_held(slf),
            _ => Err(unexpected("Endpoint")),
        }
    }

    /// A TB of this GPU registers with TB group `group` (`members` GPUs) at the Group
    /// Sync Table of chip `chip` (`args`: chip, group, members), as `group_sync`; its
    /// plan waits for the release.
    fn begin(
        slf: &Bound<'_, Self>,
        _sim: &Bound<'_, Simulator>,
        args: [i64; 3],
        process: &Bound<'_, Process>,
    ) -> PyResult<Begun> {
        let [chip, group, members] = args;
        // the release, when it is back, resumes the TB's process itself
        Endpoint::register(slf, chip, group, members, process.clone().into_any().unbind())?;
        Ok(Begun::Held)
    }
}

#[pymethods]
impl Endpoint {
    /// GPU `index` on `sim`, with what it reads of the system config `cfg`
    /// (`gpu.memory_latency_ns`, `gpu.read_serve_kB`, `switch.chips`, `link.vcs`: see
    /// `params.rs`), its `memory`, the packet format and VC map, and its HBM share.
    #[new]
    #[pyo3(signature = (sim, index, cfg, memory, packetizer, vcmap, hbm = None))]
    fn new(
        sim: Bound<'_, Simulator>,
        index: i64,
        cfg: SystemParams,
        memory: Bound<'_, PyAny>,
        packetizer: Py<PyAny>,
        vcmap: Py<PyAny>,
        hbm: Option<Py<HbmShare>>,
    ) -> PyResult<Self> {
        let py = sim.py();
        let functional = memory.getattr("functional")?.is_truthy()?;
        let clock = sim.get().clock();
        let (chips, vcs) = (cfg.switch.chips, cfg.link.vcs);
        Ok(Endpoint::from(EndpointState {
            clock,
            sim: sim.unbind(),
            index,
            memory: memory.unbind(),
            functional,
            packets: PacketBook::new(py, packetizer.clone_ref(py), vcmap.clone_ref(py), cfg.gpus)?,
            pk: packetizer,
            vcmap,
            memory_latency_ps: ps(cfg.gpu.memory_latency_ns, 1e3),
            serve_bytes: ps(cfg.gpu.read_serve_kB, 1024.0),
            serving: 0,
            reading: VecDeque::new(),
            responding: false,
            hbm,
            held: (0..chips)
                .map(|_| (0..vcs).map(|_| VecDeque::new()).collect())
                .collect(),
            holding: 0,
            handlers: PyDict::new(py).unbind(),
            signals: HashMap::default(),
            signal_waits: HashMap::default(),
            up: Vec::new(),
            switches: Vec::new(),
            ack_flits: 0,
            injected: 0,
        }))
    }

    /// This GPU's HBM (its streams are counted here).
    #[getter]
    fn hbm(&self, py: Python<'_>) -> Option<Py<HbmShare>> {
        let me = self.st(py);
        me.hbm.as_ref().map(|h| h.clone_ref(py))
    }

    #[setter]
    fn set_hbm(&self, py: Python<'_>, hbm: Py<HbmShare>) {
        let mut me = self.st(py);
        me.hbm = Some(hbm);
    }

    /// Signal words: key -> value (a copy).
    #[getter]
    fn signals(&self, py: Python<'_>) -> HashMap<i64, i64> {
        let me = self.st(py);
        me.signals.clone()
    }

    /// Bind the ports: `up[c]` is this GPU's channel to switch chip `c`, whose input
    /// port `switches[c]` is; `write_ack_flits` (of the packet format): writes are
    /// acknowledged per packet when non-zero, else only fenced ones.
    fn connect(&self, py: Python<'_>, up: Vec<Py<Channel>>, switches: Vec<Py<SwitchChip>>, write_ack_flits: i64) {
        let mut me = self.st(py);
        me.up = up;
        me.switches = switches;
        me.ack_flits = write_ack_flits;
    }

    /// A train's tail has arrived from chip `train.chip`.
    fn receive(slf: &Bound<'_, Self>, train: Bound<'_, Train>) -> PyResult<()> {
        Endpoint::receive_train(slf, train)
    }

    /// Put a train on this GPU's port to `train.chip`. `head`/`tail` default to now
    /// (the data is all ready); an SM pushing data at a finite rate passes later
    /// times. `on_start` runs when it goes on the wire.
    #[pyo3(signature = (train, head = None, tail = None, on_start = None))]
    fn inject(
        slf: &Bound<'_, Self>,
        train: Bound<'_, Train>,
        head: Option<i64>,
        tail: Option<i64>,
        on_start: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hook = match on_start {
            None => Hook::None,
            Some(f) => Hook::Call(f),
        };
        Endpoint::inject_train(slf, train, head, tail, hook)
    }

    /// A `__threadfence_system`'s probes (`cais.isa.Isa.fence`): for each of `dsts` in
    /// order, one zero-payload flag of `wire` bytes (`last`: its last packet's) down
    /// each chip `0..chips` in turn, on VC `vc` and traffic class `cls`, its write
    /// response completing `acked`; each put on its port as `inject` does (head and
    /// tail now).
    #[allow(clippy::too_many_arguments)] // the Python method's parameters
    fn fence_probes(
        slf: &Bound<'_, Self>,
        dsts: Vec<i64>,
        chips: i64,
        wire: i64,
        last: i64,
        vc: i64,
        cls: i64,
        acked: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let src = slf.st().index;
        for &dst in &dsts {
            for chip in 0..chips {
                let mut t = TrainState::blank(0, wire, last, FLAG, src, dst);
                t.chip = chip;
                t.vc = slf.st().packets.at(py, vc, src, dst)?;
                t.cls = cls;
                t.fence = opt(acked.clone_ref(py), py);
                let probe = slf.st().sim.get().new_train(py, t)?;
                Endpoint::inject_train(slf, probe, None, None, Hook::None)?;
            }
        }
        Ok(())
    }

    /// A TB's registration with TB group `group` (`members` GPUs) at the Group Sync
    /// Table of chip `chip`: one empty packet up; the signal returned fires when the
    /// switch's release has come back (CAIS §III-B). `issue` with `GROUP_SYNC`, built
    /// here: a layer's TBs register twice each.
    pub(crate) fn group_sync(slf: &Bound<'_, Self>, chip: i64, group: i64, members: i64) -> PyResult<Py<Signal>> {
        let py = slf.py();
        let released = Py::new(py, Signal::blank(py))?;
        Endpoint::register(slf, chip, group, members, released.clone_ref(py).into_any())?;
        Ok(released)
    }

    /// What an SM issues (`cais.isa`): a train of `kind` for `nbytes` of data (or, for
    /// a request, the bytes it asks for) to `dst` across chip `chip`, carrying
    /// `payload` bytes, on the VC of `kind` and the issuing kernel's `stream`, put on
    /// this GPU's port with its head and tail at `head`/`tail` (default now). A store
    /// or reduction reads its payload from this GPU's HBM first.
    #[pyo3(signature = (kind, dst, chip, addr, data, done, payload, nbytes, want = 0, fence = None, tag = -1,
                        expect = 0, quorum = 0, stream = 0, head = None, tail = None))]
    #[allow(clippy::too_many_arguments)] // the Python method's parameters
    fn issue(
        slf: &Bound<'_, Self>,
        kind: i64,
        dst: i64,
        chip: i64,
        addr: Option<Py<PyAny>>,
        data: Option<Py<PyAny>>,
        done: Option<Py<PyAny>>,
        payload: i64,
        nbytes: i64,
        want: i64,
        fence: Option<Py<PyAny>>,
        tag: i64,
        expect: i64,
        quorum: i64,
        stream: i64,
        head: Option<i64>,
        tail: Option<i64>,
    ) -> PyResult<()> {
        let op = Op {
            kind,
            dst,
            stream,
            tag,
            expect,
            quorum,
        };
        let piece = Piece {
            chip,
            addr,
            data,
            done,
            payload,
            nbytes,
            want,
            fence,
        };
        Endpoint::issue_train(slf, &op, piece, head, tail)
    }

    /// An operation cut into `stripes`, a list of (region, chip), one train each: what
    /// `issue` does for every stripe, with `done` (a `Completion` over all of them) as
    /// each train's completion. `loads`: each train asks for its region's bytes
    /// (`want`) and carries none; else it carries them, pushed through the SM's `port`
    /// (if any) and read from this GPU's HBM. `data`: each stripe's data (functional
    /// mode); `fences`: each stripe's completion of its write response, or None.
    /// `encoding`: wire bytes per data byte of a protocol's line format.
    #[pyo3(signature = (kind, dst, stripes, done, port = None, stream = 0, loads = false, data = None, tag = -1,
                        expect = 0, quorum = 0, encoding = 1.0, fences = None))]
    #[allow(clippy::too_many_arguments)] // the Python method's parameters
    fn issue_pieces(
        slf: &Bound<'_, Self>,
        kind: i64,
        dst: i64,
        stripes: &Bound<'_, PyList>,
        done: Py<PyAny>,
        port: Option<Bound<'_, SmPort>>,
        stream: i64,
        loads: bool,
        data: Option<Bound<'_, PyList>>,
        tag: i64,
        expect: i64,
        quorum: i64,
        encoding: f64,
        fences: Option<Bound<'_, PyList>>,
    ) -> PyResult<()> {
        let op = Op {
            kind,
            dst,
            stream,
            tag,
            expect,
            quorum,
        };
        let carry = Carry {
            loads,
            port,
            data,
            fences,
            encoding,
        };
        Endpoint::issue_stripes(slf, &op, stripes, done, carry)
    }

    /// Send the write response of a delivered write back to its issuer.
    fn ack(slf: &Bound<'_, Self>, write: Bound<'_, Train>) -> PyResult<()> {
        Endpoint::ack_write(slf, &write)
    }

    /// Add `amount` to signal word `key` in this GPU's memory (as a reduction
    /// carrying a signal does once its data has landed, cf. NVSHMEM's
    /// put-with-signal).
    fn signal(slf: &Bound<'_, Self>, key: i64, amount: i64) -> PyResult<()> {
        Endpoint::signal_word(slf, key, amount)
    }

    /// Run `fn` once signal word `key` reaches `target` (a kernel polling it).
    fn wait_signal(&self, py: Python<'_>, key: i64, target: i64, r#fn: Py<PyAny>) -> PyResult<()> {
        let mut me = self.st(py);
        if me.signals.get(&key).copied().unwrap_or(0) >= target {
            let now = me.now(py);
            me.sim
                .get()
                .push(py, now, Action::Call(r#fn, PyTuple::empty(py).unbind()))
        } else {
            me.signal_waits.entry(key).or_default().push((target, r#fn));
            Ok(())
        }
    }

    /// Input buffers holding requests it cannot serve yet (for the watchdog).
    fn stuck(&self, py: Python<'_>) -> Vec<String> {
        let me = self.st(py);
        let mut out = Vec::new();
        for (c, per_chip) in me.held.iter().enumerate() {
            for (vc, held) in per_chip.iter().enumerate() {
                if !held.is_empty() {
                    out.push(format!(
                        "gpu{} input from sw{c} VC {vc}: {} train(s) held ({}/{} read bytes being served)",
                        me.index,
                        held.len(),
                        me.serving,
                        me.serve_bytes
                    ));
                }
            }
        }
        out
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        visit.call(&me.memory)?;
        me.packets.visit(&visit)?;
        visit.call(&me.hbm)?;
        visit.call(&me.handlers)?;
        for per_chip in me.held.iter() {
            for q in per_chip.iter() {
                for t in q.iter() {
                    visit.call(t)?;
                }
            }
        }
        for waits in me.signal_waits.values() {
            for (_, f) in waits.iter() {
                visit.call(f)?;
            }
        }
        for (_, _, t) in me.reading.iter() {
            visit.call(t)?;
        }
        for c in me.up.iter() {
            visit.call(c)?;
        }
        for s in me.switches.iter() {
            visit.call(s)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.hbm = None;
            me.held.clear();
            me.reading.clear();
            me.signal_waits.clear();
            me.up.clear();
            me.switches.clear();
        }
    }
}

properties!(Endpoint {
    sim: Py<Simulator>;
    index: i64;
    memory: Py<PyAny>;
    pk: Py<PyAny>;
    vcmap: Py<PyAny>;
    memory_latency_ps: i64;
    serve_bytes: i64;
    serving: i64;
    handlers: Py<PyDict>;
    injected: i64;
});

impl Endpoint {
    /// `group_sync`'s registration, the release's completion being `done` (a signal,
    /// or the process of the TB that waits: resumed when the release is back).
    fn register(slf: &Bound<'_, Self>, chip: i64, group: i64, members: i64, done: Py<PyAny>) -> PyResult<()> {
        let op = Op {
            kind: GROUP_SYNC,
            dst: -1,
            stream: 0,
            tag: group,
            expect: members,
            quorum: 0,
        };
        let piece = Piece {
            chip,
            addr: None,
            data: None,
            done: Some(done),
            payload: 0,
            nbytes: 0,
            want: 0,
            fence: None,
        };
        Endpoint::issue_train(slf, &op, piece, None, None)
    }
}
