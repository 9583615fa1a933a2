"""A job's training data: pre-tokenized shards or text with a tokenizer, as fixed samples.

Sources. ``DataConfig.path`` is a file or a folder of files, read in name order:
  * token shards: ``.bin`` (raw ``uint16``/``uint32`` token ids, nanoGPT's convention) or
    ``.npy`` (a 1-D integer array), memory-mapped;
  * text: ``.txt`` (a file is one document) or ``.jsonl`` (one JSON object per line, the
    document in ``text_field``), tokenized with the ``tokenizers`` library's
    ``tokenizer.json`` (or a model folder that has one); documents are joined with the
    tokenizer's end-of-text token when it has one. The token ids are cached as ``.npy``
    (keyed by the files' sizes and times and the tokenizer) so a resumed launch does not
    tokenize again.

Samples. The token stream of ``n`` tokens is cut into ``(n - 1) // seq_len`` windows of
``seq_len + 1`` tokens starting every ``seq_len`` tokens (inputs, and targets shifted by
one). Epoch ``e`` visits them in the order of a permutation seeded by ``(seed, e)``. Sample
*position* ``p`` (samples consumed since the start of training) is window
``perm(p // S)[p % S]``; a step takes the next ``global_batch`` positions and data-parallel
rank ``r`` reads only rows ``[r·G/dp, (r+1)·G/dp)``. The batch is therefore a function of the
position alone, the same for any dp, and a checkpoint that saves the position resumes the
exact sequence of batches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

import numpy as np

log = logging.getLogger(__name__)

TOKEN_SUFFIXES = (".bin", ".npy")
TEXT_SUFFIXES = (".txt", ".text", ".md", ".jsonl")
_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
_MASK_NAMES = ("[MASK]", "<mask>")


class DataError(ValueError):
    """Bad data configuration; ``field`` names the job field (``data.path`` ...)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class DataConfig:
    """What a job trains on (``kind`` "synthetic": the built-in learnable sequences)."""

    kind: str = "synthetic"  # synthetic | tokens | text
    path: str = ""
    tokenizer: str | None = None
    dtype: str = "uint16"  # of .bin shards
    text_field: str = "text"
    shuffle: bool = True

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"


def source_files(path: str | Path) -> list[Path]:
    """The data files of ``path`` (a file, or a folder's data files in name order)."""
    p = Path(path)
    if not p.exists():
        raise DataError("data.path", f"{p} does not exist (give a file or folder every "
                                     "worker can read)")
    if p.is_file():
        if p.suffix not in TOKEN_SUFFIXES + TEXT_SUFFIXES:
            raise DataError("data.path", f"{p.name}: unknown data file type {p.suffix!r}; "
                            f"one of {', '.join(TOKEN_SUFFIXES + TEXT_SUFFIXES)}")
        files = [p]
    else:
        files = sorted(f for f in p.iterdir()
                       if f.is_file() and f.suffix in TOKEN_SUFFIXES + TEXT_SUFFIXES)
        if not files:
            raise DataError("data.path", f"{p} holds no data files "
                            f"({', '.join(TOKEN_SUFFIXES + TEXT_SUFFIXES)})")
    kinds = {"tokens" if f.suffix in TOKEN_SUFFIXES else "text" for f in files}
    if len(kinds) > 1:
        raise DataError("data.path", f"{p} mixes token shards and text files; keep one kind")
    for f in files:
        if not os.access(f, os.R_OK):
            raise DataError("data.path", f"{f} is not readable")
    return files


def kind_of(files: list[Path]) -> str:
    return "tokens" if files[0].suffix in TOKEN_SUFFIXES else "text"


def tokenizer_file(path: str | Path) -> Path:
    """``tokenizer.json`` itself or inside a model folder."""
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise DataError("data.tokenizer", f"{p}: no tokenizer.json (give a tokenizer.json of "
                        "the tokenizers library or a model folder that has one)")
    return f


def load_tokenizer(path: str | Path) -> Any:
    from tokenizers import Tokenizer

    f = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(f))
    except Exception as exc:  # the library raises its own exception type
        raise DataError("data.tokenizer", f"{f}: not a tokenizers tokenizer.json ({exc})") from None


