//! A TB's remote requests, issued by the core in the order the TB planned them: its
//! mainloop's loads ([`LoadStream`]) and its epilogue's reductions ([`RedStream`]).
//! Each request first takes room for its bytes in the SM's request window and then
//! in its GPU's bound on outstanding remote requests ([`Grants`]), and gives it back
//! when it is acknowledged.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::cell::{properties, unit, GilCell, Unit, UnitState};
use crate::engine::completion::{Assembly, Completion};
use crate::engine::sim::Simulator;
use crate::engine::unit::{Begun, Event, Handler, UnitRef};
use crate::engine::wait::{ByteBound, Countdown, Process, Signal};
use crate::hw::gpu::{Carry, Endpoint, Op};
use crate::hw::interleave::Interleave;
use crate::hw::region::{region_bytes, Region};
use crate::hw::sm_port::SmPort;
use crate::isa::kept::{region_hash, KeptLines};
use crate::isa::red_form::RedForm;

/// A request's room in the SM's window, then in its GPU's bound: at most each
/// bound's limit (a request larger than a bound takes all of it), waiting first come,
/// first served while either is full.
struct Grants {
    /// The SM's window, then the GPU's bound.
    bounds: [Py<ByteBound>; 2],
    /// How many of the two the next request holds.
    held: usize,
}

impl Grants {
    /// Take what the next request of `nbytes` does not hold yet: true once it holds
    /// both, else false, and `stream` is told `Event::Fired` when the bound it waits
    /// for grants it (which counts as one more held).
    fn take<T: Handler>(&mut self, py: Python<'_>, nbytes: i64, stream: &Bound<'_, T>) -> PyResult<bool> {
        while self.held < 2 {
            let granted = {
                let mut b = self.bounds[self.held].get().st(py);
                let n = nbytes.min(b.limit);
                b.acquire_for(n, || UnitRef::of_bound(stream))?
            };
            if !granted {
                return Ok(false);
            }
            self.held += 1;
        }
        Ok(true)
    }

    /// Give a request's room back to both bounds (`bounds`: cloned out of the stream,
    /// whose waiting request a release may resume), first-come waiters first.
    fn give_back(py: Python<'_>, bounds: [Py<ByteBound>; 2], nbytes: i64) -> PyResult<()> {
        for bound in bounds {
            let n = nbytes.min(bound.get().st(py).limit);
            ByteBound::release(bound.bind(py), n)?;
        }
        Ok(())
    }

    fn clone_bounds(&self, py: Python<'_>) -> [Py<ByteBound>; 2] {
        [self.bounds[0].clone_ref(py), self.bounds[1].clone_ref(py)]
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for b in &self.bounds {
            visit.call(b)?;
        }
        Ok(())
    }
}

/// One planned load: its home GPU, its region and that region's stripes (one train
/// per transfer unit and chip), and what to call with its data (functional mode).
struct Item {
    home: i64,
    region: Py<PyAny>,
    stripes: Py<PyList>,
    placed: Py<PyAny>,
    nbytes: i64,
    /// Its region's hash as an L2's kept lines take it (`region_hash`), once made (0:
    /// not yet): the plan is shared, and its loads are looked up by every TB.
    key_hash: AtomicU64,
}

impl Item {
    /// The same load, for another plan.
    fn clone_ref(&self, py: Python<'_>) -> Item {
        Item {
            home: self.home,
            region: self.region.clone_ref(py),
            stripes: self.stripes.clone_ref(py),
            placed: self.placed.clone_ref(py),
            nbytes: self.nbytes,
            key_hash: AtomicU64::new(self.key_hash.load(Ordering::Relaxed)),
        }
    }
}

/// An item's region and its hash, as a `KeptLines` key takes them (a load that may
/// join another's must have a `Region`).
fn kept_region<'a, 'py>(py: Python<'py>, item: &'a Item) -> PyResult<(&'a Bound<'py, Region>, u64)> {
    let region = item.region.bind(py).cast::<Region>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err("a load that may join another's needs a Region as its region")
    })?;
    let mut hash = item.key_hash.load(Ordering::Relaxed);
    if hash == 0 {
        hash = region_hash(region)?;
        item.key_hash.store(hash, Ordering::Relaxed);
    }
    Ok((region, hash))
}

/// A load GEMM operand as a tile walks it: whether K runs over the stored rows
/// (tokens), the stored [T, cols] tensor's buffer, its rows per owner and its columns,
/// and the tile's first row (A) or column (B) of the operand and how many.
type TileOperand = (bool, Py<PyString>, i64, i64, i64, i64);

/// A load as Python's `Load` takes its fields: (operand, home, region, row, col, rows,
/// cols).
type LoadFields = (usize, i64, Region, i64, i64, i64, i64);

/// One load of a tile's mainloop (`cais.kernels.remote_gemm.Load`).
struct TileLoad {
    op: usize,
    home: i64,
    region: Region,
    row: i64,
    col: i64,
    nrows: i64,
    ncols: i64,
}

/// (owner, first row, rows) of rows `t0 .. t0+nt-1` of a tensor sharded by rows,
/// `rows_l` an owner (`cais.kernels.remote_gemm.Sharded.owners`).
fn owners(t0: i64, nt: i64, rows_l: i64) -> impl Iterator<Item = (i64, i64, i64)> {
    let end = t0 + nt;
    let mut t = t0;
    std::iter::from_fn(move || {
        if t >= end {
            return None;
        }
        let owner = t.div_euclid(rows_l);
        let cnt = end.min((owner + 1) * rows_l) - t;
        let part = (owner, t, cnt);
        t += cnt;
        Some(part)
    })
}

