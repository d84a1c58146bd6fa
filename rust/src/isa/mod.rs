//! What the ISA issues on the core's side (`cais.isa`): a TB's remote loads and its
//! epilogue's reductions, issued in order under the SM's and the GPU's bounds, and
//! the reduce warps of a staged NVLS AllReduce step under their window.
//! Built on the engine and the hardware.

pub mod kept;
pub mod red_form;
pub mod reduce_stream;
pub mod stream;
