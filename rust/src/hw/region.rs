//! A region of a GPU's memory: the address every memory instruction carries.

use pyo3::basic::CompareOp;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

/// Elements of a named buffer (flat, row-major): ``rows`` runs of ``count``
/// elements, the first at element ``start``, each ``stride`` after the previous (a
/// 2-D block such as a GEMM tile; ``rows == 1`` is a contiguous run).
/// ``elem_bytes`` is the simulated element size (2 for bf16): timing uses it, while
/// functional data may be held at higher precision so that sums are exact.
///
/// Immutable, compared and hashed by its fields (a merge unit's CAM and an L2's
/// kept lines key on it).
#[pyclass(module = "cais._core", frozen, freelist = 4096)]
pub struct Region {
    #[pyo3(get)]
    pub buffer: Py<PyString>,
    #[pyo3(get)]
    pub start: i64,
    #[pyo3(get)]
    pub count: i64,
    #[pyo3(get)]
    pub elem_bytes: i64,
    #[pyo3(get)]
    pub rows: i64,
    #[pyo3(get)]
    pub stride: i64,
}

impl Region {
    pub(crate) fn make(buffer: Py<PyString>, start: i64, count: i64, elem_bytes: i64, rows: i64, stride: i64) -> Self {
        Region {
            buffer,
            start,
            count,
            elem_bytes,
            rows,
            stride,
        }
    }

    /// Bytes it covers.
    /// The block [r0:r0+nrows, c0:c0+ncols] of a row-major matrix (`Region.block`).
    pub(crate) fn block_of(
        buffer: Py<PyString>,
        row_len: i64,
        r0: i64,
        nrows: i64,
        c0: i64,
        ncols: i64,
        elem_bytes: i64,
    ) -> Self {
        if ncols == row_len {
            Region::make(buffer, r0 * row_len, nrows * row_len, elem_bytes, 1, 0)
        } else {
            Region::make(buffer, r0 * row_len + c0, ncols, elem_bytes, nrows, row_len)
        }
    }

    /// The same region, as a new value.
    pub(crate) fn copy(&self, py: Python<'_>) -> Self {
        Region::make(
            self.buffer.clone_ref(py),
            self.start,
            self.count,
            self.elem_bytes,
            self.rows,
            self.stride,
        )
    }

    pub(crate) fn size(&self) -> i64 {
        self.rows * self.count * self.elem_bytes
    }

    fn same(&self, py: Python<'_>, other: &Region) -> PyResult<bool> {
        if (self.start, self.count, self.elem_bytes, self.rows, self.stride)
            != (other.start, other.count, other.elem_bytes, other.rows, other.stride)
        {
            return Ok(false);
        }
        if self.buffer.is(&other.buffer) {
            return Ok(true);
        }
        Ok(self.buffer.bind(py).to_str()? == other.buffer.bind(py).to_str()?)
    }
}

#[pymethods]
impl Region {
    #[new]
    #[pyo3(signature = (buffer, start, count, elem_bytes = 2, rows = 1, stride = 0))]
    fn new(buffer: Py<PyString>, start: i64, count: i64, elem_bytes: i64, rows: i64, stride: i64) -> Self {
        Region::make(buffer, start, count, elem_bytes, rows, stride)
    }

    /// Bytes it covers: rows x count x elem_bytes.
    #[getter]
    fn nbytes(&self) -> i64 {
        self.size()
    }

    /// Byte address of its first element in the buffer.
    #[getter]
    fn byte_offset(&self) -> i64 {
        self.start * self.elem_bytes
    }

    /// The contiguous sub-region of ``count`` elements at ``start`` elements into
    /// this (contiguous) one.
    fn sub(&self, py: Python<'_>, start: i64, count: i64) -> Self {
        Region::make(
            self.buffer.clone_ref(py),
            self.start + start,
            count,
            self.elem_bytes,
            1,
            0,
        )
    }

    /// Rows ``first .. first+rows-1`` of this block.
    fn row_block(&self, py: Python<'_>, first: i64, rows: i64) -> Self {
        Region::make(
            self.buffer.clone_ref(py),
            self.start + first * self.stride,
            self.count,
            self.elem_bytes,
            rows,
            self.stride,
        )
    }

    /// The block [r0:r0+nrows, c0:c0+ncols] of a row-major matrix with rows of
    /// ``row_len`` elements (whole rows are one contiguous run).
    #[staticmethod]
    #[pyo3(signature = (buffer, row_len, r0, nrows, c0, ncols, elem_bytes = 2))]
    fn block(buffer: Py<PyString>, row_len: i64, r0: i64, nrows: i64, c0: i64, ncols: i64, elem_bytes: i64) -> Self {
        Region::block_of(buffer, row_len, r0, nrows, c0, ncols, elem_bytes)
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<Region>() else {
            return Ok(py.NotImplemented());
        };
        let same = self.same(py, other.get())?;
        Ok(match op {
            CompareOp::Eq => same.into_pyobject(py)?.to_owned().into_any().unbind(),
            CompareOp::Ne => (!same).into_pyobject(py)?.to_owned().into_any().unbind(),
            _ => py.NotImplemented(),
        })
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        // the buffer's own (cached) string hash, mixed with the fields
        let mut h = self.buffer.bind(py).hash()? as u64;
        for v in [self.start, self.count, self.elem_bytes, self.rows, self.stride] {
            h = (h.rotate_left(5) ^ v as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        let h = h as isize;
        Ok(if h == -1 { -2 } else { h })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Region(buffer={}, start={}, count={}, elem_bytes={}, rows={}, stride={})",
            self.buffer.bind(py).repr()?,
            self.start,
            self.count,
            self.elem_bytes,
            self.rows,
            self.stride
        ))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let r = slf.get();
        let args = PyTuple::new(
            py,
            [
                r.buffer.clone_ref(py).into_any(),
                r.start.into_pyobject(py)?.into_any().unbind(),
                r.count.into_pyobject(py)?.into_any().unbind(),
                r.elem_bytes.into_pyobject(py)?.into_any().unbind(),
                r.rows.into_pyobject(py)?.into_any().unbind(),
                r.stride.into_pyobject(py)?.into_any().unbind(),
            ],
        )?;
        Ok((slf.get_type().into_any(), args))
    }
}

/// The bytes an address covers: a [`Region`]'s own, or any other object's `nbytes`.
pub(crate) fn region_bytes(addr: &Bound<'_, PyAny>) -> PyResult<i64> {
    match addr.cast::<Region>() {
        Ok(r) => Ok(r.get().size()),
        Err(_) => addr.getattr("nbytes")?.extract(),
    }
}
