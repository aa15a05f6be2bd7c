"""File layer: lazy readers for vector files and atomic writers for vectors and results.

Supported formats (see :data:`FORMATS`): ``.npy``; TEXMEX ``.fvecs``/``.ivecs``/``.bvecs``;
big-ann-benchmarks ``.fbin``/``.u8bin``/``.i8bin``/``.ibin``; ann-benchmarks HDF5
(``.hdf5``/``.h5``). Readers memory-map or lazily open the file; writers stage every file
under a temporary name and rename it into place only when complete.

This package imports nothing from the rest of ``knng``, so it stays usable on its own.
"""

from knng.io.outputs import OutputFolder, OutputFolderError, OutputWriteError
from knng.io.workarea import (
    CheckpointDamagedError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointMismatchError,
    NotAWorkAreaError,
    WorkArea,
)
from knng.io.readers import (
    FORMATS,
    HDF5_DATASETS,
    describe,
    format_of,
    iter_row_blocks,
    read_vectors,
    take_rows,
)
from knng.io.writers import (
    METADATA_FILE,
    NEIGHBOR_FILES,
    ResultSet,
    atomic_write,
    json_default,
    metadata_json,
    write_hdf5,
    write_neighbors,
    write_vectors,
)

__all__ = [
    "CheckpointDamagedError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointMismatchError",
    "NotAWorkAreaError",
    "WorkArea",
    "FORMATS",
    "HDF5_DATASETS",
    "METADATA_FILE",
    "NEIGHBOR_FILES",
    "OutputFolder",
    "OutputFolderError",
    "OutputWriteError",
    "ResultSet",
    "atomic_write",
    "describe",
    "format_of",
    "iter_row_blocks",
    "json_default",
    "metadata_json",
    "read_vectors",
    "take_rows",
    "write_hdf5",
    "write_neighbors",
    "write_vectors",
]
