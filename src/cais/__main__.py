"""``python -m cais``: the ``cais`` command."""

from cais.cli import main

raise SystemExit(main())
