"""Ring ReduceScatter and AllGather bus bandwidth against buffer size on 8 x H100
(docs/validation.md §9), next to the published nccl-tests figures we found.

    PYTHONPATH=src .venv/bin/python scripts/ring_sizes.py      # about 20 s
"""

from cais.experiments.collective import run_collective
from cais.config import load_system

# nccl-tests busbw (GB/s), 8 x H100 SXM, ring, out-of-place: ReduceScatter from
# NVIDIA/nccl#1047 (NCCL_ALGO=Ring); AllGather 1 GB from NVIDIA/nccl#1506.
PUBLISHED = {("reducescatter", 128): 311.34, ("reducescatter", 256): 330.94, ("reducescatter", 1024): 349.36,
             ("allgather", 1024): 350.0}

if __name__ == "__main__":
    cfg = load_system("dgx-h100")
    print("| op | size (MB) | time (us) | busbw (GB/s) | published busbw | error |")
    print("|---|---|---|---|---|---|")
    for op in ("reducescatter", "allgather"):
        for mb in (32, 64, 128, 256, 1024):
            r = run_collective(cfg, op, "ring", mb << 20)
            pub = PUBLISHED.get((op, mb))
            err = f"{r.busbw_GBps / pub - 1:+.1%}" if pub else "n/a"
            print(f"| {op} | {mb} | {r.time_us:,.1f} | {r.busbw_GBps:.1f} | {pub or 'not found'} | {err} |", flush=True)