def _special(tok: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return int(i)
    return None


def _documents(files: list[Path], text_field: str,
               limit_bytes: int | None = None) -> Iterator[str]:
    """Yield the documents of text files (``limit_bytes``: stop after about that much)."""
    seen = 0
    for f in files:
        if f.suffix == ".jsonl":
            with f.open(encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)[text_field]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise DataError("data.text_field", f"{f}:{n}: not a JSON object with "
                                        f"a {text_field!r} string") from None
                    seen += len(line)
                    yield str(doc)
                    if limit_bytes is not None and seen >= limit_bytes:
                        return
        else:
            text = f.read_text(encoding="utf-8", errors="replace")
            if limit_bytes is not None:
                text = text[:max(0, limit_bytes - seen)]
            seen += len(text)
            yield text
            if limit_bytes is not None and seen >= limit_bytes:
                return


def tokenize(files: list[Path], tokenizer: Any, text_field: str,
             limit_bytes: int | None = None) -> np.ndarray:
    """Token ids of the documents, each followed by the end-of-text token if any."""
    eos = _special(tokenizer, _EOS_NAMES)
    ids: list[np.ndarray] = []
    batch: list[str] = []

    def flush() -> None:
        for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
            ids.append(np.asarray(enc.ids + ([eos] if eos is not None else []),
                                  dtype=np.uint32))
        batch.clear()

    for doc in _documents(files, text_field, limit_bytes):
        batch.append(doc)
        if len(batch) >= 256:
            flush()
    flush()
    return np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint32)


def fingerprint(cfg: DataConfig, files: list[Path]) -> str:
    """Changes when the files or the tokenizer change (names, sizes, modification times)."""
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    if cfg.tokenizer:
        f = tokenizer_file(cfg.tokenizer)
        h.update(hashlib.sha256(f.read_bytes()).digest())
    h.update(f"{cfg.dtype}|{cfg.text_field}".encode())
    return h.hexdigest()[:16]


def _token_arrays(cfg: DataConfig, files: list[Path]) -> list[np.ndarray]:
    out = []
    for f in files:
        if f.suffix == ".npy":
            a = np.load(f, mmap_mode="r")
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise DataError("data.path", f"{f}: needs a 1-D integer array, got "
                                f"{a.dtype} of shape {a.shape}")
        else:
            if cfg.dtype not in ("uint16", "uint32"):
                raise DataError("data.dtype", f"{cfg.dtype!r}; one of uint16, uint32")
            item = np.dtype(cfg.dtype).itemsize
            if f.stat().st_size % item:
                raise DataError("data.dtype", f"{f}: {f.stat().st_size} bytes is not a whole "
                                f"number of {cfg.dtype} tokens")
            a = np.memmap(f, dtype=cfg.dtype, mode="r")
        out.append(a)
    return out


