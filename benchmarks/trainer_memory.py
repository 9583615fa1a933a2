"""The built-in trainer's own tensor peak on the CPU, for ``memory_accuracy``'s ``runtime``.

One rank of ``orchestrator.trainer``'s ``ParallelTransformer`` (the model the service trains)
runs two training steps under ``FakeTensorMode`` with ``predictor.measure``'s
``StorageTracker``: the step is the trainer loop's (``orchestrator/trainer/loop.py``:
autocast forward, the model's loss (``F.cross_entropy`` on ``logits.float()`` at tp = 1, the
vocab-parallel cross entropy on the logit shard at tp > 1), ``(loss * scale).backward()`` per
micro-batch, the flattened dp gradient all-reduce, ``opt.step()`` of the trainer's own
optimizer (``loop.build_optimizer``: weight decay on the matrices; under ZeRO the
trainer's ``ZeroOptimizer`` over rank 0's chunks, ZeRO-3's layers sharded by
``shard_blocks``), ``zero_grad``). The tensor-parallel and
data-parallel collectives are replaced by no-ops for the measurement (all-reduces work in
place, ZeRO's reduce-scatter and all-gather write into outputs the trainer allocates, so they
change no memory; ZeRO-3's gathers fill in the rank's own chunk and skip the others'),
which lets one process measure rank 0 of a tp·dp plan (rank 0 holds the largest vocabulary
shard). A pipeline plan runs the trainer's own 1F1B schedule (``loop.pipeline_backward``)
for each stage in turn, its point-to-point exchange faked the same way (a receive allocates
the tensor a real one fills, a send does nothing), and the measured peak is the worst
stage's, as ``estimate_memory`` reports it (``run`` also prices every stage against its
own measurement). tp (with the vocabulary split), dp, pp (even and
uneven splits), ZeRO-1/2/3, micro-batch, recomputation and precision vary.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from predictor.measure.tracker import StorageTracker
from predictor.memory import estimate_memory
from predictor.runtimes import FRENZY_CPU
from predictor.spec import Family, ModelSpec, ParallelConfig, Precision, TrainingSpec

log = logging.getLogger(__name__)


_COLLECTIVES = ("all_reduce", "broadcast", "reduce_scatter_tensor", "reduce_scatter_single",
                "all_gather_into_tensor", "all_gather_single")


@contextlib.contextmanager
def _local_collectives() -> Iterator[None]:
    """The trainer's collectives as no-ops: all-reduces and broadcasts work in place, and ZeRO's
    reduce-scatter and all-gather write into outputs the trainer allocated itself, so none
    changes the memory."""
    import torch.distributed as dist

    orig = {n: getattr(dist, n) for n in _COLLECTIVES if hasattr(dist, n)}
    for n in orig:
        setattr(dist, n, lambda *a, **k: None)
    try:
        yield
    finally:
        for n, fn in orig.items():
            setattr(dist, n, fn)


def _fake_p2p() -> type:
    """The pipeline's exchange in one process: a receive allocates the tensor a real one
    would fill, a send does nothing."""
    from orchestrator.trainer.pipeline import P2P

    class FakeP2P(P2P):
        def exchange(self, send_next: torch.Tensor | None = None,
                     send_prev: torch.Tensor | None = None, recv_next: bool = False,
                     recv_prev: bool = False
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
            return (self._empty() if recv_prev and self.prev is not None else None,
                    self._empty() if recv_next and self.next is not None else None)

    return FakeP2P


def measure_trainer_peak(model: ModelSpec, train: TrainingSpec, par: ParallelConfig,
                         steps: int = 2, tracker: StorageTracker | None = None) -> int:
    """Tensor peak of rank 0 in the last of ``steps`` steps of the built-in trainer; under
    pipeline parallelism the largest over the stages' first ranks (``measure_stage_peak``)."""
    if par.pp > 1:
        return max(measure_stage_peak(model, train, par, stage, steps)
                   for stage in range(par.pp))
    return measure_stage_peak(model, train, par, 0, steps, tracker)


