"""Where a run keeps its work beside an output folder, for the checkpoint tests (one process and
distributed): the work area, the step it last saved, and every sibling it leaves."""

from __future__ import annotations

import json
from pathlib import Path


def work_area(out: Path) -> Path:
    """The work area of output folder ``out`` (``.OUT.knng-work`` beside it)."""
    return out.with_name(f".{out.name}.knng-work")


def saved_step(out: Path) -> int | None:
    """The step the work area's ``state.json`` records (a distributed run: the last step every
    rank has saved), or None if there is none yet."""
    try:
        return json.loads((work_area(out) / "state.json").read_text())["step"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def siblings(out: Path) -> list[str]:
    """Hidden entries beside ``out`` that belong to it (work area, lock, temporaries)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))
