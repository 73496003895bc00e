"""``python -m admission`` runs the command-line interface."""

from admission.cli._worker import main

raise SystemExit(main())