def measure_stage_peak(model: ModelSpec, train: TrainingSpec, par: ParallelConfig,
                       stage: int, steps: int = 2, tracker: StorageTracker | None = None
                       ) -> int:
    """Tensor peak of the first rank of pipeline stage ``stage`` in the last of ``steps``
    steps of the built-in trainer."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from orchestrator.trainer.loop import (
        FP16_LOSS_SCALE,
        RunConfig,
        _autocast,
        average_grads,
        build_optimizer,
        pipeline_backward,
        sync_tied_grads,
    )
    from orchestrator.trainer.model import ParallelTransformer
    from orchestrator.trainer.parallel import Layout
    from orchestrator.trainer.zero import ZeroOptimizer, check_zero_stage

    check_zero_stage(par.zero_stage)
    world = par.tp * par.dp * par.pp
    layout = Layout(stage * par.tp * par.dp, world, par.tp, par.dp, pp=par.pp)
    device = torch.device("cpu")
    share = train.global_batch // par.dp
    micro = share // par.micro_batch
    scale = FP16_LOSS_SCALE if train.precision is Precision.FP16 else 1.0
    tracker = tracker or StorageTracker()
    with _local_collectives(), FakeTensorMode(), tracker:
        net = ParallelTransformer(model, layout, par.recompute)
        params = list(net.parameters())
        tracker.label(params, "parameters")
        cfg = RunConfig(job_id="trainer-memory", model=model, global_batch=train.global_batch,
                        seq_len=train.seq_len, total_steps=steps, tp=par.tp, dp=par.dp,
                        pp=par.pp, micro_batch=par.micro_batch, zero_stage=par.zero_stage,
                        precision=train.precision, optimizer=train.optimizer)
        opt = build_optimizer(cfg, params, layout, net.layers)
        if isinstance(opt, ZeroOptimizer):
            opt.shard_blocks(net)  # ZeRO-3: the layers' weights as chunks from here on
        net.train()
        peak = 0
        for _ in range(steps):
            tracker.reset_peak()
            seq = torch.randint(0, model.vocab_size, (share, train.seq_len + 1))
            inputs, targets = seq[:, :-1], seq[:, 1:]
            if model.family is Family.BERT:
                inputs = inputs.clone()
            if par.pp > 1:
                total = pipeline_backward(cfg, net, layout, inputs, targets, micro, scale,
                                          _fake_p2p())
            else:
                total = torch.zeros(())
                for mb in range(micro):
                    x = inputs[mb * par.micro_batch:(mb + 1) * par.micro_batch]
                    y = targets[mb * par.micro_batch:(mb + 1) * par.micro_batch]
                    tracker.set_phase("forward")
                    with _autocast(train.precision, device):
                        logits = net(x)
                    loss = net.loss(logits, y) / micro
                    tracker.set_phase("backward")
                    (loss * scale).backward()
                    total += loss.detach()
                    del logits, loss
            tracker.set_phase("allreduce")
            average_grads(opt, params, layout, scale)  # in place, as the trainer does
            sync_tied_grads(net, opt, layout)
            tracker.set_phase("optimizer")
            opt.step()
            opt.zero_grad(set_to_none=True)
            peak = tracker.peak
            del seq, inputs, targets, total
    return peak


def measure_real_peak(model: ModelSpec, train: TrainingSpec, par: ParallelConfig,
                      steps: int = 2) -> int:
    """Rank 0's (under pp the worst stage's first rank's) tensor peak over ``steps`` real
    steps of the built-in trainer itself (``orchestrator.trainer.loop.train``, tp·dp·pp
    local gloo processes, synthetic data), as
    the trainer measures it at run time (``orchestrator.trainer.memory``): no copy of its
    step, real tensors."""
    import tempfile

    from orchestrator.trainer.local import run_local
    from orchestrator.trainer.loop import RunConfig

    with tempfile.TemporaryDirectory(prefix="frz-trainer-mem-") as tmp:
        cfg = RunConfig(job_id="trainer-memory", model=model, global_batch=train.global_batch,
                        seq_len=train.seq_len, total_steps=steps, tp=par.tp, dp=par.dp,
                        pp=par.pp, micro_batch=par.micro_batch, recompute=par.recompute,
                        zero_stage=par.zero_stage, precision=train.precision,
                        optimizer=train.optimizer,
                        checkpoint_dir=tmp, checkpoint_every=10**9)
        results = run_local(cfg, timeout_s=600.0)
    # rank 0 (under pp the worst stage's first rank: each stage's rank 0 of its tp·dp block)
    peaks = [r.peak_tensors_bytes for r in results[::par.tp * par.dp]]
    peak = None if None in peaks else max(peaks)
    if peak is None:
        raise RuntimeError("the trainer reported no peak (not on the CPU?)")
    return int(peak)


@dataclass(frozen=True, slots=True)
class TrainerCase:
    model: ModelSpec
    train: TrainingSpec
    par: ParallelConfig

    def label(self) -> str:
        p, t = self.par, self.train
        return (f"{self.model.name} s{t.seq_len} B{t.global_batch} {t.precision.value} "
                f"{t.optimizer.value} tp{p.tp}dp{p.dp}" + (f"pp{p.pp}" if p.pp > 1 else "")
                + f" mb{p.micro_batch} "
                f"rc={p.recompute.value}" + (f" z{p.zero_stage}" if p.zero_stage else ""))


def _small(name: str, family: str, layers: int, hidden: int, heads: int, vocab: int,
           **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, family=family, num_layers=layers, hidden_size=hidden,
                     num_heads=heads, vocab_size=vocab, max_seq_len=1024, **kw)


LLAMA_S = _small("llama-small", "llama", 4, 512, 8, 32000, num_kv_heads=4,
                 ffn_hidden_size=1408, tie_embeddings=False)
QWEN_S = _small("qwen2-small", "qwen2", 4, 512, 8, 32000, num_kv_heads=2,
                ffn_hidden_size=1408, tie_embeddings=False)
NEOX_S = _small("neox-small", "gpt_neox", 4, 512, 8, 32000, tie_embeddings=False)
GPT_S = _small("gpt2-small4", "gpt2", 4, 512, 8, 50257)
BERT_S = _small("bert-small", "bert", 4, 512, 8, 30522, type_vocab_size=2)
# large vocabularies (Llama 3's 128256, Qwen2's 151936) on a small body: the head and the
# loss make most of a rank's peak, so the vocab-parallel split is what the plans test
LLAMA_V = _small("llama-v128k", "llama", 4, 512, 8, 128256, num_kv_heads=4,
                 ffn_hidden_size=1408, tie_embeddings=False)
QWEN_V = _small("qwen2-v152k", "qwen2", 4, 512, 8, 151936, num_kv_heads=4,
                ffn_hidden_size=1408, tie_embeddings=True)
# many layers, wide, a small vocabulary: under full recomputation at tp > 1 the forward's end
# (every weight copy autocast made, before it exits) is the peak
NEOX_D = _small("neox-deep", "gpt_neox", 12, 1024, 8, 8192, tie_embeddings=False)
LLAMA_D = _small("llama-deep", "llama", 12, 1024, 8, 8192, num_kv_heads=4,
                 ffn_hidden_size=2816, tie_embeddings=False)
# heads whose width is not hidden / heads: Q and the attention output twice the hidden size
# (Qwen3-0.6B's 16 x 128 over 1024, Mistral-Nemo's 32 x 128 over 5120), or half of it; and
# Qwen3's per-head q/k RMSNorm
LLAMA_HD = _small("llama-hd128", "llama", 4, 512, 8, 32000, num_kv_heads=4,
                  ffn_hidden_size=1408, tie_embeddings=False, explicit_head_dim=128)
LLAMA_HN = _small("llama-hd32", "llama", 4, 512, 8, 32000, num_kv_heads=2,
                  ffn_hidden_size=1408, tie_embeddings=False, explicit_head_dim=32)
QWEN3_S = _small("qwen3-small", "qwen3", 4, 512, 8, 32000, num_kv_heads=4,
                 ffn_hidden_size=1408, tie_embeddings=True, explicit_head_dim=128)


def _case(model: ModelSpec, s: int, B: int, prec: str = "bf16", opt: str = "adamw",
          **par: Any) -> TrainerCase:
    train = TrainingSpec(global_batch=B, seq_len=s, precision=prec, optimizer=opt)
    return TrainerCase(model, train, ParallelConfig(**par))


CASES: list[TrainerCase] = [
    _case(GPT_S, 256, 4, micro_batch=4),
    _case(GPT_S, 256, 4, "fp32", "adam", micro_batch=2),
    _case(GPT_S, 512, 8, micro_batch=2, recompute="selective"),
    _case(GPT_S, 512, 8, micro_batch=4, recompute="full"),
    _case(GPT_S, 256, 8, micro_batch=2, tp=2),
    _case(GPT_S, 256, 8, "fp16", "sgd", micro_batch=2, dp=2),
    _case(GPT_S, 512, 16, micro_batch=2, tp=2, dp=2, recompute="selective"),
    _case(LLAMA_S, 256, 4, micro_batch=4),
    _case(LLAMA_S, 512, 4, micro_batch=2, recompute="full"),
    _case(LLAMA_S, 256, 8, micro_batch=4, tp=2),
    _case(LLAMA_S, 256, 8, "fp32", "adamw", micro_batch=2, tp=4),
    _case(LLAMA_S, 512, 8, micro_batch=1, dp=2, recompute="selective"),
    _case(LLAMA_S, 256, 16, micro_batch=2, tp=2, dp=4),
    _case(QWEN_S, 256, 4, micro_batch=4),
    _case(QWEN_S, 512, 8, micro_batch=2, tp=2, recompute="selective"),
    _case(QWEN_S, 256, 8, "fp16", "adam", micro_batch=2, dp=2),
    _case(NEOX_S, 256, 4, micro_batch=4),
    _case(NEOX_S, 512, 8, micro_batch=2, tp=2, recompute="full"),
    _case(NEOX_S, 256, 8, "fp32", "sgd", micro_batch=4, dp=2),
    _case(BERT_S, 256, 8, micro_batch=8),
    _case(BERT_S, 256, 8, micro_batch=4, tp=2, recompute="selective"),
    _case(BERT_S, 512, 8, "fp32", "adamw", micro_batch=2, dp=2),
    _case(GPT_S, 1024, 4, micro_batch=1, tp=4),
    _case(LLAMA_S, 1024, 4, micro_batch=1, recompute="selective"),
    # few tokens: the peak moves to the end of the backward (a tied embedding's gradients
    # summed), the dp all-reduce's flat copy or the optimizer step
    _case(GPT_S, 64, 1, micro_batch=1),
    _case(GPT_S, 64, 2, micro_batch=1),
    _case(LLAMA_S, 64, 1, micro_batch=1),
    _case(LLAMA_S, 64, 1, "fp32", "adam", micro_batch=1),
    _case(NEOX_S, 32, 2, "bf16", "sgd", micro_batch=1, dp=2),
    _case(BERT_S, 64, 1, micro_batch=1),
    _case(QWEN_S, 128, 2, "fp16", "adam", micro_batch=1, tp=2),
    _case(LLAMA_S, 128, 1, micro_batch=1, recompute="full"),
]
VOCAB_PARALLEL_CASES: list[TrainerCase] = [
    # tp > 1 with the vocabulary split (50257, 30522 and 151936 rows shard unevenly at tp 4)
    _case(GPT_S, 512, 8, micro_batch=2, tp=2),
    _case(GPT_S, 256, 8, "fp32", "adamw", micro_batch=2, tp=4),
    _case(GPT_S, 64, 2, micro_batch=1, tp=2),
    _case(GPT_S, 1024, 2, micro_batch=1, tp=4, recompute="full"),
    _case(LLAMA_V, 256, 4, micro_batch=2, tp=2),
    _case(LLAMA_V, 512, 8, micro_batch=2, tp=4, recompute="selective"),
    _case(LLAMA_V, 128, 4, "fp32", "adam", micro_batch=1, tp=2, dp=2),
    _case(LLAMA_V, 256, 8, "fp16", "sgd", micro_batch=4, tp=4, recompute="full"),
    _case(QWEN_V, 256, 4, micro_batch=2, tp=4),
    _case(BERT_S, 128, 8, micro_batch=4, tp=4),
    _case(NEOX_D, 256, 8, micro_batch=2, tp=2, recompute="full"),
]
CASES += VOCAB_PARALLEL_CASES
HEAD_DIM_CASES: list[TrainerCase] = [
    # explicit head widths and q/k norms (selective and full recompute, tp 1 and 2, one
    # micro-batch per step); ZeRO-2 ones are in ZERO_CASES
    _case(LLAMA_HD, 256, 4, micro_batch=4),
    _case(LLAMA_HD, 512, 4, micro_batch=2, recompute="full"),
    _case(LLAMA_HD, 256, 8, micro_batch=2, tp=2, recompute="selective"),
    _case(LLAMA_HD, 256, 8, "fp16", "sgd", micro_batch=2, dp=2),
    _case(LLAMA_HN, 256, 8, micro_batch=2, tp=2),
    _case(QWEN3_S, 256, 4, micro_batch=4),
    _case(QWEN3_S, 512, 4, micro_batch=2, recompute="selective"),
    _case(QWEN3_S, 256, 8, micro_batch=2, tp=2),
    _case(QWEN3_S, 256, 8, "fp32", "adamw", micro_batch=2, tp=2, recompute="full"),
    _case(QWEN3_S, 512, 8, "fp16", "adam", micro_batch=2, recompute="full"),
    _case(QWEN3_S, 64, 1, micro_batch=1),
]
CASES += HEAD_DIM_CASES

ZERO_CASES: list[TrainerCase] = [
    # ZeRO-1 (Adam's states in chunks over dp) and ZeRO-2 (gradients too, reduce-scattered in
    # the backward): dp 2 and 4, with tp 2, with recomputation, one and several micro-batches
    _case(GPT_S, 256, 8, micro_batch=2, dp=2, zero_stage=1),
    _case(GPT_S, 256, 8, micro_batch=4, dp=2, zero_stage=2),
    _case(GPT_S, 512, 16, micro_batch=2, tp=2, dp=2, zero_stage=1, recompute="selective"),
    _case(GPT_S, 256, 8, "fp32", "adam", micro_batch=2, dp=4, zero_stage=2, recompute="full"),
    _case(GPT_S, 64, 2, micro_batch=1, dp=2, zero_stage=2),
    _case(LLAMA_S, 256, 16, micro_batch=2, tp=2, dp=4, zero_stage=1),
    _case(LLAMA_S, 256, 16, micro_batch=2, tp=2, dp=4, zero_stage=2),
    _case(LLAMA_S, 512, 8, micro_batch=2, dp=4, zero_stage=2, recompute="selective"),
    _case(LLAMA_S, 256, 8, micro_batch=2, dp=2, zero_stage=2, recompute="full"),
    _case(LLAMA_S, 64, 4, micro_batch=1, dp=4, zero_stage=1),
    _case(LLAMA_S, 64, 4, micro_batch=1, dp=4, zero_stage=2),
    _case(QWEN_S, 256, 8, "fp16", "adam", micro_batch=2, dp=2, zero_stage=2),
    _case(NEOX_S, 256, 8, "bf16", "sgd", micro_batch=2, dp=2, zero_stage=1),
    _case(BERT_S, 256, 8, micro_batch=2, tp=2, dp=2, zero_stage=2),
    _case(LLAMA_D, 256, 8, micro_batch=2, tp=2, dp=2, zero_stage=1, recompute="full"),
    _case(QWEN3_S, 256, 8, micro_batch=2, dp=2, zero_stage=2),
    _case(QWEN3_S, 64, 2, micro_batch=1, tp=2, dp=2, zero_stage=2),
    _case(LLAMA_HD, 256, 16, micro_batch=2, tp=2, dp=2, zero_stage=2, recompute="selective"),
]

ZERO3_CASES: list[TrainerCase] = [
    # ZeRO-3 (the layers' weights in chunks, gathered around each layer's forward and
    # backward; embedding, head and final norm whole): dp 2 and 4, with and without tp 2,
    # recompute none / full, one and several micro-batches
    _case(GPT_S, 256, 8, micro_batch=2, dp=2, zero_stage=3),
    _case(GPT_S, 64, 2, micro_batch=1, dp=2, zero_stage=3),
    _case(GPT_S, 256, 8, micro_batch=2, dp=4, zero_stage=3, recompute="full"),
    _case(GPT_S, 512, 16, micro_batch=2, tp=2, dp=2, zero_stage=3),
    _case(LLAMA_S, 256, 8, micro_batch=2, dp=2, zero_stage=3),
    _case(LLAMA_S, 256, 4, micro_batch=1, dp=4, zero_stage=3),
    _case(LLAMA_S, 256, 16, micro_batch=2, tp=2, dp=4, zero_stage=3, recompute="full"),
    _case(LLAMA_S, 64, 4, micro_batch=1, dp=4, zero_stage=3),
    _case(LLAMA_D, 256, 8, micro_batch=2, dp=2, zero_stage=3),
    _case(LLAMA_D, 256, 4, micro_batch=2, dp=2, zero_stage=3, recompute="full"),
    _case(LLAMA_D, 256, 8, micro_batch=2, tp=2, dp=4, zero_stage=3, recompute="full"),
    _case(NEOX_D, 256, 4, micro_batch=1, tp=2, dp=2, zero_stage=3),
    _case(NEOX_D, 256, 8, "fp32", "adam", micro_batch=2, dp=2, zero_stage=3),
    _case(NEOX_D, 256, 4, "fp32", "adamw", micro_batch=2, dp=2, zero_stage=3, recompute="full"),
    _case(QWEN_S, 256, 8, "fp16", "adam", micro_batch=2, dp=2, zero_stage=3,
          recompute="selective"),
    _case(QWEN3_S, 256, 8, micro_batch=2, tp=2, dp=2, zero_stage=3),
    _case(BERT_S, 256, 8, micro_batch=2, dp=2, zero_stage=3),
    _case(NEOX_S, 256, 16, "bf16", "sgd", micro_batch=4, dp=4, zero_stage=3),
]

PIPELINE_CASES: list[TrainerCase] = [
    # pipeline stages under 1F1B (the worst stage's peak): pp 2, 3, 4 and 5, even and uneven
    # splits (the first stages take the remainder), tied embeddings (the last stage's copy),
    # with tp 2, dp 2 and ZeRO-1/2/3, selective and full recomputation, one micro-batch per
    # step and several
    _case(GPT_S, 256, 8, micro_batch=2, pp=2),
    _case(GPT_S, 256, 8, micro_batch=2, pp=3),
    _case(GPT_S, 64, 1, micro_batch=1, pp=2),
    _case(LLAMA_S, 256, 16, micro_batch=2, pp=4),
    _case(LLAMA_S, 256, 8, "fp32", "adamw", micro_batch=2, pp=2),
    _case(LLAMA_D, 256, 16, micro_batch=2, pp=5),
    _case(LLAMA_V, 256, 8, micro_batch=2, tp=2, pp=2),
    _case(GPT_S, 256, 16, micro_batch=2, dp=2, pp=2, zero_stage=1),
    _case(LLAMA_S, 256, 16, micro_batch=2, tp=2, dp=2, pp=2, zero_stage=2),
    _case(LLAMA_D, 256, 16, micro_batch=2, dp=2, pp=2, zero_stage=3),
    _case(NEOX_D, 256, 8, micro_batch=2, pp=2, recompute="full"),
    _case(QWEN_S, 512, 8, "fp32", "adam", micro_batch=2, pp=2, recompute="selective"),
    _case(BERT_S, 256, 8, micro_batch=2, pp=2),
    _case(NEOX_S, 256, 8, "fp16", "sgd", micro_batch=2, pp=2),
    # m <= pp - stage micro-batches: a stage's first backward (all m in flight) runs before
    # any gradient exists, every later one in the cool-down with fewer in flight
    _case(GPT_S, 256, 4, micro_batch=2, pp=2),
    _case(LLAMA_S, 256, 8, micro_batch=2, pp=4),
    _case(LLAMA_D, 256, 4, micro_batch=2, pp=3),
    _case(GPT_S, 256, 8, micro_batch=2, dp=2, pp=2, zero_stage=1),
    _case(LLAMA_S, 256, 8, micro_batch=2, dp=2, pp=2, zero_stage=2),
    _case(LLAMA_D, 256, 8, micro_batch=2, dp=2, pp=2, zero_stage=3),
    _case(NEOX_D, 256, 6, micro_batch=2, pp=3, recompute="full"),
    _case(QWEN_S, 512, 4, "fp32", "adam", micro_batch=2, pp=2, recompute="selective"),
    # fp32 ZeRO-3 without recomputation: each micro-batch in flight keeps the gathered
    # matrices its forward saved (m = 3 <= pp in the second)
    _case(LLAMA_D, 256, 8, "fp32", "adamw", micro_batch=1, dp=2, pp=3, zero_stage=3),
    _case(NEOX_D, 256, 6, "fp32", "adamw", micro_batch=1, dp=2, pp=3, zero_stage=3),
    _case(QWEN_S, 256, 16, "fp32", "adamw", micro_batch=2, tp=2, dp=2, pp=2, zero_stage=3),
]

ALL_CASES: list[TrainerCase] = CASES + ZERO_CASES + ZERO3_CASES + PIPELINE_CASES
QUICK_CASES: list[TrainerCase] = [*CASES[:3], ZERO_CASES[0], ZERO_CASES[4], ZERO3_CASES[1]]
"""The CI-size subset: three plans without ZeRO, a ZeRO-1, a ZeRO-2 and a ZeRO-3 one."""


def run(cases: list[TrainerCase] | None = None, real: bool = False) -> list[dict[str, Any]]:
    """Measured trainer peak vs ``estimate_memory(..., runtime=FRENZY_CPU).tensors``; ``real``:
    measured by the trainer itself on real tensors (``measure_real_peak``), else its step
    under fake tensors (``measure_trainer_peak``, seconds instead of minutes)."""
    rows = []
    cases = cases or ALL_CASES
    for i, case in enumerate(cases):
        m, tr, par = case.model, case.train, case.par
        stages: list[dict[str, Any]] = []
        if real:
            measured = measure_real_peak(m, tr, par)
        elif par.pp > 1:  # every stage's first rank, each priced with its stage
            for st in range(par.pp):
                got = measure_stage_peak(m, tr, par, st)
                want = estimate_memory(m, tr, par, runtime=FRENZY_CPU, stages=(st,)).tensors
                stages.append(dict(stage=st, measured=got, predicted=want,
                                   err_pct=100.0 * (want - got) / got))
            measured = max(st["measured"] for st in stages)
        else:
            measured = measure_trainer_peak(m, tr, par)
        predicted = estimate_memory(m, tr, par, runtime=FRENZY_CPU).tensors
        err = 100.0 * (predicted - measured) / measured
        log.info("[%d/%d] %s: trainer %.1f MiB, predicted %+.2f%%%s", i + 1,
                 len(cases), case.label(), measured / 2**20, err,
                 "".join(f", stage {st['stage']} {st['err_pct']:+.2f}%" for st in stages))
        rows.append(dict(config=case.label(), measured=measured, predicted=predicted,
                         err_pct=err, zero_stage=par.zero_stage, pp=par.pp, stages=stages))
    return rows
