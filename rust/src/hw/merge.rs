//! The CAIS merge unit (paper §III-A.2-4): one per switch port, in the data path of
//! the requests whose home GPU is behind that port.
//!
//! A CAM looks requests up by (address, type). Each hit or miss is a *session* in the
//! merging table, whose entries are lines of `line_bytes`; a session is `Load-Wait`
//! (the first load went to the home and its data is not back), `Load-Ready` (the data
//! is cached; later loads are answered from it) or `Reduction` (partial sums being
//! accumulated), and counts the requests merged into it. How many lines a session
//! takes and when it may open is the session rule's (`session_rule.rs`: all or
//! nothing); which session is evicted when lines are needed is the replacement
//! policy's (`replacement/`: LRU by default, FIFO); a session idle for `timeout_us` is flushed like an eviction (the idle timer
//! keeps its own queue, in order of last access, whatever the policy); the merge tracker ends a session
//! once every requester of its address has come. `cais/hw/merge.py` has the whole
//! description (the policy is the same; this is its compiled form).
//!
//! The unit serves its switch chip natively (a [`SwitchChip`] host: merged responses
//! and sums are made and sent without entering Python), or any Python object with the
//! host's methods (`forward`, `take`, `answer`, `write_home`), as the unit tests use.
//! Functional data stays Python objects: a sum is `a + b`, a first contribution is
//! `data.copy()`.

use rustc_hash::FxHashMap as HashMap;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::channel::Hook;
use crate::engine::completion::complete;
use crate::engine::sim::{Action, Clock, Simulator};
use crate::engine::train::{obj, Train};
use crate::engine::unit::{unexpected, Event, Handler, UnitRef};
use crate::hw::params::{ps, MergeConfig};
use crate::hw::region::Region;
use crate::hw::replacement::{self, AccessOrder, Replacement};
use crate::hw::session_rule::{self, Room, SessionRule};
use crate::hw::switch::{HomeSum, SwitchChip};

/// The CAM's request types.
const LOAD: u8 = 0;
const REDUCTION_TYPE: u8 = 1;

/// A session's state.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    LoadWait,
    LoadReady,
    Reduction,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::LoadWait => "Load-Wait",
            State::LoadReady => "Load-Ready",
            State::Reduction => "Reduction",
        }
    }
}

/// An address as the CAM compares it: a `Region` by its fields, or a plain string or
/// integer (what the unit tests use).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Address {
    Region(u32, i64, i64, i64, i64, i64),
    Str(String),
    Int(i64),
}

/// A CAM key: request type and address.
type Key = (u8, Address);

/// What the CAM and the accounting need of a request's address: its key, its bytes
/// (a `Region`'s `nbytes`) and the tensor it belongs to (its buffer's id; None for
/// other addresses).
struct AddrInfo {
    address: Address,
    nbytes: i64,
    tensor: Option<u32>,
}

/// Buffer names as small ids, so that a CAM key is all integers: by the name's
/// content, with the string objects already seen as a fast path (each held, so that
/// its address cannot be reused by another string while it is known).
#[derive(Default)]
struct BufferIds {
    by_object: HashMap<usize, (u32, Py<PyString>)>,
    by_name: HashMap<String, u32>,
    names: Vec<String>,
}

impl BufferIds {
    fn id(&mut self, name: &Bound<'_, PyString>) -> PyResult<u32> {
        let ptr = name.as_ptr() as usize;
        if let Some(&(id, _)) = self.by_object.get(&ptr) {
            return Ok(id);
        }
        let text = name.to_str()?;
        let id = match self.by_name.get(text) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.push(text.to_owned());
                self.by_name.insert(text.to_owned(), id);
                id
            }
        };
        self.by_object.insert(ptr, (id, name.clone().unbind()));
        Ok(id)
    }

    fn name(&self, id: Option<u32>) -> String {
        id.map_or_else(String::new, |i| self.names[i as usize].clone())
    }
}

fn addr_info(addr: &Bound<'_, PyAny>, ids: &mut BufferIds) -> PyResult<AddrInfo> {
    if let Ok(r) = addr.cast::<Region>() {
        let r = r.get();
        let id = ids.id(r.buffer.bind(addr.py()))?;
        return Ok(AddrInfo {
            nbytes: r.size(),
            address: Address::Region(id, r.start, r.count, r.elem_bytes, r.rows, r.stride),
            tensor: Some(id),
        });
    }
    let address = if let Ok(s) = addr.cast::<PyString>() {
        Address::Str(s.to_str()?.to_owned())
    } else if let Ok(i) = addr.extract::<i64>() {
        Address::Int(i)
    } else {
        return Err(PyTypeError::new_err(format!(
            "a merge unit keys addresses that are a Region, a str or an int, not {}",
            addr.get_type().name()?
        )));
    };
    let nbytes = match addr.getattr("nbytes") {
        Ok(n) => n.extract()?,
        Err(_) => 0,
    };
    Ok(AddrInfo {
        address,
        nbytes,
        tensor: None,
    })
}

/// One merging-table entry group: a CAM key, its state, its merge count and the
/// content-array data (deferred requesters, cached load data or partial sum).
struct Entry {
    id: i64,
    key: Key,
    state: State,
    count: i64,
    expect: i64,
    quorum: i64,
    lines: i64,
    /// Loads waiting for the home's data.
    waiters: Vec<Py<Train>>,
    /// Requests whose acknowledgement throttling holds back.
    held: Vec<Py<Train>>,
    data: Py<PyAny>,
    addr: Py<PyAny>,
    nbytes: i64,
    tensor: usize,
    signal: i64,
    cls: i64,
    vc: i64,
    head: i64,
    touched: i64,
    doomed: bool,
}

