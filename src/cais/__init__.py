"""cais-sim: a discrete-event simulator of tensor-parallel LLM work on NVLink/NVSwitch
multi-GPU systems, built around CAIS (compute-aware in-switch computing)."""

__version__ = "0.1.0"
