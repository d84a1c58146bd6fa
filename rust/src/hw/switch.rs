//! One NVSwitch chip: input buffers, a crossbar that forwards packets between its
//! GPU ports, and (with NVLS) the engine that multicasts stores and reduces loads
//! in the switch.
//!
//! Each input port (one per GPU) has one buffer per virtual channel, sized and
//! flow-controlled by the credits of the channel that feeds it. A train is handed
//! to its output port(s) as it arrives (virtual output queues: a train for a free
//! output does not wait behind one for a busy output) and holds its input buffer
//! until its last copy is on the wire. Head-of-line blocking comes from the shared
//! buffer: when trains for a congested output fill a VC's buffer, the sender has no
//! credits left for anything else on that VC, whatever its output; other VCs are
//! not affected. A packet kind is served by a Python handler registered for it in
//! `handlers`, if any (a test's unit); else, on a CAIS chip, by the compiled merge
//! unit of the home's port (`ld.cais`, `red.cais`: `merge.rs`) or the Group Sync
//! Table (registrations: `group_sync.rs`); else by the NVLS engine for the NVLS kinds
//! when it is enabled; else it is forwarded to its destination GPU.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::channel::{Channel, Hook, Sink};
use crate::engine::credits::Credits;
use crate::engine::sim::{Action, Clock, Simulator};
use crate::engine::train::{opt, opt_ref, Fanout, Train, TrainState};
use crate::engine::unit::{unexpected, Event, Handler, UnitRef};
use crate::hw::gpu::Endpoint;
use crate::hw::group_sync::{Admitted, GroupSyncTable};
use crate::hw::kinds::*;
use crate::hw::merge::MergeUnit;
use crate::hw::packets::PacketBook;
use crate::hw::params::{ps, SwitchConfig, SystemParams};

const NEVER: i64 = 1 << 62;
/// The chip's own timed event: a Group Sync Table entry's deadline.
const SYNC_TIMEOUT: u8 = 0;

/// Byte accounting of a switch chip, for the conservation check:
/// bytes in + bytes created by multicast = bytes out + bytes absorbed by reduction.
#[pyclass(module = "cais._core", frozen)]
pub struct SwitchLedger {
    st: GilCell<SwitchLedgerState>,
}

/// The mutable state of a [`SwitchLedger`] (see there), borrowed while holding the GIL.
#[derive(Default)]
pub(crate) struct SwitchLedgerState {
    pub bytes_in: i64,
    pub bytes_out: i64,
    pub multicast_created: i64,
    pub reduction_absorbed: i64,
}

unit!(SwitchLedger, SwitchLedgerState);

impl Handler for SwitchChip {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            // a train from a GPU reaches its input port
            Event::Arrived(train) => SwitchChip::receive_train(slf, train),
            // a train leaves its input buffer
            Event::Started {
                train, start, finish, ..
            } => SwitchChip::departed(slf, train, start, finish),
            // a Group Sync Table entry's deadline
            Event::Due { what: SYNC_TIMEOUT, .. } => SwitchChip::sync_deadlines(slf),
            _ => Err(unexpected("SwitchChip")),
        }
    }
}

#[pymethods]
impl SwitchLedger {
    #[new]
    fn new() -> Self {
        SwitchLedger::from(SwitchLedgerState::default())
    }

    fn balanced(&self, py: Python<'_>) -> bool {
        let me = self.st(py);
        me.bytes_in + me.multicast_created == me.bytes_out + me.reduction_absorbed
    }
}

properties!(SwitchLedger {
    bytes_in: i64, set set_bytes_in;
    bytes_out: i64, set set_bytes_out;
    multicast_created: i64, set set_multicast_created;
    reduction_absorbed: i64, set set_reduction_absorbed;
});

/// A merge unit's (partial) sum on its way to its home GPU `home`: `nbytes` at `addr`
/// (its `data` in functional mode), on VC `vc` with class `cls`, for signal word
/// `signal`, carrying `count` contributions, its head ready at `head` (before the
/// chip's reduction latency).
pub(crate) struct HomeSum {
    pub home: i64,
    pub nbytes: i64,
    pub addr: Py<PyAny>,
    pub data: Py<PyAny>,
    pub vc: i64,
    pub cls: i64,
    pub signal: i64,
    pub count: i64,
    pub head: i64,
}

/// State of one in-flight `multimem.ld_reduce`: responses still expected, the
/// running sum, and the latest head time among the responses.
struct Reduction {
    issuer: i64,
    remaining: i64,
    acc: Option<Py<PyAny>>,
    head: i64,
    nbytes: i64,
    addr: Option<Py<PyAny>>,
    done: Option<Py<PyAny>>,
}