/// A view of one session, for a Python host's `write_home` and for tests.
#[pyclass(module = "cais._core", get_all, frozen)]
pub struct Session {
    id: i64,
    state: &'static str,
    count: i64,
    expect: i64,
    quorum: i64,
    lines: i64,
    addr: Py<PyAny>,
    data: Py<PyAny>,
    signal: i64,
    cls: i64,
    vc: i64,
    head: i64,
    touched: i64,
    doomed: bool,
}

impl Session {
    fn of(py: Python<'_>, e: &Entry) -> Session {
        Session {
            id: e.id,
            state: e.state.name(),
            count: e.count,
            expect: e.expect,
            quorum: e.quorum,
            lines: e.lines,
            addr: e.addr.clone_ref(py),
            data: e.data.clone_ref(py),
            signal: e.signal,
            cls: e.cls,
            vc: e.vc,
            head: e.head,
            touched: e.touched,
            doomed: e.doomed,
        }
    }
}

/// What one merge unit did: requests merged into a session another opened, requests
/// that bypassed it (`bypassed_loads` of them loads), sessions evicted (by the
/// replacement policy) and flushed by the idle timer, sessions the merge tracker ended once every requester
/// of their address had come (`tracked`), sessions opened, lines in use (peak, the
/// integral over time, and the time it held any: `busy_ps`), and the arrival skew per
/// address: first to last of the requests one access expects (merged or not).
#[pyclass(module = "cais._core", get_all)]
#[derive(Clone, Default)]
pub struct MergeStats {
    merged: i64,
    bypassed: i64,
    bypassed_loads: i64,
    evicted: i64,
    timed_out: i64,
    tracked: i64,
    sessions: i64,
    peak_lines: i64,
    line_ps: i64,
    busy_ps: i64,
    skew_n: i64,
    skew_sum_ps: i64,
    skew_max_ps: i64,
    /// Lookups the unit started (requests and the home's load data), and the time
    /// they waited for a free lookup slot (`switch.merge.lookups_per_ns`).
    lookups: i64,
    lookup_wait_ps: i64,
}

/// How the merge units of one switch chip share the work over time: the time any of
/// them holds a session (`any_ps`) and the integral of how many do (`port_ps`); their
/// ratio is the mean number of ports holding sessions while the chip holds any.
#[pyclass(module = "cais._core", frozen)]
pub struct PortSpread {
    st: GilCell<PortSpreadState>,
}

/// The mutable state of a [`PortSpread`] (see there), borrowed while holding the GIL.
#[derive(Default)]
pub(crate) struct PortSpreadState {
    active: i64,
    since: i64,
    any_ps: i64,
    port_ps: i64,
}

unit!(PortSpread, PortSpreadState);

#[pymethods]
impl PortSpread {
    #[new]
    fn new() -> Self {
        PortSpread::from(PortSpreadState::default())
    }

    /// A port started (+1) or stopped (-1) holding sessions at `now`.
    fn change(&self, py: Python<'_>, now: i64, delta: i64) {
        let mut me = self.st(py);
        if me.active != 0 {
            me.any_ps += now - me.since;
            me.port_ps += me.active * (now - me.since);
        }
        me.since = now;
        me.active += delta;
    }

    /// (`any_ps`, `port_ps`) over [0, `end`].
    fn until(&self, py: Python<'_>, end: i64) -> (i64, i64) {
        let me = self.st(py);
        let tail = if me.active != 0 { (end - me.since).max(0) } else { 0 };
        (me.any_ps + tail, me.port_ps + me.active * tail)
    }
}

properties!(PortSpread {
    active: i64;
    since: i64;
    any_ps: i64;
    port_ps: i64;
});

/// Whom the unit asks to move trains: its switch chip, or a Python stand-in.
enum Host {
    Chip(Py<SwitchChip>),
    Object(Py<PyAny>),
}

impl Host {
    /// Send `train` on to its destination port unmerged.
    fn forward(&self, train: &Bound<'_, Train>) -> PyResult<()> {
        let py = train.py();
        match self {
            Host::Chip(chip) => {
                let dst = train.st().dst;
                SwitchChip::emit_train(chip.bind(py), train, dst, Some(train), Hook::None)
            }
            Host::Object(o) => o.call_method1(py, "forward", (train,)).map(|_| ()),
        }
    }

    /// `train` is taken into the unit as it arrives; `absorbed` payload bytes stay.
    fn take(&self, train: &Bound<'_, Train>, absorbed: i64) -> PyResult<()> {
        let py = train.py();
        match self {
            Host::Chip(chip) => SwitchChip::take_train(chip.bind(py), train, absorbed),
            Host::Object(o) => o.call_method1(py, "take", (train, absorbed)).map(|_| ()),
        }
    }

    /// Send load data to each requester of `reqs`.
    fn answer(
        &self,
        py: Python<'_>,
        reqs: &mut Vec<Py<Train>>,
        data: Py<PyAny>,
        head: i64,
        tail: i64,
        source: Option<&Bound<'_, Train>>,
    ) -> PyResult<()> {
        match self {
            Host::Chip(chip) => SwitchChip::answer_loads(chip.bind(py), reqs, &data, head, tail, source),
            Host::Object(o) => {
                let reqs = PyList::new(py, reqs.drain(..))?;
                o.call_method1(py, "answer", (reqs, data, head, tail, source))
                    .map(|_| ())
            }
        }
    }
}