/// The loads of each K step of a tile (`LoadPlan.tile_loads`).
fn tile_blocks(py: Python<'_>, operands: &[TileOperand], steps: &[(i64, i64)], eb: i64) -> Vec<Vec<TileLoad>> {
    steps
        .iter()
        .map(|&(k0, kk)| {
            let mut loads = Vec::new();
            for (op, (tokens_k, shard, rows_l, cols, s0, sn)) in operands.iter().enumerate() {
                // the stored block: [k0, k0+kk) x [s0, s0+sn), or the transpose; where the
                // tile's whole block starts (its first K at 0)
                let (t0, nt, col0, ncol) = if *tokens_k {
                    (k0, kk, *s0, *sn)
                } else {
                    (*s0, *sn, k0, kk)
                };
                let (base_t, base_c) = if *tokens_k { (0, *s0) } else { (*s0, 0) };
                for (owner, t, cnt) in owners(t0, nt, *rows_l) {
                    let region = Region::block_of(shard.clone_ref(py), *cols, t - owner * rows_l, cnt, col0, ncol, eb);
                    loads.push(TileLoad {
                        op,
                        home: owner,
                        region,
                        row: t - base_t,
                        col: col0 - base_c,
                        nrows: cnt,
                        ncols: ncol,
                    });
                }
            }
            loads
        })
        .collect()
}

/// Append the load of `region` from `home`, cut into request pieces of at most `piece`
/// bytes, each with its trains of `unit`, to `items` (timing mode: nothing to place).
fn cut_into(
    py: Python<'_>,
    lanes: &mut Interleave,
    home: i64,
    region: &Region,
    piece: i64,
    unit: i64,
    items: &mut Vec<Item>,
) -> PyResult<()> {
    for pc in lanes.cut(py, region, piece)? {
        let stripes = lanes.trains_of(py, &pc, unit)?.unbind();
        items.push(Item {
            home,
            nbytes: pc.size(),
            region: Py::new(py, pc)?.into_any(),
            stripes,
            placed: py.None(),
            key_hash: AtomicU64::new(0),
        });
    }
    Ok(())
}

/// A tile's planned mainloop loads, converted once and shared by every GPU that runs
/// the tile (a GEMM's tiles are the same on each): a GPU's [`LoadStream`] walks it,
/// skipping the loads whose home is that GPU (it reads its own rows locally). The
/// plan is the kernel's; only its form is the core's.
#[pyclass(module = "cais._core", frozen)]
pub struct LoadPlan {
    items: Vec<Item>,
}

impl LoadPlan {
    fn of_list(loads: &Bound<'_, PyList>) -> PyResult<Self> {
        let mut items = Vec::with_capacity(loads.len());
        for load in loads.iter() {
            let (home, region, stripes, placed): (i64, Bound<'_, PyAny>, Bound<'_, PyList>, Bound<'_, PyAny>) =
                load.extract()?;
            items.push(Item {
                home,
                nbytes: region_bytes(&region)?,
                region: region.unbind(),
                stripes: stripes.unbind(),
                placed: placed.unbind(),
                key_hash: AtomicU64::new(0),
            });
        }
        Ok(LoadPlan { items })
    }

    fn others(&self, skip: i64) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(move |item| item.home != skip)
    }
}

#[pymethods]
impl LoadPlan {
    /// `loads`: (home, region, stripes, placed) each, in issue order.
    #[new]
    fn new(loads: &Bound<'_, PyList>) -> PyResult<Self> {
        LoadPlan::of_list(loads)
    }

    /// A tile's planned `loads` (each with its home at index 1 and its region at 2, as
    /// `Load`s), cut into request pieces of at most `piece` bytes and each piece into
    /// its trains of `unit` (`Interleave.trains`), in order, for timing mode (nothing to
    /// place); the loads whose home is `skip` are left out (None: none).
    #[staticmethod]
    #[pyo3(signature = (interleave, loads, piece, unit, skip = None))]
    fn cut(
        interleave: &Bound<'_, Interleave>,
        loads: &Bound<'_, PyList>,
        piece: i64,
        unit: i64,
        skip: Option<i64>,
    ) -> PyResult<Self> {
        let py = loads.py();
        let mut lanes = interleave.borrow_mut();
        let mut items = Vec::with_capacity(loads.len());
        for load in loads.iter() {
            let home: i64 = load.get_item(1)?.extract()?;
            if Some(home) != skip {
                let region = load.get_item(2)?;
                cut_into(
                    py,
                    &mut lanes,
                    home,
                    region.cast::<Region>()?.get(),
                    piece,
                    unit,
                    &mut items,
                )?;
            }
        }
        Ok(LoadPlan { items })
    }

    /// A load GEMM tile's mainloop, K step by K step (`steps`: (first K, K) each), as
    /// `cut` makes each step's plan of the loads `tile_loads` lists: the operands'
    /// stored blocks on their owners, cut into request pieces and trains.
    #[staticmethod]
    #[pyo3(signature = (interleave, operands, steps, elem_bytes, piece, unit, skip = None))]
    #[allow(clippy::too_many_arguments)] // the Python method's parameters
    fn cut_steps(
        py: Python<'_>,
        interleave: &Bound<'_, Interleave>,
        operands: Vec<TileOperand>,
        steps: Vec<(i64, i64)>,
        elem_bytes: i64,
        piece: i64,
        unit: i64,
        skip: Option<i64>,
    ) -> PyResult<Vec<LoadPlan>> {
        let mut lanes = interleave.borrow_mut();
        let mut out = Vec::with_capacity(steps.len());
        for step in tile_blocks(py, &operands, &steps, elem_bytes) {
            let mut items = Vec::with_capacity(step.len());
            for load in step.into_iter().filter(|load| Some(load.home) != skip) {
                cut_into(py, &mut lanes, load.home, &load.region, piece, unit, &mut items)?;
            }
            out.push(LoadPlan { items });
        }
        Ok(out)
    }