/// A switch chip with one port per GPU (the GPU's links to this chip, taken
/// together): per-VC input FIFOs and a crossbar that forwards unicast packets to
/// their destination port; with `nvls` set, NVIDIA's NVLS engine (Klenk et al.,
/// ISCA'20): multicast of `multimem.st`/`multimem.red` (and of barrier flags) to
/// every replica, and `multimem.ld_reduce` as pulls from every replica summed in
/// the switch, admitted in order at the engine's operand rate (`reduce_GBps`;
/// None: unlimited). The CAIS chip's merge units (`units`) and Group Sync Table
/// (`enable_group_sync`) are compiled and served here; a Python unit may still serve
/// a kind by registering a handler for it in `handlers`.
#[pyclass(module = "cais._core", subclass, frozen)]
pub struct SwitchChip {
    st: GilCell<SwitchChipState>,
}

/// The mutable state of a [`SwitchChip`] (see there), borrowed while holding the GIL.
pub(crate) struct SwitchChipState {
    sim: Py<Simulator>,
    clock: Clock,
    chip: i64,
    down: Py<PyList>,
    gpus: Py<PyList>,
    pk: Py<PyAny>,
    vcmap: Py<PyAny>,
    packets: PacketBook,
    pipeline_ps: i64,
    reduce_ps: i64,
    reduce_ps_per_byte: f64,
    engine_free_at: i64,
    ledger: Py<SwitchLedger>,
    held: Vec<Vec<i64>>,
    handlers: Py<PyDict>,
    merge_cfg: Py<PyAny>,
    sync_entries: i64,
    /// The Group Sync Table's entry timeout (ps; None: never).
    sync_timeout_ps: Option<i64>,
    /// Mirror mode (the fabric's `mirror`): only GPU 0 runs; a train for GPU g
    /// stands for the train GPU -g sends to GPU 0 (its image under the GPUs'
    /// rotation), so every output goes to GPU 0's port.
    mirror: bool,
    /// The NVLS engine serves the multicast and ld_reduce kinds.
    nvls: bool,
    channels: Vec<Py<Channel>>,
    /// Each GPU's input port (its endpoint, or its `receive` if it has none).
    receivers: Vec<Sink>,
    pending: HashMap<i64, Reduction>,
    /// The CAIS chip's Group Sync Table (None: a chip without one).
    gst: Option<GroupSyncTable>,
    next_id: i64,
    /// The CAIS merge units, one per GPU port (empty: the chip has none); they serve
    /// `ld.cais` requests and data and `red.cais` contributions.
    units: Vec<Py<MergeUnit>>,
}

unit!(SwitchChip, SwitchChipState);

