//! The stream side of a GPU's HBM share: the bytes the fabric and copy engines move
//! through HBM, counted per window and turned into a rate (the kernel phases that
//! share the HBM with them are timed in Python, `cais.hw.hbm.HbmShare`, a subclass).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::cell::{unit, GilCell, Unit};

/// Stream traffic through one GPU's HBM: counted, not timed; its rate is estimated
/// over the last complete window of `window` ps. `enabled=False` turns the sharing
/// off (nothing is counted).
#[pyclass(module = "cais._core", subclass, frozen)]
pub struct HbmStreams {
    st: GilCell<HbmStreamsState>,
}

/// The mutable state of a [`HbmStreams`] (see there), borrowed while holding the GIL.
pub(crate) struct HbmStreamsState {
    window: i64,
    enabled: bool,
    /// Index of the current stream window.
    bucket: i64,
    bucket_bytes: f64,
    /// Bytes in the last complete window.
    prev_bytes: f64,
    /// Total counted (a statistic).
    stream_bytes: f64,
}

unit!(HbmStreams, HbmStreamsState);

impl HbmStreamsState {
    fn new(window: i64, enabled: bool) -> Self {
        HbmStreamsState {
            window,
            enabled,
            bucket: 0,
            bucket_bytes: 0.0,
            prev_bytes: 0.0,
            stream_bytes: 0.0,
        }
    }

    /// Bytes per ps of stream traffic, over the last complete window.
    fn rate(&mut self, now: i64) -> f64 {
        self.roll(now);
        self.prev_bytes / self.window as f64
    }

    fn roll(&mut self, now: i64) {
        let b = now.div_euclid(self.window);
        if b != self.bucket {
            self.prev_bytes = if b == self.bucket + 1 { self.bucket_bytes } else { 0.0 };
            self.bucket = b;
            self.bucket_bytes = 0.0;
        }
    }

    pub(crate) fn count(&mut self, now: i64, nbytes: f64) {
        if !self.enabled || nbytes <= 0.0 {
            return;
        }
        self.roll(now);
        self.bucket_bytes += nbytes;
        self.stream_bytes += nbytes;
    }
}

#[pymethods]
impl HbmStreams {
    #[new]
    #[pyo3(signature = (bytes_per_ps, window_ps, enabled = true, streams_yield = false))]
    fn new(bytes_per_ps: f64, window_ps: i64, enabled: bool, streams_yield: bool) -> PyResult<Self> {
        let _ = streams_yield; // the phases' business (the Python subclass)
        if bytes_per_ps <= 0.0 || window_ps <= 0 {
            return Err(PyValueError::new_err("HBM bandwidth and window must be positive"));
        }
        Ok(HbmStreams::from(HbmStreamsState::new(window_ps, enabled)))
    }

    /// `nbytes` moved through HBM by the fabric side at `now`.
    fn stream(&self, py: Python<'_>, now: i64, nbytes: f64) {
        let mut me = self.st(py);
        me.count(now, nbytes);
    }

    /// Bytes per ps of stream traffic, over the last complete window.
    fn stream_rate(&self, py: Python<'_>, now: i64) -> f64 {
        self.st(py).rate(now)
    }

    #[getter]
    fn window(&self, py: Python<'_>) -> i64 {
        self.st(py).window
    }

    #[getter]
    fn enabled(&self, py: Python<'_>) -> bool {
        self.st(py).enabled
    }

    #[setter]
    fn set_enabled(&self, py: Python<'_>, value: bool) {
        self.st(py).enabled = value;
    }

    #[getter]
    fn stream_bytes(&self, py: Python<'_>) -> f64 {
        self.st(py).stream_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams() -> HbmStreamsState {
        HbmStreamsState::new(1000, true)
    }

    #[test]
    fn the_rate_is_the_last_complete_window() {
        let mut h = streams();
        h.count(100, 500.0);
        h.count(900, 300.0);
        assert_eq!(h.rate(999), 0.0); // the window is not complete yet
        assert_eq!(h.rate(1500), 0.8); // 800 B over the 1000 ps window [0, 1000)
        assert_eq!(h.rate(3000), 0.0); // a window with nothing in between
        assert_eq!(h.stream_bytes, 800.0);
    }

    #[test]
    fn nothing_is_counted_when_disabled() {
        let mut h = streams();
        h.enabled = false;
        h.count(100, 500.0);
        assert_eq!((h.stream_bytes, h.rate(1500)), (0.0, 0.0));
    }
}
