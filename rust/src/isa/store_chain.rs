//! A sender SM's chunked stores, each chunk followed by its tail flag, per
//! destination: the loop of DeepEP's normal dispatch and combine senders
//! (`cais.kernels.ep_deepep`, one warp group per destination rank) on the core's side.
//!
//! This is the loop the TB program would otherwise run in Python, a few callbacks per
//! chunk; which chunks, their stripes and what their landing counts into stay the
//! kernel's. Timing mode only: in functional mode the kernel's Python loop carries
//! the rows' data.

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::channel::Hook;
use crate::engine::completion::Completion;
use crate::engine::sim::{Action, Simulator};
use crate::engine::train::TrainState;
use crate::engine::unit::{unexpected, Event, Handler, UnitRef};
use crate::engine::wait::{Countdown, Signal};
use crate::hw::gpu::{Carry, Endpoint, Op};
use crate::hw::kinds;
use crate::hw::sm_port::SmPort;

/// A flag's train to one destination: the chip its address maps to, its VC there and
/// its wire bytes (the whole train's and its last packet's), as `cais.isa.Isa.flag_wire`
/// gives them.
#[derive(Clone, Copy)]
pub(crate) struct FlagWire {
    pub chip: i64,
    pub vc: i64,
    pub wire: i64,
    pub last: i64,
}

/// The write responses a fenced store of `stripes` waits for: the last stripe down
/// each chip carries that chip's (the stripes down one chip travel in order on one VC).
pub(crate) fn fence_count(stripes: &Bound<'_, PyList>) -> PyResult<i64> {
    Ok(last_per_chip(stripes)?.len() as i64)
}

/// (chip, index of its last stripe) for each chip `stripes` cross.
fn last_per_chip(stripes: &Bound<'_, PyList>) -> PyResult<Vec<(i64, usize)>> {
    let mut last: Vec<(i64, usize)> = Vec::new();
    for (i, stripe) in stripes.iter().enumerate() {
        let chip: i64 = stripe.get_item(1)?.extract()?;
        match last.iter_mut().find(|(k, _)| *k == chip) {
            Some(slot) => slot.1 = i,
            None => last.push((chip, i)),
        }
    }
    Ok(last)
}

/// Stores of `stripes` from `gpu` to GPU `dst` on `stream`, pushed through `port`, as
/// `cais.isa.Isa.st` issues them in timing mode: `done` is each train's completion;
/// with `fenced`, the last stripe down each chip carries it as its write response's
/// completion. `encoding`: wire bytes per data byte of a protocol's line format.
#[allow(clippy::too_many_arguments)] // the store's parts, as `Isa.st` takes them
pub(crate) fn issue_stores(
    gpu: &Bound<'_, Endpoint>,
    dst: i64,
    stream: i64,
    stripes: &Bound<'_, PyList>,
    port: &Py<SmPort>,
    done: Py<PyAny>,
    fenced: Option<&Py<Completion>>,
    encoding: f64,
) -> PyResult<()> {
    let py = gpu.py();
    let fences = match fenced {
        None => None,
        Some(acked) => {
            let mut at: Vec<Py<PyAny>> = (0..stripes.len()).map(|_| py.None()).collect();
            for (_, i) in last_per_chip(stripes)? {
                at[i] = acked.clone_ref(py).into_any();
            }
            Some(PyList::new(py, at)?)
        }
    };
    let op = Op {
        kind: kinds::WRITE,
        dst,
        stream,
        tag: -1,
        expect: 0,
        quorum: 0,
    };
    let carry = Carry {
        loads: false,
        port: Some(port.clone_ref(py).into_bound(py)),
        data: None,
        fences,
        encoding,
    };
    Endpoint::issue_stripes(gpu, &op, stripes, done, carry)
}

/// One arrival on each of `counts` (what a landing counts into), in order.
pub(crate) fn arrive_each(sim: &Bound<'_, Simulator>, counts: Vec<Py<Countdown>>) -> PyResult<()> {
    for count in counts {
        Countdown::arrive(count.bind(sim.py()), sim, 1)?;
    }
    Ok(())
}

/// A flag from GPU `src` to `dst` as `cais.isa.Isa.flag` sends it (`flag`: its wire),
/// `done` its completion when it lands.
pub(crate) fn send_flag(
    gpu: &Bound<'_, Endpoint>,
    sim: &Bound<'_, Simulator>,
    src: i64,
    dst: i64,
    flag: FlagWire,
    done: Py<PyAny>,
) -> PyResult<()> {
    let py = gpu.py();
    let mut t = TrainState::blank(0, flag.wire, flag.last, kinds::FLAG, src, dst);
    t.chip = flag.chip;
    t.vc = flag.vc;
    t.done = Some(done);
    let train = sim.get().new_train(py, t)?;
    Endpoint::inject_train(gpu, train, None, None, Hook::None)
}