/// The call that frees a flushed reduction's lines when its sum goes on the wire (a
/// Python host's `on_start`).
#[pyclass(module = "cais._core", frozen)]
pub struct FreeLines {
    unit: Py<MergeUnit>,
    lines: i64,
    tensor: usize,
}

#[pymethods]
impl FreeLines {
    #[pyo3(signature = (*_args))]
    fn __call__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<()> {
        MergeUnit::occupy(self.unit.bind(py), -self.lines, self.tensor)
    }
}

/// The merge unit of switch port `port`: it merges the mergeable requests whose home
/// GPU is `port` and that the address hash sends to this chip.
#[pyclass(module = "cais._core", frozen)]
pub struct MergeUnit {
    st: GilCell<MergeUnitState>,
}

/// The mutable state of a [`MergeUnit`] (see there), borrowed while holding the GIL.
pub(crate) struct MergeUnitState {
    host: Host,
    sim: Py<Simulator>,
    clock: Clock,
    spread: Py<PortSpread>,
    port: i64,
    capacity: i64,
    line_bytes: i64,
    timeout_ps: i64,
    latency_ps: i64,
    /// The time between two access slots (`1 / lookups_per_ns`; 0: no limit), the
    /// slots a reduction's line takes (`red_accesses`), when the next slot is free, and
    /// what the request being served waited for its slot.
    lookup_ps: i64,
    red_accesses: i64,
    free_at: i64,
    wait_ps: i64,
    wait_at: i64,
    default_expect: i64,
    /// The CAM: key -> session id.
    cam: HashMap<Key, i64>,
    /// The sessions by id.
    entries: HashMap<i64, Entry>,
    /// The idle timer's queue: the sessions in order of last access (first: idle
    /// longest); the replacement policy is handed it too (LRU evicts by it).
    idle: AccessOrder,
    /// Which session goes when lines are needed (`switch.merge.replacement`).
    policy: Box<dyn Replacement>,
    /// How many lines a session takes and when it may open (all or nothing).
    rule: Box<dyn SessionRule>,
    replacement: String,
    /// Lines held (sessions, and sums waiting to leave).
    used: i64,
    since: i64,
    next: i64,
    timer: bool,
    /// The merge tracker: address -> (first arrival, requests so far).
    arrivals: HashMap<Key, (i64, i64)>,
    stats: MergeStats,
    /// Per tensor (a session address's buffer): lines held now and at most.
    tensors: Vec<(String, i64, i64)>,
    tensor_index: HashMap<Option<u32>, usize>,
    buffers: BufferIds,
    /// (time, lines) at each change, when recording.
    log: Option<Vec<(i64, i64)>>,
    /// Emptied request lists of ended sessions (their waiters, their held requests),
    /// kept for the next sessions: a session's lists cost no allocation.
    spare: Vec<Vec<Py<Train>>>,
}

unit!(MergeUnit, MergeUnitState);

/// Emptied request lists a merge unit keeps.
const SPARE_LISTS: usize = 64;

/// Add `train` to a session's request list, which takes a kept list when it has none.
fn keep_in(list: &mut Vec<Py<Train>>, spare: &mut Vec<Vec<Py<Train>>>, train: &Bound<'_, Train>) {
    if list.capacity() == 0 {
        if let Some(kept) = spare.pop() {
            *list = kept;
        }
    }
    list.push(train.clone().unbind());
}

impl MergeUnit {
    /// Every request for the address has arrived: a session still open for it ends now.
    fn last_arrived(slf: &Bound<'_, Self>, key: &Key) -> PyResult<()> {
        let state = {
            let mut me = slf.st();
            let Some(&sid) = me.cam.get(key) else { return Ok(()) };
            let e = &me.entries[&sid];
            if e.count >= e.expect {
                return Ok(());
            }
            let state = e.state;
            me.stats.tracked += 1;
            if state == State::LoadWait {
                let e = me.entries.get_mut(&sid).expect("session");
                e.expect = e.count;
                e.quorum = e.count;
                return Ok(());
            }
            (sid, state)
        };
        match state {
            (sid, State::Reduction) => MergeUnit::flush(slf, sid),
            (sid, _) => MergeUnit::close(slf, sid),
        }
    }

    /// A request of CAM type `kind` arrives: its key, what its address says, whether
    /// it is the last its address expects (the merge tracker) and its session, if any.
    fn look_up(
        slf: &Bound<'_, Self>,
        kind: u8,
        req: &Bound<'_, Train>,
    ) -> PyResult<(Key, AddrInfo, bool, Option<i64>)> {
        let py = slf.py();
        let mut me = slf.st();
        let now = me.now(py);
        let nbytes = if kind == LOAD { req.st().want } else { req.st().payload };
        let lines = me.lines_for(nbytes).max(1);
        let per_line = if kind == REDUCTION_TYPE { me.red_accesses } else { 1 };
        me.reserve(now, req, lines, per_line);
        let r = req.st();
        let (key, info) = match &r.addr {
            // borrowed: a new reference would be dropped with a check of the thread's state
            Some(addr) => me.key(kind, addr.bind(py))?,
            None => me.key(kind, &py.None().into_bound(py))?,
        };
        let last = me.arrive(py, &key, r.count, r.expect);
        let found = me.cam.get(&key).copied();
        Ok((key, info, last, found))
    }

