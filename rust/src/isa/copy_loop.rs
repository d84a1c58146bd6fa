//! An SM's copy loop over its moves (`cais.kernels.ep_common.copy_tb`, the loop of
//! NCCL's all-to-all channels and DeepEP's low-latency senders) on the core's side:
//! each move's stores go out in order through the SM's store port while a window of
//! bytes in flight admits them.
//!
//! This is the loop the TB program would otherwise run in Python, a few callbacks per
//! store; which moves, their stripes and what their landing counts into stay the
//! kernel's. Timing mode only: in functional mode the kernel's Python loop carries the
//! rows' data.

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, UnitState};
use crate::engine::completion::Completion;
use crate::engine::sim::{Action, Simulator};
use crate::engine::unit::{unexpected, Event, Handler, UnitRef};
use crate::engine::wait::{Countdown, Signal};
use crate::hw::gpu::Endpoint;
use crate::hw::sm_port::SmPort;

use super::store_chain::{arrive_each, fence_count, issue_stores, send_flag, FlagWire};

/// How a move is sent (`cais.kernels.ep_common.Move.protocol`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// To the SM's own GPU: the loop's time for its bytes, nothing on the fabric.
    Local,
    /// Plain stores: a part lands with its stores.
    Plain,
    /// NCCL's LL: the stores at the LL loop's rate and in its line format.
    Ll,
    /// NCCL's Simple: the stores, their write responses, then a flag; a part lands
    /// with its flag.
    Simple,
}

/// One store of a move (its rows, or for FP8 their scales): its stripes and bytes, and
/// for a Simple move its flag (taken as the part goes out).
struct Part {
    stripes: Py<PyList>,
    nbytes: i64,
    flag: Option<FlagWire>,
}

/// One move: where it goes, how, its parts, the loop's time for it (a local move) and
/// what its landing counts into.
struct Move {
    dst: i64,
    protocol: Protocol,
    parts: Vec<Part>,
    pause: i64,
    landed: Vec<Py<Countdown>>,
    /// Parts not landed yet.
    left: usize,
}

/// A move as Python hands it over: `(dst, protocol, parts, pause, landed)` (`CopyLoop::new`).
type MoveArgs = (i64, String, Vec<(Py<PyList>, i64)>, i64, Vec<Py<Countdown>>);

/// An SM's copy loop (see the module). The moves go out in order: a local move
/// holds the loop for its time; a remote one's parts each take their bytes in the
/// window first (a soft limit: a part is admitted whenever nothing is in flight, as
/// `cais.kernels.common.Window`), waiting while it is full. When a part lands its
/// bytes are given back first (the loop goes on), then it counts into its move (a
/// move counts into its countdowns when its last part has landed). `finished` fires
/// once every move has gone out and every remote part has landed.
#[pyclass(module = "cais._core", frozen)]
pub struct CopyLoop {
    st: GilCell<CopyLoopState>,
}

/// The mutable state of a [`CopyLoop`] (see there), borrowed while holding the GIL.
pub(crate) struct CopyLoopState {
    gpu: Py<Endpoint>,
    sim: Py<Simulator>,
    port: Py<SmPort>,
    ll_port: Py<SmPort>,
    ll_encoding: f64,
    /// `flag_wire(dst)`: a new flag's wire to `dst` (a Simple part's, taken as the
    /// part goes out).
    flag_wire: Py<PyAny>,
    src: i64,
    stream: i64,
    limit: i64,
    moves: Vec<Move>,
    /// The next move, and its next part.
    next: usize,
    part: usize,
    used: i64,
    /// The loop waits for room in the window.
    waiting: bool,
    /// Remote parts not landed yet.
    in_flight: i64,
    finished: Option<Py<Signal>>,
    started: bool,
}

unit!(CopyLoop, CopyLoopState);

/// What a [`CopyStep`] stands for: a part landed, a Simple part's write responses, a
/// Simple part's flag landed, the end of a local move's time.
const LANDED: u8 = 0;
const FENCED: u8 = 1;
const TAIL: u8 = 2;
const LOCAL: u8 = 3;

impl CopyLoop {
    fn handle(slf: &Bound<'_, Self>, m: usize, p: usize, role: u8) -> PyResult<Py<CopyStep>> {
        Py::new(
            slf.py(),
            CopyStep {
                copy: slf.clone().unbind(),
                m,
                p,
                role,
            },
        )
    }