    /// A load GEMM tile's mainloop loads, K step by K step (`steps`: (first K, K)
    /// each): per step, for each operand (`operands`: whether K runs over the stored
    /// rows, the stored tensor's buffer, rows an owner, columns, and the tile's first
    /// row or column of the operand and how many), the stored block split where an
    /// owner's rows end, as `(operand, owner, region, row, col, rows, cols)` (a `Load`:
    /// where in the tile's block the region goes).
    #[staticmethod]
    fn tile_loads(
        py: Python<'_>,
        operands: Vec<TileOperand>,
        steps: Vec<(i64, i64)>,
        elem_bytes: i64,
    ) -> Vec<Vec<LoadFields>> {
        tile_blocks(py, &operands, &steps, elem_bytes)
            .into_iter()
            .map(|step| {
                step.into_iter()
                    .map(|l| (l.op, l.home, l.region, l.row, l.col, l.nrows, l.ncols))
                    .collect()
            })
            .collect()
    }

    /// The loads of `plans`, one after the other (a mainloop's K steps from its first,
    /// each step cut once and shared by the tiles that walk it).
    #[staticmethod]
    fn chain(py: Python<'_>, plans: Vec<Bound<'_, LoadPlan>>) -> Self {
        let items = plans
            .iter()
            .flat_map(|plan| plan.get().items.iter().map(|item| item.clone_ref(py)))
            .collect();
        LoadPlan { items }
    }

    /// The loads GPU `skip` issues (those whose home is another GPU; None: all).
    #[pyo3(signature = (skip = None))]
    pub(crate) fn loads(&self, skip: Option<i64>) -> usize {
        self.others(skip.unwrap_or(-1)).count()
    }

    /// The trains those loads go out as (their stripes), for the ISA's op count.
    #[pyo3(signature = (skip = None))]
    fn stripes(&self, py: Python<'_>, skip: Option<i64>) -> usize {
        self.others(skip.unwrap_or(-1))
            .map(|item| item.stripes.bind(py).len())
            .sum()
    }

    fn __len__(&self) -> usize {
        self.items.len()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for item in &self.items {
            visit.call(&item.region)?;
            visit.call(&item.stripes)?;
            visit.call(&item.placed)?;
        }
        Ok(())
    }
}

/// The remote loads of one TB's mainloop, issued in order as the TB issues them:
/// each takes room for its bytes in the SM's request window and then in its GPU's
/// bound on outstanding remote requests (at most each bound's limit: a load larger
/// than a bound takes all of it), waiting first come, first served while either is
/// full; then it goes out (`ld`, or `ld.cais` with `quorum`). When its data is in,
/// it gives its room back, hands the data to `placed` (functional mode) and counts
/// into `arrived`, which the TB waits on.
///
/// This is the loop a TB program would otherwise run in Python, one resumption per
/// load; the TB's plan (which loads, in which order, from whom) stays the kernel's.
#[pyclass(module = "cais._core", frozen)]
pub struct LoadStream {
    st: GilCell<LoadStreamState>,
}

/// The mutable state of a [`LoadStream`] (see there), borrowed while holding the GIL.
pub(crate) struct LoadStreamState {
    gpu: Py<Endpoint>,
    kind: i64,
    quorum: i64,
    /// The TB's loads, and the home whose loads it skips (its own GPU; -1: none).
    plan: Py<LoadPlan>,
    skip: i64,
    /// The next load to issue, and its room.
    next: usize,
    grants: Grants,
    arrived: Py<Countdown>,
    assemble: Py<PyAny>,
    /// Loads issued so far.
    issued: usize,
    /// Loads that may join another TB's (an L2 that keeps peer reads, a cluster's
    /// multicast, a staged block): what this GPU has asked for, by (scope, home,
    /// region), each a signal that fires with the data; None: every load goes out.
    kept: Option<Py<KeptLines>>,
    scope: i64,
}

unit!(LoadStream, LoadStreamState);

impl LoadStreamState {
    /// The line item `index` joins in `kept`, if one is there.
    fn kept_line(&self, py: Python<'_>, kept: &KeptLines, index: usize) -> PyResult<Option<Py<Signal>>> {
        let item = &self.plan.get().items[index];
        let (region, hash) = kept_region(py, item)?;
        Ok(kept.get(self.scope, item.home, region, hash))
    }

    fn sim(&self, py: Python<'_>) -> Py<Simulator> {
        self.grants.bounds[0].get().st(py).sim.clone_ref(py)
    }

    /// What item `index` needs to join a load asked for first (`LoadStream::join`).
    fn joiner(&self, py: Python<'_>, index: usize) -> Joiner {
        Joiner {
            placed: self.plan.get().items[index].placed.clone_ref(py),
            arrived: self.arrived.clone_ref(py),
            sim: self.sim(py),
        }
    }
}