    pub(crate) fn load_train(slf: &Bound<'_, Self>, req: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (key, info, last, found) = MergeUnit::look_up(slf, LOAD, req)?;
        match found {
            None => {
                let lines = {
                    let me = slf.st();
                    me.lines_for(req.st().want)
                };
                if let Some(sid) = MergeUnit::open(slf, &key, info, State::LoadWait, req, lines)? {
                    {
                        let mut me = slf.st();
                        let me = &mut *me;
                        let e = me.entries.get_mut(&sid).expect("session");
                        keep_in(&mut e.waiters, &mut me.spare, req);
                    }
                    req.st().tag = sid;
                    let host = slf.st().host(py);
                    host.forward(req)?; // the standard routing path to the home GPU
                    MergeUnit::touch(slf, sid)?;
                }
            }
            Some(sid) => {
                let host = {
                    let mut me = slf.st();
                    me.entries.get_mut(&sid).expect("session").count += 1; // a hit
                    me.stats.merged += 1;
                    me.host(py)
                };
                host.take(req, 0)?;
                let (answer, close) = {
                    let mut me = slf.st();
                    let me = &mut *me;
                    let e = me.entries.get_mut(&sid).expect("session");
                    if e.state == State::LoadWait {
                        keep_in(&mut e.waiters, &mut me.spare, req); // deferred response
                        (false, false)
                    } else {
                        keep_in(&mut e.held, &mut me.spare, req);
                        (e.count >= e.quorum, e.count >= e.expect)
                    }
                };
                if answer {
                    let now = slf.st().now(py);
                    MergeUnit::answer_held(slf, sid, now)?;
                }
                if close {
                    MergeUnit::close(slf, sid)?;
                } else {
                    MergeUnit::touch(slf, sid)?;
                }
            }
        }
        if last {
            MergeUnit::last_arrived(slf, &key)?;
        }
        Ok(())
    }

    /// The home's data for session `resp.tag` arrives (false: not the unit's).
    pub(crate) fn load_data_train(slf: &Bound<'_, Self>, resp: &Bound<'_, Train>) -> PyResult<bool> {
        let py = slf.py();
        let (sid, mut waiters, answer, data, lat, host) = {
            let mut me = slf.st();
            let sid = resp.st().tag;
            if !me.entries.get(&sid).is_some_and(|e| e.state == State::LoadWait) {
                return Ok(false);
            }
            let now = me.now(py);
            let lines = me.lines_for(resp.st().payload).max(1);
            me.reserve(now, resp, lines, 1); // the data is written into the content array
            let lat = me.latency_ps;
            let host = me.host(py);
            let Some(e) = me.entries.get_mut(&sid) else {
                return Ok(false);
            };
            if e.state != State::LoadWait {
                return Ok(false);
            }
            let data = obj(&resp.st().data, py);
            e.state = State::LoadReady;
            e.data = data.clone_ref(py);
            let waiters = std::mem::take(&mut e.waiters);
            let answer = e.count >= e.quorum || e.doomed;
            (sid, waiters, answer, data, lat, host)
        };
        if answer {
            let (head, tail) = {
                let r = resp.st();
                (r.head + lat, r.tail + lat)
            };
            host.answer(py, &mut waiters, data, head, tail, Some(resp))?;
            slf.st().give_back(waiters);
        } else {
            // throttled: the early requesters wait for their peers (answered from the cache)
            let mut me = slf.st();
            let e = me.entries.get_mut(&sid).expect("session");
            if e.held.is_empty() {
                std::mem::swap(&mut e.held, &mut waiters);
            } else {
                e.held.append(&mut waiters);
            }
            me.give_back(waiters);
            drop(me);
            let payload = resp.st().payload;
            host.take(resp, payload)?;
        }
        let close = {
            let me = slf.st();
            let e = &me.entries[&sid];
            e.count >= e.expect || e.doomed
        };
        if close {
            MergeUnit::close(slf, sid)?;
        } else {
            MergeUnit::touch(slf, sid)?;
        }
        Ok(true)
    }

    pub(crate) fn reduce_train(slf: &Bound<'_, Self>, red: &Bound<'_, Train>) -> PyResult<()> {
        let py = slf.py();
        let (key, info, last, found) = MergeUnit::look_up(slf, REDUCTION_TYPE, red)?;
        let (payload, head, data, count) = {
            let r = red.st();
            (r.payload, r.head, obj(&r.data, py), r.count)
        };
        let sid = match found {
            None => {
                let lines = slf.st().lines_for(payload);
                let Some(sid) = MergeUnit::open(slf, &key, info, State::Reduction, red, lines)? else {
                    if last {
                        MergeUnit::last_arrived(slf, &key)?;
                    }
                    return Ok(());
                };
                let first = if data.is_none(py) {
                    data
                } else {
                    data.call_method0(py, "copy")?
                };
                slf.st().entries.get_mut(&sid).expect("session").data = first;
                sid
            }
            Some(sid) => {
                let old = {
                    let mut me = slf.st();
                    me.stats.merged += 1;
                    let e = me.entries.get_mut(&sid).expect("session");
                    e.count += count;
                    e.data.clone_ref(py)
                };
                if !data.is_none(py) {
                    let sum = if old.is_none(py) {
                        data.call_method0(py, "copy")?
                    } else {
                        old.bind(py).add(data.bind(py))?.unbind()
                    };
                    slf.st().entries.get_mut(&sid).expect("session").data = sum;
                }
                sid
            }
        };
        let host = {
            let mut me = slf.st();
            let e = me.entries.get_mut(&sid).expect("session");
            e.head = e.head.max(head);
            me.host(py)
        };
        host.take(red, payload)?;
        let (ack, flush) = {
            let mut me = slf.st();
            let me = &mut *me;
            let e = me.entries.get_mut(&sid).expect("session");
            keep_in(&mut e.held, &mut me.spare, red); // accepted: the store window frees (throttled: once peers are in)
            (e.count >= e.quorum, e.count >= e.expect)
        };
        if ack {
            MergeUnit::ack_held(slf, sid)?;
        }
        if flush {
            MergeUnit::flush(slf, sid)?;
        } else {
            MergeUnit::touch(slf, sid)?;
        }
        if last {
            MergeUnit::last_arrived(slf, &key)?;
        }
        Ok(())
    }

