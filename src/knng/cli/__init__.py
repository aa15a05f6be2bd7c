"""The ``knng`` command line: ``search``, ``graph``, ``embed``, ``info``, ``demo`` and ``bench``.

One module per job: :mod:`~knng.cli.parser` (the argument tree, from :mod:`~knng.cli.texts`,
:mod:`~knng.cli.choices` and :mod:`~knng.cli.argtypes`), :mod:`~knng.cli.entry` (``main``: dispatch
and error reporting), one module per command (:mod:`~knng.cli.search`, :mod:`~knng.cli.graph`,
:mod:`~knng.cli.embed`, :mod:`~knng.cli.info`, :mod:`~knng.cli.demo`, :mod:`~knng.cli.bench`), and
what they share: :mod:`~knng.cli.inputs` (opening vector files), :mod:`~knng.cli.ann_benchmarks`
(train/test files and recall), :mod:`~knng.cli.ranks` (several processes), :mod:`~knng.cli.runs`
(output folders, checkpoints, ``knng.json``) and :mod:`~knng.cli.console` (what is printed).

Building the parser imports neither torch nor scikit-learn: ``knng --help`` costs what Python
and argparse cost. A command's module, and what it needs, is imported only when it runs.
"""

from knng.cli.entry import main
from knng.cli.parser import build_parser

__all__ = ["main", "build_parser"]
