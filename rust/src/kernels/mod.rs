//! Kernels' thread blocks made in the core: what a Python kernel would make per TB,
//! put together here from a kernel-level description (above the ISA, below no scheme).

pub mod core_tb;
pub mod load_tbs;
pub mod reduce_tbs;
pub(crate) mod tb_parts;
pub mod tile_plans;