    /// A new session for `first` (a CAM miss), making room by evicting the replacement
    /// policy's victims; None (and
    /// `first` forwarded unmerged) when it cannot have the lines.
    fn open(
        slf: &Bound<'_, Self>,
        key: &Key,
        info: AddrInfo,
        state: State,
        first: &Bound<'_, Train>,
        lines: i64,
    ) -> PyResult<Option<i64>> {
        let py = slf.py();
        if !MergeUnit::make_room(slf, lines)? {
            let host = {
                let mut me = slf.st();
                me.stats.bypassed += 1;
                if state == State::LoadWait {
                    me.stats.bypassed_loads += 1;
                }
                me.host(py)
            };
            host.forward(first)?;
            return Ok(None);
        }
        let (sid, tensor) = {
            let mut me = slf.st();
            let now = me.now(py);
            let sid = me.next;
            me.next += 1;
            let tensor = me.tensor(info.tensor);
            let f = first.st();
            let expect = if f.expect != 0 { f.expect } else { me.default_expect };
            let entry = Entry {
                id: sid,
                key: key.clone(),
                state,
                count: f.count,
                expect,
                quorum: f.quorum.min(expect),
                lines,
                waiters: Vec::new(),
                held: Vec::new(),
                data: py.None(),
                addr: obj(&f.addr, py),
                nbytes: info.nbytes,
                tensor,
                signal: f.tag,
                cls: f.cls,
                vc: f.vc,
                head: f.head,
                touched: now,
                doomed: false,
            };
            me.cam.insert(key.clone(), sid);
            me.idle.touch(sid);
            me.policy.open(sid);
            me.entries.insert(sid, entry);
            me.stats.sessions += 1;
            (sid, tensor)
        };
        MergeUnit::occupy(slf, lines, tensor)?;
        Ok(Some(sid))
    }

    /// Room for a session of `lines` lines, as the session rule says: true once it has
    /// them (evicting the replacement policy's victims on the way), false if its
    /// request is to bypass.
    fn make_room(slf: &Bound<'_, Self>, lines: i64) -> PyResult<bool> {
        loop {
            let victim = {
                let mut me = slf.st();
                match me.rule.room(lines, me.capacity - me.used) {
                    Room::Open => return Ok(true),
                    Room::Bypass => return Ok(false),
                    Room::Evict => {}
                }
                let Some(sid) = me.policy.victim(&me.idle) else {
                    return Ok(false); // the lines are held by sums waiting to leave
                };
                let e = me.entries.get_mut(&sid).expect("session");
                if e.state == State::LoadWait {
                    e.doomed = true; // released once its data is out; this request bypasses
                    return Ok(false);
                }
                me.stats.evicted += 1;
                sid
            };
            MergeUnit::flush(slf, victim)?;
        }
    }

    fn answer_held(slf: &Bound<'_, Self>, sid: i64, now: i64) -> PyResult<()> {
        let py = slf.py();
        let (mut held, data, t, host) = {
            let mut me = slf.st();
            let wait = if now == me.wait_at { me.wait_ps } else { 0 }; // the request being served's
            let t = now + me.latency_ps + wait;
            let host = me.host(py);
            let e = me.entries.get_mut(&sid).expect("session");
            (std::mem::take(&mut e.held), e.data.clone_ref(py), t, host)
        };
        if held.is_empty() {
            return Ok(());
        }
        host.answer(py, &mut held, data, t, t, None)?;
        slf.st().give_back(held);
        Ok(())
    }

    fn ack_held(slf: &Bound<'_, Self>, sid: i64) -> PyResult<()> {
        let py = slf.py();
        let mut held = std::mem::take(&mut slf.st().entries.get_mut(&sid).expect("session").held);
        let (now, sim) = {
            let me = slf.st();
            (me.now(py), me.sim.clone_ref(py))
        };
        for red in held.drain(..) {
            let red = red.into_bound(py);
            complete(&red, now)?;
            sim.get().recycle(py, red); // it ends here
        }
        slf.st().give_back(held);
        Ok(())
    }

    /// End a session: a Reduction sends its (partial) sum home, its lines free when
    /// that leaves; a load session just frees its lines. Requests throttling held back
    /// are acknowledged.
    fn flush(slf: &Bound<'_, Self>, sid: i64) -> PyResult<()> {
        let py = slf.py();
        if slf.st().entries[&sid].state != State::Reduction {
            return MergeUnit::close(slf, sid);
        }
        MergeUnit::ack_held(slf, sid)?;
        let (e, host, port, head) = {
            let mut me = slf.st();
            let e = me.forget(sid);
            let head = e.head + me.latency_ps;
            (e, me.host(py), me.port, head)
        };
        match host {
            Host::Chip(chip) => {
                let lines = u32::try_from(e.lines).expect("an entry's lines fit in 32 bits");
                let tensor = u32::try_from(e.tensor).expect("a tensor's index fits in 32 bits");
                let hook = Hook::Unit(UnitRef::of_bound(slf), (lines, tensor));
                let sum = HomeSum {
                    home: port,
                    nbytes: e.nbytes,
                    addr: e.addr,
                    data: e.data,
                    vc: e.vc,
                    cls: e.cls,
                    signal: e.signal,
                    count: e.count,
                    head,
                };
                SwitchChip::write_home_sum(chip.bind(py), sum, hook)
            }
            Host::Object(o) => {
                let view = Session::of(py, &e);
                let free = FreeLines {
                    unit: slf.clone().unbind(),
                    lines: e.lines,
                    tensor: e.tensor,
                };
                o.call_method1(py, "write_home", (port, view, head, free)).map(|_| ())
            }
        }
    }

