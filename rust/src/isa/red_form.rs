//! How a GEMM-RS epilogue's partial rows go out and are counted at their owner
//! (`kernels/remote_gemm.py`'s `RemoteAccess.red_form`): one description that the
//! timing mode's tile plans (`RedPlan.build`) and the functional mode's reductions
//! both read.

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::hw::region::Region;

/// The LN row blocks of every owner's shard of a token-row-sharded tensor, as CAIS's
/// TB-level dependencies cut it (`opt/tb_dependencies.py`): `rows_l` rows an owner,
/// blocks of `block_rows` rows from the start of each shard, rows of `width` elements,
/// and each block's signal word (`keys`, by block). A piece of an epilogue's partial
/// rows is cut where a block (or a shard) ends, each part counted in its block's word.
#[pyclass(module = "cais._core", frozen)]
pub struct RowBlocks {
    width: i64,
    rows_l: i64,
    block_rows: i64,
    keys: Vec<i64>,
}

/// One part of a region cut at row blocks: its block, the part, and where the part's
/// elements start in the region's elements taken in order (its data's offset).
pub(crate) struct Part {
    pub block: usize,
    pub region: Region,
    pub offset: i64,
}

impl RowBlocks {
    /// (first row, rows, first column, columns, offset) spans of `region` in its
    /// owner's shard: one for a 2-D block; for a run, whole rows and the parts of rows
    /// where it starts or ends mid-row.
    fn spans(&self, region: &Region) -> Vec<(i64, i64, i64, i64, i64)> {
        let width = self.width;
        if region.rows > 1 {
            let (r0, c0) = (region.start.div_euclid(width), region.start.rem_euclid(width));
            return vec![(r0, region.rows, c0, region.count, 0)];
        }
        let mut spans = Vec::new();
        let (mut pos, end) = (region.start, region.start + region.count);
        while pos < end {
            let (r0, c0) = (pos.div_euclid(width), pos.rem_euclid(width));
            if c0 == 0 && end - pos >= width {
                let rows = (end - pos) / width;
                spans.push((r0, rows, 0, width, pos - region.start));
                pos += rows * width;
            } else {
                let cnt = (width - c0).min(end - pos);
                spans.push((r0, 1, c0, cnt, pos - region.start));
                pos += cnt;
            }
        }
        spans
    }

    /// (block, first row in the shard, rows) of `owner`'s rows `row0 ..
    /// row0+rows-1`, cut where a block or a shard ends (`TbDependencies.cut`).
    fn cut_rows(&self, owner: i64, row0: i64, rows: i64) -> Vec<(i64, i64, i64)> {
        let (rows_l, per) = (self.rows_l, self.block_rows);
        let mut out = Vec::new();
        let (mut t, end) = (owner * rows_l + row0, owner * rows_l + row0 + rows);
        while t < end {
            let (o, row) = (t.div_euclid(rows_l), t.rem_euclid(rows_l));
            let block = row / per;
            let stop = end.min(o * rows_l + rows_l.min((block + 1) * per));
            out.push((block, row, stop - t));
            t = stop;
        }
        out
    }

    /// `region` (of `owner`'s shard) cut at row blocks, in order.
    pub(crate) fn parts(&self, py: Python<'_>, region: &Region, owner: i64) -> PyResult<Vec<Part>> {
        let mut out = Vec::new();
        for (r0, rows, c0, cols, off) in self.spans(region) {
            for (block, t, cnt) in self.cut_rows(owner, r0, rows) {
                let buffer = region.buffer.clone_ref(py);
                out.push(Part {
                    block: usize::try_from(block).map_err(|_| bad_block(block))?,
                    region: Region::block_of(buffer, self.width, t, cnt, c0, cols, region.elem_bytes),
                    offset: off + (t - r0) * cols,
                });
            }
        }
        Ok(out)
    }

    /// The signal word of block `block`.
    pub(crate) fn key(&self, block: usize) -> PyResult<i64> {
        self.keys.get(block).copied().ok_or_else(|| bad_block(block as i64))
    }
}

fn bad_block(block: i64) -> PyErr {
    pyo3::exceptions::PyIndexError::new_err(format!("row block {block} has no signal word"))
}

#[pymethods]
impl RowBlocks {
    #[new]
    fn new(width: i64, rows_l: i64, block_rows: i64, keys: Vec<i64>) -> PyResult<Self> {
        if width < 1 || rows_l < 1 || block_rows < 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "row blocks need width, rows_l and block_rows of at least 1, got {width}, {rows_l}, {block_rows}"
            )));
        }
        Ok(RowBlocks {
            width,
            rows_l,
            block_rows,
            keys,
        })
    }

    /// `region` (of `owner`'s shard) cut at row blocks: (block, part, offset of the
    /// part's first element among the region's), in order.
    fn cut(&self, py: Python<'_>, region: PyRef<'_, Region>, owner: i64) -> PyResult<Vec<(usize, Region, i64)>> {
        Ok(self
            .parts(py, &region, owner)?
            .into_iter()
            .map(|p| (p.block, p.region, p.offset))
            .collect())
    }
}

/// How a GEMM-RS epilogue's partial rows go out (`kind`: a plain `red`, or a
/// mergeable `red.cais` with its `quorum`), in trains of at most `unit` bytes, and
/// how the owner counts them: every part raises signal word `signal` by its bytes
/// (-1: none), or, with `blocks`, its row block's word. The owner's own partial rows
/// are added locally and raise the same words (none when `signal` is -1 and there
/// are no blocks: a plain add).
#[pyclass(module = "cais._core", frozen)]
pub struct RedForm {
    pub(crate) kind: i64,
    pub(crate) signal: i64,
    pub(crate) quorum: i64,
    pub(crate) unit: i64,
    pub(crate) blocks: Option<Py<RowBlocks>>,
}

impl RedForm {
    /// The signal words the owner's own `region` raises, and by how much, in order.
    pub(crate) fn own_signals(&self, py: Python<'_>, region: &Region, owner: i64) -> PyResult<Vec<(i64, i64)>> {
        match &self.blocks {
            Some(rb) => {
                let rb = rb.get();
                rb.parts(py, region, owner)?
                    .into_iter()
                    .map(|p| Ok((rb.key(p.block)?, p.region.size())))
                    .collect()
            }
            None if self.signal >= 0 => Ok(vec![(self.signal, region.size())]),
            None => Ok(Vec::new()),
        }
    }
}

#[pymethods]
impl RedForm {
    #[new]
    #[pyo3(signature = (kind, unit, signal = -1, quorum = 0, blocks = None))]
    fn new(kind: i64, unit: i64, signal: i64, quorum: i64, blocks: Option<Py<RowBlocks>>) -> PyResult<Self> {
        if unit < 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a reduction's transfer unit must be at least 1 byte, got {unit}"
            )));
        }
        Ok(RedForm {
            kind,
            signal,
            quorum,
            unit,
            blocks,
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.blocks)
    }
}
