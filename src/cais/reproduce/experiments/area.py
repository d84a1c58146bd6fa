"""Past the paper, beside its §V-D: the SRAM area of the CAIS merge unit (per switch
chip) and of the TB-group synchroniser (per GPU die) against merge-table size, in
closed form from published bit cells (cais.reproduce.area); no runs."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.area import SOURCES, area_table, merge_unit_mm2, sync_mm2
from cais.reproduce.experiments.common import Context, Experiment, compare, no_points
from cais.reproduce.report import Section


def area_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """Closed-form SRAM area of the merge tables and synchroniser against table size."""
    t = area_table()
    kb = P.TABLE_KB_SIMULATED
    series = {n: (list(g["table_kB"]), list(g["switch_mm2"])) for n, g in t.groupby("node")}
    plots.lines(ctx.out / "area.png", series, "merge table per port (kB, log)",
                "merge-unit SRAM per switch chip (mm^2)", "Past the paper: merge-unit area against table size",
                paper={f"paper: {P.AREA_SWITCH_MM2:.2f} mm^2 at {P.TABLE_KB:.0f} KB (12 nm)":
                       ([kb], [P.AREA_SWITCH_MM2])}, logx=True)
    sec = Section("area", "Past the paper: SRAM area of the merge unit and the synchroniser")
    sec.p("Data arrays only (bit-cell area / array efficiency), per switch chip with 8 GPU ports, plus the CAM "
          "tags at 2x a bit cell; " + SOURCES)
    why = ("ours counts the SRAM/CAM arrays only; the paper's synthesis also has the CAM match logic, the "
           "reduction adders and control")
    ours40 = merge_unit_mm2(kb, "16/12 nm")
    fits = sec.claim("the merge unit's bit cells fit the paper's area", ours40 <= P.AREA_SWITCH_MM2,
                     f"{ours40:.2f} mm^2 per chip")
    sec.says(f"The merge unit's bit cells fit the paper's {P.AREA_SWITCH_MM2:.2f} mm^2 per switch chip (12 nm): {fits}; "
             f"{ours40:.2f} mm^2 at {P.TABLE_KB:.0f} KB per port, a lower bound.",
             "With CACTI's periphery and the adders the whole unit is the cost section's figure (its area claim).")
    sec.img("area.png").table(pd.DataFrame([
        compare(f"merge unit per switch chip at {P.TABLE_KB:.0f} KB/port, 12 nm (mm^2)", ours40,
                P.AREA_SWITCH_MM2, why),
        compare("synchroniser (256 entries) per GPU die, 12 nm (mm^2)", sync_mm2(256, "16/12 nm"),
                P.AREA_SYNC_MM2, why)]), summary=True)
    sec.table(t)
    return t, sec


EXPERIMENT = Experiment("area", "area", no_points, area_analyse)
