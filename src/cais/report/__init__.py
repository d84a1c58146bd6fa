"""Reports of recorded runs: timelines (Chrome Trace Event Format, for Perfetto)."""