    fn close(slf: &Bound<'_, Self>, sid: i64) -> PyResult<()> {
        let now = slf.st().now(slf.py());
        MergeUnit::answer_held(slf, sid, now)?;
        let (lines, tensor) = {
            let e = slf.st().forget(sid);
            (e.lines, e.tensor)
        };
        MergeUnit::occupy(slf, -lines, tensor)
    }

    /// `lines` more (or fewer) lines in use, of tensor `tensor`.
    pub(crate) fn occupy(slf: &Bound<'_, Self>, lines: i64, tensor: usize) -> PyResult<()> {
        let py = slf.py();
        let change = {
            let mut me = slf.st();
            let t = &mut me.tensors[tensor];
            t.1 += lines;
            t.2 = t.2.max(t.1);
            let now = me.now(py);
            let (used, since) = (me.used, me.since);
            me.stats.line_ps += used * (now - since);
            if used != 0 {
                me.stats.busy_ps += now - since;
            }
            me.since = now;
            me.used += lines;
            let after = me.used;
            me.stats.peak_lines = me.stats.peak_lines.max(after);
            if let Some(log) = me.log.as_mut() {
                log.push((now, after));
            }
            match (used != 0, after != 0) {
                (false, true) => Some((me.spread.clone_ref(py), now, 1)),
                (true, false) => Some((me.spread.clone_ref(py), now, -1)),
                _ => None,
            }
        };
        if let Some((spread, now, delta)) = change {
            spread.get().change(py, now, delta);
        }
        Ok(())
    }

    /// An access: the session goes to the back of the idle timer's queue (the order
    /// of last access, so the timer need only look at the front) and the replacement
    /// policy is told.
    fn touch(slf: &Bound<'_, Self>, sid: i64) -> PyResult<()> {
        let py = slf.py();
        let mut me = slf.st();
        let now = me.now(py);
        me.entries.get_mut(&sid).expect("session").touched = now;
        me.idle.touch(sid);
        me.policy.touch(sid);
        if !me.timer {
            me.timer = true;
            let due = now + me.timeout_ps;
            me.sim
                .get()
                .push(py, due, Action::Due(UnitRef::of_bound(slf), 0, None))?;
        }
        Ok(())
    }

    /// The unit's idle timer: flush every session idle for `timeout_us` (a Load-Wait
    /// session waits for its data, which touches it), then re-arm for the next one due.
    pub(crate) fn expire(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (due, now, limit) = {
            let mut me = slf.st();
            me.timer = false;
            let now = me.now(py);
            let limit = me.timeout_ps;
            let mut due = Vec::new();
            for sid in me.idle.iter() {
                let e = &me.entries[&sid];
                if e.touched + limit > now {
                    break;
                }
                if e.state != State::LoadWait {
                    due.push(sid);
                }
            }
            (due, now, limit)
        };
        for sid in due {
            slf.st().stats.timed_out += 1;
            MergeUnit::flush(slf, sid)?;
        }
        let mut me = slf.st();
        let next = me
            .idle
            .iter()
            .map(|sid| &me.entries[&sid])
            .find(|e| e.state != State::LoadWait)
            .map(|e| e.touched + limit);
        if let Some(t) = next {
            me.timer = true;
            me.sim
                .get()
                .push(py, t.max(now), Action::Due(UnitRef::of_bound(slf), 0, None))?;
        }
        Ok(())
    }
}

impl MergeUnitState {
    /// The lookups of `train`, one per line it covers (`lines`, packets of up to
    /// `line_bytes` each), start at the unit's next free slot and take `per_line` access
    /// slots each (a reduction's read-modify-write: `red_accesses`): the train is held
    /// the wait (its head and tail move on by it, as a switch's pipeline moves them) and
    /// its slots are taken. The lines are counted whatever the limit (the energy's
    /// lookups).
    fn reserve(&mut self, now: i64, train: &Bound<'_, Train>, lines: i64, per_line: i64) {
        let (start, free) = next_slot(now, self.free_at, self.lookup_ps * lines * per_line);
        self.free_at = free;
        self.wait_ps = start - now;
        self.wait_at = now;
        self.stats.lookups += lines;
        self.stats.lookup_wait_ps += self.wait_ps;
        if self.wait_ps > 0 {
            let mut t = train.st();
            t.head += self.wait_ps;
            t.tail += self.wait_ps;
        }
    }

    fn now(&self, py: Python<'_>) -> i64 {
        let _ = py;
        self.clock.now()
    }

    fn tensor(&mut self, buffer: Option<u32>) -> usize {
        if let Some(&i) = self.tensor_index.get(&buffer) {
            return i;
        }
        let i = self.tensors.len();
        self.tensors.push((self.buffers.name(buffer), 0, 0));
        self.tensor_index.insert(buffer, i);
        i
    }

    /// The lines a session for a request of `nbytes` takes (the session rule's).
    fn lines_for(&self, nbytes: i64) -> i64 {
        self.rule.lines(nbytes)
    }

