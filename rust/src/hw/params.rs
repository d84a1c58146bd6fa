//! What the hardware units read of the system config (`cais.config.SystemConfig`,
//! loaded from a preset in `src/cais/data/systems/`), typed. Each struct is extracted
//! from the config object by attribute, and each field has the name it has in the
//! preset's JSON and in the pydantic model (`switch.merge.entries` is
//! `SystemParams.switch.merge.entries`), so a field is one name from the file to the
//! unit that uses it. The defaults are the config's (Python's); nothing here has its
//! own. Times in the config are ns or us; a unit converts them to ps where it reads
//! them, rounding half to even as Python's `round` does.

use pyo3::prelude::*;

/// `round(x)` of a float, as Python's: half to even.
pub(crate) fn ps(time: f64, ps_per_unit: f64) -> i64 {
    (time * ps_per_unit).round_ties_even() as i64
}

/// `switch.merge`: the CAIS merge unit of one switch port.
#[derive(FromPyObject, Clone, Debug)]
pub(crate) struct MergeConfig {
    /// Merging-table lines per port (0: every request bypasses).
    pub entries: i64,
    /// Data bytes one line holds.
    pub line_bytes: i64,
    /// An entry idle this long is flushed.
    pub timeout_us: f64,
    /// CAM lookup and merge time added to a merged response or sum.
    pub latency_ns: f64,
    /// Lookups one port's unit starts per ns (None: no limit): a request waits for
    /// the unit's next free lookup slot.
    pub lookups_per_ns: Option<f64>,
    /// Access slots a reduction's line takes under `lookups_per_ns` (2: the read and
    /// the write of a one-port content array; 1: a 1R1W array).
    pub red_accesses: i64,
    /// Which session goes when lines are needed: "lru" or "fifo" (`replacement/`).
    pub replacement: String,
}

/// `gpu`: what a GPU's endpoint reads.
#[derive(FromPyObject)]
#[allow(non_snake_case)] // the config's own names (kB, GBps)
pub(crate) struct GpuConfig {
    /// Time a GPU takes to serve a remote read.
    pub memory_latency_ns: f64,
    /// Bytes of remote reads a GPU serves at once.
    pub read_serve_kB: f64,
}

/// `link`: what the units read of the links.
#[derive(FromPyObject)]
pub(crate) struct LinkConfig {
    /// Virtual channels per link.
    pub vcs: usize,
}

/// `switch`: the switch chips.
#[derive(FromPyObject)]
#[allow(non_snake_case)]
pub(crate) struct SwitchConfig {
    pub chips: usize,
    /// Crossbar traversal added per switch hop.
    pub pipeline_latency_ns: f64,
    /// Extra time of an in-switch reduction.
    pub reduce_latency_ns: f64,
    /// Operand bytes per second one chip's NVLS reduction engine takes in (None:
    /// never the limit).
    pub reduce_GBps: Option<f64>,
    /// The merge unit's config, as Python has it (the chip hands it to its merge
    /// units, which read it as a [`MergeConfig`]).
    pub merge: Py<PyAny>,
}

/// `cais`: the CAIS chip's Group Sync Table.
#[derive(FromPyObject)]
pub(crate) struct CaisConfig {
    /// TB groups the table holds at once.
    pub sync_entries: i64,
    /// An entry's timeout (us): a group not complete this long after its first member
    /// registered releases the members it has (None: never).
    pub sync_timeout_us: Option<f64>,
}

/// What the core's hardware units read of a `SystemConfig`.
#[derive(FromPyObject)]
pub(crate) struct SystemParams {
    pub gpus: i64,
    pub gpu: GpuConfig,
    pub link: LinkConfig,
    pub switch: SwitchConfig,
    pub cais: CaisConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_half_to_even_as_python() {
        assert_eq!(ps(0.5, 1.0), 0);
        assert_eq!(ps(1.5, 1.0), 2);
        assert_eq!(ps(20.0, 1e6), 20_000_000);
    }

    #[test]
    fn a_merge_config_is_read_by_its_field_names() {
        Python::initialize();
        Python::attach(|py| {
            let ns = py.import("types").unwrap().getattr("SimpleNamespace").unwrap();
            let kw = pyo3::types::PyDict::new(py);
            for (k, v) in [
                ("entries", 320.0),
                ("line_bytes", 128.0),
                ("timeout_us", 20.0),
                ("latency_ns", 0.0),
            ] {
                if k.ends_with("us") || k.ends_with("ns") {
                    kw.set_item(k, v).unwrap();
                } else {
                    kw.set_item(k, v as i64).unwrap();
                }
            }
            kw.set_item("replacement", "lru").unwrap();
            kw.set_item("lookups_per_ns", py.None()).unwrap();
            kw.set_item("red_accesses", 2).unwrap();
            let cfg: MergeConfig = ns.call((), Some(&kw)).unwrap().extract().unwrap();
            assert_eq!((cfg.entries, cfg.line_bytes, cfg.timeout_us), (320, 128, 20.0));
            assert_eq!(cfg.lookups_per_ns, None); // null: no limit
            assert_eq!(cfg.red_accesses, 2);
            kw.set_item("lookups_per_ns", 2.5).unwrap();
            let cfg: MergeConfig = ns.call((), Some(&kw)).unwrap().extract().unwrap();
            assert_eq!(cfg.lookups_per_ns, Some(2.5));
            kw.del_item("entries").unwrap();
            let missing = ns.call((), Some(&kw)).unwrap().extract::<MergeConfig>();
            assert!(missing.unwrap_err().to_string().contains("entries"));
        });
    }
}
