"""``python -m cais``: the ``cais`` command."""

import sys

try:
    from cais.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command is still importing: the same one line
    print("cais: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