    fn host(&self, py: Python<'_>) -> Host {
        match &self.host {
            Host::Chip(c) => Host::Chip(c.clone_ref(py)),
            Host::Object(o) => Host::Object(o.clone_ref(py)),
        }
    }

    fn key(&mut self, kind: u8, addr: &Bound<'_, PyAny>) -> PyResult<(Key, AddrInfo)> {
        let info = addr_info(addr, &mut self.buffers)?;
        Ok(((kind, info.address.clone()), info))
    }

    /// The merge tracker (paper §III-B.1): count a request's arrival for its address,
    /// merged or not. Once all the requesters it expects have come, record first-to-
    /// last arrival and return true: no request for the address is still to come.
    fn arrive(&mut self, py: Python<'_>, key: &Key, count: i64, expect: i64) -> bool {
        let now = self.now(py);
        let need = if expect != 0 { expect } else { self.default_expect };
        let seen = self.arrivals.entry(key.clone()).or_insert((now, 0));
        seen.1 += count;
        if seen.1 < need {
            return false;
        }
        let first = seen.0;
        self.arrivals.remove(key);
        let skew = now - first;
        let st = &mut self.stats;
        st.skew_n += 1;
        st.skew_sum_ps += skew;
        st.skew_max_ps = st.skew_max_ps.max(skew);
        true
    }

    fn forget(&mut self, sid: i64) -> Entry {
        let mut e = self.entries.remove(&sid).expect("session");
        self.cam.remove(&e.key);
        self.idle.remove(sid);
        self.policy.close(sid);
        self.give_back(std::mem::take(&mut e.waiters));
        self.give_back(std::mem::take(&mut e.held));
        e
    }

    /// Keep an emptied request list for the next session (a few dozen at most: as
    /// many as sessions end at once).
    fn give_back(&mut self, list: Vec<Py<Train>>) {
        if list.capacity() > 0 && list.is_empty() && self.spare.len() < SPARE_LISTS {
            self.spare.push(list);
        }
    }
}

impl Handler for MergeUnit {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            // its idle timer
            Event::Due { .. } => MergeUnit::expire(slf),
            // a flushed sum goes on the wire: its lines (of a tensor) free
            Event::Started {
                arg: (lines, tensor), ..
            } => MergeUnit::occupy(slf, -lines, tensor),
            _ => Err(unexpected("MergeUnit")),
        }
    }
}

/// When a lookup asked for at `now` starts, and when the next may: one every
/// `interval` ps (0: every lookup starts at once), from `free` on.
fn next_slot(now: i64, free: i64, interval: i64) -> (i64, i64) {
    if interval <= 0 {
        return (now, free);
    }
    let start = now.max(free);
    (start, start + interval)
}

/// The time between two lookups at `lookups_per_ns` (None: 0, no limit).
fn lookup_interval_ps(lookups_per_ns: Option<f64>) -> PyResult<i64> {
    match lookups_per_ns {
        None => Ok(0),
        Some(r) if r > 0.0 && r.is_finite() => Ok(ps(1.0 / r, 1e3).max(1)),
        Some(r) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "switch.merge.lookups_per_ns must be positive, not {r}"
        ))),
    }
}

/// The access slots a reduction's line takes (`switch.merge.red_accesses`, at least 1).
fn red_accesses(n: i64) -> PyResult<i64> {
    if n >= 1 {
        Ok(n)
    } else {
        Err(pyo3::exceptions::PyValueError::new_err(format!(
            "switch.merge.red_accesses must be at least 1, not {n}"
        )))
    }
}

#[pymethods]
impl MergeUnit {
    #[new]
    #[pyo3(signature = (host, port, cfg, gpus, spread = None))]
    fn new(
        py: Python<'_>,
        host: &Bound<'_, PyAny>,
        port: i64,
        cfg: MergeConfig,
        gpus: i64,
        spread: Option<Py<PortSpread>>,
    ) -> PyResult<Self> {
        let sim: Py<Simulator> = host.getattr("sim")?.extract()?;
        let host = match host.cast::<SwitchChip>() {
            Ok(chip) => Host::Chip(chip.clone().unbind()),
            Err(_) => Host::Object(host.clone().unbind()),
        };
        let clock = sim.get().clock();
        Ok(MergeUnit::from(MergeUnitState {
            host,
            clock,
            sim,
            spread: match spread {
                Some(s) => s,
                None => Py::new(py, PortSpread::from(PortSpreadState::default()))?,
            },
            port,
            capacity: cfg.entries,
            line_bytes: cfg.line_bytes,
            timeout_ps: ps(cfg.timeout_us, 1e6),
            latency_ps: ps(cfg.latency_ns, 1e3),
            lookup_ps: lookup_interval_ps(cfg.lookups_per_ns)?,
            red_accesses: red_accesses(cfg.red_accesses)?,
            free_at: 0,
            wait_ps: 0,
            wait_at: -1,
            default_expect: gpus - 1,
            cam: HashMap::default(),
            entries: HashMap::default(),
            idle: AccessOrder::default(),
            policy: replacement::by_name(&cfg.replacement)?,
            rule: session_rule::of(&cfg),
            replacement: cfg.replacement.clone(),
            used: 0,
            since: 0,
            next: 0,
            timer: false,
            arrivals: HashMap::default(),
            stats: MergeStats::default(),
            tensors: Vec::new(),
            spare: Vec::new(),
            tensor_index: HashMap::default(),
            buffers: BufferIds::default(),
            log: None,
        }))
    }

    /// An `ld.cais` request for `req.want` bytes of the home's memory arrives.
    fn load(slf: &Bound<'_, Self>, req: Bound<'_, Train>) -> PyResult<()> {
        MergeUnit::load_train(slf, &req)
    }

