//! The benchmark's yardstick compiled: `benchmarks/bench_core.py` times a bare Python
//! `heapq` loop as the measure of its rows; the same loop on Rust's `BinaryHeap` is the
//! ceiling any compiled event loop has on this machine (a queue operation per event
//! and no other work), timed in the same run.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `n` pop/push of `(time, seq)` in a binary heap holding `pending` events, the keys
/// and delays of the benchmark's `heapq` loop (`heapq_million`): the seconds the loop
/// took and the last time it popped (the Python loop's, for the same arguments).
#[pyfunction]
pub fn heap_yardstick(n: u64, pending: u64) -> PyResult<(f64, i64)> {
    if pending == 0 {
        return Err(PyValueError::new_err("heap_yardstick: pending must be at least 1"));
    }
    let delay = |seq: u64| ((seq * 7919) % 10_007) as i64;
    let mut heap: BinaryHeap<Reverse<(i64, u64)>> = (0..pending).map(|i| Reverse((delay(i), i))).collect();
    let mut last = 0;
    let t0 = Instant::now();
    for seq in pending..pending + n {
        let Reverse((now, _)) = heap.pop().expect("the heap holds `pending` events");
        last = now;
        heap.push(Reverse((now + delay(seq), seq)));
    }
    Ok((t0.elapsed().as_secs_f64(), last))
}
