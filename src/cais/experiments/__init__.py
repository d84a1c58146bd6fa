"""Runnable experiments: collectives and GEMMs on a system, paper reproductions, sweeps."""
