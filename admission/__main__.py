"""``python -m admission`` runs the command-line interface."""

from admission.cli._main import main

raise SystemExit(main())
