"""The NVLink/NVSwitch fabric: for every GPU and every switch chip, an up channel
(GPU -> chip) and a down channel (chip -> GPU) carrying that GPU's links to that chip,
each with credits for the input buffer at its far end; the switch chips (of the
model the config names); and the address hash that decides which chip a transfer
crosses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cais._core import Interleave
from cais.engine import Channel, Credits, Simulator, Train
from cais.engine.channel import OnStart
from cais.config import PS_PER_NS, SystemConfig
from cais.hw.packets import Packetizer, VcMap
from cais.hw.switches import switch_model

if TYPE_CHECKING:
    from cais.hw.gpu import Gpu


class Fabric:
    """GPUs x switch chips, fully connected: GPU g reaches chip c over
    ``links_per_gpu[c]`` NVLinks, modelled as one port whose bandwidth is their sum.

    Routing is deterministic: a transfer unit's packets are interleaved over the GPU's
    links by address (see ``stripe``), and the link decides the chip, so the same
    bytes on every GPU meet in the same chip and each chip carries traffic in
    proportion to its links. The same offset in every GPU's buffer therefore meets
    in the same chip (required for NVLS and CAIS merging), and each chip receives
    traffic in proportion to its link count (5:4:4:5 on DGX-H100).
    """

    def __init__(self, sim: Simulator, cfg: SystemConfig, gpus: list["Gpu"], packetizer: Packetizer,
                 vcmap: VcMap, mirror: bool = False) -> None:
        self.sim = sim
        self.cfg = cfg
        self.gpus = gpus
        self.pk = packetizer
        self.vcmap = vcmap
        self.link_chip = [c for c, n in enumerate(cfg.switch.links_per_gpu) for _ in range(n)]
        lat = cfg.link_latency_ps
        vcs = cfg.link.vcs
        n, chips = cfg.gpus, cfg.switch.chips
        pipe = round(cfg.switch.pipeline_latency_ns * PS_PER_NS)
        back = cfg.credit_latency_ps
        # The credit loop of an input buffer: a byte crosses the link, (in a switch)
        # the pipeline, and its credit comes back.
        rtt_up, rtt_down = lat + pipe + back, lat + back

        model = switch_model(cfg.switch.model)

        def channel(name: str, chip: int, buffer: str, rtt: int, drains: bool) -> Channel:
            credits = Credits(buffer, vcs, cfg.vc_capacity_bytes(chip), back, drains, model.absorbs)
            return Channel(sim, name, cfg.port_ps_per_byte(chip), lat, vcs, False, credits, rtt)

        # Switch input buffers hold a train until its outputs take it (but for the
        # kinds a switch unit absorbs); GPU endpoints drain as trains arrive (and hold
        # only reads they cannot serve yet).
        self.up = [[channel(f"gpu{g}->sw{c}", c, f"sw{c}.in{g}", rtt_up, False) for c in range(chips)]
                   for g in range(n)]
        self.down = [[channel(f"sw{c}->gpu{g}", c, f"gpu{g}.in{c}", rtt_down, True) for g in range(n)]
                     for c in range(chips)]
        self.switches = [model(sim, c, self.down[c], gpus, packetizer, vcmap, cfg) for c in range(chips)]
        # Mirror mode: only GPU 0 runs a program; every switch output goes to GPU 0
        # (a train for GPU g stands for its image, the one GPU -g sends to GPU 0).
        # Exact only for a workload that every GPU runs alike, shifted by its index.
        self.mirror = mirror
        # NVLink's address interleave (compiled): how units spread over the links. In
        # mirror mode it counts the units of fewer packets than links: each GPU's go to
        # other chips (the start link hashes the address), so GPU 0's image does not
        # stand for the others' chip loads (docs/validation.md section 10).
        self.interleave = Interleave(self.link_chip, packetizer.maxp, mirror)
        for sw in self.switches:
            sw.mirror = mirror
        for g, gpu in enumerate(gpus):  # bind each GPU's ports: its up channels, into the chips' input ports
            gpu.connect(self.up[g], self.switches, packetizer.fmt.write_ack_flits)

    def stripe(self, unit_index: int, slots: int) -> list[tuple[int, int]]:
        """How a transfer unit of ``slots`` packets (or rows) spreads over the chips:
        (chip, slots) in the order its contiguous stripes take. Packets are dealt to
        the L links in turn, starting at a link chosen by a hash of the unit's index
        (so remainders do not always fall on the same links); a chip carries the
        packets of its links as one train."""
        return self.interleave.stripe(unit_index, slots)

    @property
    def uneven_units(self) -> int:
        """Units striped in mirror mode with fewer packets than links."""
        return self.interleave.uneven_units

    @property
    def uneven_packets(self) -> int:
        """The packets of those units."""
        return self.interleave.uneven_packets

    @property
    def mirror_packets(self) -> int:
        """The packets of all units striped in mirror mode."""
        return self.interleave.mirror_packets

    @property
    def injected(self) -> int:
        """Payload bytes put on the fabric by GPUs."""
        return sum(gpu.injected for gpu in self.gpus)

    def inject(self, train: Train, head: int | None = None, tail: int | None = None,
               on_start: OnStart | None = None) -> None:
        """Put a train on its source GPU's port to ``train.chip``. ``head``/``tail``
        default to now (the data is all ready); an SM pushing data at a finite rate
        passes later times. ``on_start`` runs when it goes on the wire."""
        self.gpus[train.src].inject(train, head, tail, on_start)

    def ack(self, gpu: int, write: Train) -> None:
        """Send the write response of a delivered write back to its issuer (it calls
        the write's ``fence`` there)."""
        self.gpus[gpu].ack(write)

    def stuck(self) -> list[str]:
        """What holds trains: channels with trains queued and switch input buffers
        with trains waiting for an output (for the forward-progress watchdog)."""
        out = [f"{ch.name} VC {vc}" for ch in self.channels() for vc, _, _ in ch.waiting()]
        for sw in self.switches:
            out.extend(sw.stuck())
        return out

    def channels(self) -> list[Channel]:
        return [ch for row in self.up for ch in row] + [ch for row in self.down for ch in row]

    def bytes_per_direction(self) -> tuple[list[int], list[int]]:
        """Wire bytes each GPU sent (up) and received (down), summed over chips."""
        up = [sum(ch.wire_bytes for ch in row) for row in self.up]
        down = [sum(self.down[c][g].wire_bytes for c in range(len(self.down))) for g in range(len(self.gpus))]
        return up, down
