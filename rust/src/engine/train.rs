//! A train of packets (a transfer unit) in flight.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use super::cell::{properties, unit, GilCell, Unit};
use super::credits::Credits;

/// A train of packets (a transfer unit) in flight.
///
/// `payload` is the data bytes it carries, `wire` the bytes it occupies on a link
/// (payload plus headers and extra flits), `packet_wire` the wire size of its last
/// packet. `head`/`tail` are the times its first and last packet are available at
/// its current position; `vc` its virtual channel. `fp`/`credits` are the buffer
/// bytes it holds at its current position and whose credits they are (set by the
/// channel that carried it there).
///
/// The remaining fields are the packet's typed descriptor, which the engine does
/// not read: `kind` (a registered packet kind), `cls` (traffic class), `src`,
/// `dst`, `chip`, `addr`, `data`; `done` (the issuer's completion, called with the
/// train where the packet completes), `fence` (called when a write's
/// acknowledgement is back at its issuer), `want` (bytes a request asks for),
/// `tag` (an id the hardware that created it uses), `parent` (the train it was
/// copied from in a switch), `left`/`dep0`/`dep1` (a switch's departure
/// bookkeeping), `count` (how many requests it stands for: a merged reduction
/// carries the number it sums), `expect` (how many requests a mergeable access
/// expects to merge with) and `quorum` (TB-aware throttling: how many of them must
/// have arrived before it is acknowledged; 0: at once).
#[pyclass(module = "cais._core", frozen, freelist = 4096)]
pub struct Train {
    st: GilCell<TrainState>,
}

/// The mutable state of a [`Train`] (see there), borrowed while holding the GIL.
pub(crate) struct TrainState {
    pub payload: i64,
    pub wire: i64,
    pub packet_wire: i64,
    pub head: i64,
    pub tail: i64,
    pub vc: i64,
    pub fp: i64,
    pub credits: Option<Py<Credits>>,
    pub kind: i64,
    pub cls: i64,
    pub src: i64,
    pub dst: i64,
    pub chip: i64,
    pub addr: Option<Py<PyAny>>,
    pub data: Option<Py<PyAny>>,
    pub done: Option<Py<PyAny>>,
    pub fence: Option<Py<PyAny>>,
    pub want: i64,
    pub tag: i64,
    pub parent: Option<Py<PyAny>>,
    pub left: i64,
    pub dep0: i64,
    pub dep1: i64,
    pub count: i64,
    pub expect: i64,
    pub quorum: i64,
}

unit!(Train, TrainState);

/// What a train's fields held, taken out of it to be released.
pub(crate) struct Held {
    credits: Option<Py<PyAny>>,
    objects: [Option<Py<PyAny>>; 5],
}

impl Held {
    /// Release the references (bound to the GIL the caller holds: no check per field
    /// of whether this thread is attached, as dropping a `Py` does).
    pub(crate) fn release(self, py: Python<'_>) {
        let Held { credits, objects } = self;
        if let Some(c) = credits {
            drop(c.into_bound(py));
        }
        for o in objects.into_iter().flatten() {
            drop(o.into_bound(py));
        }
    }
}

/// A Python object as one of a train's optional fields: None for Python's None, so
/// that an absent field holds no reference (a train is made and dropped per hop).
pub(crate) fn opt(obj: Py<PyAny>, py: Python<'_>) -> Option<Py<PyAny>> {
    if obj.is_none(py) {
        None
    } else {
        Some(obj)
    }
}

/// A new reference to an optional field's object, Python's None where absent.
pub(crate) fn obj(field: &Option<Py<PyAny>>, py: Python<'_>) -> Py<PyAny> {
    match field {
        Some(o) => o.clone_ref(py),
        None => py.None(),
    }
}

/// A new reference to an optional field's object.
pub(crate) fn opt_ref(obj: &Option<Py<PyAny>>, py: Python<'_>) -> Option<Py<PyAny>> {
    obj.as_ref().map(|o| o.clone_ref(py))
}

/// A train a switch chip sends to every port at once (a multicast copy, the pulls of
/// an `ld_reduce`), described once for all of them. A port's copy is made from it, its
/// destination and the input train it comes from (`entry`: source, VC, class, address,
/// and, as `data` / `done` say, its data and completion) when the copy goes on the
/// wire, not when the chip sends it: until then it waits in the port's queue as this
/// description and its destination (`Channel::offer_copy`). The copy is the train the
/// chip would have made at once, field for field; what changes is that thousands of
/// copies waiting on a large machine's ports are not thousands of train objects.
pub(crate) struct Fanout {
    pub payload: i64,
    pub wire: i64,
    pub packet_wire: i64,
    pub kind: i64,
    pub chip: i64,
    pub want: i64,
    pub tag: i64,
    pub head: i64,
    pub tail: i64,
    pub data: bool,
    pub done: bool,
}

