"""Print the baseline comparison table for docs/validation.md (all nine baselines x
the three Table I models x prefill/train, 66 SMs). About 10 minutes on 2 cores.

    .venv/bin/python scripts/paper_baselines.py > /tmp/baselines.md
"""

from cais.experiments.baselines import markdown, run_grid

if __name__ == "__main__":
    print(markdown(run_grid()))