/// A load joining a line: its placer (None in timing mode), its TB's count of loads
/// in, and the simulator.
struct Joiner {
    placed: Py<PyAny>,
    arrived: Py<Countdown>,
    sim: Py<Simulator>,
}

impl Joiner {
    /// When `line` fires (now, if it has), the data goes to the placer and the load
    /// counts into its TB's `arrived` (called with no borrow of the stream held).
    fn join(self, line: &Bound<'_, Signal>) -> PyResult<()> {
        let py = line.py();
        if self.placed.is_none(py) {
            // timing mode: nothing to hand over, so no callable object per load
            drop(self.placed.into_bound(py)); // no thread-local read, as for a `Py`
            return Signal::count_into(line, self.arrived, self.sim);
        }
        let join = JoinedLoad {
            placed: self.placed,
            arrived: self.arrived,
            sim: self.sim,
        };
        Signal::on_fire(line, Py::new(py, join)?.into_any())
    }
}

/// A load that joined one another TB of its GPU asked for first: when that one's
/// data is in (its line fires), the data goes to this load's placer and the load
/// counts into its TB's `arrived`. It took no room: it sent nothing.
#[pyclass(module = "cais._core", frozen)]
pub struct JoinedLoad {
    placed: Py<PyAny>,
    arrived: Py<Countdown>,
    sim: Py<Simulator>,
}

#[pymethods]
impl JoinedLoad {
    fn __call__(&self, py: Python<'_>, data: Py<PyAny>) -> PyResult<()> {
        if !self.placed.is_none(py) {
            self.placed.call1(py, (data,))?;
        }
        Countdown::arrive(self.arrived.bind(py), self.sim.bind(py), 1)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.placed)?;
        visit.call(&self.arrived)?;
        visit.call(&self.sim)
    }
}

impl LoadStream {
    /// Issue what the bounds admit, in order; stop at the first load that must wait
    /// (its grant resumes the stream).
    fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        loop {
            let mut me = slf.st();
            let plan = me.plan.clone_ref(py);
            let items = &plan.get().items;
            while me.next < items.len() && items[me.next].home == me.skip {
                me.next += 1; // its own rows: read locally
            }
            if me.next >= items.len() {
                return Ok(());
            }
            let index = me.next;
            let kept = me.kept.as_ref().map(|k| k.clone_ref(py));
            if let (Some(kept), 0) = (kept.as_ref(), me.grants.held) {
                // asked for already (an L2 hit, or a miss in flight): join it
                if let Some(line) = me.kept_line(py, kept.get(), index)? {
                    me.next += 1;
                    let joiner = me.joiner(py, index);
                    drop(me);
                    joiner.join(line.bind(py))?;
                    continue;
                }
            }
            let want = items[index].nbytes;
            if !me.grants.take(py, want, slf)? {
                return Ok(()); // resumed when granted
            }
            let mut kept_line = None;
            if let Some(kept) = kept.as_ref() {
                // another TB of this GPU may have asked for it meanwhile: join that
                if let Some(line) = me.kept_line(py, kept.get(), index)? {
                    me.next += 1;
                    me.grants.held = 0;
                    let (bounds, joiner) = (me.grants.clone_bounds(py), me.joiner(py, index));
                    drop(me);
                    Grants::give_back(py, bounds, want)?;
                    joiner.join(line.bind(py))?;
                    continue;
                }
                let line = Py::new(py, Signal::blank(py))?;
                let item = &items[index];
                let (region, hash) = kept_region(py, item)?;
                kept.get().insert(me.scope, item.home, region, hash, line.clone_ref(py));
                kept_line = Some(line);
            }
            let item = &items[index];
            let (gpu, kind, home, quorum) = (me.gpu.clone_ref(py), me.kind, item.home, me.quorum);
            let stripes = item.stripes.clone_ref(py);
            let assembly = Assembly {
                region: item.region.clone_ref(py),
                pieces: stripes.clone_ref(py).into_any(),
                assemble: me.assemble.clone_ref(py),
            };
            let count = stripes.bind(py).len() as i64;
            // its data kept for the loads that join it (its line), once this one has it
            let line = kept_line.map(|line| (line, me.sim(py).get().clock()));
            let done = Completion::of_stream_item(
                py,
                count,
                item.placed.clone_ref(py),
                assembly,
                UnitRef::of_bound(slf),
                item.nbytes,
                line,
            )?;
            me.next += 1;
            me.grants.held = 0;
            me.issued += 1;
            drop(me);
            Endpoint::issue_loads(gpu.bind(py), kind, home, stripes.bind(py), done.into_any(), quorum)?;
        }
    }

    /// A bound granted the waiting load its room: on to the next grant, or out.
    pub(crate) fn granted(slf: &Bound<'_, Self>) -> PyResult<()> {
        slf.st().grants.held += 1;
        LoadStream::advance(slf)
    }

    /// A load's data is in: give its room back to both bounds, first-come waiters
    /// first (the SM's window, then the GPU's bound).
    pub(crate) fn release(slf: &Bound<'_, Self>, nbytes: i64) -> PyResult<()> {
        let py = slf.py();
        let bounds = slf.st().grants.clone_bounds(py);
        Grants::give_back(py, bounds, nbytes)
    }

    /// ... and count it into what the TB waits on.
    pub(crate) fn landed(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (arrived, window) = {
            let me = slf.st();
            (me.arrived.clone_ref(py), me.grants.bounds[0].clone_ref(py))
        };
        let sim = window.get().st(py).sim.clone_ref(py);
        Countdown::arrive(arrived.bind(py), sim.bind(py), 1)
    }
}

