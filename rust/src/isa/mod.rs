//! What the ISA issues on the core's side (`cais.isa`): a TB's remote loads and its
//! epilogue's reductions, issued in order under the SM's and the GPU's bounds, and
//! the reduce warps of a staged NVLS AllReduce step under their window, a sender SM's
//! chunked stores with their tail flags, and an SM's windowed copy loop.
//! Built on the engine and the hardware.

pub mod copy_loop;
pub mod kept;
pub mod red_form;
pub mod reduce_stream;
pub mod store_chain;
pub mod stream;
