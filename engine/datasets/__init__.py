"""The data side: datasets (HDF, NumPy, generated), the HDF writer, ordering, batching, and audio files
read as log-mel features (audio.py, log_mel.py) for corpora made from speech.

No TensorFlow here: the engine hands the padded NumPy batches to the model.

Stage 3 (datasets): may import runtime, config and report; imported by model and every stage above it.
"""
from engine.datasets.base import DataKeyInfo, Dataset
from engine.datasets.batching import Batch, BatchOptions, BatchPrefetcher, generate_batches, plan_batches
from engine.datasets.factory import DATASET_CLASSES, create_dataset, dataset_from_cli_arg, dataset_from_config
from engine.datasets.generated import DummyDataset, LabelFramesDataset, Task12AXDataset
from engine.datasets.hdf_reader import HDFDataset, parse_byte_size
from engine.datasets.hdf_writer import HDFWriter
from engine.datasets.npz import NpzDataset
from engine.datasets.streams import DataDims, data_dims

__all__ = [
    "Batch", "BatchOptions", "BatchPrefetcher", "DATASET_CLASSES", "DataDims", "DataKeyInfo", "Dataset",
    "DummyDataset", "HDFDataset", "HDFWriter", "LabelFramesDataset", "NpzDataset", "Task12AXDataset",
    "create_dataset", "data_dims", "dataset_from_cli_arg", "dataset_from_config", "generate_batches",
    "parse_byte_size", "plan_batches",
]