class TokenData:
    """The token stream of a ``DataConfig`` and the batches cut from it (see the module)."""

    def __init__(self, cfg: DataConfig, cache_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        files = source_files(cfg.path)
        self.fingerprint = fingerprint(cfg, files)
        self.mask_id = 0
        if kind_of(files) == "tokens":
            self._arrays = _token_arrays(cfg, files)
        else:
            if not cfg.tokenizer:
                raise DataError("data.tokenizer", "text data needs a tokenizer (a "
                                "tokenizer.json or a model folder with one)")
            tok = load_tokenizer(cfg.tokenizer)
            self.mask_id = _special(tok, _MASK_NAMES) or 0
            self._arrays = [self._cached_tokens(files, tok, cache_dir)]
        self._starts = np.cumsum([0] + [len(a) for a in self._arrays])
        self._perms: dict[int, np.ndarray] = {}

    def _cached_tokens(self, files: list[Path], tok: Any,
                       cache_dir: str | Path | None) -> np.ndarray:
        if cache_dir is None:
            return tokenize(files, tok, self.cfg.text_field)
        path = Path(cache_dir) / f"tokens-{self.fingerprint}.npy"
        if path.is_file():
            return np.load(path, mmap_mode="r")
        ids = tokenize(files, tok, self.cfg.text_field)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, ids)
        os.replace(tmp, path)
        log.info("tokenized %d files into %d tokens -> %s", len(files), len(ids), path)
        return ids

    @property
    def num_tokens(self) -> int:
        return int(self._starts[-1])

    def num_samples(self, seq_len: int) -> int:
        return max(0, (self.num_tokens - 1) // seq_len)

    def max_token(self) -> int:
        return max((int(a.max()) for a in self._arrays if len(a)), default=0)

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the stream (across shard boundaries)."""
        out = np.empty(length, dtype=np.int64)
        pos, filled = start, 0
        while filled < length:
            i = int(np.searchsorted(self._starts, pos, side="right")) - 1
            a = self._arrays[i]
            off = pos - int(self._starts[i])
            take = min(length - filled, len(a) - off)
            out[filled:filled + take] = a[off:off + take]
            filled += take
            pos += take
        return out

    def _order(self, epoch: int, samples: int, seed: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            if self.cfg.shuffle:
                import torch

                g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
                perm = torch.randperm(samples, generator=g).numpy()
            else:
                perm = np.arange(samples)
            self._perms = {epoch: perm}  # keep one epoch's order
        return perm

    def windows(self, position: int, count: int, seq_len: int, seed: int) -> torch.Tensor:
        """[count, seq_len + 1] token windows of sample positions ``position ...``."""
        samples = self.num_samples(seq_len)
        if samples < 1:
            raise DataError("data.path", f"{self.num_tokens} tokens make no sample of "
                            f"{seq_len + 1} tokens")
        rows = []
        for p in range(position, position + count):
            idx = int(self._order(p // samples, samples, seed)[p % samples])
            rows.append(self.read(idx * seq_len, seq_len + 1))
        import torch

        return torch.from_numpy(np.stack(rows))

    def batch(self, position: int, global_batch: int, dp: int, dp_rank: int, seq_len: int,
              seed: int) -> torch.Tensor:
        """This dp rank's rows of the global batch starting at sample ``position``."""
        share = global_batch // dp
        return self.windows(position + dp_rank * share, share, seq_len, seed)


@dataclass(frozen=True)
class DataSummary:
    """What submission-time validation found: tokens, what the job needs, epochs."""

    files: int
    tokens: int
    exact: bool  # False: estimated from a prefix of a large text corpus
    tokens_needed: int
    samples: int
    epochs: float
    vocab_size: int | None  # tokenizer's vocabulary, or the largest token id + 1

    @property
    def note(self) -> str:
        about = "" if self.exact else "about "
        base = (f"data: {about}{self.tokens:,} tokens in {self.files} file(s); the job reads "
                f"{self.tokens_needed:,}")
        if self.epochs > 1:
            return base + f", {self.epochs:.2f} epochs (samples repeat, reshuffled each epoch)"
        return base + f", {self.epochs:.2f} of an epoch"


ESTIMATE_ABOVE_BYTES = 8 << 20
VOCAB_SCAN_TOKENS = 1 << 26


def summarize(cfg: DataConfig, *, seq_len: int, global_batch: int, steps: int) -> DataSummary:
    """Validate a data config as submission does: files exist and are readable, the
    tokenizer loads, at least one sample fits; count the tokens (text corpora over 8 MiB are
    estimated from their first 8 MiB). ``DataError`` names the field."""
    files = source_files(cfg.path)
    kind = kind_of(files)
    exact = True
    if kind == "tokens":
        arrays = _token_arrays(cfg, files)
        tokens = sum(len(a) for a in arrays)
        # the largest id in the first VOCAB_SCAN_TOKENS of each shard (training checks all)
        vocab = max((int(a[:VOCAB_SCAN_TOKENS].max()) for a in arrays if len(a)),
                    default=-1) + 1
    else:
        if not cfg.tokenizer:
            raise DataError("data.tokenizer", "text data needs a tokenizer (a tokenizer.json "
                            "or a model folder with one)")
        tok = load_tokenizer(cfg.tokenizer)
        vocab = int(tok.get_vocab_size(with_added_tokens=True))
        size = sum(f.stat().st_size for f in files)
        if size > ESTIMATE_ABOVE_BYTES:
            sample = tokenize(files, tok, cfg.text_field, limit_bytes=ESTIMATE_ABOVE_BYTES)
            tokens = int(len(sample) * size / ESTIMATE_ABOVE_BYTES)
            exact = False
        else:
            tokens = len(tokenize(files, tok, cfg.text_field))
    samples = max(0, (tokens - 1) // seq_len)
    if samples < 1:
        raise DataError("data.path", f"{tokens} tokens make no sample of seq_len+1 = "
                        f"{seq_len + 1} tokens; give more data or a shorter seq_len")
    needed = steps * global_batch * seq_len
    return DataSummary(files=len(files), tokens=tokens, exact=exact, tokens_needed=needed,
                       samples=samples, epochs=steps * global_batch / samples,
                       vocab_size=vocab)
