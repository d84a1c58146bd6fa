"""The HBM of one GPU as a shared resource: its achievable bandwidth is divided among
everything that reads or writes it at the same time.

Two kinds of users:

* **Kernel phases** (SM work): a GEMM tile's mainloop, a memory-bound kernel's TB.
  A TB program yields an :class:`HbmPhase` (how long it takes alone, how many bytes
  it moves through HBM in that time); the process that runs the TB (a
  :class:`~cais.engine.Process` given the GPU's share) turns it into a delay with
  :meth:`HbmShare.request`.
* **Streams** driven by the fabric and copy engines: data read to be sent (stores,
  reductions, DMA), data landing (writes; reductions read, add and write back), and
  remote reads and NVLS pulls being served. They are counted, not timed, in
  ``HbmShare.stream``; their rate is estimated over the last complete window
  (``stream_rate``).

Model (proportional share of a saturated memory controller): when phases start,
the demand is their own rates (bytes / time alone) plus the rates of the kernel
phases still running plus the stream rate. If that exceeds the calibrated achievable
bandwidth, every user gets the same fraction supply / demand of what it asks for
(requests queue in the same controller queues and see the same delay), so the phase
takes ``time_alone * demand / supply``. Below the supply nothing changes. As with
the busy-SM count of a GEMM tile, the state at a phase's start fixes its time (the
phases starting at one instant are timed together); a phase already running is not
re-timed when another starts, and streams are not
slowed (the NVLink side, at most 2 x 450 GB/s per GPU, is the bottleneck there).
Interference only changes time: no data path goes through this class.

Both classes are compiled (``rust/src/hbm.rs``): a phase is timed once per TB, and
the endpoint counts streams once per packet train.
"""

from cais._core import HbmPhase, HbmShare

__all__ = ["HbmPhase", "HbmShare"]
