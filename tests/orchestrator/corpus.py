"""Tiny corpora and tokenizers for trainer tests, built locally (no downloads)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

_SENTENCE = ("the cluster schedules jobs on heterogeneous gpus while the predictor estimates "
             "memory and step time for every plan so that training finishes before its "
             "deadline and nothing runs out of memory")
WORDS = tuple(_SENTENCE.split())


def write_text_corpus(folder: Path, docs: int = 40, seed: int = 0) -> Path:
    """``folder/corpus.jsonl`` (half the documents) and ``folder/more.txt``: made-up
    sentences from ``WORDS``; returns ``folder``."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "."
             for _ in range(docs)]
    half = docs // 2
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(lines[:half])))
    (folder / "more.txt").write_text("\n".join(lines[half:]) + "\n")
    return folder


def train_tokenizer(folder: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE ``tokenizer.json`` (tokenizers library) trained on ``WORDS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<|endoftext|>", "<unk>", "[MASK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def write_bin_shards(folder: Path, sizes: tuple[int, ...], vocab: int,
                     dtype: str = "uint16") -> np.ndarray:
    """Shards ``shard-000.bin``... of ``sizes`` tokens (ids ``i % vocab``, consecutive across
    shards); returns the whole stream."""
    folder.mkdir(parents=True, exist_ok=True)
    stream = (np.arange(sum(sizes)) % vocab).astype(dtype)
    start = 0
    for i, n in enumerate(sizes):
        stream[start:start + n].tofile(folder / f"shard-{i:03d}.bin")
        start += n
    return stream