impl Handler for LoadStream {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            // a bound granted the waiting load its room
            Event::Fired => LoadStream::granted(slf),
            // a load's data is in: its room back, then (after its callback) the count
            Event::Acked(nbytes) => LoadStream::release(slf, nbytes),
            Event::Landed => LoadStream::landed(slf),
            _ => Err(crate::engine::unit::unexpected("LoadStream")),
        }
    }

    /// A TB's plan starts the stream (`start`); the plan waits on `arrived` itself,
    /// where it waits for the loads.
    fn begin(
        slf: &Bound<'_, Self>,
        _sim: &Bound<'_, Simulator>,
        _args: [i64; 3],
        _process: &Bound<'_, Process>,
    ) -> PyResult<Begun> {
        LoadStream::advance(slf)?;
        Ok(Begun::Go)
    }
}

#[pymethods]
impl LoadStream {
    /// `loads`: a [`LoadPlan`], or its list: (home, region, stripes, placed) each, in
    /// issue order (`placed`: a callable taking the load's data, or None); `skip`: a
    /// home whose loads are not issued (the GPU's own; None: none); `window`, `bound`:
    /// the SM's and the GPU's bounds; `arrived`: counts the loads in;
    /// `assemble(region, stripes, parts)`: puts a load's data together from its
    /// stripes' (functional mode). `kept`: a load may join one its GPU already asked
    /// for, keyed `(scope, home, region)` there (a signal firing with the data; the
    /// regions must be `Region`s); None: each goes out. `scope`: an int (default 0).
    #[new]
    #[pyo3(signature = (gpu, kind, loads, window, bound, arrived, assemble, quorum = 0, kept = None,
                        scope = None, skip = None))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    pub(crate) fn new(
        gpu: Py<Endpoint>,
        kind: i64,
        loads: &Bound<'_, PyAny>,
        window: Py<ByteBound>,
        bound: Py<ByteBound>,
        arrived: Py<Countdown>,
        assemble: Py<PyAny>,
        quorum: i64,
        kept: Option<Py<KeptLines>>,
        scope: Option<i64>,
        skip: Option<i64>,
    ) -> PyResult<Self> {
        let py = loads.py();
        let plan = match loads.cast::<LoadPlan>() {
            Ok(plan) => plan.clone().unbind(),
            Err(_) => Py::new(py, LoadPlan::of_list(loads.cast::<PyList>()?)?)?,
        };
        Ok(LoadStream::from(LoadStreamState {
            gpu,
            kind,
            quorum,
            plan,
            skip: skip.unwrap_or(-1),
            next: 0,
            grants: Grants {
                bounds: [window, bound],
                held: 0,
            },
            arrived,
            assemble,
            issued: 0,
            kept,
            scope: scope.unwrap_or(0),
        }))
    }

    /// Issue the loads the bounds admit now; the rest follow as room frees.
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        LoadStream::advance(slf)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        me.grants.visit(&visit)?;
        visit.call(&me.arrived)?;
        visit.call(&me.assemble)?;
        if let Some(kept) = &me.kept {
            visit.call(kept)?;
        }
        visit.call(&me.plan)
    }
}

properties!(LoadStream {
    issued: usize;
});

/// One reduction of an epilogue piece: its kind (`red`, `red.cais`), destination
/// GPU, stripes (one train per transfer unit and chip), each stripe's data
/// (functional mode), signal word (`red.cais`; -1: none) and quorum.
struct Red {
    kind: i64,
    dst: i64,
    stripes: Py<PyList>,
    data: Option<Py<PyList>>,
    tag: i64,
    quorum: i64,
}

impl Red {
    /// A reduction of a timing-mode plan into `owner`, as `form` says, raising `tag`.
    fn planned(form: &RedForm, owner: i64, stripes: Py<PyList>, tag: i64) -> Red {
        Red {
            kind: form.kind,
            dst: owner,
            stripes,
            data: None,
            tag,
            quorum: form.quorum,
        }
    }

    fn of(red: &Bound<'_, PyAny>) -> PyResult<Red> {
        let (kind, dst, stripes, data, tag, quorum): (
            i64,
            i64,
            Bound<'_, PyList>,
            Option<Bound<'_, PyList>>,
            i64,
            i64,
        ) = red.extract()?;
        Ok(Red {
            kind,
            dst,
            stripes: stripes.unbind(),
            data: data.map(Bound::unbind),
            tag,
            quorum,
        })
    }

    fn clone_ref(&self, py: Python<'_>) -> Red {
        Red {
            kind: self.kind,
            dst: self.dst,
            stripes: self.stripes.clone_ref(py),
            data: self.data.as_ref().map(|d| d.clone_ref(py)),
            tag: self.tag,
            quorum: self.quorum,
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.stripes)?;
        visit.call(&self.data)
    }
}

