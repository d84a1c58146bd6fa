//! NVLink's fine-grained address interleave: how a GPU's accesses are cut into
//! transfer units and spread over its links, hence over the switch chips.

use rustc_hash::FxHashMap as HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::hw::region::Region;

/// Fibonacci hashing's multiplier: spreads consecutive keys over the links.
const SPREAD: i128 = 0x9E37_79B9_7F4A_7C15;

/// NVLink's address interleave of one system.
///
/// A region is cut at transfer-unit boundaries of its address (a 2-D block: into
/// groups of whole rows of at most one unit). A unit's packets (or rows) are dealt
/// to the GPU's links in turn, from a link chosen by a hash of the unit's index, so
/// that remainders do not always fall on the same links; a chip carries the
/// packets of its links as one train. The same address on every GPU is therefore
/// cut and routed alike, which NVLS and CAIS merging need, and each chip carries
/// traffic in proportion to its links.
///
/// In mirror mode it also counts the units of fewer packets than links (their
/// chip loads differ from GPU to GPU, which GPU 0's image cannot stand for).
#[pyclass(module = "cais._core")]
pub struct Interleave {
    /// The chip each of a GPU's links goes to.
    link_chip: Vec<i64>,
    /// A packet's largest payload (bytes).
    max_payload: i64,
    #[pyo3(get, set)]
    mirror: bool,
    /// Units striped in mirror mode with fewer packets than links, and their packets.
    #[pyo3(get)]
    uneven_units: i64,
    #[pyo3(get)]
    uneven_packets: i64,
    /// Packets of all units striped in mirror mode.
    #[pyo3(get)]
    mirror_packets: i64,
    /// (first link, slots) -> (chip, slots) stripes.
    stripes: HashMap<(i64, i64), Vec<(i64, i64)>>,
}

impl Interleave {
    /// The link a key (a unit's index, a flag's key) starts at.
    fn start_link(&self, key: i64) -> i64 {
        (((key as i128) * SPREAD) >> 29).rem_euclid(self.link_chip.len() as i128) as i64
    }

    fn spread(&mut self, unit_index: i64, slots: i64) -> &[(i64, i64)] {
        let nl = self.link_chip.len() as i64;
        if self.mirror {
            self.mirror_packets += slots;
            if slots < nl {
                self.uneven_units += 1;
                self.uneven_packets += slots;
            }
        }
        let start = self.start_link(unit_index);
        let links = &self.link_chip;
        self.stripes.entry((start, slots)).or_insert_with(|| {
            let (full, rem) = (slots / nl, slots % nl);
            let mut counts: Vec<(i64, i64)> = Vec::new(); // (chip, slots) in first-seen order
            for i in 0..nl {
                let chip = links[((start + i) % nl) as usize];
                let n = full + i64::from(i < rem);
                match counts.iter_mut().find(|(c, _)| *c == chip) {
                    Some(entry) => entry.1 += n,
                    None => counts.push((chip, n)),
                }
            }
            counts.retain(|&(_, n)| n != 0);
            counts
        })
    }

    pub(crate) fn cut(&self, py: Python<'_>, region: &Region, unit: i64) -> PyResult<Vec<Region>> {
        let eb = region.elem_bytes;
        let mut out = Vec::new();
        if region.rows > 1 {
            let row_bytes = region.count * eb;
            if row_bytes <= 0 {
                return Err(PyValueError::new_err(format!(
                    "a block of empty rows cannot be cut: {row_bytes} B per row"
                )));
            }
            let per_rows = 1.max(unit / row_bytes);
            let mut r = 0;
            while r < region.rows {
                let n = per_rows.min(region.rows - r);
                out.push(Region::make(
                    region.buffer.clone_ref(py),
                    region.start + r * region.stride,
                    region.count,
                    eb,
                    n,
                    region.stride,
                ));
                r += per_rows;
            }
            return Ok(out);
        }
        if eb <= 0 {
            return Err(PyValueError::new_err(format!("elem_bytes must be positive, got {eb}")));
        }
        let per = 1.max(unit / eb);
        let (mut start, end) = (region.start, region.start + region.count);
        while start < end {
            let stop = end.min((start.div_euclid(per) + 1) * per);
            out.push(Region::make(region.buffer.clone_ref(py), start, stop - start, eb, 1, 0));
            start = stop;
        }
        Ok(out)
    }
}

#[pymethods]
impl Interleave {
    #[new]
    #[pyo3(signature = (link_chip, max_payload, mirror = false))]
    fn new(link_chip: Vec<i64>, max_payload: i64, mirror: bool) -> PyResult<Self> {
        if link_chip.is_empty() || max_payload <= 0 {
            return Err(PyValueError::new_err(
                "an interleave needs at least one link and a positive packet payload",
            ));
        }
        Ok(Interleave {
            link_chip,
            max_payload,
            mirror,
            uneven_units: 0,
            uneven_packets: 0,
            mirror_packets: 0,
            stripes: HashMap::default(),
        })
    }

    /// How a transfer unit of ``slots`` packets (or rows) spreads over the chips:
    /// (chip, slots) in the order its contiguous stripes take.
    fn stripe(&mut self, unit_index: i64, slots: i64) -> Vec<(i64, i64)> {
        self.spread(unit_index, slots).to_vec()
    }

    /// The chip a key maps to (a flag's address: every GPU's copy of one flag alike).
    pub(crate) fn chip_of(&self, key: i64) -> i64 {
        self.link_chip[self.start_link(key) as usize]
    }

    /// A region cut at transfer-unit (``unit`` bytes) boundaries of its byte address.
    fn pieces(&self, py: Python<'_>, region: PyRef<'_, Region>, unit: i64) -> PyResult<Vec<Region>> {
        self.cut(py, &region, unit)
    }

    /// (sub-region, chip) trains of a region: its units, each striped over the chips.
    fn trains<'py>(&mut self, region: PyRef<'py, Region>, unit: i64) -> PyResult<Bound<'py, PyList>> {
        self.trains_of(region.py(), &region, unit)
    }
}

impl Interleave {
    /// (sub-region, chip) trains of a region (`trains`).
    pub(crate) fn trains_of<'py>(
        &mut self,
        py: Python<'py>,
        region: &Region,
        unit: i64,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for piece in self.cut(py, region, unit)? {
            let (rows, per, slots) = if piece.rows > 1 {
                (true, 1, piece.rows)
            } else {
                let per = 1.max(self.max_payload / piece.elem_bytes);
                (false, per, (piece.count + per - 1) / per)
            };
            let unit_index = (piece.start * piece.elem_bytes).div_euclid(unit);
            let mut first = 0;
            for &(chip, n) in self.spread(unit_index, slots) {
                let sub = if rows {
                    Region::make(
                        piece.buffer.clone_ref(py),
                        piece.start + first * piece.stride,
                        piece.count,
                        piece.elem_bytes,
                        n,
                        piece.stride,
                    )
                } else {
                    let cnt = (n * per).min(piece.count - first);
                    Region::make(
                        piece.buffer.clone_ref(py),
                        piece.start + first,
                        cnt,
                        piece.elem_bytes,
                        1,
                        0,
                    )
                };
                out.append(PyTuple::new(
                    py,
                    [Bound::new(py, sub)?.into_any(), chip.into_pyobject(py)?.into_any()],
                )?)?;
                first += if rows { n } else { n * per };
            }
        }
        Ok(out)
    }
}
