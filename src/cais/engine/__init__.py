"""Discrete-event core: an integer-picosecond clock, an event queue, processes and
signals, serialising channels with virtual channels, and credit flow control.
Knows nothing of GPUs."""

from cais._core import ArrivePerGpu, Completion
from cais.engine.bound import Bound
from cais.engine.channel import Channel, Train
from cais.engine.credits import Credits
from cais.engine.sim import Countdown, Process, Signal, Simulator, TbPlan, all_of

__all__ = ["ArrivePerGpu", "Bound", "Channel", "Completion", "Countdown", "Credits", "Process", "Signal", "Simulator",
           "TbPlan", "Train", "all_of"]
