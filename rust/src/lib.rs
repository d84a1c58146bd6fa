//! The compiled event core of cais-sim, in three layers that mirror `src/cais`:
//!
//! * [`engine`] (`cais.engine`): the event queue and its clock
//!   ([`engine::sim::Simulator`]), trains, serialising channels with virtual channels
//!   ([`engine::channel::Channel`]), the credit flow control of the buffers they feed
//!   ([`engine::credits::Credits`]), what TB programs wait on and an operation's
//!   completion. It names nothing built on it: a unit takes the engine's events
//!   through its seam, [`engine::unit::Handler`].
//! * [`hw`] (`cais.hw`): the switch chips' crossbar and NVLS engine
//!   ([`hw::switch::SwitchChip`], with the CAIS merge unit, [`hw::merge::MergeUnit`],
//!   and Group Sync Table), the GPUs' NVLink endpoints ([`hw::gpu::Endpoint`], with
//!   their HBM share, [`hw::hbm::HbmShare`], and TB dispatcher,
//!   [`hw::tb_dispatch::TbDispatcher`]), packet kinds and format, regions and the
//!   address interleave. It uses the engine.
//! * [`isa`] (`cais.isa`): a TB's streams of remote loads and reductions. It uses
//!   both.
//!
//! Python drives it through the same classes the pure-Python engine had; a
//! channel's arbitrations and a train's arrival run here without entering the
//! interpreter. This file is the one place that knows every layer: it registers the
//! units Python may hand to the engine and adds the classes to the module.

use pyo3::prelude::*;

pub mod engine;
pub mod hw;
pub mod isa;
pub mod kernels;

use engine::{channel, completion, credits, sim, train, unit, wait, yardstick};
use hw::{gpu, hbm, interleave, kinds, merge, region, sm_port, switch, tb_dispatch};
use isa::{copy_loop, kept, red_form, reduce_stream, store_chain, stream};

/// The units Python may hand to the engine as such (a channel's far end, a
/// process's pacer, a buffer's waiter), the most frequent first.
pub(crate) fn register_units() {
    unit::register(vec![
        unit::kind::<switch::SwitchChip>(),
        unit::kind::<gpu::Endpoint>(),
        unit::kind::<channel::Channel>(),
        unit::kind::<hbm::HbmShare>(),
        unit::kind::<merge::MergeUnit>(),
        unit::kind::<stream::LoadStream>(),
        unit::kind::<stream::RedStream>(),
        unit::kind::<sm_port::SmPort>(),
        unit::kind::<kernels::core_tb::CoreTb>(),
    ]);
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The units' state cells (`cell::GilCell`) rely on the GIL: refuse an interpreter
    // running without it (a free-threaded Python started with PYTHON_GIL=0).
    let sys = m.py().import("sys")?;
    if sys.hasattr("_is_gil_enabled")? && !sys.call_method0("_is_gil_enabled")?.extract::<bool>()? {
        return Err(pyo3::exceptions::PyImportError::new_err(
            "cais._core needs the global interpreter lock; run without PYTHON_GIL=0",
        ));
    }
    register_units();
    m.add_class::<sim::Simulator>()?;
    m.add_function(wrap_pyfunction!(yardstick::heap_yardstick, m)?)?;
    m.add_function(wrap_pyfunction!(hw::replacement::replacement_policies, m)?)?;
    m.add_class::<train::Train>()?;
    m.add_class::<region::Region>()?;
    m.add_class::<interleave::Interleave>()?;
    m.add_class::<wait::Signal>()?;
    m.add_class::<wait::Countdown>()?;
    m.add_class::<wait::ByteBound>()?;
    m.add_class::<wait::Process>()?;
    m.add_class::<wait::TbPlan>()?;
    m.add_class::<stream::LoadPlan>()?;
    m.add_class::<stream::LoadStream>()?;
    m.add_class::<kept::KeptLines>()?;
    m.add_class::<stream::RedPlan>()?;
    m.add_class::<red_form::RedForm>()?;
    m.add_class::<red_form::RowBlocks>()?;
    m.add_class::<stream::RedStream>()?;
    m.add_class::<kernels::reduce_tbs::ReduceTbs>()?;
    m.add_class::<kernels::tile_plans::TilePlans>()?;
    m.add_class::<kernels::load_tbs::LoadTbs>()?;
    m.add_class::<kernels::core_tb::CoreTb>()?;
    m.add_class::<reduce_stream::ReduceStream>()?;
    m.add_class::<reduce_stream::ReducedPiece>()?;
    m.add_class::<store_chain::StoreChains>()?;
    m.add_class::<store_chain::ChainStep>()?;
    m.add_class::<copy_loop::CopyLoop>()?;
    m.add_class::<copy_loop::CopyStep>()?;
    m.add_class::<channel::Channel>()?;
    m.add_class::<credits::Credits>()?;
    m.add_class::<switch::SwitchChip>()?;
    m.add_class::<switch::SwitchLedger>()?;
    m.add_class::<gpu::Endpoint>()?;
    m.add_class::<hbm::HbmShare>()?;
    m.add_class::<hbm::HbmPhase>()?;
    m.add_class::<completion::Completion>()?;
    m.add_class::<completion::ArrivePerGpu>()?;
    m.add_class::<sm_port::SmPort>()?;
    m.add_class::<tb_dispatch::TbDispatcher>()?;
    m.add_class::<merge::MergeUnit>()?;
    m.add_class::<merge::MergeStats>()?;
    m.add_class::<merge::PortSpread>()?;
    m.add_class::<merge::Session>()?;
    m.add_class::<merge::FreeLines>()?;
    // The packet kinds the core serves itself, by name (cais.hw.packets.Kind must agree).
    let kinds = pyo3::types::PyDict::new(m.py());
    for (name, kind) in kinds::ALL {
        kinds.set_item(name, kind)?;
    }
    m.add("CORE_KINDS", kinds)?;
    Ok(())
}
