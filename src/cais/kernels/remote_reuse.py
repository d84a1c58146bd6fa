"""How the TBs of one remote-load GEMM share the remote rows they read.

An AG-GEMM's A rows (a token-sharded activation) are read by every column tile of
the GEMM: 11 column tiles for FC1 in paper-llama-7b. Merging in the switch removes
the repeated upload from the home, not the repeated delivery to the requester. What
delivers each remote block to a GPU fewer times is a feature of the GPU that a real
kernel would use (docs/remote-access.md):

* ``reload``: nothing is shared; each TB streams its rows through its shared memory.
* ``l2``: the requesting GPU's L2 keeps the lines its TBs read from peers
  (``gpu.l2_keeps_peer_reads``, the paper's traffic model): a second request of the
  kernel joins the first, at no HBM cost.
* ``cluster``: thread-block clusters of ``cluster`` CTAs along the shared operand's
  other dimension, whose loads are TMA loads multicast into every CTA's shared
  memory: one remote read per cluster. A cluster is launched together, so the
  launch order keeps its CTAs adjacent, and they walk K in step.
* ``staged`` (the upper bound: no real kernel works so): the first TB of the GPU
  that needs a remote block pulls it into a local staging buffer; later TBs read the
  copy after an untimed local flag, and the copy takes no SM time. The copy costs
  HBM: the remote share of the operand is written once and the whole operand is
  read locally.
* ``copy-engine``, ``comm-sms`` (:attr:`RemoteReuse.copies`): what real kernels do
  instead, a copy stage (the copy engine, or copy TBs on some SMs) filling the local
  gathered tensor by chunk and a local GEMM waiting on per-chunk flags
  (kernels/remote_copy.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cais.config import SystemConfig
from cais.kernels.gemm import GemmShape

Tile = tuple[int, int]


@dataclass(frozen=True)
class RemoteReuse:
    """The reuse of remote operand rows among one GEMM's TBs on one GPU: the
    strategy (``reload``, ``l2``, ``cluster`` or ``staged``), the CTAs per cluster and
    whether clusters span column tiles (they share A rows) or row tiles (B)."""

    strategy: str
    cluster: int = 1
    along_n: bool = True

    @classmethod
    def of(cls, cfg: SystemConfig, loaded: Sequence[str]) -> RemoteReuse:
        """The reuse a system gives a GEMM that loads the operands ``loaded`` (``a``,
        ``b``) remotely: the L2's where it keeps peer reads, else ``remote_read``'s."""
        if cfg.gpu.l2_keeps_peer_reads:
            return cls("l2")
        rr = cfg.remote_read
        return cls(rr.strategy, rr.cluster_ctas if rr.strategy == "cluster" else 1, "a" in loaded)

    @property
    def shares(self) -> bool:
        """Whether a TB's remote load may serve other TBs."""
        return self.strategy != "reload"

    @property
    def copies(self) -> bool:
        """Whether a copy stage fills a local gathered copy that the GEMM reads
        (``copy-engine``, ``comm-sms``: kernels/remote_copy.py)."""
        return self.strategy in ("copy-engine", "comm-sms", "auto")

    @property
    def clusters(self) -> bool:
        return self.strategy == "cluster"

    def local_shares(self, loaded: Sequence[str], n: int) -> dict[str, float]:
        """Per loaded operand, the share of it in this GPU's HBM traffic
        (``tile_hbm_bytes``): its own rows (1/n), or with staging every row read from
        the GPU's own memory plus the remote share written there once."""
        share = 2.0 - 1.0 / n if self.strategy == "staged" or self.copies else 1.0 / n
        return {w: share for w in loaded}

    def _span(self, tile: Tile, shape: GemmShape) -> tuple[int, int, int]:
        """(cluster row, first index along the cluster, last + 1) of ``tile``'s cluster."""
        i, j = tile
        along, extent, fixed = (j, shape.tiles_n, i) if self.along_n else (i, shape.tiles_m, j)
        first = along - along % self.cluster
        return fixed, first, min(extent, first + self.cluster)

    def scope(self, tile: Tile, shape: GemmShape) -> int:
        """Which TBs share what ``tile`` loads: the kernel's (0) or its cluster's."""
        if not self.clusters:
            return 0
        fixed, first, _ = self._span(tile, shape)
        per = -(-(shape.tiles_n if self.along_n else shape.tiles_m) // self.cluster)
        return fixed * per + first // self.cluster

    def members(self, tile: Tile, shape: GemmShape) -> list[Tile]:
        """The tiles of ``tile``'s cluster (itself alone without clusters)."""
        if not self.clusters:
            return [tile]
        fixed, first, end = self._span(tile, shape)
        return [(fixed, a) if self.along_n else (a, fixed) for a in range(first, end)]

    def launch_order(self, order: list[Tile], shape: GemmShape) -> list[Tile]:
        """The kernel's launch order with each cluster's CTAs together, where its first
        CTA was in ``order`` (a cluster launches as one)."""
        if not self.clusters:
            return order
        out: list[Tile] = []
        seen: set[int] = set()
        for tile in order:
            key = self.scope(tile, shape)
            if key not in seen:
                seen.add(key)
                out += self.members(tile, shape)
        return out

    def leaders(self, order: list[Tile], shape: GemmShape) -> dict[Tile, int] | None:
        """Each tile's cluster's first launch index (the K step the cluster starts at
        is its first CTA's), or None without clusters."""
        if not self.clusters:
            return None
        first: dict[int, int] = {}
        for t, tile in enumerate(order):
            first.setdefault(self.scope(tile, shape), t)
        return {tile: first[self.scope(tile, shape)] for tile in order}
