"""``SentencePieces``: targets segmented by a SentencePiece model (the ``sentencepiece`` package), as
RETURNN's vocabulary of that name does it.

The options are those of ``sentencepiece.SentencePieceProcessor`` (``model_file`` or ``model_proto``,
``add_bos``, ``add_eos``, ``reverse``, ``enable_sampling``, ``nbest_size``, ``alpha``, ...), plus
``control_symbols`` and ``user_defined_symbols`` (name -> piece or index). The model's unknown, BOS, EOS and
padding pieces become the vocabulary's. With ``enable_sampling`` every epoch seeds SentencePiece's
generator with the epoch's seed, as RETURNN does; SentencePiece keeps one generator per thread, so the
samples repeat only where the same thread encodes the same texts in the same order.
"""
from __future__ import annotations

from typing import Any

from engine.datasets.vocabulary import Vocabulary
from engine.runtime.errors import DataError


class SentencePieces(Vocabulary):
    def __init__(self, **opts: Any) -> None:
        try:
            import sentencepiece
        except ImportError:
            raise DataError("SentencePieces targets need the 'sentencepiece' package (pip install "
                            "sentencepiece).") from None
        self._spm = sentencepiece
        opts = {k: str(v) if k in ("model_file", "model_proto") and not isinstance(v, bytes) else v
                for k, v in opts.items()}
        self._opts = dict(opts)
        control_symbols = opts.pop("control_symbols", None)
        user_defined_symbols = opts.pop("user_defined_symbols", None)
        try:
            self.sp = sentencepiece.SentencePieceProcessor(**opts)
        except (TypeError, OSError, RuntimeError) as exc:
            raise DataError(f"SentencePieces {self._opts}: the model cannot be loaded: {exc}.") from None
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.vocab_size())]
        super().__init__(vocab_file=None, labels=pieces, unknown_label=self.sp.unk_id(),
                         bos_label=self.sp.bos_id(), eos_label=self.sp.eos_id(), pad_label=self.sp.pad_id(),
                         control_symbols=control_symbols, user_defined_symbols=user_defined_symbols)

    def __repr__(self) -> str:
        return f"SentencePieces({self._opts!r})"

    def set_random_seed(self, seed: int) -> None:
        self._spm.set_random_generator_seed(seed)

    def get_seq(self, text: str) -> list[int]:
        return list(self.sp.encode(text, out_type=int))
