"""Sweeps: a grid of simulation points run in local processes or on a Ray cluster,
each finished point appended to a Parquet table at once, so that an interrupted sweep
resumes without redoing finished points (docs/sweeps.md).

* :mod:`cais.sweep.grid`: a spec (YAML-loaded dict) to a list of points; point ids.
* :mod:`cais.sweep.point`: what one point means (a layer or a collective run) and
  its validation before anything runs.
* :mod:`cais.sweep.store`: the results table on disk (atomic appends, resume).
* :mod:`cais.sweep.runner`: :func:`run_sweep`, local processes or Ray, progress bar.
"""
