//! The compiled event core of cais-sim.
//!
//! What runs once per packet train lives here: the event queue and its clock
//! ([`sim::Simulator`]), trains ([`train::Train`]), serialising channels with
//! virtual channels ([`channel::Channel`]), the credit flow control of the
//! buffers they feed ([`credits::Credits`]) and the switch chips' crossbar and NVLS
//! engine ([`switch::SwitchChip`]). Python drives it through the same
//! classes the pure-Python engine had (`cais.engine`); a channel's arbitrations
//! and a train's arrival run here without entering the interpreter.

use pyo3::prelude::*;

pub mod channel;
pub mod credits;
pub mod sim;
pub mod switch;
pub mod train;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<sim::Simulator>()?;
    m.add_class::<train::Train>()?;
    m.add_class::<channel::Channel>()?;
    m.add_class::<credits::Credits>()?;
    m.add_class::<switch::SwitchChip>()?;
    m.add_class::<switch::SwitchLedger>()?;
    // The packet kinds the core serves itself, by name (cais.hw.packets.Kind must agree).
    let kinds = pyo3::types::PyDict::new(m.py());
    for (name, kind) in [
        ("WRITE", switch::WRITE),
        ("RED", switch::RED),
        ("MC_STORE", switch::MC_STORE),
        ("MC_LDRED_REQ", switch::MC_LDRED_REQ),
        ("MC_PULL_REQ", switch::MC_PULL_REQ),
        ("MC_PULL_RESP", switch::MC_PULL_RESP),
        ("MC_LDRED_RESP", switch::MC_LDRED_RESP),
        ("MC_RED", switch::MC_RED),
        ("FLAG", switch::FLAG),
        ("MC_FLAG", switch::MC_FLAG),
    ] {
        kinds.set_item(name, kind)?;
    }
    m.add("CORE_KINDS", kinds)?;
    Ok(())
}
