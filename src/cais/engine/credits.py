"""Credit-based flow control for one input buffer, as its sender sees it.

The receiving end of a channel has one buffer per virtual channel (VC) of
``capacity`` bytes. The sender holds a credit per byte of free space: it may put a
train on the wire only if the credits cover it, and credits come back when the
receiver has passed the train on (its departure), one latency later. Trains stream
through the buffer and their credits come back as a linear ramp
(docs/fabric-model.md, "Flow control").

Compiled (``rust/src/credits.rs``); its documentation is on the class
(``help(Credits)``).
"""

from __future__ import annotations

from cais._core import Credits

__all__ = ["Credits"]