impl Fanout {
    /// The copy for `dst` of `entry`'s train (its `parent` is the caller's to set).
    pub(crate) fn make(&self, py: Python<'_>, entry: &TrainState, dst: i64) -> TrainState {
        TrainState {
            chip: self.chip,
            addr: opt_ref(&entry.addr, py),
            data: if self.data { opt_ref(&entry.data, py) } else { None },
            done: if self.done { opt_ref(&entry.done, py) } else { None },
            vc: entry.vc,
            cls: entry.cls,
            want: self.want,
            tag: self.tag,
            head: self.head,
            tail: self.tail,
            ..TrainState::blank(self.payload, self.wire, self.packet_wire, self.kind, entry.src, dst)
        }
    }
}

impl TrainState {
    /// A train of `kind` from `src` to `dst` with the constructor's defaults for the
    /// rest (no data, no completion, VC 0), as the units of the core make them.
    pub(crate) fn blank(payload: i64, wire: i64, packet_wire: i64, kind: i64, src: i64, dst: i64) -> Self {
        TrainState {
            payload,
            wire,
            packet_wire,
            head: 0,
            tail: 0,
            vc: 0,
            fp: 0,
            credits: None,
            kind,
            cls: 0,
            src,
            dst,
            chip: -1,
            addr: None,
            data: None,
            done: None,
            fence: None,
            want: 0,
            tag: -1,
            parent: None,
            left: 0,
            dep0: 0,
            dep1: 0,
            count: 1,
            expect: 0,
            quorum: 0,
        }
    }

    /// The Python objects its fields hold, taken out of it (the fields left None).
    pub(crate) fn take_held(&mut self) -> Held {
        Held {
            credits: self.credits.take().map(Py::into_any),
            objects: [
                self.addr.take(),
                self.data.take(),
                self.done.take(),
                self.fence.take(),
                self.parent.take(),
            ],
        }
    }

    /// The Python objects its fields hold, for the cyclic collector.
    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.credits)?;
        visit.call(&self.addr)?;
        visit.call(&self.data)?;
        visit.call(&self.done)?;
        visit.call(&self.fence)?;
        visit.call(&self.parent)
    }
}

#[pymethods]
impl Train {
    #[new]
    #[pyo3(signature = (payload, wire, packet_wire, kind, src, dst, chip = -1, addr = None, data = None,
                        done = None, vc = 0, cls = 0, want = 0, tag = -1, count = 1, expect = 0, quorum = 0))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        payload: i64,
        wire: i64,
        packet_wire: i64,
        kind: i64,
        src: i64,
        dst: i64,
        chip: i64,
        addr: Option<Py<PyAny>>,
        data: Option<Py<PyAny>>,
        done: Option<Py<PyAny>>,
        vc: i64,
        cls: i64,
        want: i64,
        tag: i64,
        count: i64,
        expect: i64,
        quorum: i64,
    ) -> Self {
        Train::from(TrainState {
            vc,
            cls,
            chip,
            addr,
            data,
            done,
            want,
            tag,
            count,
            expect,
            quorum,
            ..TrainState::blank(payload, wire, packet_wire, kind, src, dst)
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let me = self.st(py);
        format!(
            "Train(kind={}, src={}, dst={}, chip={}, payload={}, wire={}, vc={}, head={}, tail={})",
            me.kind, me.src, me.dst, me.chip, me.payload, me.wire, me.vc, me.head, me.tail
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        me.visit(&visit)
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.credits = None;
            me.addr = None;
            me.data = None;
            me.done = None;
            me.fence = None;
            me.parent = None;
        }
    }
}

properties!(Train {
    payload: i64, set set_payload;
    wire: i64, set set_wire;
    packet_wire: i64, set set_packet_wire;
    head: i64, set set_head;
    tail: i64, set set_tail;
    vc: i64, set set_vc;
    fp: i64, set set_fp;
    credits: Option<Py<Credits>>, set set_credits;
    kind: i64, set set_kind;
    cls: i64, set set_cls;
    src: i64, set set_src;
    dst: i64, set set_dst;
    chip: i64, set set_chip;
    addr: Option<Py<PyAny>>, set set_addr;
    data: Option<Py<PyAny>>, set set_data;
    done: Option<Py<PyAny>>, set set_done;
    fence: Option<Py<PyAny>>, set set_fence;
    want: i64, set set_want;
    tag: i64, set set_tag;
    parent: Option<Py<PyAny>>, set set_parent;
    left: i64, set set_left;
    dep0: i64, set set_dep0;
    dep1: i64, set set_dep1;
    count: i64, set set_count;
    expect: i64, set set_expect;
    quorum: i64, set set_quorum;
});
