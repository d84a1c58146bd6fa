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

A stack adds to this (``decode.stack``, :class:`~cais.config.DecodeConfig`): vLLM 0.6's
multi-step decode (``vllm-0.6``, read from its v0.6.1 source) also runs
``graph_inputs`` (the CUDA-graph runner's five copies into the graph's input buffers
before each replay: ``CUDAGraphRunner.forward``, ``prepare_graph_input_buffers``),
``prune`` (the logits processor's ``index_select`` of the rows to sample), a
concatenation after its logits gather (``GroupCoordinator.gather``: an NCCL gather to
the driver, timed as the all-gather of the same shards), six more sampler kernels
(``Sampler.forward`` at greedy: the temperature division, softmax and log-softmax
beside the cast, then ``_sample_with_torch``'s index cast, row gather and index put
beside the arg-max), ``token_broadcast`` (the driver's sampled ids to the other TP
workers, ``broadcast_tensor_dict`` in ``MultiStepWorker``: an NCCL broadcast, timed as
the all-gather of the same ids) and ``advance_step`` (``advance_step_flashattn``).

Under a CUDA graph (``gpu.launch`` = graph, ``decode.graph_padding``) the graph runs
the batch padded up to its captured size (:func:`graph_batch`): the layers, the
embedding and the final norm (:data:`IN_GRAPH`) at that batch, the rest at the real one.

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
INT64 = 8
#: the tail's parts every stack runs, in the order the step runs them
PARTS = ("embedding", "final_norm", "lm_head", "logits_gather", "sampling")
#: the tail's parts of vLLM 0.6's multi-step decode (``decode.stack`` = vllm-0.6), in order
VLLM06_PARTS = ("graph_inputs", "embedding", "final_norm", "prune", "lm_head", "logits_gather", "sampling",
                "token_broadcast", "advance_step")
#: the tail's parts inside the decode CUDA graph (the rest run outside it, on the real rows)
IN_GRAPH = ("embedding", "final_norm")
#: the batch sizes a decode CUDA graph is captured for, as vLLM and SGLang capture them
#: (DecodeConfig.graph_padding): 1, 2, 4, then multiples of 8 to 256, then of 16 to 512
GRAPH_SIZES = (1, 2, 4, *range(8, 257, 8), *range(272, 513, 16))


def graph_batch(batch: int) -> int:
    """The batch a decode CUDA graph runs for ``batch`` sequences: the smallest captured
    size (:data:`GRAPH_SIZES`) that holds them (vLLM 0.6's ``_get_graph_batch_size``,
    SGLang's ``bisect_left`` over ``capture_bs``); above the largest, ``batch`` itself
    (the stacks run such a batch outside a graph: not modelled, its launch mode kept)."""
    if batch < 1:
        raise ValueError(f"batch {batch}: at least 1 sequence")
    return next((g for g in GRAPH_SIZES if g >= batch), batch)


@dataclass(frozen=True)
class TokenTime:
    """The time per output token (us): ``layers`` x ``layer_us`` + the tail's parts;
    ``graph_batch``: the batch the decode CUDA graph ran when it padded the real one
    (0: not padded)."""

    layers: int
    layer_us: float
    tail: dict[str, float]
    graph_batch: int = 0

    @property
    def tail_us(self) -> float:
        return sum(self.tail.values())

    @property
    def token_us(self) -> float:
        return self.layers * self.layer_us + self.tail_us

    def as_json(self) -> dict[str, object]:
        return {"token_us": self.token_us, "layers": self.layers, "layer_us": self.layer_us,
                "layers_us": self.layers * self.layer_us, "tail_us": self.tail_us, "tail": self.tail,
                **({"graph_batch": self.graph_batch} if self.graph_batch else {})}


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
                   tp: int | None = None, graph_rows: int | None = None) -> dict[str, float]:
    """The tail of one decode step (module doc), us per part, its vocabulary split over
    ``tp`` ranks (default: every GPU; fewer: a MoE layer's attention TP group, its
    collectives within the group (:func:`_collective_us`); 1: each GPU holds the whole
    vocabulary, and the embedding's all-reduce and the logits gather have no peer: 0). A model without a
    vocabulary size has no lm_head, logits or sampling to time: those parts are 0.
    ``graph_rows``: the batch the CUDA graph runs (:func:`graph_batch`; default
    ``batch``): the parts inside it (:data:`IN_GRAPH`) run that many rows. The parts are
    :data:`PARTS`, or :data:`VLLM06_PARTS` under ``decode.stack`` = vllm-0.6."""
    n, h, eb = cfg.gpus if tp is None else tp, model.hidden, model.dtype_bytes
    rows, graph = batch * h * eb, (batch if graph_rows is None else graph_rows) * h * eb
    reduce_us = _collective_us(cfg, "allreduce", graph, n) if n > 1 else 0.0
    tail = {"embedding": _small_us(cfg, cm, 2 * graph, sms) + reduce_us,
            "final_norm": _small_us(cfg, cm, 2 * graph, sms), "lm_head": 0.0, "logits_gather": 0.0, "sampling": 0.0}
    logits = batch * (model.vocab or 0)
    if model.vocab:
        shard = -(-model.vocab // n)
        tail["lm_head"] = _gemm_us(cfg, cm, batch, shard, h, sms)
        tail["logits_gather"] = _collective_us(cfg, "allgather", batch * shard * n * eb, n) if n > 1 else 0.0
        tail["sampling"] = _small_us(cfg, cm, logits * (eb + FP32), sms) + _small_us(cfg, cm, logits * FP32, sms)
    if cfg.decode.stack == "vllm-0.6":
        tail = _vllm06_tail(cfg, cm, tail, batch, rows, logits, eb, n, sms)
    return tail


def _vllm06_tail(cfg: SystemConfig, cm: ComputeModel, tail: dict[str, float], batch: int, rows: int, logits: int,
                 eb: int, n: int, sms: int) -> dict[str, float]:
    """``tail`` (every stack's parts) with what vLLM 0.6's multi-step decode adds (module
    doc), in :data:`VLLM06_PARTS`' order: ``rows`` the bytes of the batch's hidden rows,
    ``logits`` the batch's logits (elements, the whole vocabulary)."""
    ids = batch * INT64
    small = _small_us(cfg, cm, 2 * ids, sms)  # a kernel over a few int tensors of the batch: its floor
    extra = {"graph_inputs": 5 * small, "prune": _small_us(cfg, cm, 2 * rows, sms),
             "token_broadcast": _collective_us(cfg, "allgather", ids * n, n) if n > 1 else 0.0,
             "advance_step": small}
    if logits:
        concat = _small_us(cfg, cm, 2 * logits * eb, sms) if n > 1 else 0.0
        rw32 = _small_us(cfg, cm, 2 * logits * FP32, sms)  # an fp32 [batch, vocab] read and written
        tail = {**tail, "logits_gather": tail["logits_gather"] + concat,
                "sampling": tail["sampling"] + 4 * rw32 + 2 * small}  # div, softmax, log-softmax, row gather; long, put
    return {k: ({**tail, **extra}[k]) for k in VLLM06_PARTS}


def graph_padded(model: ModelSpec, rows: int) -> ModelSpec:
    """``model``'s decode run (``batch`` sequences over a KV cache of ``seq``) as the
    CUDA graph of ``rows`` sequences runs it: the padding sequences hold one cached
    token each (vLLM 0.6's builder pads the sequence lengths with 1), and the run's one
    KV length is the mean over the ``rows``, so the KV bytes read stay the real ones."""
    b, kv = model.batch, model.seq
    return model.with_run(rows, max(1, round((b * kv + (rows - b)) / rows)))


def token_time(cfg: SystemConfig, cm: ComputeModel, model: ModelSpec, batch: int, sms: int,
               layer_us: float, graph_rows: int | None = None) -> TokenTime:
    """The whole model's time per output token at the simulated ``layer_us`` (the layers
    run at ``graph_rows`` sequences when the CUDA graph pads ``batch``)."""
    padded = graph_rows if graph_rows is not None and graph_rows != batch else 0
    return TokenTime(model.layers, layer_us, decode_tail_us(cfg, cm, model, batch, sms, graph_rows=graph_rows), padded)


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
                        dense_layers=dense_layers, dense_layer_us=dense_layer_us, dense_scheme=dense_scheme)
