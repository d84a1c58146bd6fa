"""The Python API as a notebook uses it (docs/python.md): one layer, one collective, a
system with overrides, a model from a Hugging Face config.json, and a sweep into a
pandas DataFrame; every result carries its provenance. Small and fast (Mega-GPT-4B,
64 tokens, 4 GPUs): a few seconds. Files go to a new temporary folder, named at the
end.

    .venv/bin/python examples/python_api.py

Each part between two ``# ---`` lines is a code block of docs/python.md, word for word
(tests/test_examples.py checks this and runs the script).
"""

# --- one layer
from cais.experiments.spec import LayerSpec, SystemSpec

layer = LayerSpec(model="paper-mega-gpt-4b", scheme="cais", mode="prefill", batch=1, seq=64,
                  system=SystemSpec("dgx-h100", gpus=4))
r = layer.run()
print(f"{r.model} {r.scheme} {r.mode}: {r.total_us:,.1f} us per layer period")
for name, sub in r.sublayers.items():
    print(f"  {name}: {sub['time_us']:,.1f} us (lower bound {sub['bound_us']:,.1f} us)")

result = r.as_json()  # every metric, as `cais run --json` prints it
print(result["provenance"]["commit"], result["provenance"]["system_sha256"])
# ---

# --- one collective
from cais.experiments.spec import CollectiveRunSpec

allreduce = CollectiveRunSpec(op="allreduce", algo="nvls", nbytes="16MiB", system=SystemSpec(gpus=4))
ar = allreduce.run()
print(f"AllReduce of {ar.nbytes:,} bytes: {ar.time_us:,.1f} us, busbw {ar.busbw_GBps:,.1f} GB/s")
# ---

# --- sizes and mistakes
from cais.errors import UserError

for size in (16777216, "16M", "16MiB", "1.5K"):
    print(repr(size), "is", CollectiveRunSpec("allreduce", "nvls", size).size(), "bytes")
try:
    CollectiveRunSpec("allreduce", "nvls", "16MB").run()  # MB: 10**6 or 2**20? refused, not guessed
except UserError as exc:  # every mistake in what you asked for: one line, naming it
    print(exc)
# ---

# --- a system with overrides
slow = SystemSpec("dgx-h100", gpus=4, sets={"link.bandwidth_GBps": 12.5, "link.latency_ns": 500})
cfg, overrides = slow.build()  # the full configuration, checked, and the values the overrides set
print(cfg.link.bandwidth_GBps, cfg.link.latency_ns, overrides)

ar_slow = CollectiveRunSpec("allreduce", "nvls", "16MiB", system=slow).run()
print(f"on slower links: {ar_slow.time_us:,.1f} us (was {ar.time_us:,.1f})")
print(ar_slow.as_json()["provenance"]["sets"])  # the overrides, in the result
# ---

# --- a system file
import tempfile
from pathlib import Path

out_dir = Path(tempfile.mkdtemp(prefix="cais-python-api-"))  # a new folder for the files this page writes
system_file = out_dir / "my-h100.json"
system_file.write_text('{"base": "dgx-h100", "name": "my-h100", "link": {"bandwidth_GBps": 50}}')
mine = CollectiveRunSpec("allreduce", "nvls", 16 << 20, system=SystemSpec(str(system_file), gpus=4)).run()
print(f"on my-h100: {mine.time_us:,.1f} us")
# ---

# --- a model from a Hugging Face config.json
import json

from cais.workload.models import from_hf_config

hf_config = {"_name_or_path": "TinyLlama/TinyLlama-1.1B", "model_type": "llama", "hidden_size": 2048,
             "intermediate_size": 5632, "num_attention_heads": 32, "num_key_value_heads": 4,
             "num_hidden_layers": 22, "hidden_act": "silu", "vocab_size": 32000}
config_json = out_dir / "tinyllama" / "config.json"  # as downloaded from the Hub
config_json.parent.mkdir(exist_ok=True)
config_json.write_text(json.dumps(hf_config))

model = from_hf_config(config_json, seq=64)
print(model.name, model.hidden, model.ffn_hidden, model.heads, model.kv_heads, model.norm, model.activation)

tiny = LayerSpec(model=str(config_json), scheme="tp-nvls", mode="prefill", batch=1, seq=64,
                 system=SystemSpec(gpus=4)).run()
print(f"{tiny.model}: {tiny.total_us:,.1f} us per layer period")
# ---

# --- a sweep into a pandas DataFrame
import pandas as pd

from cais.sweep.grid import expand
from cais.sweep.point import run_point

points = expand({"fixed": {"kind": "layer", "model": "paper-mega-gpt-4b", "mode": "prefill", "batch": 1,
                           "seq": 64, "gpus": 4},
                 "grid": {"scheme": ["tp-nvls", "cais"], "set.link.bandwidth_GBps": [25, 50]}})
df = pd.DataFrame([run_point(p) for p in points])  # one row per point, in this process
print(df.pivot_table(index="scheme", columns="link.bandwidth_GBps", values="total_us"))
print(df[["scheme", "link.bandwidth_GBps", "total_us", "provenance.system_sha256"]].to_string())
# ---

# --- a resumable sweep
from cais.sweep.runner import run_sweep

table = run_sweep(points, out_dir / "sweep.parquet", workers=1, progress=False)  # workers=1: in this process
print(table[["point.scheme", "point.set.link.bandwidth_GBps", "status", "total_us"]].to_string())
again = run_sweep(points, out_dir / "sweep.parquet", workers=1, progress=False)
print(again.attrs)  # {'points_run': 0, 'points_reused': 4}: every point was in the table
# ---

print(f"files in {out_dir}")
