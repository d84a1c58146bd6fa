"""Print what each of the three worlds is, as a Markdown list, from the one
description the code keeps (``cais.reproduce.experiments.common.WORLD_TEXT``): the
README and docs/reproduce.md embed this output between ``<!-- table: ... -->``
markers, and tests/test_samples.py holds them to it.

    .venv/bin/python scripts/worlds_doc.py
"""

from __future__ import annotations

from cais.reproduce.experiments.common import WORLD_TEXT

NAMES = {"as-sold": "(i) As sold", "paper-l2": "(ii) The paper's L2 assumption", "paper-world": "(iii) Paper-world"}


def main() -> None:
    for key, text in WORLD_TEXT.items():
        print(f"- **{NAMES[key]}**: {text}.")


if __name__ == "__main__":
    main()
