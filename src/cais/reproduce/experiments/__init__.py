"""The reproduction experiments, one module each: every experiment names the points it
needs (run through the sweep runner, so shared points run once and a run resumes) and
turns their rows into a CSV, a figure and a report section that puts our numbers
beside the paper's (:mod:`cais.reproduce.paper`).

The paper's (``PAPER_SET``): fig2, fig11-fig18, table2; past it: map, worlds, bound,
area, cost, full, nvl72, decode, production, moe. :mod:`.common` holds what several share."""

from __future__ import annotations

from cais.reproduce.experiments import (area, bound, cost, decode, fig2, fig11, fig12, fig13, fig14, fig15, fig16, fig17,
                                        fig18, full, moe, nvl72, production, table2, worlds)
from cais.reproduce.experiments import map as map_  # the module, without hiding the builtin here
from cais.reproduce.experiments.common import Context, Experiment, compare, failures, geomean, ok_rows
from cais.reproduce.experiments.fig11 import fig11_verdict, first_reason, geomean_table

__all__ = ["EXPERIMENTS", "PAPER_SET", "Context", "Experiment", "compare", "failures", "geomean", "ok_rows",
           "fig11_verdict", "first_reason", "geomean_table"]

_REGISTRY: tuple[Experiment, ...] = tuple(m.EXPERIMENT for m in (
    fig2, fig11, fig12, fig13, fig14, fig15, fig16, fig17, fig18, table2,
    map_, worlds, bound, area, cost, full, nvl72, decode, production, moe))
#: every experiment by name, in the report's order
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in _REGISTRY}
#: the paper's figures and tables (``cais reproduce paper``)
PAPER_SET = ("fig2", "fig11", "fig12", "fig13", "fig14", "fig15", "fig16", "fig17", "fig18", "table2")