impl SwitchChip {
    /// A train's tail has arrived on the input port of GPU `train.src`.
    pub(crate) fn receive_train(slf: &Bound<'_, Self>, train: Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (kind, credits, fp) = {
            let me = slf.st();
            let mut t = train.st();
            me.ledger.get().st(py).bytes_in += t.payload;
            (t.left, t.dep0, t.dep1) = (1, NEVER, 0); // 1: held until the handler has emitted all
            (t.kind, t.credits.as_ref().map(|c| c.bind(py).clone()), t.fp) // the buffer's, before a departure
        };
        {
            let mut me = slf.st();
            let (src, vc) = {
                let t = train.st();
                (t.src, t.vc)
            };
            let g = py_index(src, me.held.len())?;
            let v = py_index(vc, me.held[g].len())?;
            me.held[g][v] += 1;
        }
        let handler = handler(py, &slf.st().handlers, kind)?;
        let nvls = slf.st().nvls;
        match handler {
            Some(h) => {
                h.call1((&train,))?;
            }
            None if !slf.st().units.is_empty() && matches!(kind, LD_CAIS_REQ | LD_CAIS_RESP | RED_CAIS) => {
                SwitchChip::merge_train(slf, &train, kind)?
            }
            None if kind == GROUP_SYNC && slf.st().gst.is_some() => SwitchChip::register_group(slf, &train)?,
            None if nvls && matches!(kind, MC_STORE | MC_RED | MC_FLAG) => SwitchChip::multicast_train(slf, &train)?,
            None if nvls && kind == MC_LDRED_REQ => SwitchChip::ld_reduce_request(slf, &train)?,
            None if nvls && kind == MC_PULL_RESP => SwitchChip::ld_reduce_response(slf, &train)?,
            None => {
                let dst = train.st().dst;
                SwitchChip::emit_train(slf, &train, dst, Some(&train), Hook::None)?;
            }
        }
        let retire = {
            let mut t = train.st();
            if t.left > 0 {
                // not absorbed
                t.left -= 1;
                (t.left == 0).then_some((t.dep0, t.dep1))
            } else {
                None
            }
        };
        if let Some((t0, t1)) = retire {
            SwitchChip::retire_train(slf, &train, t0, t1, credits.as_ref().map(Bound::as_unbound), fp)?;
        }
        Ok(())
    }

    /// Send `out` to GPU `dst`; `entry` is the input train it comes from (it leaves
    /// its buffer once all its outputs are on the wire), None for a train the switch
    /// made itself (`on_start` runs when it goes on the wire).
    pub(crate) fn emit_train(
        slf: &Bound<'_, Self>,
        out: &Bound<'_, Train>,
        dst: i64,
        entry: Option<&Bound<'_, Train>>,
        on_start: Hook,
    ) -> PyResult<()> {
        let py = slf.py();
        let (channel, receiver) = {
            let me = slf.st();
            let mut o = out.st();
            me.ledger.get().st(py).bytes_out += o.payload;
            o.head += me.pipeline_ps;
            o.tail += me.pipeline_ps;
            let dst = if me.mirror {
                o.dst = 0; // the image: the train another GPU sends to GPU 0
                0
            } else {
                dst
            };
            let d = dst as usize;
            (me.channels[d].bind(py).clone(), me.receivers[d].clone_ref(py))
        };
        let hook = match entry {
            None => on_start,
            Some(entry) => {
                entry.st().left += 1;
                if !out.is(entry) {
                    out.st().parent = Some(entry.clone().into_any().unbind());
                }
                Hook::Unit(UnitRef::of_bound(slf), (0, 0))
            }
        };
        Channel::offer(&channel, out.clone(), receiver, hook)
    }

    /// A copy (or the train itself) of an input train went on the wire.
    pub(crate) fn departed(slf: &Bound<'_, Self>, out: &Bound<'_, Train>, start: i64, finish: i64) -> PyResult<()> {
        let py = slf.py();
        let parent = opt_ref(&out.st().parent, py);
        let entry = match parent.as_ref().map(|p| p.bind(py).cast::<Train>()) {
            Some(Ok(p)) => p.clone(),
            _ => out.clone(),
        };
        let retire = {
            let mut e = entry.st();
            if start < e.dep0 {
                e.dep0 = start;
            }
            if finish > e.dep1 {
                e.dep1 = finish;
            }
            e.left -= 1;
            // called before the departing train's credit fields change hands
            (e.left == 0).then(|| (e.dep0, e.dep1, e.credits.as_ref().map(|c| c.clone_ref(py)), e.fp))
        };
        if let Some((t0, t1, credits, fp)) = retire {
            SwitchChip::retire_train(slf, &entry, t0, t1, credits.as_ref(), fp)?;
        }
        Ok(())
    }

    /// `entry` has left its input buffer between `t0` and `t1`: return its `fp`
    /// bytes of `credits`.
    fn retire_train(
        slf: &Bound<'_, Self>,
        entry: &Bound<'_, Train>,
        t0: i64,
        t1: i64,
        credits: Option<&Py<Credits>>,
        fp: i64,
    ) -> PyResult<()> {
        let py = slf.py();
        let (src, vc) = {
            let e = entry.st();
            (e.src, e.vc)
        };
        if let Some(cr) = credits {
            Credits::give_back_at(cr.bind(py), vc, fp, t0, t1, true)?;
        }
        let mut me = slf.st();
        let g = py_index(src, me.held.len())?;
        let v = py_index(vc, me.held[g].len())?;
        me.held[g][v] -= 1;
        Ok(())
    }

    /// multimem.st / multimem.red: one copy to every replica, the issuer included.
    fn multicast_train(slf: &Bound<'_, Self>, train: &Bound<'_, Train>) -> PyResult<()> {
        let n = slf.st().receivers.len() as i64;
        let dsts: Vec<i64> = (0..n).collect();
        let kind = match train.st().kind {
            MC_STORE => WRITE,
            MC_RED => RED,
            _ => FLAG,
        };
        SwitchChip::multicast_some(slf, train, &dsts, kind)
    }

    /// One copy of `train`, as a train of kind `kind`, to each GPU of `dsts` (the
    /// replicas of a static multicast object, or the members of a dynamic group).
    fn multicast_some(slf: &Bound<'_, Self>, train: &Bound<'_, Train>, dsts: &[i64], kind: i64) -> PyResult<()> {
        let py = slf.py();
        let (chip, payload, wire, last) = {
            let mut me = slf.st();
            let n = dsts.len() as i64;
            let t = train.st();
            me.ledger.get().st(py).multicast_created += (n - 1) * t.payload;
            let (wire, last) = if kind != FLAG {
                me.packets.wire(py, kind, t.payload)?
            } else {
                (t.wire, t.packet_wire)
            };
            (me.chip, t.payload, wire, last)
        };
        let (head, tail) = {
            let t = train.st();
            (t.head, t.tail)
        };
        let copy = Fanout {
            payload,
            wire,
            packet_wire: last,
            kind,
            chip,
            want: 0,
            tag: -1,
            head,
            tail,
            data: true,
            done: true,
        };
        SwitchChip::emit_copies(slf, train, copy, dsts)
    }

    /// Send copies of the input train `entry`, described by `copy`, one to the port of
    /// each GPU of `dsts`, as `emit_train` sends a train the chip made (each is made
    /// when it goes on the wire: `Fanout`).
    fn emit_copies(slf: &Bound<'_, Self>, entry: &Bound<'_, Train>, mut copy: Fanout, dsts: &[i64]) -> PyResult<()> {
        let py = slf.py();
        let mirror = {
            let me = slf.st();
            copy.head += me.pipeline_ps;
            copy.tail += me.pipeline_ps;
            me.mirror
        };
        let copy = Arc::new(copy);
        for &g in dsts {
            let (channel, receiver) = {
                let me = slf.st();
                me.ledger.get().st(py).bytes_out += copy.payload;
                let d = if mirror { 0 } else { py_index(g, me.channels.len())? }; // mirror: the image sent to GPU 0
                (me.channels[d].bind(py).clone(), me.receivers[d].clone_ref(py))
            };
            entry.st().left += 1;
            let dst = if mirror { 0 } else { g };
            let hook = Hook::Unit(UnitRef::of_bound(slf), (0, 0));
            Channel::offer_copy(&channel, entry, &copy, dst, receiver, hook)?;
        }
        Ok(())
    }

    /// multimem.ld_reduce: read the address from every replica (the issuer's too).
    fn ld_reduce_request(slf: &Bound<'_, Self>, req: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (n, rid, wire, last, head, tail, chip) = {
            let mut me = slf.st();
            let n = me.receivers.len() as i64;
            let rid = me.next_id;
            me.next_id += 1;
            let r = req.st();
            me.pending.insert(
                rid,
                Reduction {
                    issuer: r.src,
                    remaining: n,
                    acc: None,
                    head: 0,
                    nbytes: r.want,
                    addr: opt_ref(&r.addr, py),
                    done: opt_ref(&r.done, py),
                },
            );
            let (wire, last) = me.packets.wire(py, MC_PULL_REQ, r.want)?;
            let (mut head, mut tail) = (r.head, r.tail);
            if me.reduce_ps_per_byte != 0.0 {
                // the engine admits a reduction when it has room for its n operands;
                // mirror mode: this reduction stands for the n GPUs' images, each as large
                let work = r.want * n * if me.mirror { n } else { 1 };
                let start = me.now(py).max(me.engine_free_at);
                me.engine_free_at = start + (work as f64 * me.reduce_ps_per_byte).round_ties_even() as i64;
                (head, tail) = (head.max(start), tail.max(start));
            }
            (n, rid, wire, last, head, tail, me.chip)
        };
        let pull = Fanout {
            payload: 0,
            wire,
            packet_wire: last,
            kind: MC_PULL_REQ,
            chip,
            want: req.st().want,
            tag: rid,
            head,
            tail,
            data: false,
            done: false,
        };
        let all: Vec<i64> = (0..n).collect();
        SwitchChip::emit_copies(slf, req, pull, &all)
    }

    fn ld_reduce_response(slf: &Bound<'_, Self>, resp: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (tag, data, head) = {
            let r = resp.st();
            (r.tag, opt_ref(&r.data, py), r.head)
        };
        {
            let mut me = slf.st();
            let red = me.pending.get_mut(&tag).expect("a response to a pending ld_reduce");
            if let Some(data) = data {
                red.acc = Some(match &red.acc {
                    None => data.bind(py).call_method0("copy")?.unbind(),
                    Some(acc) => acc.bind(py).add(data.bind(py))?.unbind(),
                });
            }
            red.head = red.head.max(head);
            red.remaining -= 1;
        }
        SwitchChip::absorb_train(slf, resp)?;
        let (red, chip, reduce_ps, now, wire, last, vc) = {
            let mut me = slf.st();
            if me.pending[&tag].remaining > 0 {
                return Ok(());
            }
            let red = me.pending.remove(&tag).expect("pending");
            me.ledger.get().st(py).reduction_absorbed -= resp.st().payload; // the last one leaves as the sum
            let (wire, last) = me.packets.wire(py, MC_LDRED_RESP, red.nbytes)?;
            let vc = me.packets.vc_to(py, MC_LDRED_RESP, 0, -1, red.issuer)?;
            (red, me.chip, me.reduce_ps, me.now(py), wire, last, vc)
        };
        let mut out = TrainState::blank(red.nbytes, wire, last, MC_LDRED_RESP, -1, red.issuer);
        out.chip = chip;
        out.addr = red.addr;
        out.data = red.acc;
        out.done = red.done;
        out.vc = vc;
        out.head = red.head + reduce_ps;
        out.tail = now + reduce_ps;
        let out = slf.st().sim.get().new_train(py, out)?;
        SwitchChip::emit_train(slf, &out, red.issuer, None, Hook::None)
    }

    /// A TB of group `req.tag` on GPU `req.src` registers with the Group Sync Table;
    /// the group has `req.expect` TBs. A registration for a new group that finds the
    /// table full stays in its input buffer until an entry frees.
    fn register_group(slf: &Bound<'_, Self>, req: &Bound<'_, Train>) -> PyResult<()> {
        let tag = req.st().tag;
        let mut me = slf.st();
        let gst = me.gst.as_mut().expect("a chip with a Group Sync Table");
        if gst.late_member(tag) {
            // its group timed out: released at once
            drop(me);
            SwitchChip::consume_train(slf, req)?;
            return SwitchChip::release_group(slf, tag, vec![req.clone().unbind()]);
        }
        if gst.full_for(tag) {
            req.st().left += 1; // stays in its input buffer
            gst.wait(req.clone().unbind());
            return Ok(());
        }
        drop(me);
        SwitchChip::admit_group(slf, req)
    }

    /// Count a registration: it leaves its input buffer; if it completes its group,
    /// release every member, then admit the waiting registrations an entry is free for.
    fn admit_group(slf: &Bound<'_, Self>, req: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (tag, expect) = {
            let t = req.st();
            (t.tag, t.expect)
        };
        let (admitted, arm) = {
            let mut me = slf.st();
            let (timeout, now) = (me.sync_timeout_ps, me.now(py));
            let gst = me.gst.as_mut().expect("a chip with a Group Sync Table");
            let new = !gst.holds(tag);
            let admitted = gst.admit(req.clone().unbind(), tag, expect);
            let arm = match (timeout, &admitted) {
                (Some(t), Admitted::Counted) if new => {
                    gst.arm(tag, now + t);
                    Some(now + t)
                }
                _ => None,
            };
            (admitted, arm)
        };
        if let Some(deadline) = arm {
            let s = slf.st().sim.clone_ref(py);
            s.get()
                .push(py, deadline, Action::Due(UnitRef::of_bound(slf), SYNC_TIMEOUT, None))?;
        }
        SwitchChip::consume_train(slf, req)?;
        let Admitted::Complete(members) = admitted else {
            return Ok(());
        };
        SwitchChip::release_group(slf, tag, members)?;
        SwitchChip::admit_waiting(slf)
    }

    /// The Group Sync Table's deadlines that have come: each group still incomplete
    /// releases the members it has (`group_sync.rs`), then the registrations waiting
    /// for an entry are admitted.
    fn sync_deadlines(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let expired = {
            let mut me = slf.st();
            let now = me.now(py);
            let gst = me.gst.as_mut().expect("a chip with a Group Sync Table");
            gst.expire(now, |t| t.get().st(py).expect)
        };
        for (tag, members) in expired {
            SwitchChip::release_group(slf, tag, members)?;
        }
        SwitchChip::admit_waiting(slf)
    }

    /// Admit the registrations that waited for an entry, in order, while one is free.
    fn admit_waiting(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        loop {
            let next = {
                let mut me = slf.st();
                let gst = me.gst.as_mut().expect("a chip with a Group Sync Table");
                gst.next_waiting(|t| t.get().st(py).tag)
            };
            match next {
                Some(w) => SwitchChip::admit_group(slf, w.bind(py))?,
                None => return Ok(()),
            }
        }
    }

    /// Send group `group`'s release (an empty packet) to the GPU of each of its
    /// registrations, which completes that registration's operation.
    fn release_group(slf: &Bound<'_, Self>, group: i64, members: Vec<Py<Train>>) -> PyResult<()> {
        let py = slf.py();
        let (wire, last, vc, chip, now) = {
            let mut me = slf.st();
            let (wire, last) = me.packets.wire(py, GROUP_RELEASE, 0)?;
            let vc = me.packets.vc(py, GROUP_RELEASE, 0)?;
            (wire, last, vc, me.chip, me.now(py))
        };
        for req in members {
            let (src, done) = {
                let r = req.get().st(py);
                (r.src, opt_ref(&r.done, py))
            };
            let mut out = TrainState::blank(0, wire, last, GROUP_RELEASE, -1, src);
            out.chip = chip;
            out.vc = vc;
            out.tag = group;
            out.done = done;
            out.head = now;
            out.tail = now;
            let sim = slf.st().sim.clone_ref(py);
            let out = sim.get().new_train(py, out)?;
            SwitchChip::emit_train(slf, &out, src, None, Hook::None)?;
            sim.get().recycle(py, req.into_bound(py)); // released: the registration ends here
        }
        Ok(())
    }

    /// `entry` is taken off its input buffer by a unit of the switch as it arrives
    /// (it streamed through the buffer): its credits go back now.
    pub(crate) fn consume_train(slf: &Bound<'_, Self>, entry: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let now = slf.st().now(py);
        let (t0, t1, credits, fp) = {
            let mut e = entry.st();
            e.left = 0;
            let (t0, t1) = if e.tail >= now { (e.head, e.tail) } else { (now, now) }; // held a while: leaves now
            (t0, t1, e.credits.as_ref().map(|c| c.bind(py).clone()), e.fp)
        };
        SwitchChip::retire_train(slf, entry, t0, t1, credits.as_ref().map(Bound::as_unbound), fp)
    }

    /// A CAIS kind reaches the merge unit of its home's port: `ld.cais` requests and
    /// `red.cais` contributions go to the unit of their destination, load data to the
    /// unit of the home it comes from (an unmerged load's data, tag < 0, or one the
    /// unit does not know, goes on to the requester).
    fn merge_train(slf: &Bound<'_, Self>, train: &Bound<'_, Train>, kind: i64) -> PyResult<()> {
        let py = slf.py();
        let (src, dst, tag) = {
            let t = train.st();
            (t.src, t.dst, t.tag)
        };
        let unit = |g: i64| -> PyResult<Bound<'_, MergeUnit>> {
            let me = slf.st();
            Ok(me.units[py_index(g, me.units.len())?].bind(py).clone())
        };
        match kind {
            LD_CAIS_REQ => MergeUnit::load_train(&unit(dst)?, train),
            RED_CAIS => MergeUnit::reduce_train(&unit(dst)?, train),
            _ => {
                if tag < 0 || !MergeUnit::load_data_train(&unit(src)?, train)? {
                    SwitchChip::emit_train(slf, train, dst, Some(train), Hook::None)?;
                }
                Ok(())
            }
        }
    }

    /// A merge unit takes `train` as it arrives; `absorbed` payload bytes stay in its
    /// table.
    pub(crate) fn take_train(slf: &Bound<'_, Self>, train: &Bound<'_, Train>, absorbed: i64) -> PyResult<()> {
        slf.st().ledger.get().st(slf.py()).reduction_absorbed += absorbed;
        SwitchChip::consume_train(slf, train)
    }

    /// A merge unit's load data for each requester of `reqs`: copies of the home's
    /// response `source`, or (None) responses made from the unit's cached data.
    pub(crate) fn answer_loads(
        slf: &Bound<'_, Self>,
        reqs: &mut Vec<Py<Train>>,
        data: &Py<PyAny>,
        head: i64,
        tail: i64,
        source: Option<&Bound<'_, Train>>,
    ) -> PyResult<()> {
        let py = slf.py();
        for (i, req) in reqs.drain(..).enumerate() {
            let req = req.into_bound(py);
            let (resp, to) = {
                let mut me = slf.st();
                let r = req.get().st(py);
                let nbytes = r.want;
                let (wire, last) = me.packets.wire(py, LD_CAIS_RESP, nbytes)?;
                let vc = me.packets.vc_to(py, LD_CAIS_RESP, 0, r.dst, r.src)?;
                let mut resp = TrainState::blank(nbytes, wire, last, LD_CAIS_RESP, r.dst, r.src);
                resp.chip = me.chip;
                resp.addr = opt_ref(&r.addr, py);
                resp.data = opt(data.clone_ref(py), py);
                resp.done = opt_ref(&r.done, py);
                resp.vc = vc;
                resp.want = nbytes;
                (resp.head, resp.tail) = (head, tail);
                if source.is_none() || i > 0 {
                    me.ledger.get().st(py).multicast_created += nbytes; // made from the table's data
                }
                (me.sim.get().new_train(py, resp)?, r.src)
            };
            SwitchChip::emit_train(slf, &resp, to, source, Hook::None)?;
            let sim = slf.st().sim.clone_ref(py);
            sim.get().recycle(py, req); // answered: the request ends here
        }
        Ok(())
    }

    /// A merge unit's (partial) sum goes to its home GPU as one reduction;
    /// `on_start` frees the unit's lines.
    pub(crate) fn write_home_sum(slf: &Bound<'_, Self>, sum: HomeSum, on_start: Hook) -> PyResult<()> {
        let py = slf.py();
        let HomeSum {
            home,
            nbytes,
            addr,
            data,
            vc,
            cls,
            signal,
            count,
            head,
        } = sum;
        let out = {
            let mut me = slf.st();
            let (wire, last) = me.packets.wire(py, RED_CAIS, nbytes)?;
            let mut out = TrainState::blank(nbytes, wire, last, RED_CAIS, -1, home);
            out.chip = me.chip;
            out.addr = opt(addr, py);
            out.data = opt(data, py);
            out.vc = vc;
            out.cls = cls;
            out.tag = signal;
            out.count = count;
            out.head = head + me.reduce_ps;
            out.tail = me.now(py) + me.reduce_ps;
            me.ledger.get().st(py).reduction_absorbed -= nbytes; // the sum leaves the table
            me.sim.get().new_train(py, out)?
        };
        SwitchChip::emit_train(slf, &out, home, None, on_start)
    }

    fn absorb_train(slf: &Bound<'_, Self>, entry: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (t0, t1) = {
            let me = slf.st();
            let mut e = entry.st();
            me.ledger.get().st(py).reduction_absorbed += e.payload;
            e.left = 0;
            (e.head, e.tail.max(me.now(py)))
        };
        SwitchChip::retire_train(slf, entry, t0, t1, None, 0)
    }
}