    /// Issue what the loop may now: moves and parts in order until a local move holds
    /// it, the window is full or every move has gone out.
    fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        loop {
            let (m, p, mv_dst, protocol, pause, stripes, nbytes) = {
                let mut me = slf.st();
                let (m, p) = (me.next, me.part);
                let Some(mv) = me.moves.get(m) else {
                    drop(me);
                    return CopyLoop::maybe_finish(slf);
                };
                let (dst, protocol, pause) = (mv.dst, mv.protocol, mv.pause);
                if protocol == Protocol::Local {
                    me.next += 1;
                    (m, p, dst, protocol, pause, None, 0)
                } else {
                    let part = &mv.parts[p];
                    let nbytes = part.nbytes;
                    if me.used > 0 && me.used + nbytes > me.limit {
                        me.waiting = true;
                        return Ok(()); // a landing resumes it
                    }
                    let stripes = part.stripes.clone_ref(py);
                    if p + 1 == mv.parts.len() {
                        me.next += 1;
                        me.part = 0;
                    } else {
                        me.part += 1;
                    }
                    me.used += nbytes;
                    me.in_flight += 1;
                    (m, p, dst, protocol, pause, Some(stripes), nbytes)
                }
            };
            let (gpu, sim) = {
                let me = slf.st();
                (me.gpu.clone_ref(py), me.sim.clone_ref(py))
            };
            let Some(stripes) = stripes else {
                // a local move: the loop's time, then it counts in
                let at = sim.get().now() + pause;
                let step = CopyLoop::handle(slf, m, p, LOCAL)?;
                return sim.get().schedule(py, at, Action::Due(UnitRef::new(step), LOCAL, None));
            };
            let stripes = stripes.bind(py);
            let (stream, port, encoding) = {
                let me = slf.st();
                let (port, encoding) = match protocol {
                    Protocol::Ll => (me.ll_port.clone_ref(py), me.ll_encoding),
                    _ => (me.port.clone_ref(py), 1.0),
                };
                (me.stream, port, encoding)
            };
            if protocol == Protocol::Simple {
                // its flag's address is taken now, as the part goes out
                let flag_wire = slf.st().flag_wire.clone_ref(py);
                let (chip, vc, wire, last): (i64, i64, i64, i64) = flag_wire.call1(py, (mv_dst,))?.extract(py)?;
                slf.st().moves[m].parts[p].flag = Some(FlagWire { chip, vc, wire, last });
                let acks = fence_count(stripes)?;
                let acked =
                    Completion::of_stream_request(py, acks, UnitRef::new(CopyLoop::handle(slf, m, p, FENCED)?), 0)?;
                issue_stores(
                    gpu.bind(py),
                    mv_dst,
                    stream,
                    stripes,
                    &port,
                    py.None(),
                    Some(&acked),
                    1.0,
                )?;
            } else {
                let count = stripes.len() as i64;
                let step = CopyLoop::handle(slf, m, p, LANDED)?;
                let done = Completion::of_stream_request(py, count, UnitRef::new(step), nbytes)?.into_any();
                issue_stores(gpu.bind(py), mv_dst, stream, stripes, &port, done, None, encoding)?;
            }
        }
    }

    /// Fire `finished` once every move has gone out and every part has landed.
    fn maybe_finish(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let fire = {
            let mut me = slf.st();
            if me.next < me.moves.len() || me.in_flight > 0 {
                return Ok(());
            }
            me.finished.take()
        };
        match fire {
            Some(sig) => {
                let now = slf.st().sim.get().now();
                Signal::fire_now(sig.bind(py), now, py.None())
            }
            None => Ok(()),
        }
    }

    /// Part `p` of move `m` has landed: its bytes back (the loop goes on if it waited),
    /// then it counts into its move, then into the loop.
    fn landed(slf: &Bound<'_, Self>, m: usize, p: usize) -> PyResult<()> {
        let py = slf.py();
        let resume = {
            let mut me = slf.st();
            me.used -= me.moves[m].parts[p].nbytes;
            std::mem::take(&mut me.waiting)
        };
        if resume {
            CopyLoop::advance(slf)?;
        }
        let (sim, counts) = {
            let mut me = slf.st();
            let mv = &mut me.moves[m];
            mv.left -= 1;
            let counts: Vec<Py<Countdown>> = if mv.left == 0 {
                mv.landed.iter().map(|c| c.clone_ref(py)).collect()
            } else {
                Vec::new()
            };
            me.in_flight -= 1;
            (me.sim.clone_ref(py), counts)
        };
        arrive_each(sim.bind(py), counts)?;
        CopyLoop::maybe_finish(slf)
    }

    /// A Simple part's write responses are back: its flag goes out.
    fn fenced(slf: &Bound<'_, Self>, m: usize, p: usize) -> PyResult<()> {
        let py = slf.py();
        let (gpu, sim, src, dst, flag) = {
            let me = slf.st();
            let mv = &me.moves[m];
            let flag = mv.parts[p].flag.expect("a Simple part's flag is taken as it goes out");
            (me.gpu.clone_ref(py), me.sim.clone_ref(py), me.src, mv.dst, flag)
        };
        let tail = CopyLoop::handle(slf, m, p, TAIL)?;
        let done = Completion::of_stream_request(py, 1, UnitRef::new(tail), 0)?.into_any();
        send_flag(gpu.bind(py), sim.bind(py), src, dst, flag, done)
    }

    /// A local move's time is over: it counts in, and the loop goes on.
    fn local_done(slf: &Bound<'_, Self>, m: usize) -> PyResult<()> {
        let py = slf.py();
        let (sim, counts) = {
            let me = slf.st();
            let counts: Vec<Py<Countdown>> = me.moves[m].landed.iter().map(|c| c.clone_ref(py)).collect();
            (me.sim.clone_ref(py), counts)
        };
        arrive_each(sim.bind(py), counts)?;
        CopyLoop::advance(slf)
    }
}

