//! The compiled event core of cais-sim.
//!
//! What runs once per packet train lives here: the event queue and its clock
//! ([`sim::Simulator`]), trains ([`train::Train`]), serialising channels with
//! virtual channels ([`channel::Channel`]), the credit flow control of the
//! buffers they feed ([`credits::Credits`]), the switch chips' crossbar and NVLS
//! engine ([`switch::SwitchChip`], with the CAIS merge unit, [`merge::MergeUnit`], and
//! Group Sync Table, `group_sync::GroupSyncTable`) and the GPUs' NVLink endpoints
//! ([`gpu::Endpoint`], with their HBM share, [`hbm::HbmShare`]). Python drives it through the same
//! classes the pure-Python engine had (`cais.engine`); a channel's arbitrations
//! and a train's arrival run here without entering the interpreter.

use pyo3::prelude::*;

pub mod cell;
pub mod channel;
pub mod completion;
pub mod credits;
pub mod gpu;
pub mod group_sync;
pub mod hbm;
pub mod interleave;
pub mod kinds;
pub mod merge;
pub mod packets;
pub mod region;
pub mod sim;
pub mod stream;
pub mod switch;
pub mod train;
pub mod wait;

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
    m.add_class::<sim::Simulator>()?;
    m.add_class::<train::Train>()?;
    m.add_class::<region::Region>()?;
    m.add_class::<interleave::Interleave>()?;
    m.add_class::<wait::Signal>()?;
    m.add_class::<wait::Countdown>()?;
    m.add_class::<wait::ByteBound>()?;
    m.add_class::<wait::Process>()?;
    m.add_class::<stream::LoadStream>()?;
    m.add_class::<stream::RedStream>()?;
    m.add_class::<channel::Channel>()?;
    m.add_class::<credits::Credits>()?;
    m.add_class::<switch::SwitchChip>()?;
    m.add_class::<switch::SwitchLedger>()?;
    m.add_class::<gpu::Endpoint>()?;
    m.add_class::<hbm::HbmShare>()?;
    m.add_class::<hbm::HbmPhase>()?;
    m.add_class::<completion::Completion>()?;
    m.add_class::<completion::SmPort>()?;
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