impl SwitchChipState {
    fn now(&self, py: Python<'_>) -> i64 {
        let _ = py;
        self.clock.now()
    }
}

#[pymethods]
impl SwitchChip {
    /// Chip `chip` on `sim`: its channels `down` to the GPUs, the GPUs (their input
    /// ports), the packet format and VC map, and what it reads of the system config
    /// `cfg` (`link.vcs`, `switch.pipeline_latency_ns`, `switch.reduce_latency_ns`,
    /// `switch.reduce_GBps`, `switch.merge`, `cais.sync_entries`: see `params.rs`).
    #[new]
    #[pyo3(signature = (sim, chip, down, gpus, packetizer, vcmap, cfg))]
    fn new(
        sim: Py<Simulator>,
        chip: i64,
        down: &Bound<'_, PyAny>,
        gpus: &Bound<'_, PyAny>,
        packetizer: Py<PyAny>,
        vcmap: Py<PyAny>,
        cfg: SystemParams,
    ) -> PyResult<Self> {
        let py = down.py();
        let down = PyList::new(py, down.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
        let gpus = PyList::new(py, gpus.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
        let channels = down
            .iter()
            .map(|c| Ok(c.cast::<Channel>()?.clone().unbind()))
            .collect::<PyResult<Vec<_>>>()?;
        let receivers = gpus
            .iter()
            .map(|g| match g.cast::<Endpoint>() {
                Ok(gpu) => Ok(Sink::Unit(UnitRef::of_bound(gpu))),
                Err(_) => Ok(Sink::Call(g.getattr("receive")?.unbind())),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let vcs = cfg.link.vcs;
        let SwitchConfig {
            pipeline_latency_ns,
            reduce_latency_ns,
            reduce_GBps,
            merge: merge_cfg,
            ..
        } = cfg.switch;
        let (pipeline_ps, reduce_ps) = (ps(pipeline_latency_ns, 1e3), ps(reduce_latency_ns, 1e3));
        let sync_entries = cfg.cais.sync_entries;
        let sync_timeout_ps = cfg.cais.sync_timeout_us.map(|us| ps(us, 1e6));
        let clock = sim.get().clock();
        Ok(SwitchChip::from(SwitchChipState {
            clock,
            sim,
            chip,
            held: vec![vec![0; vcs]; gpus.len()],
            packets: PacketBook::new(py, packetizer.clone_ref(py), vcmap.clone_ref(py), gpus.len() as i64)?,
            down: down.unbind(),
            gpus: gpus.unbind(),
            pk: packetizer,
            vcmap,
            pipeline_ps,
            reduce_ps,
            reduce_ps_per_byte: match reduce_GBps {
                Some(r) if r != 0.0 => 1000.0 / r,
                _ => 0.0,
            },
            engine_free_at: 0,
            ledger: Py::new(py, SwitchLedger::from(SwitchLedgerState::default()))?,
            handlers: PyDict::new(py).unbind(),
            merge_cfg,
            sync_entries,
            sync_timeout_ps,
            mirror: false,
            nvls: false,
            channels,
            receivers,
            pending: HashMap::default(),
            gst: None,
            next_id: 0,
            units: Vec::new(),
        }))
    }

    /// A train's tail has arrived on the input port of GPU `train.src`.
    fn receive(slf: &Bound<'_, Self>, train: Bound<'_, Train>) -> PyResult<()> {
        SwitchChip::receive_train(slf, train)
    }

    /// Send `out` to GPU `dst`; `entry` is the input train it comes from (it leaves
    /// its buffer once all its outputs are on the wire), None for a train the switch
    /// made itself (a reduction's result; `on_start` runs when it goes on the wire).
    #[pyo3(signature = (out, dst, entry, on_start = None))]
    fn emit(
        slf: &Bound<'_, Self>,
        out: Bound<'_, Train>,
        dst: i64,
        entry: Option<Bound<'_, Train>>,
        on_start: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hook = match on_start {
            None => Hook::None,
            Some(f) => Hook::Call(f),
        };
        SwitchChip::emit_train(slf, &out, dst, entry.as_ref(), hook)
    }

    /// The NVLS engine's multicast of `train` (a store, reduction or flag) to every
    /// replica, for a Python unit that serves the kind and passes it on.
    fn multicast(slf: &Bound<'_, Self>, train: Bound<'_, Train>) -> PyResult<()> {
        SwitchChip::multicast_train(slf, &train)
    }

    /// A dynamic multicast: one copy of `train` (a store or reduction, `kind` WRITE or
    /// RED) to each GPU of `dsts`, for a Python unit that resolved the train's group
    /// to its members (a CAIS-EP switch's group table).
    fn multicast_to(slf: &Bound<'_, Self>, train: Bound<'_, Train>, dsts: Vec<i64>, kind: i64) -> PyResult<()> {
        if dsts.is_empty() || !matches!(kind, WRITE | RED) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "multicast_to: needs at least one destination and a WRITE or RED kind",
            ));
        }
        SwitchChip::multicast_some(slf, &train, &dsts, kind)
    }

    /// `entry` has left its input buffer between `t0` and `t1`: return its `fp`
    /// bytes of `credits`.
    fn retire(
        slf: &Bound<'_, Self>,
        entry: Bound<'_, Train>,
        t0: i64,
        t1: i64,
        credits: Option<Py<Credits>>,
        fp: i64,
    ) -> PyResult<()> {
        SwitchChip::retire_train(slf, &entry, t0, t1, credits.as_ref(), fp)
    }

    /// `entry` is taken off its input buffer by a unit of the switch as it arrives
    /// (it streamed through the buffer): its credits go back now.
    fn consume(slf: &Bound<'_, Self>, entry: Bound<'_, Train>) -> PyResult<()> {
        SwitchChip::consume_train(slf, &entry)
    }

    /// The CAIS merge units, one per GPU port.
    #[getter]
    fn units<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let me = self.st(py);
        PyList::new(py, me.units.iter().map(|u| u.clone_ref(py)))
    }