/// A piece of partial rows: its bytes, and the reductions it goes out as.
fn piece_of(item: &Bound<'_, PyAny>) -> PyResult<(i64, Vec<Red>)> {
    let (nbytes, reds): (i64, Bound<'_, PyList>) = item.extract()?;
    let reds = reds.iter().map(|red| Red::of(&red)).collect::<PyResult<Vec<Red>>>()?;
    Ok((nbytes, reds))
}

/// What a TB's epilogue does next, in its order: an add into its own GPU's memory
/// (a Python call, at once: `add()`), its own block of a plan added in timing mode
/// (the signal words it raises, and by how much: nothing else of an add is timed), or
/// a piece of partial rows for an owner, which takes its `nbytes` of room and goes
/// out as one or more reductions (one per signal word it touches).
enum RedItem {
    Local(Py<PyAny>),
    Signals(Vec<(i64, i64)>),
    Piece { nbytes: i64, reds: Vec<Red> },
}

/// One block of a tile's partial rows: its owner GPU, the signal words the owner's
/// own add raises, and the pieces it goes out as from any other GPU.
struct RedBlock {
    owner: i64,
    own: Vec<(i64, i64)>,
    pieces: Vec<(i64, Vec<Red>)>,
}

/// A tile's epilogue in timing mode, made once and shared by every GPU that runs the
/// tile (its pieces do not depend on who reduces): blocks of partial rows in order,
/// each for its owner. A GPU's [`RedStream`] adds its own block locally and sends
/// the others' pieces. The plan is the kernel's; only its form is the core's.
#[pyclass(module = "cais._core", frozen)]
pub struct RedPlan {
    blocks: Vec<RedBlock>,
}

#[pymethods]
impl RedPlan {
    /// The plan of `blocks`, (owner, region) each in the epilogue's order: each cut
    /// into request pieces of at most `piece` bytes at transfer-unit boundaries of
    /// its address, each piece going out as `form` says (its reductions' stripes as
    /// `interleave` lays them), and the signal words the owner's own add raises. A
    /// block owned by `skip` (the only GPU that runs the tile, in mirror mode) has no
    /// pieces: nobody sends it.
    /// The plan of a GEMM-RS tile whose partial rows are rows `rows` (first, count)
    /// and columns `cols` of a [T, cols] tensor sharded by token rows (`reduced`: the
    /// shards' buffer, rows an owner, columns): its blocks, one per owner the rows
    /// span, as `build` makes them.
    #[staticmethod]
    #[pyo3(signature = (interleave, form, reduced, rows, cols, elem_bytes, piece, skip = None))]
    #[allow(clippy::too_many_arguments)] // the Python method's parameters
    fn tile(
        py: Python<'_>,
        interleave: &Bound<'_, Interleave>,
        form: &Bound<'_, RedForm>,
        reduced: (Py<PyString>, i64, i64),
        rows: (i64, i64),
        cols: (i64, i64),
        elem_bytes: i64,
        piece: i64,
        skip: Option<i64>,
    ) -> PyResult<Self> {
        RedPlan::tile_of(py, interleave, form, &reduced, rows, cols, elem_bytes, piece, skip)
    }

    #[staticmethod]
    #[pyo3(signature = (interleave, form, blocks, piece, skip = None))]
    fn build(
        py: Python<'_>,
        interleave: &Bound<'_, Interleave>,
        form: &Bound<'_, RedForm>,
        blocks: Vec<(i64, PyRef<'_, Region>)>,
        piece: i64,
        skip: Option<i64>,
    ) -> PyResult<Self> {
        let blocks = blocks.into_iter().map(|(owner, r)| (owner, r.copy(py))).collect();
        RedPlan::of_blocks(py, interleave, form, blocks, piece, skip)
    }

    /// The owners GPU `g` sends partial rows to, in order (each once).
    fn owners(&self, g: i64) -> Vec<i64> {
        let mut out: Vec<i64> = Vec::new();
        for b in self.blocks.iter().filter(|b| b.owner != g) {
            if !out.contains(&b.owner) {
                out.push(b.owner);
            }
        }
        out
    }

    /// How many trains GPU `g`'s reductions go out as (their stripes).
    fn stripes(&self, py: Python<'_>, g: i64) -> usize {
        self.blocks
            .iter()
            .filter(|b| b.owner != g)
            .flat_map(|b| b.pieces.iter())
            .flat_map(|(_, reds)| reds.iter())
            .map(|r| r.stripes.bind(py).len())
            .sum()
    }

    /// GPU `g`'s pieces, in order: `(nbytes, [(kind, dst, stripes, tag, quorum), ...])`.
    #[allow(clippy::type_complexity)] // the Python tuples it reads back as
    fn pieces(&self, py: Python<'_>, g: i64) -> Vec<(i64, Vec<(i64, i64, Py<PyList>, i64, i64)>)> {
        self.blocks
            .iter()
            .filter(|b| b.owner != g)
            .flat_map(|b| b.pieces.iter())
            .map(|(nbytes, reds)| {
                let reds = reds
                    .iter()
                    .map(|r| (r.kind, r.dst, r.stripes.clone_ref(py), r.tag, r.quorum))
                    .collect();
                (*nbytes, reds)
            })
            .collect()
    }

    /// The signal words GPU `g`'s own blocks raise when it adds them, and by how much.
    fn own_signals(&self, g: i64) -> Vec<(i64, i64)> {
        self.blocks
            .iter()
            .filter(|b| b.owner == g)
            .flat_map(|b| b.own.iter().copied())
            .collect()
    }

    fn __len__(&self) -> usize {
        self.blocks.len()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for b in &self.blocks {
            for (_, reds) in &b.pieces {
                for r in reds {
                    r.visit(&visit)?;
                }
            }
        }
        Ok(())
    }
}

impl RedPlan {
    /// `RedPlan.tile`'s plan (a GEMM-RS kernel's TBs make it in the core).
    #[allow(clippy::too_many_arguments)] // the tile and how it goes out
    pub(crate) fn tile_of(
        py: Python<'_>,
        interleave: &Bound<'_, Interleave>,
        form: &Bound<'_, RedForm>,
        reduced: &(Py<PyString>, i64, i64),
        rows: (i64, i64),
        cols: (i64, i64),
        elem_bytes: i64,
        piece: i64,
        skip: Option<i64>,
    ) -> PyResult<Self> {
        let (shard, rows_l, width) = reduced;
        let blocks = owners(rows.0, rows.1, *rows_l)
            .map(|(owner, t, cnt)| {
                let region = Region::block_of(
                    shard.clone_ref(py),
                    *width,
                    t - owner * rows_l,
                    cnt,
                    cols.0,
                    cols.1,
                    elem_bytes,
                );
                (owner, region)
            })
            .collect();
        RedPlan::of_blocks(py, interleave, form, blocks, piece, skip)
    }

    /// `build`'s plan of `blocks`.
    fn of_blocks(
        py: Python<'_>,
        interleave: &Bound<'_, Interleave>,
        form: &Bound<'_, RedForm>,
        blocks: Vec<(i64, Region)>,
        piece: i64,
        skip: Option<i64>,
    ) -> PyResult<Self> {
        let form = form.get();
        let mut lanes = interleave.borrow_mut();
        let mut out = Vec::with_capacity(blocks.len());
        for (owner, region) in blocks {
            let mut pieces = Vec::new();
            if Some(owner) != skip {
                for pc in lanes.cut(py, &region, piece)? {
                    let reds = match &form.blocks {
                        Some(rb) => {
                            let rb = rb.get();
                            let mut reds = Vec::new();
                            for part in rb.parts(py, &pc, owner)? {
                                let stripes = lanes.trains_of(py, &part.region, form.unit)?.unbind();
                                reds.push(Red::planned(form, owner, stripes, rb.key(part.block)?));
                            }
                            reds
                        }
                        None => {
                            let stripes = lanes.trains_of(py, &pc, form.unit)?.unbind();
                            vec![Red::planned(form, owner, stripes, form.signal)]
                        }
                    };
                    pieces.push((pc.size(), reds));
                }
            }
            out.push(RedBlock {
                owner,
                own: form.own_signals(py, &region, owner)?,
                pieces,
            });
        }
        Ok(RedPlan { blocks: out })
    }

    /// GPU `g`'s items: its own blocks as the signal words they raise, the others'
    /// pieces.
    fn items(&self, py: Python<'_>, g: i64) -> Vec<RedItem> {
        let mut out = Vec::new();
        for b in &self.blocks {
            if b.owner == g {
                out.push(RedItem::Signals(b.own.clone()));
                continue;
            }
            for (nbytes, reds) in &b.pieces {
                out.push(RedItem::Piece {
                    nbytes: *nbytes,
                    reds: reds.iter().map(|r| r.clone_ref(py)).collect(),
                });
            }
        }
        out
    }
}

/// The reductions of one TB's epilogue, issued in order as the TB issues them: each
/// piece takes room for its bytes in the SM's window and then in its GPU's bound
/// (as a [`LoadStream`]'s loads), goes out through the SM's store port, and gives
/// its room back once all its trains are acknowledged (the switch took them, or the
/// owner did). `issued` fires when the last item is out: the TB then waits for its
/// port to drain and ends.
///
/// This is the loop a TB program would otherwise run in Python, one resumption per
/// piece; what to reduce, where and in which order stays the kernel's.
#[pyclass(module = "cais._core", frozen)]
pub struct RedStream {
    st: GilCell<RedStreamState>,
}

/// The mutable state of a [`RedStream`] (see there), borrowed while holding the GIL.
pub(crate) struct RedStreamState {
    gpu: Py<Endpoint>,
    port: Py<SmPort>,
    items: Vec<RedItem>,
    next: usize,
    grants: Grants,
    /// Fired once every item is out (taken when it fires).
    issued: Option<Py<Signal>>,
    started: bool,
    /// Reductions issued so far.
    reductions: usize,
}

unit!(RedStream, RedStreamState);

impl RedStream {
    /// Issue what the bounds admit, in order; stop at the first piece that must wait
    /// (its grant resumes the stream).
    fn advance(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        loop {
            let mut me = slf.st();
            let index = me.next;
            let (nbytes, count) = match me.items.get(index) {
                None => {
                    let issued = me.issued.take();
                    let now = me.gpu.get().st(py).now(py);
                    drop(me);
                    return match issued {
                        Some(sig) => Signal::fire_now(sig.bind(py), now, py.None()),
                        None => Ok(()),
                    };
                }
                Some(RedItem::Local(add)) => {
                    let add = add.clone_ref(py);
                    me.next += 1;
                    drop(me);
                    add.call0(py)?;
                    continue;
                }
                Some(RedItem::Signals(_)) => {
                    let RedItem::Signals(raised) =
                        std::mem::replace(&mut me.items[index], RedItem::Signals(Vec::new()))
                    else {
                        unreachable!("signals")
                    };
                    let gpu = me.gpu.clone_ref(py).into_bound(py);
                    me.next += 1;
                    drop(me);
                    for (key, amount) in raised {
                        Endpoint::signal_word(&gpu, key, amount)?;
                    }
                    continue;
                }
                Some(RedItem::Piece { nbytes, reds }) => (
                    *nbytes,
                    reds.iter().map(|r| r.stripes.bind(py).len() as i64).sum::<i64>(),
                ),
            };
            if !me.grants.take(py, nbytes, slf)? {
                return Ok(()); // resumed when granted
            }
            let reds = match std::mem::replace(&mut me.items[index], RedItem::Local(py.None())) {
                RedItem::Piece { reds, .. } => reds,
                RedItem::Local(_) | RedItem::Signals(_) => unreachable!("a piece"),
            };
            me.next += 1;
            me.grants.held = 0;
            me.reductions += reds.len();
            let (gpu, port) = (me.gpu.clone_ref(py), me.port.clone_ref(py));
            drop(me);
            // one completion over all the piece's trains: its room comes back with the last
            let done = Completion::of_stream_request(py, count, UnitRef::of_bound(slf), nbytes)?.into_any();
            let port = port.into_bound(py);
            for r in reds {
                let op = Op {
                    kind: r.kind,
                    dst: r.dst,
                    stream: 0,
                    tag: r.tag,
                    expect: 0,
                    quorum: r.quorum,
                };
                let carry = Carry {
                    loads: false,
                    port: Some(port.clone()),
                    data: r.data.map(|d| d.into_bound(py)),
                    fences: None,
                    encoding: 1.0,
                };
                Endpoint::issue_stripes(gpu.bind(py), &op, r.stripes.bind(py), done.clone_ref(py), carry)?;
            }
        }
    }

    /// A bound granted the waiting piece its room: on to the next grant, or out.
    pub(crate) fn granted(slf: &Bound<'_, Self>) -> PyResult<()> {
        slf.st().grants.held += 1;
        RedStream::advance(slf)
    }

    /// A piece's trains are all acknowledged: its room goes back to both bounds.
    pub(crate) fn release(slf: &Bound<'_, Self>, nbytes: i64) -> PyResult<()> {
        let py = slf.py();
        let bounds = slf.st().grants.clone_bounds(py);
        Grants::give_back(py, bounds, nbytes)
    }
}

impl Handler for RedStream {
    fn on_event(slf: &Bound<'_, Self>, ev: Event<'_, '_>) -> PyResult<()> {
        match ev {
            // a bound granted the waiting piece its room
            Event::Fired => RedStream::granted(slf),
            // a piece's trains are all acknowledged: its room goes back
            Event::Acked(nbytes) => RedStream::release(slf, nbytes),
            Event::Landed => Ok(()),
            _ => Err(crate::engine::unit::unexpected("RedStream")),
        }
    }

    /// A TB's plan starts the stream (`start`) and waits until its last item is out.
    fn begin(
        slf: &Bound<'_, Self>,
        _sim: &Bound<'_, Simulator>,
        _args: [i64; 3],
        _process: &Bound<'_, Process>,
    ) -> PyResult<Begun> {
        Ok(Begun::Wait(RedStream::start(slf)?))
    }
}

#[pymethods]
impl RedStream {
    /// `items`, in issue order: a callable (an add into the GPU's own memory, called
    /// when the stream reaches it), or `(nbytes, reds)`, a piece of `nbytes` whose
    /// reductions are `(kind, dst, stripes, data, tag, quorum)` each (`data`: one entry
    /// per stripe, or None); or a [`RedPlan`], whose blocks owned by GPU `own` are
    /// added locally as `add(region)`; `window`, `bound`: the SM's and the GPU's
    /// bounds; `port`: the SM's store path.
    #[new]
    #[pyo3(signature = (gpu, items, window, bound, port, own = None))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's parameters
    pub(crate) fn new(
        py: Python<'_>,
        gpu: Py<Endpoint>,
        items: &Bound<'_, PyAny>,
        window: Py<ByteBound>,
        bound: Py<ByteBound>,
        port: Py<SmPort>,
        own: Option<i64>,
    ) -> PyResult<Self> {
        let out = match items.cast::<RedPlan>() {
            Ok(plan) => plan.get().items(py, own.unwrap_or(-1)),
            Err(_) => {
                let items = items.cast::<PyList>()?;
                let mut out = Vec::with_capacity(items.len());
                for item in items.iter() {
                    if item.is_callable() {
                        out.push(RedItem::Local(item.unbind()));
                    } else {
                        let (nbytes, reds) = piece_of(&item)?;
                        out.push(RedItem::Piece { nbytes, reds });
                    }
                }
                out
            }
        };
        Ok(RedStream::from(RedStreamState {
            gpu,
            port,
            items: out,
            next: 0,
            grants: Grants {
                bounds: [window, bound],
                held: 0,
            },
            issued: Some(Py::new(py, Signal::blank(py))?),
            started: false,
            reductions: 0,
        }))
    }

    /// Issue what the bounds admit now (the rest follows as room frees); return the
    /// signal that fires once every item is out.
    fn start(slf: &Bound<'_, Self>) -> PyResult<Py<Signal>> {
        let py = slf.py();
        let issued = {
            let mut me = slf.st();
            if me.started {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "a reduction stream starts once",
                ));
            }
            me.started = true;
            me.issued.as_ref().expect("not started").clone_ref(py)
        };
        RedStream::advance(slf)?;
        Ok(issued)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(me) = self.st.during_gc() else {
            return Ok(());
        };
        visit.call(&me.gpu)?;
        visit.call(&me.port)?;
        me.grants.visit(&visit)?;
        visit.call(&me.issued)?;
        for item in &me.items {
            match item {
                RedItem::Local(f) => visit.call(f)?,
                RedItem::Signals(_) => {}
                RedItem::Piece { reds, .. } => {
                    for r in reds {
                        r.visit(&visit)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut me) = self.st.during_gc_mut() {
            me.items.clear();
            me.issued = None;
        }
    }
}

properties!(RedStream {
    /// Reductions issued so far.
    reductions: usize;
});
