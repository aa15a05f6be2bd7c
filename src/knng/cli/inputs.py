"""Opening the vector files a command names: ``FILE`` or ``FILE.hdf5:DATASET``, read lazily."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from knng.cli.choices import METRIC_NAMES
from knng.cli.errors import CliError
from knng.io.readers import HDF5_SUFFIXES

__all__ = ["ANN_METRICS", "NATIVE_DTYPES", "AsFloat64Rows", "InputFile", "explicit_dataset", "open_input",
           "metric_for"]

#: ann-benchmarks ``distance`` attribute → knng metric.
ANN_METRICS = {"euclidean": "euclidean", "angular": "cosine"}
#: dtypes the engine computes with directly; other integer/bool data is converted on read.
NATIVE_DTYPES = frozenset({"float16", "float32", "float64", "uint8", "int8", "bfloat16"})


class AsFloat64Rows:
    """Row-sliceable view of integer vectors the engine does not take directly (int32 from
    ``.ivecs``/``.ibin``, int16, int64, ...) that converts each block it reads to float64.

    float64 holds every integer up to 2⁵³ exactly, so the conversion changes no distance (wider
    values are refused as they are read), and the file is still read block by block, never whole.
    """

    def __init__(self, source: Any, name: str) -> None:
        self.source, self.name = source, name
        self.shape = tuple(int(s) for s in source.shape)
        self.dtype = np.dtype(np.float64)
        self._wide = np.dtype(source.dtype).itemsize > 4

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        block = np.asarray(self.source[index])
        if self._wide and block.size and int(np.abs(block).max()) > 2**53:
            raise ValueError(f"{self.name} holds integers beyond 2**53, which float64 cannot hold exactly")
        return block.astype(np.float64)


@dataclass
class InputFile:
    """One opened input file: what the user typed, what it is, and the array knng gets."""

    spec: str
    info: dict[str, Any]
    array: Any
    converted: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.info["shape"])

    @property
    def is_hdf5(self) -> bool:
        return self.info["format"] in HDF5_SUFFIXES

    def summary(self) -> dict[str, Any]:
        """What ``knng.json`` records of this input."""
        out = {"path": self.info["path"], "format": self.info["format"], "shape": list(self.shape),
               "dtype": self.info["dtype"]}
        if self.is_hdf5:
            out["dataset"] = self.info["dataset"]
        if self.converted:
            out["converted_to"] = "float64 (integers, converted exactly)"
        return out


def explicit_dataset(spec: str) -> bool:
    """Whether ``spec`` names an HDF5 dataset (``file.hdf5:test``) rather than a plain file."""
    return ":" in spec and not os.path.exists(spec)


def open_input(spec: str, dataset: str | None = None) -> InputFile:
    """Open ``spec`` (``dataset`` of an HDF5 file, unless ``spec`` names one) without reading it."""
    from knng.io import describe, read_vectors

    if dataset is not None and not explicit_dataset(spec):
        spec = f"{spec}:{dataset}"
    info = describe(spec)
    array = read_vectors(spec)
    if len(info["shape"]) != 2:
        raise ValueError(f"{spec}: expected a 2-D array of vectors, got shape {tuple(info['shape'])}")
    converted = False
    if info["dtype"] not in NATIVE_DTYPES and np.dtype(array.dtype).kind in "iub":
        array, converted = AsFloat64Rows(array, spec), True
    return InputFile(spec, info, array, converted)


def metric_for(args: argparse.Namespace, source: InputFile) -> str:
    """The metric: --metric if given, else what an HDF5 file declares, else euclidean."""
    if args.metric is not None:
        return args.metric
    distance = source.info.get("distance") if source.is_hdf5 else None
    if distance is None:
        return "euclidean"
    name = str(distance).lower()
    if name not in ANN_METRICS:
        raise CliError(
            f"{source.info['path']} declares distance {distance!r}, which knng does not support "
            f"(it supports the ann-benchmarks distances {', '.join(ANN_METRICS)}); "
            f"pass --metric with one of {', '.join(METRIC_NAMES)} to override"
        )
    return ANN_METRICS[name]
