"""Discrete-event core: an integer-picosecond clock, an event queue, processes and
signals, and serialising channels with virtual channels. Knows nothing of GPUs."""

from cais.engine.channel import Channel, Train
from cais.engine.sim import Countdown, Process, Signal, Simulator

__all__ = ["Channel", "Countdown", "Process", "Signal", "Simulator", "Train"]
