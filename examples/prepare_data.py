"""Make the example data under ``var/data``: a real text corpus (this repository's README and
docs, ~100 KB), a byte-level BPE ``tokenizer.json`` trained on it with the ``tokenizers``
library (512 entries), and the same corpus pre-tokenized as a nanoGPT-style ``train.bin``.

    .venv/bin/python examples/prepare_data.py [--out var/data]

Then ``frenzy submit examples/gpt2-tiny-text.yaml`` (text + tokenizer) or
``examples/llama-tiny-tokens.yaml`` (token shards). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "var" / "data")
    ap.add_argument("--vocab", type=int, default=512)
    args = ap.parse_args()
    text = args.out / "docs"
    text.mkdir(parents=True, exist_ok=True)
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        shutil.copyfile(f, text / f"{f.parent.name}-{f.stem}.txt")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(f) for f in sorted(text.iterdir())], trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=["<|endoftext|>", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (args.out / "tokenizer").mkdir(exist_ok=True)
    tok.save(str(args.out / "tokenizer" / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    ids = [i for f in sorted(text.iterdir())
           for i in [*tok.encode(f.read_text(encoding="utf-8")).ids, eos]]
    (args.out / "tokens").mkdir(exist_ok=True)
    np.asarray(ids, dtype=np.uint16).tofile(args.out / "tokens" / "train.bin")
    print(f"{text}: {len(list(text.iterdir()))} documents; {args.out / 'tokenizer'}: "
          f"{tok.get_vocab_size()} tokens; {args.out / 'tokens' / 'train.bin'}: "
          f"{len(ids):,} uint16 tokens")


if __name__ == "__main__":
    main()
