//! Kernels' thread blocks made in the core: what a Python kernel would make per TB,
//! put together here from a kernel-level description (above the ISA, below no scheme).

pub mod reduce_tbs;
