"""``python -m admission`` runs the command-line interface."""

from admission.cli import main

raise SystemExit(main())