/// One chunk: the stripes of each of its stores (`Isa.stripes`: (region, chip) each;
/// the rows, and for FP8 their scales), its bytes, and what its tail's landing counts
/// into.
struct Chunk {
    parts: Vec<Py<PyList>>,
    nbytes: i64,
    landed: Vec<Py<Countdown>>,
}

/// One destination's chunks, issued one after the other, and its tail flag's wire.
struct DstChain {
    dst: i64,
    flag: FlagWire,
    chunks: Vec<Chunk>,
    next: usize,
}

/// A sender SM's chains, one per destination (see the module), all pushing through
/// the SM's one store port. A chunk to a peer goes out as stores; once their write
/// responses are back (a system-scope release), the chunk's tail flag goes to the
/// peer, whose landing counts into the chunk's countdowns, and the chain's next chunk
/// goes out. A chunk to the sender's own GPU takes the port's time for its bytes and
/// then counts in. `finished` fires when every chain has issued its last chunk's
/// tail (the flags may still be in flight).
#[pyclass(module = "cais._core", frozen)]
pub struct StoreChains {
    st: GilCell<StoreChainsState>,
}

/// The mutable state of a [`StoreChains`] (see there), borrowed while holding the GIL.
pub(crate) struct StoreChainsState {
    gpu: Py<Endpoint>,
    sim: Py<Simulator>,
    port: Py<SmPort>,
    src: i64,
    chains: Vec<DstChain>,
    /// Chains not finished yet.
    left: usize,
    finished: Option<Py<Signal>>,
    started: bool,
    /// Chunks issued so far.
    issued: usize,
}

unit!(StoreChains, StoreChainsState);

/// What a [`ChainStep`] stands for: a chunk's write responses, its tail's landing, or
/// the end of a local chunk's copy.
const FENCED: u8 = 0;
const TAIL: u8 = 1;
const LOCAL: u8 = 2;

impl StoreChains {
    /// Issue chain `c`'s next chunk, or count the chain finished.
    fn step(slf: &Bound<'_, Self>, c: usize) -> PyResult<()> {
        let py = slf.py();
        let (index, dst, src, nbytes, parts) = {
            let mut me = slf.st();
            let chain = &mut me.chains[c];
            let index = chain.next;
            if index == chain.chunks.len() {
                me.left -= 1;
                let fire = if me.left == 0 { me.finished.take() } else { None };
                let now = me.sim.get().now();
                drop(me);
                return match fire {
                    Some(sig) => Signal::fire_now(sig.bind(py), now, py.None()),
                    None => Ok(()),
                };
            }
            chain.next += 1;
            let dst = chain.dst;
            let chunk = &chain.chunks[index];
            let parts: Vec<Py<PyList>> = chunk.parts.iter().map(|p| p.clone_ref(py)).collect();
            let nbytes = chunk.nbytes;
            me.issued += 1;
            (index, dst, me.src, nbytes, parts)
        };
        let me_ref = slf.clone().unbind();
        let step = |role: u8| {
            Py::new(
                py,
                ChainStep {
                    chains: me_ref.clone_ref(py),
                    chain: c,
                    chunk: index,
                    role,
                },
            )
        };
        let (gpu, port, sim) = {
            let me = slf.st();
            (me.gpu.clone_ref(py), me.port.clone_ref(py), me.sim.clone_ref(py))
        };
        if dst == src {
            // its own queue: the port's time for the chunk's bytes, then its tail
            let now = sim.get().now();
            let (_, end) = port.get().st(py).push_at(now, nbytes);
            let at = end.max(now);
            return sim
                .get()
                .schedule(py, at, Action::Due(UnitRef::new(step(LOCAL)?), LOCAL, None));
        }
        let fences: i64 = parts.iter().map(|p| fence_count(p.bind(py))).sum::<PyResult<i64>>()?;
        let acked = Completion::of_stream_request(py, fences, UnitRef::new(step(FENCED)?), 0)?;
        for part in &parts {
            let fenced = Some(&acked);
            issue_stores(gpu.bind(py), dst, 0, part.bind(py), &port, py.None(), fenced, 1.0)?;
        }
        Ok(())
    }

    /// Chunk `k` of chain `c` has its write responses back: its tail goes out, then the
    /// chain's next chunk.
    fn fenced(slf: &Bound<'_, Self>, c: usize, k: usize) -> PyResult<()> {
        let py = slf.py();
        let (gpu, sim, src, dst, flag) = {
            let me = slf.st();
            let chain = &me.chains[c];
            (
                me.gpu.clone_ref(py),
                me.sim.clone_ref(py),
                me.src,
                chain.dst,
                chain.flag,
            )
        };
        let tail = Py::new(
            py,
            ChainStep {
                chains: slf.clone().unbind(),
                chain: c,
                chunk: k,
                role: TAIL,
            },
        )?;
        let done = Completion::of_stream_request(py, 1, UnitRef::new(tail), 0)?.into_any();
        send_flag(gpu.bind(py), sim.bind(py), src, dst, flag, done)?;
        StoreChains::step(slf, c)
    }

