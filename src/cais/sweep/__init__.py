"""Parallel parameter sweeps (stand-in for the sweep branch: serial, same contract)."""
