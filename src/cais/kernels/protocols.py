"""NCCL's three wire protocols for SM-driven collectives, as mechanisms.

A protocol decides how a ring step's data and its "the data is here" signal reach
the next GPU (NVIDIA/nccl ``src/include/device.h``, the line formats; docs/fabric-model.md,
"Protocols", gives the sources):

- **Simple**: the data in plain stores, then a memory fence (the stores' write
  responses come back) and a separate flag store. Full payload per byte on the
  wire, but a round trip and a flag packet per step.
- **LL** (low latency): every 16-byte line carries 8 bytes of data and two 4-byte
  flags written with it in one store, so the receiver sees data and flag together:
  no fence, no flag packet, half the wire's bytes are payload.
- **LL128**: 128-byte lines of 120 bytes of data and an 8-byte flag, stored by a warp
  at once (NVLink keeps a 128-byte store whole): no fence or flag packet, 120/128 of
  the wire's bytes are payload.

Each protocol also has NCCL's per-step payload per channel (its buffer of
``NCCL_STEPS`` = 8 slots divided by the line format). NVLS uses Simple only.
"""

from __future__ import annotations

from dataclasses import dataclass

from cais.errors import UserError


@dataclass(frozen=True)
class Protocol:
    """One wire protocol: ``line_bytes`` on the wire carry ``line_payload`` bytes of
    data; ``inline_flag``: the flag travels in the line (no fence, no flag store);
    ``step_bytes``: payload of one ring step of one channel (NCCL's buffer / 8)."""

    name: str
    line_bytes: int
    line_payload: int
    inline_flag: bool
    step_bytes: int

    @property
    def encoding(self) -> float:
        """Wire bytes per payload byte from the line format alone (before packet headers)."""
        return self.line_bytes / self.line_payload


#: NCCL: LL buffer 512 KiB of 16 B lines over 8 steps, half of them flags -> 32 KiB of data per step
LL = Protocol("ll", 16, 8, True, 32 * 1024)
#: NCCL: LL128 buffer 4,915,200 B of 128 B lines over 8 steps, 15/16 data -> 576,000 B per step
LL128 = Protocol("ll128", 128, 120, True, 576_000)
#: NCCL: Simple buffer 4 MiB over 8 steps -> 512 KiB per step (a config field: collective.ring_step_bytes)
SIMPLE = Protocol("simple", 1, 1, False, 512 * 1024)

PROTOCOLS = {p.name: p for p in (LL, LL128, SIMPLE)}
#: what a run may ask for: a protocol, or auto (NCCL's choice by size, kernels/tuning.py)
PROTOCOL_CHOICES = ("auto", *PROTOCOLS)


def protocol(name: str) -> Protocol:
    """The protocol called ``name``; UserError naming the valid ones."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise UserError(f"protocol: unknown '{name}'; valid: {', '.join(PROTOCOLS)}") from None
