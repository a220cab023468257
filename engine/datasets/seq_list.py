"""Sequence-tag list files, in the forms RETURNN reads (``Dataset._load_seq_list_file``).

``name.txt`` (any name not ending in ``.pkl``): one tag per line, every line a tag (an empty line is the
tag ``''``, as RETURNN splits the text into lines); ``name.pkl``: a pickled list of tags, or for
``MetaDataset`` a dict of sub-dataset name -> list of tags; either with ``.gz`` appended: gzip-compressed.
Text is read as UTF-8.

A pickle can run code when it is loaded; the file is named by the config, which is Python run by the
engine anyway, so it is trusted no less than the config itself.
"""
from __future__ import annotations

import gzip
import pickle

from engine.runtime.errors import DataError

SeqList = list[str] | dict[str, list[str]]


def load_seq_list(path: str, *, owner: str, allow_dict: bool = False) -> SeqList:
    """The tags of ``path``; with ``allow_dict`` a pickle may hold a dict of name -> tags.
    ``owner`` names the dataset and option in errors."""
    if not isinstance(path, str) or not path:
        raise DataError(f"{owner}: expected a file name, got {path!r}.")
    compressed = path.endswith(".gz")
    plain_name = path[:-3] if compressed else path
    opener = gzip.open if compressed else open
    try:
        if plain_name.endswith(".pkl"):
            with opener(path, "rb") as f:
                content = pickle.load(f)
        else:
            with opener(path, "rt", encoding="utf-8") as f:
                content = f.read().splitlines()
    except FileNotFoundError:
        raise DataError(f"{owner}: sequence list file '{path}' does not exist.") from None
    except (OSError, EOFError, pickle.UnpicklingError, UnicodeDecodeError) as exc:
        kind = "a pickle" if plain_name.endswith(".pkl") else "UTF-8 text"
        raise DataError(f"{owner}: sequence list file '{path}' cannot be read as {kind}"
                        f"{' (gzip)' if compressed else ''}: {exc}.") from None
    if isinstance(content, dict) and allow_dict:
        for name, tags in content.items():
            _check_tags(tags, f"{owner}: sequence list file '{path}', entry {name!r}")
        return {str(name): list(tags) for name, tags in content.items()}
    _check_tags(content, f"{owner}: sequence list file '{path}'")
    return list(content)


def _check_tags(tags: object, where: str) -> None:
    if not isinstance(tags, (list, tuple)) or not all(isinstance(tag, str) for tag in tags):
        found = type(tags).__name__ if not isinstance(tags, (list, tuple)) else \
            f"a list holding {type(next(t for t in tags if not isinstance(t, str))).__name__}"
        raise DataError(f"{where}: expected a list of tag strings, found {found}.")