    #[setter]
    fn set_units(&self, py: Python<'_>, units: Vec<Py<MergeUnit>>) {
        let mut me = self.st(py);
        me.units = units;
    }

    /// `entry` (of a kind in `absorbs`: its sender already scheduled its credits'
    /// return) is consumed by a unit of the switch as it arrives.
    fn absorb(slf: &Bound<'_, Self>, entry: Bound<'_, Train>) -> PyResult<()> {
        SwitchChip::absorb_train(slf, &entry)
    }

    /// Input buffers holding trains, and ld_reduces waiting for replicas (for the
    /// forward-progress watchdog).
    fn stuck(&self, py: Python<'_>) -> Vec<String> {
        let me = self.st(py);
        let mut out = Vec::new();
        for (g, port) in me.held.iter().enumerate() {
            for (vc, &count) in port.iter().enumerate() {
                if count != 0 {
                    out.push(format!(
                        "sw{} input from gpu{g} VC {vc}: {count} train(s) waiting for an output",
                        me.chip
                    ));
                }
            }
        }
        if !me.pending.is_empty() {
            out.push(format!(
                "sw{}: {} ld_reduce(s) waiting for replica responses",
                me.chip,
                me.pending.len()
            ));
        }
        if let Some(gst) = &me.gst {
            out.extend(gst.stuck(|t| t.get().st(py).expect));
        }
        out
    }

