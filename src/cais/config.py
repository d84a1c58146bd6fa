"""System description: every hardware number a user may change, typed and validated.

A *system* is GPUs + NVLink + NVSwitch chips. Presets live as JSON files in
``cais/data/systems/`` (``cais systems`` lists them); a user can also pass a path to
their own JSON file, which gives every field or names the preset it inherits the rest
from (``"base": "dgx-h100"``; docs/errors.md). Nothing in the simulator hard-codes a
DGX-H100 number: it reads them from a :class:`SystemConfig`. The field defaults below
serve code that builds a ``SystemConfig`` directly; files never fall back on them,
except for a field made with :func:`knob`: a setting added after the presets whose
default is the behaviour before it existed (``switch.merge.replacement``), which a file
may leave out, so that a new knob does not mean editing every preset.

Time in the simulator is integer picoseconds; the configs are written in the units
people quote (GB/s, ns, us) and converted by the helper properties here.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from cais._core import replacement_policies
from cais.errors import UserError, looks_like_path, validation_message

PS_PER_NS = 1_000
PS_PER_US = 1_000_000


def knob(default: Any, **kwargs: Any) -> Any:
    """A field a system file may leave out (it then has ``default``): a setting added
    after the presets (its description says what its default means). Otherwise a
    pydantic ``Field``."""
    return Field(default, json_schema_extra={"optional_in_files": True}, **kwargs)


def _optional_in_files(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get("optional_in_files") is True


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PacketFormat(_Strict):
    """NVLink packetisation: how many 16 B flits a request, a write or a response costs.

    The CAIS paper states one header flit per packet of at most 128 B. NVLink's own
    packet format also has an address-extension flit on requests and a byte-enable flit
    on writes (see docs/fabric-model.md); ``request_extra_flits`` and
    ``write_extra_flits`` express those and are 0 in the paper's format.
    """

    flit_bytes: int = Field(16, gt=0)
    max_payload_bytes: int = Field(128, gt=0)
    header_flits: int = Field(1, ge=0)
    request_extra_flits: int = Field(0, ge=0, description="extra flits on a read/ld_reduce request")
    write_extra_flits: int = Field(0, ge=0, description="extra flits on a write/st/red packet")
    write_ack_flits: int = Field(0, ge=0, description="flits of a per-packet write response (0: posted writes)")


class LinkConfig(_Strict):
    """One NVLink: bandwidth per direction, one-way latency, and the input buffers at
    its receiving end with their credit flow control (docs/fabric-model.md, "Flow
    control": why the default depth is 1024 flits)."""

    bandwidth_GBps: float = Field(25.0, gt=0, description="per link, per direction")
    latency_ns: float = Field(250.0, ge=0, description="GPU<->switch, one way")
    vcs: int = Field(8, ge=2, description="virtual channels per input port (half for requests, half for responses)")
    vc_depth_flits: int = Field(1024, gt=0, description="input buffer per VC per link (per port if buffer_scope=port)")
    buffer_scope: Literal["link", "port"] = Field(
        "link", description="link: every NVLink has its own buffers (a port holds links x depth); "
                            "port: one buffer per port of vc_depth_flits")
    vc_policy: Literal["class", "kernel", "one", "destination", "shared"] = Field(
        "class", description="class: a VC per traffic class (load, store, reduction, sync) within the request "
                             "and response sets; kernel: a VC per issuing kernel (its stream number); one: one "
                             "request VC and one response VC; destination: a VC per destination GPU (modulo the "
                             "set's VCs), a queue per output at every input; shared: everything on VC 0 (can "
                             "deadlock)")
    credit_latency_ns: float | None = Field(None, ge=0, description="one-way time of a credit return "
                                                                     "(default: latency_ns)")


class MergeConfig(_Strict):
    """The CAIS merge unit of one switch port (paper §III-A.2, §IV-A): a merging table
    of ``entries`` lines of ``line_bytes`` (320 x 128 B = 40 KB per port), looked up by
    a CAM on (address, type). The paper gives no idle timeout and no lookup latency;
    docs/cais.md gives the reasons for the defaults."""

    entries: int = Field(320, ge=0, description="merging-table lines per switch port (0: every request bypasses)")
    line_bytes: int = Field(128, gt=0, description="data bytes one entry holds (one NVLink packet's payload)")
    timeout_us: float = Field(20.0, gt=0, description="an entry idle this long is flushed (Reduction: its partial sum "
                                                      "goes home; Load-Ready: dropped)")
    latency_ns: float = Field(0.0, ge=0, description="CAM lookup and merge time added to a merged response or sum")
    lookups_per_ns: float | None = knob(None, gt=0, description="array access slots one port's unit starts per ns "
                                                                 "(clock x accesses per cycle): a ld.cais line and the "
                                                                 "home's load data line take one each, a red.cais line "
                                                                 "red_accesses; a request waits for the next free "
                                                                 "slot; null: no limit")
    red_accesses: int = knob(2, ge=1, description="access slots a red.cais line takes under lookups_per_ns: 2, the "
                                                  "read and the write of a one-port content array (its read-modify-"
                                                  "write); 1, a 1R1W array")
    cacti_node: Literal["22nm", "12nm", "7nm", "5nm"] | None = knob(
        None, description="take latency_ns, lookups_per_ns and red_accesses from the cost model of this table at this "
                          "node (the stored CACTI run, cais/data/cacti/merge_unit.json, scaled by bit cell, at "
                          "clock_GHz with cells, data_ports, accumulate and tables; docs/switch-cost.md): they "
                          "override what is set")
    cells: Literal["itrs-hp", "itrs-lstp"] = knob(
        "itrs-hp", description="with cacti_node: the arrays' devices, ITRS high-performance or low-standby-power "
                               "(the rate and the leakage both follow it)")
    clock_GHz: float = knob(1.5, gt=0, description="with cacti_node: the unit's pipeline clock, an assumption "
                                                   "(NVSwitch's is not published; docs/switch-cost.md shows 1-2 GHz)")
    data_ports: Literal["1rw", "1r1w"] = knob(
        "1rw", description="with cacti_node: the content array's ports, one read-write (a reduction takes two "
                           "slots) or one read and one write (one slot, a larger array)")
    accumulate: Literal["bf16", "fp32"] = knob(
        "bf16", description="with cacti_node: the partial sums' format (fp32: FP32 adders and twice the data bytes)")
    tables: Literal[1, 4] = knob(
        1, description="with cacti_node: tables per port (4: one per link, address-hashed, each with its own adders; "
                       "the rate x 4, the hash taken as even)")
    replacement: str = knob(
        "lru", description="which session is evicted when a new one needs lines: a policy of the core's registry "
                           "(cais._core.replacement_policies: lru, the one accessed longest ago, the paper's; fifo, "
                           "the one opened first); rust/src/hw/replacement/ has one file per policy")

    @field_validator("replacement")
    @classmethod
    def _a_policy_of_the_core(cls, name: str) -> str:
        """Only a policy the compiled core registers (its registry is the one list)."""
        names = replacement_policies()
        if name not in names:
            raise ValueError(f"Input should be {' or '.join(repr(n) for n in names)}")
        return name

    @model_validator(mode="before")
    @classmethod
    def _from_cacti(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("cacti_node") is not None:
            from cais.cost.merge_unit import preset_timing

            kinds = {"cells": str, "clock_GHz": float, "data_ports": str, "accumulate": str, "tables": int}
            opts = {k: f(data[k]) for k, f in kinds.items() if k in data}
            data = {**data, **preset_timing(str(data["cacti_node"]), **opts)}
        return data


class SwitchConfig(_Strict):
    """The NVSwitch chips: how many, how each GPU's links spread over them, and the
    in-switch compute (NVLS multicast/reduction, and the CAIS merge unit)."""

    chips: int = Field(4, gt=0)
    links_per_gpu: list[int] = Field(default_factory=lambda: [5, 4, 4, 5],
                                     description="NVLinks from each GPU to each chip")
    model: str = Field("auto", description="switch chip model (see hw/switches.py): nvls (NVLS only), cais (NVLS "
                                           "plus a merge unit per port), auto (cais for schemes that issue "
                                           "ld.cais/red.cais, else nvls)")
    pipeline_latency_ns: float = Field(0.0, ge=0, description="crossbar traversal added per switch hop")
    reduce_latency_ns: float = Field(0.0, ge=0, description="extra time of an in-switch reduction")
    reduce_GBps: float | None = Field(None, gt=0, description="operand bytes per second one chip's NVLS reduction "
                                                              "engine takes in (a multimem.ld_reduce over n GPUs "
                                                              "brings n operands); null: never the limit. A "
                                                              "calibration where set (docs/fabric-model.md, "
                                                              "\"The NVL72 rack\")")
    merge: MergeConfig = MergeConfig()

    @model_validator(mode="after")
    def _check_links(self) -> "SwitchConfig":
        if len(self.links_per_gpu) != self.chips:
            raise ValueError(f"links_per_gpu has {len(self.links_per_gpu)} entries; chips is {self.chips}")
        if any(n <= 0 for n in self.links_per_gpu):
            raise ValueError("links_per_gpu entries must be positive")
        return self


class InterferenceConfig(_Strict):
    """What co-running work on one GPU costs each other (docs/compute-model.md,
    "Interference"). SM sharing needs no switch: the TB dispatcher always places the
    TBs of co-running kernels on distinct SMs."""

    hbm: bool = Field(True, description="share the GPU's achievable HBM bandwidth among the kernel phases running "
                                        "on its SMs and the traffic its NVLink endpoint and copy engines move "
                                        "(false: every kernel has the HBM to itself, the behaviour before issue 9)")
    window_ns: float = Field(5000.0, gt=0, description="window over which fabric-side HBM traffic is turned into "
                                                       "a rate")
    mc_policy: Literal["share", "compute-first"] = Field(
        "share", description="memory-controller arbitration: share (every user gets the same fraction of what it asks "
                             "for) or compute-first (T3's MCA: requests from the SMs go first and fabric/DMA traffic "
                             "only fills what they leave, so kernel phases do not see it)")


class CopyEngineConfig(_Strict):
    """A GPU's copy (DMA) engine, as T3 uses it (kernels/dma.py): it moves data on no
    SM, so its limits are its own issue rate and the transfers it keeps in flight."""

    rate_GBps: float | None = Field(None, gt=0, description="bytes per second the engine issues (null: as fast as "
                                                            "the GPU's NVLinks, 18 x 25 GB/s on DGX-H100: T3 does "
                                                            "not model its DMA engine's internals)")
    window_kB: float = Field(4096.0, gt=0, description="bytes not yet delivered (or, for pulls, returned) the engine "
                                                       "keeps in flight")
    start_us: float = knob(0.0, ge=0, description="time the engine takes to start each command, one after another "
                                                  "(its descriptor fetched and set up before its first byte): 0 = "
                                                  "free, as T3 models its tracker-triggered engine; the H100 as "
                                                  "sold charges the copy-engine calibration (remote_read."
                                                  "copy_start_us, p2pBandwidthLatencyTest), as T3's engine is the "
                                                  "GPU's own (docs/schemes.md, \"What each scheme gets for free\")")


class GpuConfig(_Strict):
    """One GPU: SMs, memory and the fitted compute model it uses."""

    name: str = "H100-SXM"
    sms: int = Field(132, gt=0)
    hbm_bandwidth_GBps: float = Field(3350.0, gt=0, description="peak; memory-bound kernels use the calibrated efficiency")
    hbm_capacity_GB: float = Field(80.0, gt=0, allow_inf_nan=False,
                                   description="HBM per GPU (GB = 1e9 bytes, the datasheet figure: 80 for H100, "
                                               "141 for H200, 186 for a GB200 NVL72 GPU); a layer run whose "
                                               "per-GPU footprint (weights, KV cache, activations, optimizer "
                                               "state; docs/memory.md) exceeds it is refused")
    memory_latency_ns: float = Field(500.0, ge=0, description="time a GPU takes to serve a remote read")
    read_serve_kB: float = Field(1048576.0, gt=0, description="bytes of remote reads a GPU serves at once "
                                                              "(memory access, then the response waiting for the "
                                                              "link); more wait in its input buffer. 1 GiB by "
                                                              "default, never binding: coarse units put up to "
                                                              "256 MiB of NVLS pulls in flight per GPU "
                                                              "(docs/fabric-model.md)")
    kernel_launch_us: float = Field(3.0, ge=0)
    launch: Literal["fitted", "eager", "graph"] = knob(
        "fitted", description="how a layer's kernels reach the GPU (docs/compute-model.md, \"Launch modes\"): "
                              "fitted = each kernel's fixed cost is the compute model's fitted per-kernel overhead "
                              "(gemm_overhead_ns, mem_overhead_ns; kernel_launch_us for collectives), measured on "
                              "kernels of 27 us and more and extrapolated below: the paper's experiments; eager = "
                              "the framework's host thread issues every op (host_op_us, host_launch_us per extra "
                              "kernel of the op) and a kernel starts once its inputs are ready plus kernel_gap_us "
                              "and the host has issued it (the host runs ahead where kernels are longer than its "
                              "issue time); graph = a CUDA-graph replay: no host cost per op, kernel_gap_us between "
                              "dependent kernels, pdl_gap_us before a kernel its stack launches with programmatic "
                              "dependent launch. In eager and graph a kernel's own work is timed without the fitted "
                              "overhead (GEMM tiles, the memory-bound work, the collective's packets)")
    tb_launch: Literal["on-ready", "on-launch"] = knob(
        "on-ready", description="when a thread block whose first step waits (for data landed, a flag, its TB group's "
                                "release) is placed on an SM: on-ready = once what it waits for is there, as CAIS's "
                                "paper launches its consumer TBs (section III-C.1) and as a dataflow runtime with a "
                                "ready queue would (every scheme alike); on-launch = in launch order as SMs free, "
                                "then it waits holding its SM (a plain CUDA grid spinning on flags). "
                                "docs/compute-model.md, \"Launch on ready\"")
    kernel_gap_us: float = knob(2.0, ge=0, description="launch=eager|graph: time from a kernel's last input ready to "
                                                       "its first TB on one stream when it is already queued (a CUDA "
                                                       "graph's dependent kernel, or the host ahead): ~1-2 us on "
                                                       "H100 (SGLang PR #2904 and NVIDIA/nccl #1984 measurements, "
                                                       "docs/compute-model.md, \"Launch modes\"); chosen within that "
                                                       "range on the decode step's fit row (Llama-3-70B at TP 8, "
                                                       "scripts/fit_production.py): its high end, the error still "
                                                       "falling there (flagged in production_fit.json's at_edge)")
    pdl_gap_us: float = knob(0.5, ge=0, description="launch=eager|graph: the same gap before a kernel launched with "
                                                    "programmatic dependent launch (its prologue overlaps the "
                                                    "previous kernel's tail): less than kernel_gap_us; 0.5 us is an "
                                                    "assumption (the sensitivity runs 0 to kernel_gap_us)")
    host_op_us: float = knob(5.0, ge=0, description="launch=eager: host time to issue one framework op (Python "
                                                    "dispatch, argument checks, the first launch): ~4-6 us per op "
                                                    "(SGLang PR #2904, eager custom all-reduce vs NCCL timings)")
    host_launch_us: float = knob(4.5, ge=0, description="launch=eager: host time of each further kernel launch of "
                                                        "the same op (a copy into a registered buffer, a copy out): "
                                                        "~4-5 us per launch (NVIDIA/nccl #1984)")
    split_gemms: bool = knob(True, description="split a GEMM of less than half a wave of output tiles over more "
                                               "CTAs (split-K / stream-K) as CUTLASS's Hopper stream-K heuristic "
                                               "does, with the fitted fix-up; false: one CTA per tile over the "
                                               "whole K, the model before splits (docs/compute-model.md, "
                                               "\"Split-K and stream-K\")")
    small_kernel_us: float = knob(1.7, ge=0, description="launch=eager|graph, decode: device time of a small "
                                                         "memory-bound kernel beyond its bytes (a norm, rotary, the "
                                                         "KV-cache write, the activation, the step's tail kernels): "
                                                         "SGLang PR #32994 on H100, the fused RMSNorm of 512 x 4096 "
                                                         "in 3.78 us, its 2.1 us of bytes at the calibrated HBM rate "
                                                         "taken off (docs/compute-model.md, \"The decode step\")")
    attn_decode_floor_us: float = knob(11.0, ge=0, description="launch=eager|graph: a decode attention kernel's time "
                                                                "with an empty KV cache: the intercept of FA3's "
                                                                "paged decode on H100 under a CUDA graph "
                                                                "(Dao-AILab/flash-attention #1572, three rows, "
                                                                "least squares; docs/compute-model.md)")
    attn_decode_bw_fraction: float = knob(0.63, gt=0, le=1, description="launch=eager|graph: the KV-cache read rate "
                                                                        "of decode attention as a fraction of the "
                                                                        "calibrated HBM rate: 1.88 TB/s of FA3's "
                                                                        "paged decode on H100 (the slope of the same "
                                                                        "fit) over 3.0 TB/s")
    sm_copy_bandwidth_GBps: float = Field(200.0, gt=0,
                                          description="data one SM can move through its load/store path")
    compute_model: str = Field("h200", description="name of the calibration the GEMM model is fitted to")
    l2_keeps_peer_reads: bool = Field(False, description="the requesting GPU's L2 keeps lines its TBs read from "
                                                         "peers, so the TBs of one kernel that read the same remote "
                                                         "lines fetch them once (LADM and CAIS loads; "
                                                         "docs/cais.md)")
    remote_outstanding_kB: float | None = Field(
        None, gt=0, description="remote SM requests (loads awaiting their data, reductions not yet acknowledged) "
                                "one GPU keeps outstanding over all its SMs, on top of each SM's window; null: the "
                                "bandwidth-delay product of its NVLink ports (their bandwidth x an unloaded remote "
                                "read's round trip). The CAIS paper (section V-C) states 1,280 KB for DGX-H100")
    interference: InterferenceConfig = InterferenceConfig()
    copy_engine: CopyEngineConfig = CopyEngineConfig()


class CollectiveConfig(_Strict):
    """How NCCL-like collective kernels are launched."""

    ring_channels: int = Field(16, gt=0, description="SMs (one TB each) a ring collective uses")
    nvls_channels: int = Field(16, gt=0, description="SMs an NVLS collective uses")
    ring_step_bytes: int = Field(512 * 1024, gt=0, description="bytes per ring step per channel (NCCL Simple slot)")
    ring_slots: int = Field(8, gt=0, description="ring buffer slots per channel (NCCL_STEPS)")
    outstanding_bytes_per_sm: int = Field(64 * 1024, gt=0,
                                          description="in-flight loads (ld_reduce) one SM can keep")
    ll_channel_GBps: float = Field(8.8, gt=0, description="payload one channel (SM) moves in the LL protocol: its "
                                                          "poll-and-store loop on 16-byte lines, not the wire, "
                                                          "limits it (NCCL's LL cap of 141 GB/s on sm90 over 16 "
                                                          "channels; kernels/protocols.py)")
    ll128_channel_GBps: float = Field(36.7, gt=0, description="payload one channel moves in LL128 (NCCL's "
                                                               "per-channel LL128 cap, sm90)")
    host_us: float = Field(0.0, ge=0, description="the host's cost of one standalone NCCL call before its data "
                                                  "moves (enqueue, launch, kernel prologue beyond "
                                                  "gpu.kernel_launch_us): on the critical path of back-to-back "
                                                  "calls (nccl-tests), hidden inside a layer where the host runs "
                                                  "ahead; a calibration (docs/fabric-model.md, \"Protocols\")")
    nvls_buffers: Literal["registered", "staged"] = Field(
        "registered", description="how an NVLS AllReduce reaches the user's buffers when NCCL runs it (standalone "
                                  "calls, a layer's calls with layer_choice=nccl, and tp-nccl's): registered = zero-copy on "
                                  "them; staged = through NCCL's own multicast buffers in a pipeline of steps, "
                                  "as without user-buffer registration (nccl-tests); kernels/nvls_staged.py")
    nvls_chunk_bytes: int = Field(131072, gt=0, description="largest step of a staged NVLS AllReduce per channel "
                                                            "per head (NCCL_NVLS_CHUNKSIZE); smaller buffers use "
                                                            "NCCL's 64/32/16 KiB")
    nvls_copy_GBps: float = Field(18.0, gt=0, description="rate of one channel's staging copies in a staged NVLS "
                                                          "AllReduce (its copy warps' loads in flight over the "
                                                          "memory latency); a calibration (docs/fabric-model.md)")
    nvls_copy_step_us: float = Field(0.0, ge=0, description="fixed cost of each step of one channel's staging copy "
                                                             "in a staged NVLS AllReduce, scatter and gather alike, "
                                                             "on top of step bytes / nvls_copy_GBps: the copy warps' "
                                                             "first loads waiting out the memory latency, the "
                                                             "system-scope fence after their stores and the flag "
                                                             "store (NCCL prims_simple.h). A calibration, with "
                                                             "nvls_copy_GBps: least squares on the dgxc 8 x H100 "
                                                             "table's 2-8 MiB and 64 MiB-2 GiB points, checked on "
                                                             "16-32 MiB and across systems on the OCI GB200 two-tray "
                                                             "table at 4-128 MiB (docs/validation.md, \"Collectives "
                                                             "at the sizes TP layers issue\"); 0 on the paper's "
                                                             "presets")
    layer_choice: Literal["scheme", "nccl"] = Field("scheme", description="the protocol of a layer's collectives; "
                                                                    "the algorithm is always the one the scheme "
                                                                    "names (forced, as NCCL_ALGO forces it): "
                                                                    "scheme = the Simple protocol; nccl = NCCL's "
                                                                    "protocol by size for that algorithm, as a "
                                                                    "real call runs it (a ring at decode sizes "
                                                                    "goes LL; NVLS runs Simple only). tp-nccl and "
                                                                    "sp-nccl run NCCL's own algorithm and protocol "
                                                                    "by size with either value")
    ring_launch: Literal["fixed", "nccl"] = Field(
        "fixed", description="how many channels and threads a ring collective runs: fixed = ring_channels at every "
                             "size, each LL/LL128 channel at its full rate; nccl = NCCL's launch by size "
                             "(enqueue.cc topoGetAlgoInfo): below channels x threads x NCCL's per-thread threshold "
                             "(64 B per thread for Ring LL on 8 GPUs) it drops channels, then halves one channel's "
                             "threads, so an 8-GPU LL AllReduce of 8-32 KiB runs on one SM, 128 KiB on 4; an LL or "
                             "LL128 channel's rate (ll_channel_GBps, ll128_channel_GBps, at NCCL's most threads) "
                             "scales with its threads, and a step's first line per thread goes at ll_wave_GBps. NCCL's "
                             "rule, not fitted (kernels/tuning.py ring_launch). The Hopper presets as sold run nccl "
                             "(dgx-h100 8 KiB-1 MiB within -5 to +2 %); the paper's presets and nvl72 keep fixed "
                             "(docs/validation.md, \"Collectives at the sizes TP layers issue\")")
    ll_wave_GBps: float = Field(14.0, gt=0, description="ring LL with ring_launch=nccl: payload rate at which one "
                                                         "channel's SM stores a step's first wave of lines (one "
                                                         "16-byte line, 8 B of data, per thread) to the next GPU; the "
                                                         "lines beyond one per thread follow at ll_channel_GBps x "
                                                         "threads / 512 (prims_ll.h: one line per thread per "
                                                         "iteration). A calibration: least squares on the dgxc 8 x "
                                                         "H100 table's 8-32 KiB points (one channel), checked on 64 "
                                                         "KiB-1 MiB (docs/validation.md, \"Collectives at the sizes TP "
                                                         "layers issue\")")
    poll: Literal["oracle", "spin"] = Field(
        "oracle", description="how a staged NVLS AllReduce's warps wait for a step counter (kernels/nvls_staged.py): "
                              "oracle = one poll issued once the value it waits for is there (multimem.ld_reduce."
                              "min round trip for the reduce warps, nothing for the local flags); spin = as NCCL's "
                              "waitPeer loop does it: polls back to back from when the warp starts waiting, the "
                              "wait ending with the first poll whose read reaches the flag after it landed (a "
                              "multimem poll's read at half its simulated round trip; a local ld.volatile poll "
                              "of gpu.memory_latency_ns), a value a past poll already read needing none. NCCL's "
                              "mechanism, nothing fitted")
    fence_us: float = knob(1.25, ge=0, description="a production all-reduce kernel's release/acquire flag barrier "
                                                  "at system scope (st.release.sys / ld.acquire.sys): its cost "
                                                  "beyond the flags' packets: vLLM's two-shot between its stages, "
                                                  "the fused two-shot's (kernels/production_ar.py). Sourced at "
                                                  "0.5-2 us (vLLM PRs #8558 and #8690, torchcomms #3325); "
                                                  "fitted within that range (scripts/fit_production.py, "
                                                  "docs/validation.md)")
    custom_window: Literal["threads", "sm"] = knob(
        "threads", description="the loads one block of vLLM's custom all-reduce keeps in flight "
                               "(kernels/production_ar.py): threads = as its kernel runs them, one 16-byte packet "
                               "per peer per thread of its 512 ((n - 1) x 8 KiB), at most "
                               "outstanding_bytes_per_sm; sm = outstanding_bytes_per_sm (the model before the "
                               "kernel's loop was read)")
    release_drain: bool = knob(True, description="vLLM's two-shot: its release between the stages first waits for "
                                                 "the block's last stage-1 sums to be written (the last window's "
                                                 "stores at the block's share of HBM bandwidth), beyond fence_us")
    multimem_sync_us: float = knob(2.5, ge=0, description="PyTorch symmetric memory's cross-GPU syncs "
                                                          "(sync_remote_blocks: put_signal / wait_signal on the "
                                                          "signal pads at system scope, acquire at the start, "
                                                          "release at the end) in the multimem all-reduce: their "
                                                          "cost beyond the packets, charged at the closing sync. "
                                                          "Calibrated on published measurements "
                                                          "(scripts/fit_production.py, docs/validation.md)")
    fused_fixed_us: float = knob(5.5, ge=0, description="the fused all-reduce + norm kernel's own fixed time beyond "
                                                        "its data movement (the Lamport poll's detection, the norm's "
                                                        "cluster-wide reductions, the PDL dependency wait). "
                                                        "Calibrated on published measurements "
                                                        "(scripts/fit_production.py, docs/validation.md)")
    tuning: Literal["sm90", "sm100"] = Field("sm90", description="NCCL's tuning table that chooses algorithm and "
                                                                 "protocol by size when a run asks for auto "
                                                                 "(kernels/tuning.py): sm90 Hopper, sm100 Blackwell")


class CaisConfig(_Strict):
    """What CAIS's coordination and dataflow optimizer use that the paper leaves open
    (paper §III-B, §III-C; docs/cais.md, part 2, gives the reasons)."""

    sync_entries: int = Field(256, gt=0, description="Group Sync Table entries per switch chip (TB groups being "
                                                      "synchronised at once); a sync request that finds it full "
                                                      "waits in its input buffer")
    sync_timeout_us: float | None = knob(None, gt=0, description="a Group Sync Table entry's timeout: a TB group "
                                                                 "not complete this long after its first member "
                                                                 "registered releases the members it has, and later "
                                                                 "members go at once (null: never). As the merge "
                                                                 "table's timer does for throttling, it makes the "
                                                                 "syncs delay TBs but never deadlock them (a group "
                                                                 "whose members cannot all start because each GPU's "
                                                                 "SMs hold other groups' TBs). Off on the presets: "
                                                                 "CAIS's TBs are placed in one order on every GPU "
                                                                 "(hw/group_sync.py), which already rules that out; "
                                                                 "20 us would match switch.merge.timeout_us")
    pre_launch_sync: bool = Field(True, description="coordination: each TB registers with its TB group before it "
                                                    "starts (off: only for Fig. 13(b)'s step-by-step skew)")
    pre_access_sync: bool = Field(True, description="coordination: each TB registers again before its first "
                                                    "mergeable access (off: only for Fig. 13(b)'s steps)")
    pre_access_overlap: bool = knob(True, description="coordination: the pre-access registration goes out as the TB "
                                                      "starts and the TB waits for its release only before its first "
                                                      "remote access, its latency hidden behind the mainloop (the "
                                                      "paper, section III-B.2: hidden by independent instructions); "
                                                      "false: it registers there and waits at once")
    throttle_quorum: float = Field(0.5, ge=0, le=1, description="TB-aware throttling: a mergeable request is "
                                                                "acknowledged to its TB once this fraction of its "
                                                                "session's expected requesters has arrived (0: off)")
    outstanding_kB: float = Field(64.0, gt=0, description="mergeable request bytes a coordinated TB keeps "
                                                          "unacknowledged")
    spread: bool = Field(True, description="merging-aware TB scheduling: the coordinated variants launch the "
                                           "tiles of GEMM-RS and AG-GEMM in an owner-interleaved order, so the "
                                           "running TB groups spread over every home GPU (opt/tb_order.py); off: "
                                           "CUTLASS's row raster")
    bands: int = Field(2, gt=0, description="merging-aware TB scheduling: the fewest bands the owner-interleaved "
                                            "order cuts a GEMM's row tiles into (a band holds at most one row "
                                            "tile per owner), so that the fused chain's LN row blocks and "
                                            "AG-GEMM tiles can start once the GEMM-RS's first band is done "
                                            "(1: bands of one row tile per owner only, whole-GEMM bands where "
                                            "there are no more row tiles than GPUs)")
    request_kB: float = Field(32.0, gt=0, description="bytes of one ld.cais / red.cais as a TB issues it (the "
                                                      "ISA's transfer unit for mergeable accesses; its share of "
                                                      "one chip is one merge session)")
    split: Literal["auto", "work", "none"] | float = Field(
        "auto", description="asymmetric kernel overlap: the share of SMs for the GEMM-RS group; auto = the dataflow "
                            "optimizer chooses per sub-layer between work and none from the calibrated GEMM times, "
                            "the least link time of each direction and the pipeline's fill and drain "
                            "(opt/fusion.py, choose_split); work = in proportion to the two GEMMs' calibrated times; "
                            "none = both GEMMs on every SM, the GEMM-RS's tiles first; or a fraction in (0, 1)")


#: the smallest copy chunk (kB): one 128 B line
MIN_CHUNK_KB = 0.125


class RemoteReadConfig(_Strict):
    """How the TBs of one GEMM that read the same remote rows (the column tiles of an
    AG-GEMM, or of any GEMM whose operand is a token-sharded activation) get them:
    a software strategy of the remote-load kernels (LADM, CAIS-Base, CAIS and its
    variants), built on a feature the GPU has (docs/remote-access.md). Where
    ``gpu.l2_keeps_peer_reads`` is true the L2 shares them whatever the strategy."""

    strategy: Literal["reload", "cluster", "staged", "copy-engine", "comm-sms", "auto"] = Field(
        "reload", description="reload: every TB loads its remote rows itself (a mainloop streams them through "
                              "shared memory; nothing keeps them); cluster: TB clusters of cluster_ctas CTAs along "
                              "the shared operand's other dimension, whose remote loads are TMA loads multicast "
                              "into every CTA of the cluster (one remote read per cluster); staged (an upper "
                              "bound: no real kernel works so): the first TB of a GPU that needs a remote block "
                              "pulls it into a local staging buffer in HBM (written once, read by every TB that "
                              "needs it; the pulls are ld.cais where the scheme merges), the others wait on an "
                              "untimed local flag and the copy takes no SM time; copy-engine: the GPU's copy "
                              "engine pulls each owner's rows into the local gathered copy in chunks of "
                              "copy_chunk_kB (plain reads: a copy engine cannot merge), each chunk once its rows "
                              "are ready, and the GEMM's tiles wait on a flag per chunk they read (CUTLASS's "
                              "Distributed GEMM, PyTorch's async TP); comm-sms: comm_sms SMs of the GEMM's run "
                              "copy TBs that load the rows (ld.cais where the scheme merges) and store them into "
                              "the local gathered copy, flagging each chunk; the GEMM runs on the other SMs; "
                              "auto: each copy as an implementer would run it: copy-engine whole shards where "
                              "the rows are ready at the GEMM's launch, comm-sms on signalled_comm_sms SMs in "
                              "signalled_chunk_kB chunks where a producer signals them block by block "
                              "(docs/remote-access.md)")
    cluster_ctas: int = Field(2, ge=2, le=16, description="CTAs per thread-block cluster (strategy cluster): "
                                                          "Hopper allows 8 portably and 16 with the non-portable "
                                                          "opt-in; a cluster's CTAs are co-scheduled on one GPC")
    copy_chunk_kB: float = Field(0.0, ge=0, description="copy-engine and comm-sms: bytes of one owner's rows one "
                                                        "copy moves and flags (whole rows; 0: the owner's whole "
                                                        "shard, as CUTLASS's Distributed GEMM and PyTorch's async "
                                                        "TP copy it)")
    signalled_chunk_kB: float = knob(512.0, ge=0, description="copy-engine and comm-sms: bytes of one owner's "
                                                                "rows one copy moves and flags where a producer "
                                                                "signals the rows block by block (CAIS's fused "
                                                                "pipeline): whole rows, about the signalled blocks "
                                                                "gathered up to this; 0: whole shards, waiting for "
                                                                "the owner's last block")
    signalled_comm_sms: int = knob(8, gt=0, description="auto: SMs of a fused pipeline's GEMM set that copy the "
                                                         "rows a producer signals (at most half the set); 8 was "
                                                         "the best of 4, 6, 8, 12 and 16 on paper-llama-7b "
                                                         "(docs/remote-access.md, \"The as-sold rule\")")
    copy_start_us: float = Field(2.8, ge=0, description="copy-engine: time a copy takes to start, from its trigger "
                                                        "(its rows ready) or from the engine's previous copy, "
                                                        "whichever is later, to its first byte issued. A calibration: the CUDA sample "
                                                        "p2pBandwidthLatencyTest's P2P=Enabled latency of a "
                                                        "cudaMemcpyPeerAsync on an 8-GPU NVSwitch HGX A100 is "
                                                        "2.7-3.3 us (no H100 matrix found in the sources searched; "
                                                        "docs/remote-access.md). A host-submitted cudaMemcpyAsync "
                                                        "costs 5-7 us more on the host (DualPath, arXiv "
                                                        "2602.21548), hidden where the host runs ahead")
    copy_GBps: float | None = Field(376.0, gt=0, description="copy-engine: the rate at which a GPU's copy "
                                                             "engine issues a peer copy. A calibration: "
                                                             "p2pBandwidthLatencyTest's unidirectional P2P "
                                                             "bandwidth (copy engine) on an HGX H100 is 371-377 "
                                                             "GB/s per pair (NVIDIA/nccl issue #1264); null: "
                                                             "gpu.copy_engine.rate_GBps (T3's, link-limited)")
    comm_sms: int = Field(16, gt=0, description="comm-sms: SMs of a GEMM's SM set that run its copy TBs (at most "
                                                "half the set); 16 = the channels (one SM each) NCCL's ring and "
                                                "NVLS kernels use here (collective.ring_channels, "
                                                "nvls_channels)")

    @field_validator("copy_chunk_kB", "signalled_chunk_kB")
    @classmethod
    def _a_chunk_holds_a_line(cls, v: float) -> float:
        """A chunk is 0 (whole shards) or at least one 128 B line, the smallest transfer
        (a chunk under one row is one row)."""
        if 0 < v < MIN_CHUNK_KB:
            raise ValueError(f"{v:g} kB is below one 128 B line ({MIN_CHUNK_KB:g} kB), the smallest copy; use 0 "
                             f"(whole shards) or at least {MIN_CHUNK_KB:g}")
        return v


#: how a weight gradient gets a gathered operand: its source (a kept copy, or fetched
#: again) and where it runs (in program order, or overlapped with the work around it)
WGRAD_POLICIES = ("scheme", "keep", "keep-overlap", "refetch", "refetch-overlap")
WgradPolicy = Literal["scheme", "keep", "keep-overlap", "refetch", "refetch-overlap"]


class TrainConfig(_Strict):
    """How the backward pass feeds each weight-gradient GEMM the operand it reads
    gathered over all token rows, when activations are sequence-parallel between the
    GEMMs (docs/schemes.md, "Weight gradients"). Two operands are gathered: the
    forward *inputs* of the column-parallel GEMMs (the normed activations QKV and FC1
    read, whose weight gradients need them again) and the output *gradients* of the
    row-parallel GEMMs (what the output projection's and FC2's dgrad and wgrad both
    read). Basic TP (no SP) holds both whole on every GPU: nothing to choose.

    Each is ``scheme`` (the scheme's own, sourced on its page), or a source and a
    placement: ``keep`` (a gathered copy made when the rows were first gathered is
    kept: a collective's output, or the rows a remote-load AG-GEMM wrote to local HBM
    as it loaded them) or ``refetch`` (gathered again: an AllGather kernel, or the
    weight-gradient GEMM's own remote loads); plain (in program order, after the
    sub-layer) or ``-overlap`` (beside the work around it: the re-gather beside the
    dgrad GEMM, as Megatron-LM's asynchronous all-gather runs; a remote-load scheme's
    weight-gradient GEMM launched on a low-priority stream beside the dgrad sub-layer
    (inputs) or what follows it (gradients))."""

    wgrad_inputs: WgradPolicy = Field(
        "scheme", description="the forward inputs of QKV and FC1: keep = the forward's gathered copy stays until the "
                              "backward (the memory check counts it for every layer); refetch = gathered again after "
                              "the dgrad sub-layer; -overlap = beside it (see the section's description)")
    wgrad_grads: WgradPolicy = Field(
        "scheme", description="the gathered output gradients of the output projection and FC2 (read by their dgrad "
                              "and wgrad): keep = the dgrad's gathered copy serves the wgrad; refetch = the wgrad "
                              "GEMM loads them again (remote-load schemes); -overlap = beside what follows the "
                              "sub-layer (remote-load schemes)")


#: the serving stacks whose decode step is modelled beyond the layer's kernels (DecodeConfig.stack)
DECODE_STACKS = ("generic", "vllm-0.6")
DecodeStack = Literal["generic", "vllm-0.6"]


class DecodeConfig(_Strict):
    """The decode step as a serving stack runs it around the layer's kernels
    (experiments/token.py; docs/compute-model.md, "The decode step"): what a stack
    adds per layer and per token, and the batch its CUDA graph runs.

    ``stack`` ``generic`` is the step every stack runs (the layer's kernels; the tail's
    embedding, final norm, lm_head, logits all-gather and a greedy sampler's cast and
    arg-max). ``vllm-0.6`` is vLLM 0.6.x's multi-step decode as its v0.6.1 source runs
    it: the FlashAttention backend copies the attention's output into the layer's
    tensor (a kernel per layer), the CUDA-graph runner copies five inputs into the
    graph's buffers before each replay, the logits processor prunes the hidden rows
    (``index_select``) and gathers the vocabulary shards to the driver (a gather and a
    concatenation), the greedy sampler runs eight kernels (cast, temperature division,
    softmax, log-softmax, an index cast, a row gather, arg-max, an index put), and the
    multi-step runner advances the step's inputs on the GPU (``advance_step``)."""

    stack: DecodeStack = knob("generic", description="the serving stack whose decode step is modelled: generic = "
                                                     "the kernels every stack runs; vllm-0.6 = vLLM 0.6.x's "
                                                     "multi-step decode (the section's description)")
    graph_padding: bool = knob(True, description="launch=graph, decode: the CUDA graph runs the batch padded up to "
                                                 "the next captured size (1, 2, 4, then multiples of 8 to 256, then "
                                                 "of 16 to 512), as vLLM 0.6 (_BATCH_SIZES_TO_CAPTURE), vLLM V1 "
                                                 "(vllm/config/vllm.py) and SGLang (cuda_graph_runner.py) capture "
                                                 "and pad; the layers, embedding and final norm run at the padded "
                                                 "batch, the lm_head, logits and sampler at the real one; false = "
                                                 "every batch its own graph")


#: the routings a MoE layer run may draw (cais.workload.routing's seeded generators)
MOE_ROUTINGS = ("uniform", "powerlaw", "lognormal")
MoeRouting = Literal["uniform", "powerlaw", "lognormal"]
MoeDispatchDtype = Literal["bf16", "fp8"]
MoeExpertDtype = Literal["bf16", "fp8"]
MoeCapacity = Literal["none", "drop", "pad"]
#: how a MoE layer times multi-head latent attention (MoeConfig.mla_timing)
MLA_TIMINGS = ("mha", "mla")
MlaTiming = Literal["mha", "mla"]


class MoeConfig(_Strict):
    """How the tokens of a MoE layer run pick their experts (``cais run`` on a MoE
    model; docs/moe.md, "MoE layers under cais run"): the seeded generator of
    :mod:`cais.workload.routing` the layer path draws its period's routing from, with
    its seed and skew, the capacity that bounds each GPU's rows to one expert (dropped
    or padded past it), and the dtype its forward dispatch sends. Not hardware: a run
    setting, as ``train`` is, set with ``--set moe.routing=powerlaw``; a dense model's
    run ignores it. The defaults are the layer path's before this section existed
    (DeepEP's tests' uniform draw, the run's seed, no capacity, BF16). ``mla_timing``
    says how an MLA model's attention is timed: the MHA stand-in (default) or MLA's own
    ops (cais.workload.mla; docs/moe.md, "MLA timed as MLA")."""

    routing: MoeRouting = knob("uniform", description="uniform (DeepEP's tests' draw, group-limited where the model "
                                                      "is), powerlaw (expert popularity ~ rank ** -alpha) or "
                                                      "lognormal (popularity exp(sigma * randn))")
    seed: int | None = knob(None, ge=0, description="the routing's seed; null: the run's seed (0 unless given)")
    alpha: float = knob(1.2, ge=0, description="routing=powerlaw: the exponent (1.2, as the kernel-level in-switch "
                                               "ladder draws it; 0 is uniform popularity)")
    sigma: float = knob(1.0, ge=0, description="routing=lognormal: the spread of the log popularity")
    dispatch_dtype: MoeDispatchDtype = knob("bf16", description="the forward dispatch's payload: bf16 (the model's "
                                                                "dtype) or fp8 (1 B per element plus one FP32 scale "
                                                                "per 128, as DeepEP sends it; kernels that take it "
                                                                "only); combine and the backward's exchanges stay "
                                                                "bf16")
    expert_dtype: MoeExpertDtype = knob("bf16", description="the routed experts' grouped GEMMs' operands: bf16 "
                                                            "(the model's dtype) or fp8 (DeepGEMM's FP8 grouped "
                                                            "GEMMs with the weights in FP8, as DeepSeek-V3 ships "
                                                            "them; in inference, behind an fp8 dispatch)")

    mla_timing: MlaTiming = knob("mla", description="an MLA model's attention (DeepSeek-V2/V3): mha = the stand-in "
                                                     "the results before MLA's own ops ran, MHA of heads x (nope + "
                                                     "rope) with heads K/V heads; mla = MLA's own ops as SGLang runs "
                                                     "them (replicated qkv_a, latent norms, q_b; kv_b and MHA widths "
                                                     "192/128 in prefill and train; absorbed q/v and MQA over the "
                                                     "latent cache in decode: docs/moe.md, Models); a dense or "
                                                     "non-MLA model ignores it")
    capacity_factor: float | None = knob(None, gt=0, allow_inf_nan=False,
                                         description="each expert's capacity from one rank: ceil(F x tokens x top-k "
                                                     "/ experts) rows (Megatron-Core's moe_expert_capacity_factor); "
                                                     "null: no limit")
    capacity: MoeCapacity = knob("none", description="past capacity: none (with a capacity_factor: drop, as Megatron "
                                                     "drops whenever the factor is set), drop (the selections past "
                                                     "it, in token order) or pad (drop, and fill every expert up to "
                                                     "capacity: moe_pad_expert_input_to_capacity); drop and pad "
                                                     "need a capacity_factor")

    @model_validator(mode="after")
    def _check_capacity(self) -> MoeConfig:
        if self.capacity != "none" and self.capacity_factor is None:
            raise ValueError(f"moe.capacity: '{self.capacity}' needs moe.capacity_factor (a positive number); "
                             "allowed without one: none")
        return self

    def capacity_mode(self) -> str:
        """The capacity the routing runs: ``capacity``, except that a factor with
        ``none`` drops (Megatron-Core drops whenever ``moe_expert_capacity_factor`` is
        set and pads only with ``moe_pad_expert_input_to_capacity``)."""
        return "drop" if self.capacity == "none" and self.capacity_factor is not None else self.capacity

    def generator_kwargs(self) -> dict[str, float]:
        """The skew parameter :func:`cais.workload.routing.generate` takes for this routing."""
        return {"alpha": self.alpha} if self.routing == "powerlaw" else \
            {"sigma": self.sigma} if self.routing == "lognormal" else {}


class SystemConfig(_Strict):
    """A whole NVLink/NVSwitch system: GPUs, links, switch chips, collectives, and the
    transfer unit the network moves."""

    name: str
    description: str = ""
    gpus: int = Field(8, ge=2)
    scalable: bool = Field(False, description="the system is a template of any size: a run may set any GPU "
                                              "count; otherwise a run may use at most its own gpus (a subset "
                                              "of its GPUs on the same fabric)")
    gpu: GpuConfig = GpuConfig()
    link: LinkConfig = LinkConfig()
    packet: PacketFormat = PacketFormat()
    switch: SwitchConfig = SwitchConfig()
    collective: CollectiveConfig = CollectiveConfig()
    cais: CaisConfig = CaisConfig()
    remote_read: RemoteReadConfig = RemoteReadConfig()
    train: TrainConfig = TrainConfig()
    moe: MoeConfig = knob(MoeConfig(), description="a MoE layer run's routing (MoeConfig); a dense run ignores it")
    decode: DecodeConfig = knob(DecodeConfig(), description="the decode step as a serving stack runs it around "
                                                           "the layer (DecodeConfig)")
    gpu_slowdown: dict[int, float] = Field(default_factory=dict,
                                           description="GPU index -> factor on the time its TBs compute (a "
                                                       "straggler, for experiments); absent GPUs run at 1")
    transfer_unit_bytes: int = Field(256 * 1024, ge=128,
                                     description="largest packet train the network moves")
    min_transfer_unit_bytes: int = Field(512, ge=128, description="smallest packet train")
    collective_unit_bytes: int = Field(1024 * 1024, ge=128,
                                       description="largest unit a kernel that streams a whole shard (collectives, "
                                                   "DMA chunks) cuts it into (docs/fabric-model.md, granularity)")
    units_per_stream: int = Field(2, gt=0,
                                  description="a kernel cuts each TB's data stream into about this many units")
    watchdog_horizon_us: float = Field(100_000.0, gt=0, description="stop a run when this much simulated time "
                                                                    "passes with no delivery and no TB finishing")

    @model_validator(mode="after")
    def _check_unit(self) -> "SystemConfig":
        for field in ("transfer_unit_bytes", "min_transfer_unit_bytes", "collective_unit_bytes"):
            if getattr(self, field) % self.packet.max_payload_bytes:
                raise ValueError(f"{field} must be a multiple of packet.max_payload_bytes")
        if self.min_transfer_unit_bytes > min(self.transfer_unit_bytes, self.collective_unit_bytes):
            raise ValueError("min_transfer_unit_bytes must not exceed transfer_unit_bytes or collective_unit_bytes")
        for g, factor in self.gpu_slowdown.items():
            if not 0 <= g < self.gpus or factor <= 0:
                raise ValueError(f"gpu_slowdown: GPU indices must be in 0..{self.gpus - 1} and factors > 0")
        return self

    def remote_outstanding_bytes(self) -> int:
        """Bytes of remote SM requests one GPU keeps outstanding (``gpu.remote_outstanding_kB``;
        by default the bandwidth-delay product of its NVLink ports: all its links' bandwidth
        times the unloaded round trip of a remote read, four link crossings, two switch
        pipelines and the home's memory latency)."""
        if self.gpu.remote_outstanding_kB is not None:
            return round(self.gpu.remote_outstanding_kB * 1024)
        bandwidth = sum(self.switch.links_per_gpu) * self.link.bandwidth_GBps  # bytes per ns
        rtt_ns = 4 * self.link.latency_ns + 2 * self.switch.pipeline_latency_ns + self.gpu.memory_latency_ns
        return round(bandwidth * rtt_ns)

    def unit_for(self, stream_bytes: int) -> int:
        """The transfer unit for a kernel whose TBs each stream ``stream_bytes``: about
        ``units_per_stream`` units per stream, a power of two clamped to
        [min_transfer_unit_bytes, collective_unit_bytes]. Small transfers are cut finely
        (their timing depends on it), large ones coarsely (their events are many)."""
        want = max(1, stream_bytes // self.units_per_stream)
        unit = 1 << (want.bit_length() - 1)
        return max(self.min_transfer_unit_bytes, min(self.collective_unit_bytes, unit))

    # Derived quantities (integer picoseconds) used by the hardware models.
    @property
    def links_per_gpu(self) -> int:
        return sum(self.switch.links_per_gpu)

    def port_ps_per_byte(self, chip: int) -> float:
        """Serialisation time of one byte on the GPU<->chip port (all its links together)."""
        bw = self.link.bandwidth_GBps * self.switch.links_per_gpu[chip]  # GB/s == bytes/ns
        return PS_PER_NS / bw

    @property
    def link_latency_ps(self) -> int:
        return round(self.link.latency_ns * PS_PER_NS)

    @property
    def credit_latency_ps(self) -> int:
        lat = self.link.latency_ns if self.link.credit_latency_ns is None else self.link.credit_latency_ns
        return round(lat * PS_PER_NS)

    def vc_capacity_bytes(self, chip: int) -> int:
        """Input-buffer bytes of one VC of a GPU<->chip port."""
        per = self.link.vc_depth_flits * self.packet.flit_bytes
        return per * (self.switch.links_per_gpu[chip] if self.link.buffer_scope == "link" else 1)

    def with_overrides(self, **fields: object) -> "SystemConfig":
        """A copy with top-level fields replaced (validated again)."""
        data = self.model_dump()
        data.update(fields)
        return SystemConfig.model_validate(data)


class ConfigError(UserError):
    """A user-facing configuration mistake; its message is one line."""


def _presets_dir() -> Path:
    return Path(str(resources.files("cais") / "data" / "systems"))


def list_systems() -> dict[str, str]:
    """Preset name -> description."""
    out = {}
    for path in sorted(_presets_dir().glob("*.json")):
        out[path.stem] = json.loads(path.read_text()).get("description", "")
    return out


def _system_path(name_or_path: str) -> Path:
    """The file of a preset name or a path; ConfigError (one line) if there is none."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        if not path.exists():
            hint = ""
            if Path(name_or_path).stem in list_systems() and "/" not in name_or_path:
                hint = f" (the preset is named '{Path(name_or_path).stem}', without .json)"
            raise ConfigError(f"system: file not found: {name_or_path}{hint}")
        if path.is_dir():
            raise ConfigError(f"system: {name_or_path} is a directory, not a system JSON file")
        return path
    preset = _presets_dir() / f"{name_or_path}.json"
    if preset.is_file():
        return preset
    if Path(name_or_path).is_file():  # a file without a suffix in the working directory
        return Path(name_or_path)
    raise ConfigError(f"system: unknown system '{name_or_path}'; valid: {', '.join(list_systems())} "
                      "(or a JSON file)")


def _read_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ConfigError (one line) if it is unreadable, not
    JSON, or not an object."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{path}: cannot read it ({why})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object with the fields of a system, got a JSON "
                          f"{_json_type(data)}")
    return data


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _unknown_key(data: dict[str, Any], model: type[BaseModel], where: str = "") -> str | None:
    """The first key of ``data`` (recursively through sections) that ``model`` lacks,
    with a note of the valid keys at its level; None if every key is known."""
    for key, value in data.items():
        field = model.model_fields.get(key)
        dotted = f"{where}.{key}" if where else key
        if field is None:
            level = f"under '{where}'" if where else "at the top level"
            return f"unknown field '{dotted}'; valid fields {level}: {', '.join(model.model_fields)}"
        sub = _submodel(field.annotation)
        if sub is not None and isinstance(value, dict):
            found = _unknown_key(value, sub, dotted)
            if found:
                return found
    return None


def missing_field(data: dict[str, Any], model: type[BaseModel] | None = None, where: str = "") -> str | None:
    """The first field of ``model`` (default SystemConfig; recursively through the
    sections ``data`` gives as objects) that ``data`` does not give; None if complete.
    A field made with :func:`knob` may be left out."""
    model = model or SystemConfig
    for key, field in model.model_fields.items():
        dotted = f"{where}.{key}" if where else key
        if key not in data:
            if _optional_in_files(field):
                continue
            return dotted
        sub = _submodel(field.annotation)
        if sub is not None and isinstance(data[key], dict):
            found = missing_field(data[key], sub, dotted)
            if found:
                return found
    return None


def _merged(base: dict[str, Any], data: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """``base`` with ``data``'s values; sections given as objects merge field by field."""
    out = dict(base)
    for key, value in data.items():
        field = model.model_fields.get(key)
        sub = _submodel(field.annotation) if field is not None else None
        if sub is not None and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value, sub)
        else:
            out[key] = value
    return out


def _system_data(path: Path) -> dict[str, Any]:
    """The complete field values of the system file at ``path``: every field given, or
    ``"base": "<preset>"`` and the fields that differ from that preset."""
    data = _read_object(path)
    base = data.pop("base", None)
    unknown = _unknown_key(data, SystemConfig)
    if unknown:
        raise ConfigError(f"{path.name}: {unknown}")
    if base is None:
        missing = missing_field(data)
        if missing:
            raise ConfigError(f"{path.name}: missing field '{missing}'; a system file gives every field, or "
                              f"names a preset it inherits the rest from, e.g. \"base\": \"dgx-h100\"")
        return data
    presets = list_systems()
    if not isinstance(base, str) or base not in presets:
        raise ConfigError(f"{path.name}: field 'base': expected a preset name, one of {', '.join(presets)}; "
                          f"got {json.dumps(base)}")
    data.setdefault("name", path.stem)
    data.setdefault("description", f"{base} with the fields set in {path.name}")
    return _merged(_system_data(_presets_dir() / f"{base}.json"), data, SystemConfig)


def check_gpus(cfg: SystemConfig, gpus: int | None, label: str = "gpus ") -> None:
    """ConfigError if ``gpus`` asks more GPUs of ``cfg`` than it has and it is not a
    scalable template (using fewer of a machine's GPUs is allowed: a smaller TP group
    on the same fabric); its message starts with ``label`` and the count
    (``gpus 16: ...``)."""
    if gpus is None or gpus <= cfg.gpus or cfg.scalable:
        return
    scalable = [name for name, data in ((n, _read_object(_presets_dir() / f"{n}.json")) for n in list_systems())
                if data.get("scalable")]
    where = f"the scalable preset {', '.join(scalable)} or " if scalable else ""
    raise ConfigError(f"{label}{gpus}: system '{cfg.name}' has {cfg.gpus} GPUs and is not scalable; for more GPUs "
                      f"use {where}a system file with \"base\": \"{cfg.name}\" and \"gpus\": {gpus}")


def load_system(name_or_path: str, **overrides: object) -> SystemConfig:
    """Load a preset by name (``dgx-h100``) or a JSON file by path; raise ConfigError
    with a one-line message on a bad name, a missing file, an incomplete file, an
    invalid field, or a ``gpus`` override beyond a system that does not scale. A file
    gives every field, or ``"base": "<preset>"`` and the fields that differ."""
    path = _system_path(name_or_path)
    data = _system_data(path)
    try:
        cfg = SystemConfig.model_validate(data)
    except ValidationError as exc:
        where, msg = _first_error(exc)
        raise ConfigError(f"{path.name}: field '{where or 'system'}': {msg}") from None
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return cfg
    check_gpus(cfg, overrides.get("gpus"))  # type: ignore[arg-type]
    try:
        return SystemConfig.model_validate({**data, **overrides})
    except ValidationError as exc:
        where, msg = _first_error(exc)
        given = ", ".join(f"{k}={v}" for k, v in overrides.items())
        raise ConfigError(f"{path.name} with {given}: field '{where or 'system'}': {msg}") from None


# Dotted overrides ("link.bandwidth_GBps" -> "50") on a loaded system.

def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (also inside ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _field_at(key: str) -> FieldInfo:
    """The field a dotted key names in :class:`SystemConfig`; ConfigError naming the
    key and the valid keys at the level where it went wrong."""
    model: type[BaseModel] | None = SystemConfig
    parts = key.split(".")
    field: FieldInfo | None = None
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth])
        if model is None:
            raise ConfigError(f"unknown key '{key}': '{where}' is a value, not a section with keys")
        field = model.model_fields.get(part)
        if field is None:
            level = f"under '{where}'" if where else "at the top level"
            raise ConfigError(f"unknown key '{key}'; valid keys {level}: {', '.join(model.model_fields)}")
        model = _submodel(field.annotation)
    assert field is not None
    return field


def parse_value(text: str) -> Any:
    """A value as written after ``=``: JSON where it parses (numbers, true/false, null,
    lists, objects), else the text itself (``nvls``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _first_error(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """(dotted location under ``prefix``, message) of a validation error's first entry."""
    err = exc.errors()[0]
    where = ".".join([prefix, *(str(p) for p in err["loc"])] if prefix else [str(p) for p in err["loc"]])
    return where, validation_message(err)


def _checked_value(key: str, text: str, current: Any = None) -> Any:
    """The value for ``key``: the JSON reading of ``text`` if the field accepts it, else
    the plain text if the field accepts that (a string field given ``5``); ConfigError
    naming the key and what it allows otherwise. A section (``gpu``, ``switch.merge``)
    given as a JSON object merges into its ``current`` value field by field, as a
    system file's section merges into its base preset: the fields it does not give
    keep their values."""
    field = _field_at(key)
    sub = _submodel(field.annotation)
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[field.annotation, field])
    candidates = [parse_value(text)]
    if candidates[0] != text:
        candidates.append(text)
    first: ValidationError | None = None
    for value in candidates:
        if sub is not None and isinstance(value, dict) and isinstance(current, dict):
            value = _merged(current, value, sub)
        try:
            adapter.validate_python(value)
            return value
        except ValidationError as exc:
            first = first or exc
    assert first is not None
    where, msg = _first_error(first, key)
    raise ConfigError(f"invalid value '{text}' for '{where}': {msg}")