#[pymethods]
impl CopyLoop {
    /// `moves`, in the loop's order, each `(dst, protocol, parts, pause, landed)`:
    /// `protocol` one of "local", "plain", "ll", "simple"; `parts` each `(stripes,
    /// nbytes)` (none for a local move); `pause` the loop's time for a local move
    /// (picoseconds); `landed` the countdowns the move counts into. `port` and
    /// `ll_port`: the SM's store paths for plain and Simple stores and for LL ones,
    /// `ll_encoding` LL's wire bytes per data byte; `flag_wire(dst)`: a new flag's
    /// `(chip, vc, wire, last)` (`cais.isa.Isa.flag_wire`); `stream`: the kernel's
    /// stream; `limit`: the window's bytes.
    #[new]
    #[pyo3(signature = (gpu, sim, src, moves, port, ll_port, ll_encoding, flag_wire, stream, limit))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    fn new(
        py: Python<'_>,
        gpu: Py<Endpoint>,
        sim: Py<Simulator>,
        src: i64,
        moves: &Bound<'_, PyList>,
        port: Py<SmPort>,
        ll_port: Py<SmPort>,
        ll_encoding: f64,
        flag_wire: Py<PyAny>,
        stream: i64,
        limit: i64,
    ) -> PyResult<Self> {
        let mut out = Vec::with_capacity(moves.len());
        for mv in moves.iter() {
            let (dst, protocol, parts, pause, landed): MoveArgs = mv.extract()?;
            let protocol = match protocol.as_str() {
                "local" => Protocol::Local,
                "plain" => Protocol::Plain,
                "ll" => Protocol::Ll,
                "simple" => Protocol::Simple,
                other => {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "a copy loop's move has no protocol {other:?}"
                    )))
                }
            };
            if (protocol == Protocol::Local) != parts.is_empty() {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "a copy loop's local move has no parts, a remote one at least one",
                ));
            }
            let parts: Vec<Part> = parts
                .into_iter()
                .map(|(stripes, nbytes)| Part {
                    stripes,
                    nbytes,
                    flag: None,
                })
                .collect();
            let left = parts.len();
            out.push(Move {
                dst,
                protocol,
                parts,
                pause,
                landed,
                left,
            });
        }
        Ok(CopyLoop::from(CopyLoopState {
            gpu,
            sim,
            port,
            ll_port,
            ll_encoding,
            flag_wire,
            src,
            stream,
            limit,
            moves: out,
            next: 0,
            part: 0,
            used: 0,
            waiting: false,
            in_flight: 0,
            finished: Some(Py::new(py, Signal::blank(py))?),
            started: false,
        }))
    }

    /// Start the loop; return the signal that fires once every move has gone out and
    /// landed.
    fn start(slf: &Bound<'_, Self>) -> PyResult<Py<Signal>> {
        let py = slf.py();
        let finished = {
            let mut me = slf.st();
            if me.started {
                return Err(pyo3::exceptions::PyRuntimeError::new_err("a copy loop starts once"));
            }
            me.started = true;
            me.finished.as_ref().expect("not started").clone_ref(py)
        };
        CopyLoop::advance(slf)?;
        Ok(finished)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        visit.call(&me.sim)?;
        visit.call(&me.port)?;
        visit.call(&me.ll_port)?;
        visit.call(&me.flag_wire)?;
        visit.call(&me.finished)?;
        for mv in &me.moves {
            for p in &mv.parts {
                visit.call(&p.stripes)?;
            }
            for c in &mv.landed {
                visit.call(c)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.moves.clear();
            me.finished = None;
        }
    }
}

properties!(CopyLoop {
    /// Bytes in flight.
    used: i64;
});

/// A part or move of a [`CopyLoop`] in flight: its landing, its write responses, its
/// flag's landing or its local time's end (`role`) tells the loop.
#[pyclass(module = "cais._core", frozen)]
pub struct CopyStep {
    copy: Py<CopyLoop>,
    m: usize,
    p: usize,
    role: u8,
}

impl Handler for CopyStep {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        let me = slf.get();
        let copy = me.copy.bind(slf.py());
        match (ev, me.role) {
            (Event::Acked(_), LANDED | TAIL) => CopyLoop::landed(copy, me.m, me.p),
            (Event::Acked(_), FENCED) => CopyLoop::fenced(copy, me.m, me.p),
            (Event::Landed, LANDED | FENCED | TAIL) => Ok(()),
            (Event::Due { .. }, LOCAL) => CopyLoop::local_done(copy, me.m),
            _ => Err(unexpected("CopyStep")),
        }
    }
}

#[pymethods]
impl CopyStep {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.copy)
    }
}