    /// Give the chip the Group Sync Table of merging-aware TB coordination, with
    /// `sync_entries` entries: it serves the TB groups' registrations itself.
    fn enable_group_sync(&self, py: Python<'_>) {
        let mut me = self.st(py);
        let entries = me.sync_entries.max(1) as usize;
        me.gst = Some(GroupSyncTable::new(entries));
    }

    /// (registrations counted, most TB groups held at once) by the Group Sync Table;
    /// None without one.
    #[getter]
    fn group_sync(&self, py: Python<'_>) -> Option<(i64, usize)> {
        self.st(py).gst.as_ref().map(|g| (g.registrations, g.peak))
    }

    /// TB groups the Group Sync Table released by their timeout (0 without one).
    #[getter]
    fn sync_timeouts(&self, py: Python<'_>) -> i64 {
        self.st(py).gst.as_ref().map_or(0, |g| g.timeouts)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.sim)?;
        visit.call(&me.down)?;
        visit.call(&me.gpus)?;
        me.packets.visit(&visit)?;
        visit.call(&me.ledger)?;
        visit.call(&me.handlers)?;
        if let Some(gst) = &me.gst {
            gst.visit(&visit)?;
        }
        visit.call(&me.merge_cfg)?;
        for c in me.channels.iter() {
            visit.call(c)?;
        }
        for r in me.receivers.iter() {
            r.visit(&visit)?;
        }
        for u in me.units.iter() {
            visit.call(u)?;
        }
        for red in me.pending.values() {
            visit.call(&red.acc)?;
            visit.call(&red.addr)?;
            visit.call(&red.done)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.channels.clear();
            me.receivers.clear();
            me.pending.clear();
            me.units.clear();
            if let Some(gst) = me.gst.as_mut() {
                gst.clear();
            }
        }
    }
}

properties!(SwitchChip {
    sim: Py<Simulator>;
    chip: i64;
    down: Py<PyList>;
    gpus: Py<PyList>;
    pk: Py<PyAny>;
    vcmap: Py<PyAny>;
    pipeline_ps: i64;
    reduce_ps: i64;
    reduce_ps_per_byte: f64;
    engine_free_at: i64;
    ledger: Py<SwitchLedger>;
    /// Trains in each input buffer, per GPU port and VC.
    held: Vec<Vec<i64>>;
    handlers: Py<PyDict>;
    merge_cfg: Py<PyAny>;
    sync_entries: i64;
    mirror: bool, set set_mirror;
    nvls: bool, set set_nvls;
});
