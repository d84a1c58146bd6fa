//! The hardware (`cais.hw`): a GPU's NVLink endpoint, its TB dispatcher, its SMs'
//! store path and its HBM share; the switch chips (crossbar, NVLS engine) with the
//! CAIS merge units and Group Sync Table; the packet kinds and the packet format the
//! core asks of Python; memory regions and the fabric's address interleave. Built on the engine; each unit
//! takes the engine's events through `engine::unit::Handler`.

pub mod gpu;
pub mod group_sync;
pub mod hbm;
pub mod interleave;
pub mod kinds;
pub mod merge;
pub mod packets;
pub mod params;
pub mod region;
pub mod replacement;
pub mod session_rule;
pub mod sm_port;
pub mod switch;
pub mod tb_dispatch;