    /// The home GPU's data for session `resp.tag` arrives: answer every waiting
    /// requester, then cache it (or end the session). False: no such session.
    fn load_data(slf: &Bound<'_, Self>, resp: Bound<'_, Train>) -> PyResult<bool> {
        MergeUnit::load_data_train(slf, &resp)
    }

    /// A `red.cais` contribution (or a sum of `red.count`) arrives.
    fn reduce(slf: &Bound<'_, Self>, red: Bound<'_, Train>) -> PyResult<()> {
        MergeUnit::reduce_train(slf, &red)
    }

    /// What the unit did so far (a copy).
    #[getter]
    fn stats(&self, py: Python<'_>) -> MergeStats {
        let me = self.st(py);
        me.stats.clone()
    }

    /// The most lines each tensor's sessions held at once.
    #[getter]
    fn tensor_peak<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let me = self.st(py);
        let out = PyDict::new(py);
        for (name, _, peak) in me.tensors.iter() {
            out.set_item(name, *peak)?;
        }
        Ok(out)
    }

    /// The open sessions in order of last access, by CAM key `(type, address)` (a copy).
    #[getter]
    fn table<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let me = self.st(py);
        let out = PyDict::new(py);
        for sid in me.idle.iter() {
            let e = &me.entries[&sid];
            out.set_item((e.key.0, e.addr.clone_ref(py)), Session::of(py, e))?;
        }
        Ok(out)
    }

    /// The integral of lines in use over [0, `end`] (line-picoseconds).
    fn line_ps_until(&self, py: Python<'_>, end: i64) -> i64 {
        let me = self.st(py);
        me.stats.line_ps + me.used * (end - me.since).max(0)
    }

    /// The time in [0, `end`] the unit held any line.
    fn busy_ps_until(&self, py: Python<'_>, end: i64) -> i64 {
        let me = self.st(py);
        me.stats.busy_ps + if me.used != 0 { (end - me.since).max(0) } else { 0 }
    }

    /// Sessions still open (for the forward-progress watchdog).
    fn stuck(&self, py: Python<'_>) -> Vec<String> {
        let me = self.st(py);
        let waiting = me.entries.values().filter(|e| e.state == State::LoadWait).count();
        if waiting == 0 {
            return Vec::new();
        }
        vec![format!(
            "merge unit port {}: {waiting} Load-Wait session(s) waiting for home data",
            me.port
        )]
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        match &me.host {
            Host::Chip(c) => visit.call(c)?,
            Host::Object(o) => visit.call(o)?,
        }
        visit.call(&me.sim)?;
        visit.call(&me.spread)?;
        for e in me.entries.values() {
            for t in e.waiters.iter().chain(e.held.iter()) {
                visit.call(t)?;
            }
            visit.call(&e.data)?;
            visit.call(&e.addr)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.entries.clear();
            me.cam.clear();
            me.idle.clear();
        }
    }
}

properties!(MergeUnit {
    sim: Py<Simulator>;
    spread: Py<PortSpread>;
    port: i64;
    capacity: i64;
    line_bytes: i64;
    /// The replacement policy (`switch.merge.replacement`).
    replacement: String;
    timeout_ps: i64;
    latency_ps: i64;
    /// The time between two access slots (0: no limit).
    lookup_ps: i64;
    /// The access slots a reduction's line takes.
    red_accesses: i64;
    default_expect: i64;
    used: i64;
    /// What was recorded (None: not recording); set a list to start recording (what to
    /// start from), None to stop.
    log: Option<Vec<(i64, i64)>>, set set_log;
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_spread_integrates_ports_holding_sessions() {
        Python::initialize();
        Python::attach(|py| {
            let s = PortSpread::from(PortSpreadState::default());
            s.change(py, 10, 1); // one port from 10
            s.change(py, 30, 1); // two from 30
            s.change(py, 40, -1); // one from 40
            assert_eq!(s.until(py, 50), (40, 50)); // held 10..50; 20 + 2 x 10 + 10 port-ps
            s.change(py, 50, -1);
            assert_eq!(s.until(py, 1_000), (40, 50)); // nothing held after 50
        });
    }

    #[test]
    fn lookups_wait_for_the_next_free_slot() {
        assert_eq!(next_slot(100, 0, 0), (100, 0)); // no limit: at once, nothing reserved
        assert_eq!(next_slot(100, 0, 400), (100, 500)); // idle unit: at once
        assert_eq!(next_slot(200, 500, 400), (500, 900)); // busy until 500: waits 300
        assert_eq!(next_slot(1_000, 900, 400), (1_000, 1_400)); // free again
    }

    #[test]
    fn the_lookup_interval_is_the_rate_inverted() {
        Python::initialize();
        assert_eq!(lookup_interval_ps(None).unwrap(), 0);
        assert_eq!(lookup_interval_ps(Some(2.5)).unwrap(), 400);
        assert_eq!(lookup_interval_ps(Some(1e9)).unwrap(), 1); // at least a ps
        assert!(lookup_interval_ps(Some(0.0)).is_err());
    }

    #[test]
    fn a_reduction_takes_its_accesses() {
        Python::initialize();
        assert_eq!(red_accesses(2).unwrap(), 2);
        assert!(red_accesses(0).is_err());
        // two one-line reductions at 400 ps a slot, two slots each: the second waits 800 ps
        let (s0, f0) = next_slot(0, 0, 400 * 2);
        assert_eq!((s0, next_slot(0, f0, 400 * 2).0), (0, 800));
    }
}
