"""``MetaDataset``: several datasets joined by sequence tag, as RETURNN's ``MetaDataset`` joins them.

The typical use is a hybrid setup's features in one HDF file and its alignments in another::

    {"class": "MetaDataset",
     "datasets": {"features": {"class": "HDFDataset", "files": ["feat.hdf"]},
                  "alignments": {"class": "HDFDataset", "files": ["align.hdf"], "partition_epoch": 2}},
     "data_map": {"data": ("features", "data"), "classes": ("alignments", "data")},
     "seq_order_control_dataset": "alignments"}

Each sub-dataset is created by the engine's factory (any class it knows, the same option checks); only
those ``data_map`` names are opened, as in RETURNN. The corpus is a list of tags: the tags of the
sub-dataset that decides the order (``seq_order_control_dataset``, else the one of ``data_map["data"]``),
or those of ``seq_list_file``; every other sub-dataset's sequence is found by its tag (of a tag that occurs
twice, the later sequence, as in RETURNN's tag index). A tag a sub-dataset lacks is an error when the
dataset is created, naming the tag, the sub-dataset and its files (RETURNN fails when it reaches it).

The order of an epoch, as in RETURNN: with ``seq_order_control_dataset`` that sub-dataset's own order for
the epoch (its ``seq_ordering``, ``partition_epoch`` and seeds; the MetaDataset's own are then without
effect, which is warned); else the MetaDataset's ``seq_ordering``/``partition_epoch`` over the tag list,
where ``sorted`` and ``laplace`` use the length of key ``data`` of the sub-dataset of ``data_map["data"]``
(or ``seq_lens_file``'s ``data``). Keys keep their own lengths: features and an alignment of another
length (a subsampled one) are not an error, as in RETURNN.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Collection

import numpy as np

from engine.datasets import ordering
from engine.datasets.base import Dataset
from engine.datasets.seq_list import load_seq_list
from engine.datasets.spec_string import spec_to_kwargs
from engine.runtime import log
from engine.runtime.errors import DataError


class MetaDataset(Dataset):
    nests_datasets = True  # the factory hands its key and ignore_keys on to the sub-datasets created here
    returnn_num_inputs = 0  # RETURNN's MetaDataset's num_inputs, which its hdf_dump writes as inputPattSize

    def __init__(self, datasets: dict[str, Any], data_map: dict[str, Any], *,
                 seq_list_file: str | dict[str, str] | None = None,
                 seq_order_control_dataset: str | None = None,
                 seq_lens_file: str | None = None, data_dims: dict[str, Any] | None = None,
                 data_dtypes: dict[str, str] | None = None, _key: str = "", _ignored: Collection[str] = (),
                 _create: Callable[..., Dataset] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._where = f"MetaDataset {_key!r}" if _key else "MetaDataset"
        self.data_map = self._checked_data_map(data_map)
        used = list(dict.fromkeys(name for name, _ in self.data_map.values()))
        self.control = self._checked_control(seq_order_control_dataset, used, datasets)
        # RETURNN's "default dataset": its tags are the corpus unless a seq_list_file gives them
        self.default_name = self.control or self.data_map["data"][0]
        self.datasets: dict[str, Dataset] = {}
        try:
            self._create_sub_datasets(datasets, used, _key, _ignored, _create)
            self._set_keys(data_dims, data_dtypes)
            self._join(seq_list_file)
            self._control_pos: np.ndarray | None = None
            self._refresh_lengths(in_epoch=False)
            self._seq_lens_data = self._checked_seq_lens(seq_lens_file) if seq_lens_file is not None else None
        except BaseException:
            self.close()
            raise
        self._note_options_without_effect()

    # ----- construction -----
    def _checked_data_map(self, data_map: Any) -> dict[str, tuple[str, str]]:
        pairs_ok = isinstance(data_map, dict) and data_map and all(
            isinstance(k, str) and isinstance(v, (tuple, list)) and len(v) == 2
            and all(isinstance(x, str) for x in v) for k, v in data_map.items())
        if not pairs_ok:
            raise DataError(f"{self._where}: data_map must be a non-empty dict of our data key -> "
                            f"(sub-dataset name, its data key), e.g. {{'data': ('features', 'data')}}, got "
                            f"{data_map!r}.")
        return {key: (str(v[0]), str(v[1])) for key, v in data_map.items()}

    def _checked_control(self, control: Any, used: list[str], datasets: Any) -> str | None:
        if not isinstance(datasets, dict) or not datasets:
            raise DataError(f"{self._where}: datasets must be a non-empty dict of name -> dataset dict, got "
                            f"{datasets!r}.")
        missing = [name for name in used if name not in datasets]
        if missing:
            raise DataError(f"{self._where}: data_map uses sub-dataset(s) {missing} that 'datasets' does not "
                            f"define (it defines {sorted(datasets)}).")
        if control is None:
            if "data" not in self.data_map:
                raise DataError(f"{self._where}: without seq_order_control_dataset, data_map needs the key "
                                f"'data' (its sub-dataset decides the order, as in RETURNN); it has "
                                f"{sorted(self.data_map)}.")
            return None
        if control not in used:
            raise DataError(f"{self._where}: seq_order_control_dataset {control!r} is not one of the "
                            f"sub-datasets data_map uses ({used}); only those are opened.")
        return control

    def _create_sub_datasets(self, specs: dict[str, Any], used: list[str], key: str,
                             ignored: Collection[str], create: Callable[..., Dataset] | None) -> None:
        if create is None:
            raise DataError(f"{self._where}: create it through the engine's dataset factory "
                            "(engine.datasets.factory.create_dataset), which creates its sub-datasets.")

        unused = sorted(set(specs) - set(used))
        if unused:
            log.info(f"{self._where}: sub-dataset(s) {unused} not used by data_map and not opened (as in "
                     "RETURNN).")
        for name in used:
            try:
                spec = spec_to_kwargs(specs[name])
                # RETURNN: a sub-dataset's own random_seed_offset, else its parent's (with the rank's)
                inherit = spec.get("random_seed_offset") is None
                if inherit:
                    spec.pop("random_seed_offset", None)
                spec["name"] = f"{self.name}_{name}"  # RETURNN's naming of sub-datasets
                self.datasets[name] = create(
                    spec, random_seed_offset=self.random_seed_offset if inherit else 0,
                    key=f"{key}/{name}" if key else name, ignored=ignored)
            except DataError as exc:
                raise DataError(f"{self._where}, sub-dataset {name!r}: {exc}") from None

    def _set_keys(self, data_dims: Any, data_dtypes: Any) -> None:
        keys = (["data"] if "data" in self.data_map else []) + sorted(k for k in self.data_map if k != "data")
        for key in keys:
            name, theirs = self.data_map[key]
            sub = self.datasets[name]
            if theirs not in sub.data_keys:
                raise DataError(f"{self._where}: data_map[{key!r}] = ({name!r}, {theirs!r}), but sub-dataset "
                                f"{name!r} ({_describe(sub)}) has no key {theirs!r}; its keys are "
                                f"{sub.data_keys}.")
            self._keys[key] = sub.key_info(theirs)
            if theirs in sub.labels:
                self.labels[key] = list(sub.labels[theirs])
        self._cols = {key: self.datasets[name].data_keys.index(theirs)
                      for key, (name, theirs) in self.data_map.items()}
        if data_dims is not None:
            self._check_data_dims(data_dims)
        if data_dtypes is not None:
            log.info(f"{self._where}: data_dtypes has no effect, as in RETURNN, which no longer reads it: "
                     "the dtypes are the sub-datasets'.")

    def _check_data_dims(self, data_dims: Any) -> None:
        """RETURNN's deprecated declaration, "only to double-check": every key, as ``dim`` or
        ``(dim, ndim)`` (a plain dim is ndim 2 for ``data``, 1 otherwise, as RETURNN converts it); here it
        must be the data's."""
        if not isinstance(data_dims, dict):
            raise DataError(f"{self._where}: data_dims must be a dict of data key -> (dim, ndim), got "
                            f"{data_dims!r}.")
        for key, info in self._keys.items():
            if key not in data_dims:
                raise DataError(f"{self._where}: data_dims gives no dims for key {key!r} (it must list every "
                                f"key of data_map, as in RETURNN).")
            value = data_dims[key]
            if isinstance(value, int) and not isinstance(value, bool):
                value = (value, 2 if key == "data" else 1)
            if not isinstance(value, (tuple, list)) or tuple(value) != (info.dim, info.ndim):
                raise DataError(f"{self._where}: data_dims[{key!r}] = {data_dims[key]!r}, but the data of "
                                f"{self.data_map[key]} has [dim, ndim] {[info.dim, info.ndim]}.")

    def _join(self, seq_list_file: Any) -> None:
        """Fix the corpus: its tags (``self._tags``) and each sub-dataset's sequence of every entry."""
        default = self.datasets[self.default_name]
        default_tags = _all_tags(default)
        if seq_list_file is None:
            lists = {name: default_tags for name in self.datasets}
            source = f"sub-dataset {self.default_name!r}"
        else:
            lists = self._seq_lists(seq_list_file)
            source = f"seq_list_file {seq_list_file!r}"
        self._index: dict[str, np.ndarray] = {}
        if self.control is not None:
            # The control dataset is not looked up by tag: its own sequence numbers index the list, as in
            # RETURNN, which then asserts that the tags agree.
            count, listed = len(default_tags), lists[self.control]
            if len(listed) < count:
                raise DataError(f"{self._where}: {source} lists {len(listed)} tags for {self.control!r}, but "
                                f"that sub-dataset ({_describe(default)}) has {count} sequences; RETURNN "
                                "indexes the list by the control dataset's sequence numbers.")
            wrong = next((i for i in range(count) if listed[i] != default_tags[i]), None)
            if wrong is not None:
                raise DataError(f"{self._where}: entry {wrong} of {source} for {self.control!r} is "
                                f"{listed[wrong]!r}, but sequence {wrong} of that sub-dataset "
                                f"({_describe(default)}) is {default_tags[wrong]!r}; with "
                                "seq_order_control_dataset the list must follow its order, as RETURNN "
                                "asserts.")
            if len(listed) > count:
                log.warning(f"{self._where}: {source} lists {len(listed)} tags, the control dataset "
                            f"{self.control!r} has {count} sequences; the entries beyond are never read (as "
                            "in RETURNN).")
            lists = {name: tags[:count] for name, tags in lists.items()}
            self._index[self.control] = np.arange(count, dtype=np.int64)
        self._tags: list[str] = list(lists[self.default_name])
        for name, sub in self.datasets.items():
            if name not in self._index:
                self._index[name] = self._lookup(name, sub, lists[name], source)
            if seq_list_file is None and sub.corpus_num_seqs < len(self._tags):
                raise DataError(f"{self._where}: sub-dataset {name!r} ({_describe(sub)}) has "
                                f"{sub.corpus_num_seqs} sequences, fewer than the {len(self._tags)} tags of "
                                f"{source} (some tag occurs more than once there); RETURNN refuses a "
                                "sub-dataset with fewer sequences than that tag list, so this engine does "
                                "too. Give a seq_list_file without the repeats.")

    def _seq_lists(self, seq_list_file: Any) -> dict[str, list[str]]:
        owner = f"{self._where}, seq_list_file"
        if isinstance(seq_list_file, dict):
            missing = [name for name in self.datasets if name not in seq_list_file]
            if missing:
                raise DataError(f"{owner}: the dict gives no file for sub-dataset(s) {missing}; it needs one "
                                "for every sub-dataset data_map uses.")
            lists = {name: load_seq_list(seq_list_file[name], owner=f"{owner}[{name!r}]")
                     for name in self.datasets}
        else:
            loaded = load_seq_list(seq_list_file, owner=owner, allow_dict=True)
            if isinstance(loaded, dict):
                missing = [name for name in self.datasets if name not in loaded]
                if missing:
                    raise DataError(f"{owner}: '{seq_list_file}' holds lists for {sorted(loaded)}, none for "
                                    f"sub-dataset(s) {missing}.")
                lists = {name: loaded[name] for name in self.datasets}
            else:
                lists = {name: loaded for name in self.datasets}
        sizes = {name: len(tags) for name, tags in lists.items()}
        if len(set(sizes.values())) > 1:
            raise DataError(f"{owner}: the lists of the sub-datasets differ in length ({sizes}); entry i of "
                            "each names the same sequence.")
        if not sizes[self.default_name]:
            raise DataError(f"{owner}: the list of {self.default_name!r} is empty.")
        return lists

    def _lookup(self, name: str, sub: Dataset, tags: list[str], source: str) -> np.ndarray:
        position = {tag: i for i, tag in enumerate(_all_tags(sub))}  # a repeated tag: the later sequence
        index = np.fromiter((position.get(tag, -1) for tag in tags), np.int64, len(tags))
        missing = np.flatnonzero(index < 0)
        if len(missing):
            examples = ", ".join(repr(tags[i]) for i in missing[1:4])
            raise DataError(
                f"{self._where}: sequence tag {tags[missing[0]]!r} (of {source}) is missing from sub-dataset "
                f"{name!r} ({_describe(sub)}); {len(missing)} of the {len(tags)} tags are missing from it"
                f"{f' (also {examples})' if examples else ''}. The sub-datasets are joined by sequence tag: "
                "every tag must be in each of them.")
        return index

    def _refresh_lengths(self, in_epoch: bool) -> None:
        """Every key's length per corpus entry (again each epoch: a generated sub-dataset draws anew). In an
        epoch the control dataset is read through its epoch, as RETURNN reads it: an LmDataset's labels
        depend on the lines it labelled before (``auto_replace_unknown_symbol``), which its corpus-wide
        labels (what the construction reads) cannot follow."""
        self._control_pos = None
        if self.control is not None and in_epoch:
            control = self.datasets[self.control]
            self._control_pos = np.full(len(self._tags), -1, np.int64)  # corpus entry -> epoch position
            self._control_pos[control.order] = np.arange(len(control.order))
            control_lengths = control.epoch_seq_lengths()
        columns = []
        for key in self._keys:
            name = self.data_map[key][0]
            if name == self.control and in_epoch:
                column = np.zeros(len(self._tags), np.int64)  # entries outside the epoch are not read
                column[control.order] = control_lengths[:, self._cols[key]]
            else:
                column = self.datasets[name]._corpus_lengths()[self._index[name], self._cols[key]]
            columns.append(column)
        self._lengths = np.stack(columns, axis=1).astype(np.int64)

    def _checked_seq_lens(self, path: Any) -> np.ndarray | None:
        """RETURNN takes every length from this JSON file (tag -> data key -> length) instead of the data;
        the data's lengths are read here anyway, so the file must agree with them for every key."""
        where = f"{self._where}, seq_lens_file '{path}'"
        try:
            with open(path, encoding="utf-8") as f:
                table = json.load(f)
        except FileNotFoundError:
            raise DataError(f"{where}: the file does not exist.") from None
        except (OSError, ValueError, TypeError) as exc:
            raise DataError(f"{where}: cannot be read as JSON: {exc}.") from None
        if not isinstance(table, dict):
            raise DataError(f"{where}: expected a JSON object of tag -> {{data key: length}}.")
        keys = list(self._keys)
        for i, tag in enumerate(self._tags):
            entry = table.get(tag)
            if not isinstance(entry, dict):
                raise DataError(f"{where}: no lengths for sequence tag {tag!r}.")
            for col, key in enumerate(keys):
                if entry.get(key) != self._lengths[i, col]:
                    raise DataError(f"{where}: sequence {tag!r}, key {key!r}: the file says "
                                    f"{entry.get(key)!r}, the data has {self._lengths[i, col]} frames; "
                                    "RETURNN would batch by the file's lengths, so it must give the data's "
                                    "for every key.")
        return self._lengths[:, keys.index("data")].copy() if "data" in self._keys else None

    def _note_options_without_effect(self) -> None:
        if self.control is not None:
            own = [f"{name} {value!r}" for name, value, neutral in (
                ("partition_epoch", self.partition_epoch, 1),
                ("seq_ordering", self.seq_ordering.method, "default"),
                ("fixed_random_seed", self.fixed_random_seed, None)) if value != neutral]
            if own:
                log.warning(f"{self._where}: {', '.join(own)} without effect: seq_order_control_dataset "
                            f"{self.control!r} orders every epoch by its own options, as in RETURNN; set "
                            "them in that sub-dataset's dict.")
        for name, sub in self.datasets.items():
            unused = ["chunking"] * (sub.chunking is not None)
            if name != self.control:  # read by tag in the MetaDataset's order
                unused += [f"partition_epoch {sub.partition_epoch}"] * (sub.partition_epoch != 1)
                method = sub.seq_ordering.method
                unused += [f"seq_ordering {method!r}"] * (method != "default")
            if unused:
                log.info(f"{self._where}: sub-dataset {name!r}: {', '.join(unused)} without effect (as in "
                         "RETURNN): the MetaDataset orders, partitions and chunks the joined sequences.")

    # ----- epochs -----
    def init_seq_order(self, epoch: int) -> None:
        for sub in self.datasets.values():  # the control's order; generated data is drawn per epoch
            sub.init_seq_order(epoch)
        self._refresh_lengths(in_epoch=True)
        if self.control is not None:
            order = self.datasets[self.control].order  # its sequence numbers are the corpus entries
        else:
            order = ordering.epoch_order(
                self.seq_ordering, num_seqs=len(self._tags), epoch=epoch, get_lengths=self._ordering_lengths,
                partition_epoch=self.partition_epoch, fixed_random_seed=self.fixed_random_seed,
                random_seed_offset=self.random_seed_offset)
        self._order = np.asarray(order, np.int64)
        self.epoch = epoch

    def _ordering_lengths(self) -> np.ndarray:
        """RETURNN sorts by ``seq_lens_file``'s ``data``, else by key ``data`` of the default sub-dataset."""
        if self._seq_lens_data is not None:
            return self._seq_lens_data
        sub = self.datasets[self.default_name]
        if "data" not in sub.data_keys:
            raise DataError(f"{self._where}: seq_ordering {self.seq_ordering.method!r} sorts by the length "
                            f"of key 'data' of sub-dataset {self.default_name!r}, as RETURNN does, but its "
                            f"keys are {sub.data_keys}; let a sub-dataset order (seq_order_control_dataset).")
        return sub._corpus_lengths()[self._index[self.default_name], sub.data_keys.index("data")]

    # ----- Dataset implementation: sub-datasets are read by their corpus numbers, not their epoch order -----
    def _corpus_num_seqs(self) -> int:
        return len(self._tags)

    def _corpus_lengths(self) -> np.ndarray:
        return self._lengths

    def _corpus_tag(self, corpus_idx: int) -> str:
        return self._tags[corpus_idx]

    def _source(self, corpus_idx: int, key: str) -> tuple[Dataset, int, str, bool]:
        """The sub-dataset, its sequence, its key, and whether that sequence is an epoch position (the
        control dataset's) or a corpus entry."""
        if key not in self._keys:
            self.key_info(key)  # raises the DataError naming the keys
        name, theirs = self.data_map[key]
        if name == self.control and self._control_pos is not None and self._control_pos[corpus_idx] >= 0:
            return self.datasets[name], int(self._control_pos[corpus_idx]), theirs, True
        return self.datasets[name], int(self._index[name][corpus_idx]), theirs, False

    def _corpus_data(self, corpus_idx: int, key: str) -> np.ndarray:
        sub, idx, theirs, in_epoch = self._source(corpus_idx, key)
        return sub.get_data(idx, theirs) if in_epoch else sub._corpus_data(idx, theirs)

    def _read_corpus_into(self, corpus_idx: int, key: str, out: np.ndarray, offset: int = 0) -> None:
        sub, idx, theirs, in_epoch = self._source(corpus_idx, key)
        if in_epoch:
            sub.read_into(idx, theirs, out, offset)
        else:
            sub._read_corpus_into(idx, theirs, out, offset)

    def close(self) -> None:
        for sub in self.datasets.values():
            sub.close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}: {sub!r}" for name, sub in self.datasets.items())
        return f"<{self._where}: {len(self._tags)} seqs, keys {self.data_keys}; {parts}>"

    @staticmethod
    def sub_dataset_specs(options: dict[str, Any]) -> dict[str, Any]:
        """The sub-datasets a dict's options would open (those ``data_map`` uses), for the option check."""
        datasets, data_map = options.get("datasets"), options.get("data_map")
        if not isinstance(datasets, dict) or not isinstance(data_map, dict):
            return {}
        names = {v[0] for v in data_map.values() if isinstance(v, (tuple, list)) and v}
        return {name: spec for name, spec in datasets.items() if name in names}


def _all_tags(dataset: Dataset) -> list[str]:
    return [dataset._corpus_tag(i) for i in range(dataset.corpus_num_seqs)]


def _describe(dataset: Dataset) -> str:
    files = [getattr(f, "path", f) for f in getattr(dataset, "files", None) or []]
    single = getattr(dataset, "file", None)
    files += [single] if isinstance(single, str) else []
    return type(dataset).__name__ + (f", files {', '.join(map(str, files))}" if files else "")
