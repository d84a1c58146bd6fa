"""A small driver for CACTI 7 (HP Labs / Univ. of Utah, the version that the PyPI
package ``hwcomponents-cacti`` ships): write a ``.cfg`` for one SRAM or CAM array,
run the ``cacti`` binary on it and read the CSV line it appends to ``<cfg>.out``.

Where the binary comes from (:func:`find_cacti`, first found wins):

1. ``$CAIS_CACTI``: the path of a ``cacti`` binary;
2. ``$CAIS_CACTI_DIR/cacti`` (default ``~/.cache/cais/cacti/cacti``), which
   ``scripts/build_cacti.sh`` builds (with the technology files CACTI reads from its
   folder) from the ``hwcomponents-cacti`` sdist's sources
   (:data:`SDIST`, pinned by hash) with ``make opt``;
3. the binary inside an installed ``hwcomponents_cacti`` package (``pip install
   -e '.[cost]'`` on Python >= 3.12, which that package requires; its wheel's binary
   needs a newer C library than Debian 12's, so the script is the route on 3.11).

Without any of them the callers use the stored run (``cais/data/cacti/merge_unit.json``)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: the sdist whose CACTI sources scripts/build_cacti.sh builds (PyPI, Requires-Python >= 3.12)
SDIST = {"name": "hwcomponents-cacti", "version": "1.0.40",
         "url": "https://files.pythonhosted.org/packages/95/95/646a0b1c6559e8e6dc7845e50bf58929422c17a2981108ff27d3869388e7/"
                "hwcomponents_cacti-1.0.40.tar.gz",
         "sha256": "14d6541f28e7caabe2416ef29d0afc447885622c2657f6bcc69d00a15450d2bd"}

#: the smallest node CACTI 7 models (its ITRS tables stop at 22 nm)
CACTI_MIN_NM = 22

#: the settings every run shares: hwcomponents-cacti's default_cfg.cfg, except the objective
#: (cycle time, CACTI's own cache.cfg's choice) and ECC off (the content array's lines are an
#: NVLink packet's payload, ECC'd on the link). The devices (cells and periphery) and the
#: ports are each array's (:class:`Array`): ITRS high-performance or low-standby-power, one
#: read-write port or one read and one write port.
#: The off-chip IO block (``-dram_type`` on) is default_cfg.cfg's: CACTI reads it whatever it
#: models, and stops with a floating-point exception without it.
BASE_CFG = """\
-Array Power Gating - "false"
-WL Power Gating - "false"
-CL Power Gating - "false"
-Bitline floating - "false"
-Interconnect Power Gating - "false"
-Power Gating Performance Loss "default"
-single ended read ports 0
-page size (bits) 0
-burst length 8
-internal prefetch width 8
-operating temperature (K) 360
-access mode (normal, sequential, fast) - "normal"
-design objective (weight delay, dynamic power, leakage power, cycle time, area) 0:0:0:100:0
-deviate (delay, dynamic power, leakage power, cycle time, area) 20:100000:100000:100000:100000
-NUCAdesign objective (weight delay, dynamic power, leakage power, cycle time, area) 100:100:0:0:100
-NUCAdeviate (delay, dynamic power, leakage power, cycle time, area) 10:10000:10000:10000:10000
-Optimize ED or ED^2 (ED, ED^2, NONE): "ED^2"
-Cache model (NUCA, UCA)  - "UCA"
-NUCA bank count 0
-Wire signaling (fullswing, lowswing, default) - "Global_30"
-Wire inside mat - "semi-global"
-Wire outside mat - "semi-global"
-Interconnect projection - "normal"
-Core count 1
-Add ECC - "false"
-Print level (DETAILED, CONCISE) - "CONCISE"
-Print input parameters - "false"
-Force cache config - "false"
-Ndwl 1
-Ndbl 1
-Nspd 0
-Ndcm 1
-Ndsam1 0
-Ndsam2 0
-dram_type "DDR3"
-io state "WRITE"
-addr_timing 1.0
-mem_density 4 Gb
-bus_freq 800 MHz
-duty_cycle 1.0
-activity_dq 1.0
-activity_ca 0.5
-num_dq 72
-num_dqs 18
-num_ca 25
-num_clk  2
-num_mem_dq 2
-mem_data_width 8
-rtt_value 10000
-ron_value 34
-tflight_value
-num_bobs 1
-capacity 80
-num_channels_per_bob 1
-first metric "Cost"
-second metric "Bandwidth"
-third metric "Energy"
-DIMM model "ALL"
-mirror_in_bob "F"
"""

#: the device types a run may use (CACTI's names): ITRS high-performance and low-standby-power
CELLS = ("itrs-hp", "itrs-lstp")
#: the port sets a RAM may have: one read-write port, or one exclusive read and one exclusive write port
PORTS = ("1rw", "1r1w")

#: CSV column of CACTI's .out -> our key (times ns, energies nJ, leakage mW, area mm^2)
COLUMNS = {"Access time (ns)": "access_ns", "Random cycle time (ns)": "cycle_ns",
           "Dynamic search energy (nJ)": "search_nJ", "Dynamic read energy (nJ)": "read_nJ",
           "Dynamic write energy (nJ)": "write_nJ", "Standby leakage per bank(mW)": "leakage_mW",
           "Area (mm2)": "area_mm2"}


@dataclass(frozen=True)
class Array:
    """One array of the merge unit, as CACTI sees it: ``kind`` ``ram`` (an SRAM read
    and written a ``block_bytes`` word at a time) or ``cam`` (a content-addressed
    array of ``block_bytes``-wide tags, searched on one port); ``nbytes`` in all;
    ``cells`` (:data:`CELLS`) for its cells and periphery alike; ``ports``
    (:data:`PORTS`): one read-write port, or one read and one write port (a RAM only)."""

    name: str
    kind: str
    nbytes: int
    block_bytes: int
    banks: int = 1
    cells: str = "itrs-hp"
    ports: str = "1rw"

    def cfg(self, node_nm: float) -> str:
        """The .cfg text of this array at ``node_nm`` (>= 22)."""
        cam = self.kind == "cam"
        if self.cells not in CELLS or self.ports not in PORTS or (cam and self.ports != "1rw"):
            raise ValueError(f"array {self.name}: cells one of {CELLS}, ports one of {PORTS} (a CAM: 1rw)")
        rw, excl = (1, 0) if self.ports == "1rw" else (0, 1)
        devices = [f'-{a} array {b} type - "{self.cells}"' for a in ("Data", "Tag") for b in ("cell", "peripheral")]
        return BASE_CFG + "".join(f"{line}\n" for line in (
            *devices, f"-exclusive read port {excl}", f"-exclusive write port {excl}",
            f"-size (bytes) {self.nbytes}", f"-read-write port {rw}", f"-search port {1 if cam else 0}",
            f"-block size (bytes) {self.block_bytes}", f"-technology (u) {node_nm / 1000:.3f}",
            f"-output/input bus width {self.block_bytes * 8}", f"-UCA bank count {self.banks}",
            f'-cache type "{self.kind}"', '-tag size (b) "default"', f"-associativity {0 if cam else 1}"))


def find_cacti() -> Path | None:
    """The CACTI binary (module docstring for where it is looked for), or None."""
    env = os.environ.get("CAIS_CACTI")
    if env:
        return Path(env) if Path(env).is_file() else None
    built = Path(os.environ.get("CAIS_CACTI_DIR", Path.home() / ".cache" / "cais" / "cacti")) / "cacti"
    if built.is_file():
        return built
    spec = importlib.util.find_spec("hwcomponents_cacti")  # its binary, without importing it (needs hwcomponents)
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / "cacti" / "cacti"
            if p.is_file():
                return p
    return None


def run_array(array: Array, node_nm: float, binary: Path) -> dict[str, float]:
    """CACTI's figures for ``array`` at ``node_nm``: :data:`COLUMNS`' keys, leakage for
    all banks. Raises RuntimeError with CACTI's last lines where it fails."""
    with tempfile.TemporaryDirectory(prefix="cais-cacti-") as tmp:
        cfg = Path(tmp) / (array.name.replace("/", "_") + ".cfg")
        cfg.write_text(array.cfg(node_nm))
        # CACTI reads its technology files (tech_params/, contention.dat) from the folder it runs in
        p = subprocess.run([str(binary), "-infile", str(cfg)], cwd=binary.parent, capture_output=True, text=True,
                           timeout=120)
        out = Path(str(cfg) + ".out")
        if p.returncode != 0 or not out.is_file():
            tail = "\n".join((p.stdout + p.stderr).splitlines()[-5:])
            raise RuntimeError(f"CACTI failed on {array.name} at {node_nm} nm (rc {p.returncode}): {tail}")
        rows = list(csv.DictReader(out.read_text().splitlines(), skipinitialspace=True))
    row = {k.strip(): v.strip() for k, v in rows[-1].items() if k}
    got = {key: float(row[col]) if row.get(col) not in (None, "", "N/A") else 0.0 for col, key in COLUMNS.items()}
    got["leakage_mW"] *= array.banks
    return got
