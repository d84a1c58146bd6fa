"""One decode step per output token: the model's layers at the simulated layer period,
plus the step's tail outside the layers (docs/compute-model.md, "The decode step").

The tail, per GPU of the TP group, as vLLM's model runner and sampler run it:

- **embedding**: the vocabulary-parallel lookup of the new tokens (a small kernel over
  [batch, hidden]) and the all-reduce that sums the shards' rows (NCCL's choice by size,
  the same for every scheme: the tail is not what a scheme changes);
- **final norm**: a small kernel over [batch, hidden];
- **lm_head**: the GEMM [batch, hidden] x [hidden, vocab / TP], split as every GEMM is;
- **logits gather**: the vocabulary shards' logits gathered across the TP ranks (an
  NCCL all-gather of [batch, vocab] bf16);
- **sampling**: greedy, two small kernels over [batch, vocab] in fp32 (the cast and the
  arg-max); a sampler with top-p/top-k runs more.

Each kernel pays its launch as the layer's kernels do (the dependent-kernel gap under
``graph``, the host's issue under ``eager``, the fitted overhead under ``fitted``).
Not included: the host's own step (scheduling, input preparation, detokenisation),
which a published per-token latency includes unless the stack overlaps it.

A mixture-of-experts model (:class:`MoeTokenTime`, :func:`moe_token_time`) adds its
first ``dense_layers`` layers at their own simulated period (experiments/layer.py runs
them: the MoE layer's attention with the dense MLP, under the dense scheme its EP
stack's attention collectives are) to its MoE layers at the simulated MoE period, and
its tail is split over the attention's TP group (docs/moe.md, "The decode step per
output token").
"""

from __future__ import annotations

from dataclasses import dataclass

from cais.config import PS_PER_US, SystemConfig
from cais.hw.compute import ComputeModel
from cais.kernels.gemm import gemm_shape, tile_work_ps
from cais.workload.models import ModelSpec

FP32 = 4
#: the tail's parts, in the order the step runs them
PARTS = ("embedding", "final_norm", "lm_head", "logits_gather", "sampling")


@dataclass(frozen=True)
class TokenTime:
    """The time per output token (us): ``layers`` x ``layer_us`` + the tail's parts."""

    layers: int
    layer_us: float
    tail: dict[str, float]

    @property
    def tail_us(self) -> float:
        return sum(self.tail.values())

    @property
    def token_us(self) -> float:
        return self.layers * self.layer_us + self.tail_us

    def as_json(self) -> dict[str, object]:
        return {"token_us": self.token_us, "layers": self.layers, "layer_us": self.layer_us,
                "layers_us": self.layers * self.layer_us, "tail_us": self.tail_us, "tail": self.tail}


def _launch_us(cfg: SystemConfig, fitted_us: float) -> float:
    """What one tail kernel costs besides its work under ``gpu.launch``."""
    gpu = cfg.gpu
    if gpu.launch == "fitted":
        return fitted_us
    if gpu.launch == "graph":
        return gpu.kernel_gap_us
    return max(gpu.kernel_gap_us, gpu.host_op_us)


def _small_us(cfg: SystemConfig, cm: ComputeModel, nbytes: int, sms: int) -> float:
    """A small memory-bound kernel: its bytes at the calibrated rate, its floor (graph,
    eager) or the fitted overhead (fitted), and its launch."""
    bytes_us = max(0, cm.memory_time_ps(nbytes, sms, sms) - cm.memory_time_ps(0, sms, sms)) / PS_PER_US
    fitted = cm.memory_time_ps(0, sms, sms) / PS_PER_US
    floor = 0.0 if cfg.gpu.launch == "fitted" else cfg.gpu.small_kernel_us
    return bytes_us + floor + _launch_us(cfg, fitted)