    /// Chunk `k` of chain `c` has landed (its tail is visible): count it in.
    fn landed(slf: &Bound<'_, Self>, c: usize, k: usize) -> PyResult<()> {
        let py = slf.py();
        let (sim, counts) = {
            let me = slf.st();
            let counts: Vec<Py<Countdown>> = me.chains[c].chunks[k].landed.iter().map(|x| x.clone_ref(py)).collect();
            (me.sim.clone_ref(py), counts)
        };
        arrive_each(sim.bind(py), counts)
    }
}

#[pymethods]
impl StoreChains {
    /// `chains`: per destination, in the order the SM takes them, `(dst, (chip, vc,
    /// wire, last), chunks)`: the tail flag's chip, VC and wire bytes (as
    /// `cais.isa.Isa.flag` sends it), and each chunk as `(parts, nbytes, landed)`: the
    /// stripes of each of its stores, its bytes and the countdowns its tail's landing
    /// counts into. `port`: the SM's store path; `src`: the sender's GPU.
    #[new]
    fn new(
        py: Python<'_>,
        gpu: Py<Endpoint>,
        sim: Py<Simulator>,
        port: Py<SmPort>,
        src: i64,
        chains: &Bound<'_, PyList>,
    ) -> PyResult<Self> {
        let mut out = Vec::with_capacity(chains.len());
        for chain in chains.iter() {
            let (dst, (chip, vc, wire, last), chunks): (i64, (i64, i64, i64, i64), Bound<'_, PyList>) =
                chain.extract()?;
            let mut cs = Vec::with_capacity(chunks.len());
            for chunk in chunks.iter() {
                let (parts, nbytes, landed): (Vec<Py<PyList>>, i64, Vec<Py<Countdown>>) = chunk.extract()?;
                cs.push(Chunk { parts, nbytes, landed });
            }
            out.push(DstChain {
                dst,
                flag: FlagWire { chip, vc, wire, last },
                chunks: cs,
                next: 0,
            });
        }
        let left = out.len();
        Ok(StoreChains::from(StoreChainsState {
            gpu,
            sim,
            port,
            src,
            chains: out,
            left,
            finished: Some(Py::new(py, Signal::blank(py))?),
            started: false,
            issued: 0,
        }))
    }

    /// Issue every chain's first chunk, in order; return the signal that fires once
    /// every chain has issued its last.
    fn start(slf: &Bound<'_, Self>) -> PyResult<Py<Signal>> {
        let py = slf.py();
        let (finished, chains) = {
            let mut me = slf.st();
            if me.started {
                return Err(pyo3::exceptions::PyRuntimeError::new_err("store chains start once"));
            }
            me.started = true;
            (
                me.finished.as_ref().expect("not started").clone_ref(py),
                me.chains.len(),
            )
        };
        if chains == 0 {
            let now = slf.st().sim.get().now();
            slf.st().finished = None;
            Signal::fire_now(finished.bind(py), now, py.None())?;
            return Ok(finished);
        }
        for c in 0..chains {
            StoreChains::step(slf, c)?;
        }
        Ok(finished)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        visit.call(&me.sim)?;
        visit.call(&me.port)?;
        visit.call(&me.finished)?;
        for chain in &me.chains {
            for chunk in &chain.chunks {
                for p in &chunk.parts {
                    visit.call(p)?;
                }
                for c in &chunk.landed {
                    visit.call(c)?;
                }
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.chains.clear();
            me.finished = None;
        }
    }
}

properties!(StoreChains {
    /// Chunks issued so far.
    issued: usize;
});

/// A chunk of a [`StoreChains`] in flight: its write responses, its tail's landing or
/// its local copy's end (`role`) tells the chains.
#[pyclass(module = "cais._core", frozen)]
pub struct ChainStep {
    chains: Py<StoreChains>,
    chain: usize,
    chunk: usize,
    role: u8,
}

impl Handler for ChainStep {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        let me = slf.get();
        let chains = me.chains.bind(slf.py());
        match (ev, me.role) {
            (Event::Acked(_), FENCED) => StoreChains::fenced(chains, me.chain, me.chunk),
            (Event::Acked(_), TAIL) => StoreChains::landed(chains, me.chain, me.chunk),
            (Event::Landed, FENCED | TAIL) => Ok(()),
            (Event::Due { .. }, LOCAL) => {
                StoreChains::landed(chains, me.chain, me.chunk)?;
                StoreChains::step(chains, me.chain)
            }
            _ => Err(unexpected("ChainStep")),
        }
    }
}

#[pymethods]
impl ChainStep {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.chains)
    }
}
