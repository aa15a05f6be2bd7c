"""``python -m knng`` runs the command-line interface."""

from knng.cli import main

raise SystemExit(main())