def _gemm_us(cfg: SystemConfig, cm: ComputeModel, m: int, n: int, k: int, sms: int) -> float:
    """One GEMM alone on ``sms`` SMs: its tiles (split where CUTLASS would) never below
    the operands' HBM bytes, plus its launch."""
    shape = gemm_shape(cm, m, n, k, sms)
    waves = 1 if shape.units else -(-shape.tiles // sms)
    floor = max(0, cm.memory_time_ps(2 * (m * k + k * n + m * n), sms, sms) - cm.memory_time_ps(0, sms, sms))
    if shape.units:
        work = max(floor, tile_work_ps(cm, shape, shape.tiles))
    else:
        full, rest = divmod(shape.tiles, sms)
        per = floor // waves
        work = full * max(per, tile_work_ps(cm, shape, sms)) + (max(per, tile_work_ps(cm, shape, rest)) if rest else 0)
    return work / PS_PER_US + _launch_us(cfg, cm.kernel_overhead_ps / PS_PER_US)


def _collective_us(cfg: SystemConfig, op: str, nbytes: int, group: int | None = None) -> float:
    """NCCL's choice by size for ``op`` on ``nbytes``, simulated, with its launch as the
    tail's other kernels have it; over a ``group`` of fewer GPUs than ``cfg``'s (a MoE
    layer's attention TP group), NCCL's ring over that many GPUs of the system, its
    protocol by size, as the layer's group collectives run (schemes/ep.py: no NVLS
    kernel over a subset of the GPUs here)."""
    from cais.experiments.collective import run_collective

    if group is not None and group < cfg.gpus:
        r = run_collective(_first_gpus(cfg, group), op, "ring", nbytes, protocol="auto")
    else:
        r = run_collective(cfg, op, "auto", nbytes, protocol="auto")
    # its own time: without the standalone call's launch and host cost (run_collective charges them)
    own = r.time_us - cfg.gpu.kernel_launch_us - cfg.collective.host_us
    return max(0.0, own) + _launch_us(cfg, cfg.gpu.kernel_launch_us)


def _first_gpus(cfg: SystemConfig, gpus: int) -> SystemConfig:
    """``cfg`` with its first ``gpus`` GPUs (one attention group's; their slowdowns kept)."""
    data = cfg.model_dump()
    data.update(gpus=gpus, gpu_slowdown={g: f for g, f in cfg.gpu_slowdown.items() if g < gpus})
    return SystemConfig(**data)


def decode_tail_us(cfg: SystemConfig, cm: ComputeModel, model: ModelSpec, batch: int, sms: int,
                   tp: int | None = None) -> dict[str, float]:
    """The tail of one decode step (module doc), us per part, its vocabulary split over
    ``tp`` ranks (default: every GPU; fewer: a MoE layer's attention TP group, its
    collectives within the group (:func:`_collective_us`); 1: each GPU holds the whole
    vocabulary, and the embedding's all-reduce and the logits gather have no peer: 0). A model without a
    vocabulary size has no lm_head, logits or sampling to time: those parts are 0."""
    n, h, eb = cfg.gpus if tp is None else tp, model.hidden, model.dtype_bytes
    rows = batch * h * eb
    reduce_us = _collective_us(cfg, "allreduce", rows, n) if n > 1 else 0.0
    tail = {"embedding": _small_us(cfg, cm, 2 * rows, sms) + reduce_us,
            "final_norm": _small_us(cfg, cm, 2 * rows, sms), "lm_head": 0.0, "logits_gather": 0.0, "sampling": 0.0}
    if model.vocab:
        shard = -(-model.vocab // n)
        tail["lm_head"] = _gemm_us(cfg, cm, batch, shard, h, sms)
        tail["logits_gather"] = _collective_us(cfg, "allgather", batch * shard * n * eb, n) if n > 1 else 0.0
        logits = batch * model.vocab
        tail["sampling"] = _small_us(cfg, cm, logits * (eb + FP32), sms) + _small_us(cfg, cm, logits * FP32, sms)
    return tail


def token_time(cfg: SystemConfig, cm: ComputeModel, model: ModelSpec, batch: int, sms: int,
               layer_us: float) -> TokenTime:
    """The whole model's time per output token at the simulated ``layer_us``."""
    return TokenTime(model.layers, layer_us, decode_tail_us(cfg, cm, model, batch, sms))


@dataclass(frozen=True)
class MoeTokenTime(TokenTime):
    """A mixture-of-experts model's time per output token (us): ``layers`` MoE layers x
    the simulated MoE period ``layer_us``, plus ``dense_layers`` dense first layers x
    their own simulated period ``dense_layer_us`` (run under ``dense_scheme``; none and
    0 without dense layers), plus the tail's parts."""

    dense_layers: int = 0
    dense_layer_us: float = 0.0
    dense_scheme: str = ""

    @property
    def token_us(self) -> float:
        return self.layers * self.layer_us + self.dense_layers * self.dense_layer_us + self.tail_us

    def as_json(self) -> dict[str, object]:
        return {**super().as_json(), "moe_layers": self.layers, "dense_layers": self.dense_layers,
                "dense_layer_us": self.dense_layer_us, "dense_layers_us": self.dense_layers * self.dense_layer_us,
                "dense_scheme": self.dense_scheme}


def moe_token_time(cfg: SystemConfig, cm: ComputeModel, model: ModelSpec, moe_layers: int, batch: int, sms: int,
                   layer_us: float, attention_tp: int, dense_layers: int = 0, dense_layer_us: float = 0.0,
                   dense_scheme: str = "") -> MoeTokenTime:
    """A MoE model's time per output token: ``moe_layers`` x ``layer_us`` + ``dense_layers``
    x ``dense_layer_us`` (both simulated by the caller) + the tail of ``model`` (the MoE
    layer's attention model: its hidden and vocabulary) over ``batch`` sequences per
    attention group, the vocabulary split over ``attention_tp`` ranks."""
    return MoeTokenTime(moe_layers, layer_us, decode_tail_us(cfg, cm, model, batch, sms, attention_tp),
                        dense_layers, dense_layer_us, dense_scheme)
