"""Results of runs: link and buffer metrics (with or without a recorder), the recorder
of what happened over time, and results as table rows."""

from cais.results.metrics import LinkUtil, RunMetrics, link_utilisation, run_metrics
from cais.results.recorder import Mark, Recorder

__all__ = ["LinkUtil", "Mark", "Recorder", "RunMetrics", "link_utilisation", "run_metrics"]