def _get(data: dict[str, Any], key: str) -> Any:
    """``data[a][b]...`` for ``key`` ``a.b...``; None where a part is missing."""
    value: Any = data
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b]... = value`` for ``key`` ``a.b...`` (a missing or null section
    becomes a dict)."""
    *sections, leaf = key.split(".")
    for part in sections:
        if not isinstance(data.get(part), dict):
            data[part] = {}
        data = data[part]
    data[leaf] = value


def apply_overrides(cfg: SystemConfig, pairs: Mapping[str, str]) -> SystemConfig:
    """A copy of ``cfg`` with dotted keys (``link.bandwidth_GBps``, ``switch.chips``,
    any nested field) set from their text values (see :func:`parse_value`), in order,
    then validated as a whole like a system file. A section set to a JSON object
    (``gpu={"sms": 66}``) merges into the section as it is, field by field. Raises ConfigError with a one-line
    message naming the key: an unknown key (listing the valid keys at that level), a
    value the field does not allow, or a combination the system rejects."""
    if not pairs:
        return cfg
    data = cfg.model_dump()
    for key, text in pairs.items():
        _put(data, key, _checked_value(key, text, _get(data, key)))
    try:
        return SystemConfig.model_validate(data)
    except ValidationError as exc:
        where, msg = _first_error(exc)
        field = f"field '{where}': " if where else ""
        raise ConfigError(f"after setting {', '.join(pairs)}: {field}{msg}") from None


def overridden(cfg: SystemConfig, pairs: Mapping[str, str], label: str,
               gpus_label: str) -> tuple[SystemConfig, dict[str, Any]]:
    """``cfg`` with the dotted ``pairs`` applied (:func:`apply_overrides`) and the values
    they set (:func:`config_values`). A GPU count beyond a system that is not scalable is
    refused (:func:`check_gpus`, naming it ``gpus_label``); every ConfigError's one line
    starts with ``label``, the way the caller's user wrote the pairs."""
    before = cfg
    try:
        cfg = apply_overrides(cfg, pairs)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if "gpus" in pairs:
        check_gpus(before, cfg.gpus, gpus_label)
    return cfg, config_values(cfg, pairs)


def config_values(cfg: SystemConfig, keys: Iterable[str]) -> dict[str, Any]:
    """The values (JSON types) of dotted ``keys`` in ``cfg``: what overrides set."""
    data = cfg.model_dump(mode="json")
    out: dict[str, Any] = {}
    for key in keys:
        value: Any = data
        for part in key.split("."):
            value = value[part]
        out[key] = value
    return out
