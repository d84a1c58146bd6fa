//! The stream side of a GPU's HBM share: the bytes the fabric and copy engines move
//! through HBM, counted per window and turned into a rate (the kernel phases that
//! share the HBM with them are timed in Python, `cais.hw.hbm.HbmShare`, a subclass).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Stream traffic through one GPU's HBM: counted, not timed; its rate is estimated
/// over the last complete window of `window` ps. `enabled=False` turns the sharing
/// off (nothing is counted).
#[pyclass(module = "cais._core", subclass)]
pub struct HbmStreams {
    #[pyo3(get)]
    window: i64,
    #[pyo3(get, set)]
    enabled: bool,
    /// Index of the current stream window.
    bucket: i64,
    bucket_bytes: f64,
    /// Bytes in the last complete window.
    prev_bytes: f64,
    /// Total counted (a statistic).
    #[pyo3(get)]
    stream_bytes: f64,
}

impl HbmStreams {
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
        Ok(HbmStreams {
            window: window_ps,
            enabled,
            bucket: 0,
            bucket_bytes: 0.0,
            prev_bytes: 0.0,
            stream_bytes: 0.0,
        })
    }

    /// `nbytes` moved through HBM by the fabric side at `now`.
    fn stream(&mut self, now: i64, nbytes: f64) {
        self.count(now, nbytes);
    }

    /// Bytes per ps of stream traffic, over the last complete window.
    fn stream_rate(&mut self, now: i64) -> f64 {
        self.roll(now);
        self.prev_bytes / self.window as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams() -> HbmStreams {
        HbmStreams::new(1.0, 1000, true, false).expect("valid")
    }

    #[test]
    fn the_rate_is_the_last_complete_window() {
        let mut h = streams();
        h.count(100, 500.0);
        h.count(900, 300.0);
        assert_eq!(h.stream_rate(999), 0.0); // the window is not complete yet
        assert_eq!(h.stream_rate(1500), 0.8); // 800 B over the 1000 ps window [0, 1000)
        assert_eq!(h.stream_rate(3000), 0.0); // a window with nothing in between
        assert_eq!(h.stream_bytes, 800.0);
    }

    #[test]
    fn nothing_is_counted_when_disabled() {
        let mut h = streams();
        h.enabled = false;
        h.count(100, 500.0);
        assert_eq!((h.stream_bytes, h.stream_rate(1500)), (0.0, 0.0));
    }
}
