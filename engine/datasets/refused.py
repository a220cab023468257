"""RETURNN's dataset classes that read through RASR (formerly Sprint), refused with the way to convert.

RASR is a separate C++ toolkit: ``ExternSprintDataset`` starts its trainer binary as a child process that
sends features and alignments through a pipe, ``SprintDatasetBase`` (RETURNN's ``SprintDataset``) is the
receiving end inside a RASR process, and ``SprintCacheDataset`` decodes RASR's cache archives, whose
alignments need RASR's allophone and state-tying files to become class ids. None of it is part of this
engine. RETURNN's ``"sprint:<options>"`` dataset string is ``ExternSprintDataset`` too.
"""
from __future__ import annotations

from engine.runtime.errors import DataError

_WHY = {
    "ExternSprintDataset": "it starts RASR's nn-trainer as a child process that feeds the features and "
                           "alignments through a pipe",
    "SprintDataset": "it is the end of a pipe that a running RASR process feeds",
    "SprintDatasetBase": "it is the end of a pipe that a running RASR process feeds",
    "SprintCacheDataset": "it decodes RASR's cache archives, whose alignments need RASR's allophone and "
                          "state-tying files",
}
RASR_CLASSES = frozenset(_WHY)


def refusal(class_name: str) -> DataError:
    """One paragraph: why ``class_name`` cannot run here and how to turn its corpus into HDF files."""
    return DataError(
        f"Dataset class {class_name!r} reads its data through RASR (formerly Sprint), which cannot run in "
        f"this engine: {_WHY[class_name]}. Convert the corpus once where RETURNN and RASR run: RETURNN's own "
        f"tool, 'python3 returnn/tools/hdf_dump.py \"{{'class': '{class_name}', ...}}\" features.hdf' with "
        "the same config's dataset dict (or with the config file, which dumps its 'train' dataset), writes "
        "an HDF file this engine reads as {'class': 'HDFDataset', 'files': ['features.hdf']}; dump each of "
        "train, dev and eval that way. Alignments that are not in that file (e.g. from separate RASR "
        "alignment caches, dumped the same way into 'alignments.hdf') are joined by sequence tag with "
        "{'class': 'MetaDataset', 'datasets': {'features': {'class': 'HDFDataset', 'files': "
        "['features.hdf']}, 'alignments': {'class': 'HDFDataset', 'files': ['alignments.hdf']}}, "
        "'data_map': {'data': ('features', 'data'), 'classes': ('alignments', 'data')}, "
        "'seq_order_control_dataset': 'alignments'} (the alignments' key in their file: 'data' where they "
        "are its inputs, else the target's name, e.g. 'classes').")
