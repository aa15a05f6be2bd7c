"""``python -m knng`` runs the command-line interface."""

from knng.cli import program

program()
