"""Per-GPU peak memory of one parallel plan: static state, activations, logits, overhead.

Pure arithmetic (no torch, no I/O). The planner searches with the same counts split into a
static and a per-sequence part (``static_terms``, ``activation_terms``: exact, in integers) and
calls ``estimate_memory`` only for the plans it keeps.
Every coefficient is a count of tensors; nothing is fitted. Under the default runtime profile
(``predictor.runtimes.REFERENCE``) they are the tensors that ``predictor.measure.builder`` — the
PyTorch implementation this model is checked against — keeps alive; another profile adds what
its framework keeps on top (dropout masks, its loss's logits copies, vocabulary padding,
gathered ZeRO-3 / FSDP2 blocks, foreach-Adam temporaries, DDP buckets; see that module). The
memory outside the counted tensors (allocator slack, CUDA context, NCCL) is
``predictor.overhead``'s.

Notation (per rank): D = bytes of the compute dtype (2 mixed, 4 fp32), t = tp, s = sequence,
b = micro-batch, T = b·s_local tokens held by norms/residuals (s_local = s/t under sequence
parallelism, else s), T_f = b·s tokens seen by the tensor-parallel matmuls, h = hidden,
q = heads/t·head_dim (query width per rank: h/t unless the model's head width is explicit),
k = kv_heads_per_rank·head_dim, f = ffn/t, a = heads/t, a_k = kv_heads_per_rank.

Static (per parameter element n, its ZeRO shard n/dp):
  parameters D·n (n/dp under ZeRO-3; a runtime may keep some whole and gather blocks, see
  ``_static_bytes`` and ``_gathered_layer``); fp32 main gradients 4·n (n/dp under ZeRO >= 2);
  fp32 master weights 4·n/dp_1 (mixed only) and optimizer states 8 (Adam m, v) or 4 (SGD
  momentum) per element of the shard (n/dp under ZeRO >= 1). Mixed Adam = 2+4+4+8 = 18 B,
  fp32 Adam = 4+4+8 = 16 B (Megatron's figures). bitsandbytes 8-bit Adam keeps 2 bytes
  (plus a block absmax; fp32 below 4096 elements), its paged variants most of them in CUDA
  unified memory (the device figure only), transformers' Adafactor a row and a column per
  matrix (``_optimizer_states``).

Activations kept for backward per layer and micro-batch (bytes; Korthikanti et al. 2022
structure, without dropout — their 34·s·b·h + 5·a·s²·b has three dropout masks and the
dropout output on top of what is counted here):
  norms: pre-norm and post-norm layers 4·h·T·D (two norm inputs, two norm outputs — or for
  post-norm the layer input instead of the second output); parallel residual (gpt_neox)
  3·h·T·D (both norms read x); norm statistics 2·T·D per LayerNorm, 4·T per RMSNorm.
  attention, flash: Q q·T_f·D, K and V k·T_f·D each, the kernel's output q·T_f·D and
  logsumexp 4·a·T_f, the output re-laid out for the projection q·T_f·D.
  attention, explicit softmax: Q, K, V (K/V repeated to all heads under GQA: q each), the
  softmax output a·s·T_f·D (the 5·a·s²·b term less dropout), the re-laid output q·T_f·D.
  selective recompute: Q, K, V (not repeated), re-laid output.
  q/k norm (qwen3): each per-head RMSNorm keeps its input (q·T_f·D, k·T_f·D) and an fp32
  1/rms per head and token (4·(a + a_k)·T_f); as torch's composite ops (the built-in trainer
  on the CPU) an fp32 input and fp32 normalised input instead (8 bytes per element).
  MLP: GeLU 2·f·T_f·D (fc1 output, GeLU output); SwiGLU 3·f·T_f·D (gate, up, product).
  full recompute: the layer input h·T·D only (h·T·4 under a runtime's ``fp32_stream``: the
  fp32 residual), plus one layer recomputed during backward.
For gpt2 at t = 1 without flash this is 32·s·b·h + 2·a·s²·b bytes in fp16 (= Korthikanti's
34·s·b·h + 5·a·s²·b less the 2·s·b·h dropout masks and the 3·a·s²·b dropout mask + output).

Per micro-batch in flight the stage also keeps its output h·T·D (the next stage's or the
head's input), the token ids (8·b·s, first stage), bert's embedding LayerNorm input, and on
the last stage the labels and the head's activations. 1F1B: stage i of p holds
min(m, p − i) micro-batches. The peak is the largest of three moments: the loss's forward on
the last stage (bf16 logits 2·T_f·V/t + their fp32 softmax 4·T_f·V/t), the backward of the
stage's last layer (one layer's gradient working set, plus under full recompute that layer's
activations again), and the optimizer step (Adam's sqrt(v) temporary of the largest shard).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from predictor.gpus import GpuType
from predictor.runtimes import REFERENCE, RuntimeProfile
from predictor.spec import (
    Family,
    ModelSpec,
    Optimizer,
    ParallelConfig,
    Precision,
    Recompute,
    TrainingSpec,
)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Per-GPU peak memory of the worst pipeline stage, in bytes, by kind."""

    parameters: int
    gradients: int
    optimizer_states: int  # incl. fp32 master weights in mixed precision
    activations: int  # saved-for-backward of all in-flight micro-batches, incl. embeddings
    logits: int  # logits / cross-entropy buffers (last stage)
    overhead: int  # CUDA context, cuBLAS/NCCL workspaces (outside the allocator); 0 w/o GPU
    transient: int = 0  # backward working set or optimizer-step temporaries at the peak
    stage: int = 0  # the pipeline stage these figures belong to
    slack: int = 0  # caching-allocator reserve beyond the tensors (reserved - allocated)
    workspace: int = 0  # cuBLAS / cuBLASLt workspaces taken from the caching allocator (GPU)
    paged: int = 0  # paged optimizer states in CUDA unified memory (outside the allocator)

    @property
    def total(self) -> int:
        """The device figure (what nvidia-smi shows): tensors + slack + overhead, and paged
        optimizer states (resident while the device has room; evicted to the host, not an
        out-of-memory error, when it has not)."""
        return self.tensors + self.slack + self.overhead + self.paged

    @property
    def reserved(self) -> int:
        """What torch.cuda.max_memory_reserved sees: tensors plus the allocator's slack."""
        return self.tensors + self.slack

    @property
    def device(self) -> int:
        return self.total

    @property
    def tensors(self) -> int:
        """What torch.cuda.max_memory_allocated (or the CPU storage tracker) sees."""
        return (self.parameters + self.gradients + self.optimizer_states + self.activations
                + self.logits + self.transient + self.workspace)

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        if not self.paged:  # only paged 8-bit optimizers have it: other plans read as before
            del d["paged"]
        d["tensors"] = self.tensors
        d["reserved"] = self.reserved
        d["total"] = self.total
        return d


# -- helpers shared with predictor.measure -------------------------------------------------
def effective_flags(train: TrainingSpec, par: ParallelConfig) -> tuple[bool, bool]:
    """(sequence parallel, flash attention) as run: both the plan knob and the user's
    training flag must allow it; sequence parallelism needs tp > 1."""
    sp = par.tp > 1 and par.sequence_parallel and train.sequence_parallel
    return sp, par.flash_attention and train.flash_attention


def _runs_fused_attention(m: ModelSpec, rt: RuntimeProfile, mixed: bool, flash: bool
                          ) -> bool:
    """Whether the attention runs a fused kernel that keeps no score matrix. Under
    ``sdpa_dispatch`` (torch's ``scaled_dot_product_attention`` picking its backend, as
    Hugging Face models call it) an fp32 run has no flash kernel and the memory-efficient
    one takes no grouped K/V (``enable_gqa``), so a GQA model's fp32 attention runs the
    math path: explicit softmax, K and V repeated to every head."""
    return flash and not (rt.sdpa_dispatch and not mixed and m.num_kv_heads != m.num_heads)


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """K/V heads per tensor-parallel rank (replicated when tp > kv heads, as Megatron does)."""
    return max(model.num_kv_heads // tp, 1)


def stage_layers(num_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """Layer range [lo, hi) of a pipeline stage (the first stages take the remainder)."""
    base, rem = divmod(num_layers, pp)
    lo = stage * base + min(stage, rem)
    return lo, lo + base + (1 if stage < rem else 0)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _layer_param_numels(m: ModelSpec, tp: int) -> list[int]:
    """Element counts of one layer's parameter tensors on one tp rank."""
    return [math.prod(shape) for shape in _layer_param_shapes(m, tp)]


def _edge_param_numels(m: ModelSpec, tp: int, pp: int, stage: int, vocab: int = 0
                       ) -> list[int]:
    """Embedding (first stage) and head (last stage) parameter tensors of one rank
    (``vocab``: the padded vocabulary, default the model's)."""
    return [math.prod(shape) for shape in _edge_param_shapes(m, tp, pp, stage, vocab)]


def _layer_param_shapes(m: ModelSpec, tp: int) -> list[tuple[int, ...]]:
    """Shapes of one layer's parameter tensors on one tp rank (a linear weight is (out, in);
    biases and norms are vectors)."""
    h, d = m.hidden_size, m.head_dim
    q = m.num_heads // tp * d
    k = kv_heads_per_rank(m, tp) * d
    f = m.ffn_hidden_size // tp
    out: list[tuple[int, ...]] = [(q, h), (k, h), (k, h), (h, q)]
    if m.qkv_bias:
        out += [(q,), (k,), (k,)]
    if m.linear_bias:
        out += [(h,)]
    out += [(f, h), (h, f)]
    if m.swiglu:
        out += [(f, h)]
    if m.linear_bias:
        out += [(f,), (h,)]
    norm: list[tuple[int, ...]] = [(h,)] if m.rmsnorm else [(h,), (h,)]
    if m.qk_norm:  # q_norm and k_norm, replicated on every tp rank
        return out + norm + norm + [(d,), (d,)]
    return out + norm + norm


def _edge_param_shapes(m: ModelSpec, tp: int, pp: int, stage: int, vocab: int = 0
                       ) -> list[tuple[int, ...]]:
    """Shapes of the embedding (first stage) and head (last stage) parameter tensors of one
    rank (``vocab``: the padded vocabulary, default the model's)."""
    h = m.hidden_size
    vr = _cdiv(vocab or m.vocab_size, tp)
    first, last = stage == 0, stage == pp - 1
    bert = m.family is Family.BERT
    out: list[tuple[int, ...]] = []
    if first:
        out.append((vr, h))
        if m.learned_positions:
            out.append((m.max_seq_len, h))
        if bert:
            if m.type_vocab_size:
                out.append((m.type_vocab_size, h))
            out += [(h,), (h,)]
    if last:
        if bert:
            out += [(h, h), (h,), (h,), (h,), (vr,)]
        else:
            out += [(h,)] if m.rmsnorm else [(h,), (h,)]
        if not ((m.tie_embeddings or bert) and first):
            out.append((vr, h))  # untied output, or the tied copy on the last stage (pp > 1)
    return out


BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps 32-bit (fp32) states for tensors of fewer elements
(``Optimizer2State.init_state``: ``min_8bit_size`` default)."""
BNB_BLOCK = 2048
"""Elements per block-wise quantisation block: one fp32 ``absmax`` per block and state
(``init_state``, ``blocks = ceil(n / 2048)``; later releases use 256 for the optimizer
states: 4/256 instead of 4/2048 bytes per element, under 0.02 bytes per element)."""
BNB_PAGED_MIN = 100_000
"""Paged optimizers allocate a state in CUDA unified memory (``F.get_paged``,
``cudaMallocManaged``) only from this many elements (``get_state_buffer``: ``p.numel() <
1e5`` stays an ordinary torch tensor)."""


@functools.lru_cache(maxsize=4096)
def _optimizer_states(m: ModelSpec, opt: Optimizer, tp: int, pp: int, dp: int, zero: int,
                      stage: int, n_layers: int, vocab: int, half_params: bool
                      ) -> tuple[int, int, int]:
    """(optimizer-state bytes in the caching allocator, bytes of paged states in CUDA
    unified memory, the step's temporary bytes or -1) of the 8-bit and Adafactor
    optimizers for one rank of ``stage`` (shards ``ceil(n/dp)`` of every tensor under
    ZeRO >= 1; no fp32 master, which the caller adds).

    bitsandbytes 8-bit Adam/AdamW (``Optimizer2State.init_state``): a tensor of n >= 4096
    elements keeps m and v as uint8 (2·n bytes) plus one fp32 absmax per 2048-element block
    and state (8·ceil(n/2048)); a smaller one keeps fp32 m and v (8·n). Paged variants put
    the uint8 states of tensors of >= 100,000 elements in unified memory (outside PyTorch's
    allocator: not in ``max_memory_allocated`` / active / reserved; resident on the device
    unless memory runs short, so nvidia-smi shows them); the absmax stays a torch tensor.
    The update is one in-place kernel per tensor (``optimizer_update_8bit_blockwise``): no
    temporary.

    transformers' ``Adafactor`` (``beta1=None``, the Trainer's choice: no first moment): a
    tensor of two or more dimensions keeps the fp32 row and column means of the squared
    gradient (r + c elements), a vector a full fp32 ``exp_avg_sq`` (4·n). A ZeRO shard is
    a flat slice, which Adafactor sees as a vector (4 bytes per shard element). Its step
    makes, for the tensor being updated, ``grad**2 + eps`` and then the approximation
    ``r_factor * c_factor`` (or ``exp_avg_sq.rsqrt()``) while the first is alive: two fp32
    tensors of its size; with half-precision parameters also the fp32 copies of the
    gradient and the parameter (``.float()``): four."""
    shapes = _layer_param_shapes(m, tp) * n_layers + _edge_param_shapes(m, tp, pp, stage, vocab)
    states = paged = largest = 0
    for shape in shapes:
        if zero >= 1:  # a flat slice of ceil(n/dp) elements
            shape = (_cdiv(math.prod(shape), dp),)
        largest = max(largest, math.prod(shape))
        own, out = optimizer_state_bytes(opt, shape)
        states += own
        paged += out
    temp = 4 * largest * (4 if half_params else 2) if opt is Optimizer.ADAFACTOR else -1
    return states, paged, temp


def optimizer_state_bytes(opt: Optimizer, shape: tuple[int, ...]) -> tuple[int, int]:
    """(bytes in the caching allocator, bytes in unified memory) of the optimizer states of
    one parameter tensor of ``shape`` under an 8-bit or Adafactor optimizer (see
    ``_optimizer_states``)."""
    n = math.prod(shape)
    if opt is Optimizer.ADAFACTOR:
        return 4 * (shape[0] + n // shape[0] if len(shape) >= 2 else n), 0
    if not opt.eight_bit:
        raise ValueError(f"{opt.value}: not an 8-bit or Adafactor optimizer")
    if n < BNB_MIN_8BIT_SIZE:
        return 8 * n, 0  # fp32 m and v
    absmax = 2 * 4 * _cdiv(n, BNB_BLOCK)
    if opt.paged and n >= BNB_PAGED_MIN:
        return absmax, 2 * n
    return absmax + 2 * n, 0


def stage_param_numels(m: ModelSpec, tp: int, pp: int, stage: int) -> list[int]:
    """Element counts of every parameter tensor on one rank of ``stage``."""
    lo, hi = stage_layers(m.num_layers, pp, stage)
    return _layer_param_numels(m, tp) * (hi - lo) + _edge_param_numels(m, tp, pp, stage)


@functools.lru_cache(maxsize=8192)
def _static_sums(m: ModelSpec, tp: int, dp: int, pp: int, stage: int, edge: int,
                 vocab: int = 0) -> tuple[int, int, int, int]:
    """(elements, ZeRO-shard elements, largest tensor, largest shard) of one layer
    (``edge`` 0) or of the stage's embedding/head tensors (``edge`` 1). Cached: the planner
    asks for the same model many times."""
    numels = (_edge_param_numels(m, tp, pp, stage, vocab) if edge
              else _layer_param_numels(m, tp))
    shards = [-(-n // dp) for n in numels]
    return sum(numels), sum(shards), max(numels, default=0), max(shards, default=0)


def _static_bytes(m: ModelSpec, train: TrainingSpec, tp: int, pp: int, dp: int, zero: int,
                  stage: int, n_layers: int, rt: RuntimeProfile) -> tuple[int, int, int, int]:
    """(parameter, gradient, optimizer-state bytes, Adam's sqrt(v) temporary or -1) of one
    rank of ``stage`` holding ``n_layers`` layers, under the runtime's sharding.

    Default (ZeRO / distributed optimizer): compute-dtype parameters (shards under ZeRO-3,
    plus, outside the reference build, the gathered running block and ``prefetch_layers``
    more), fp32 gradients, fp32 master and optimizer states. FSDP2 under ZeRO-3: the fp32
    shards are the master (no separate copy); the gathered bf16 blocks and the unsharded
    root (embedding, head) are added. Megatron-FSDP under ZeRO-3: the default's shards plus
    the gathered units, the unsharded root and one unit's gradient bucket (see the branch).
    The built-in trainer's ZeRO-3 (``fp32_weights_autocast``): the layers' fp32 weights in
    chunks, the root whole; the layer it gathers counts only at the moments it runs
    (``_gathered_layer``), not here. ``pure_low_precision``: everything in the compute
    dtype, no master. ``optimizer_offload``: master and states on the CPU."""
    mixed = train.precision is not Precision.FP32
    D = 2 if mixed else 4
    vocab = rt.padded_vocab(m.vocab_size, tp) * (1 if rt.vocab_parallel else tp)
    lay_n, lay_sh, lay_max_full, lay_max_sh = _static_sums(m, tp, dp, 0, 0, 0)
    e_n, e_sh, e_max_full, e_max_sh = _static_sums(m, tp, dp, pp, stage, 1,
                                                   0 if vocab == m.vocab_size else vocab)
    n_full = n_layers * lay_n + e_n
    n_sh = n_layers * lay_sh + e_sh
    n_param = n_sh if zero >= 3 else n_full
    if zero >= 3 and rt.fp32_weights_autocast:  # the built-in trainer keeps the root whole
        n_param = n_layers * lay_sh + e_n
    n_grad = n_sh if zero >= 2 else n_full
    n_shard = n_sh if zero >= 1 else n_full
    if zero >= 1:
        max_shard = max(lay_max_sh if n_layers else 0, e_max_sh)
    else:
        max_shard = max(lay_max_full if n_layers else 0, e_max_full)
    opt = train.optimizer
    states = 1 if opt is Optimizer.SGD else 2
    torch_adam = opt in (Optimizer.ADAM, Optimizer.ADAMW)
    if rt.pure_low_precision:
        parameters, gradients = D * n_param, D * n_grad
        optimizer_states = D * n_shard * states
        adam = D * max_shard if states == 2 else -1
    elif rt.fp32_weights_autocast and mixed:  # fp32 weights + autocast's low-precision copies
        # (under fp32_stream the copies count with the activations: _autocast_copies)
        parameters = 4 * n_param + (0 if rt.fp32_stream else D * n_full)
        gradients = 4 * n_grad
        optimizer_states = 4 * n_shard * states
        adam = 4 * max_shard if states == 2 else -1
    elif rt.sharding == "fsdp2" and zero >= 3:
        gathered = D * ((1 + rt.prefetch_layers) * lay_n if n_layers else 0) + D * e_n
        parameters, gradients = 4 * n_sh + gathered, 4 * n_sh
        optimizer_states = 4 * n_sh * states
        adam = 4 * max_shard if states == 2 else -1
    elif rt.sharding == "megatron_fsdp" and zero >= 3:
        # Megatron-FSDP's optim_grads_params (megatron.core.distributed.fsdp): compute-dtype
        # weight, fp32 main-weight, main-gradient and optimizer-state shards, as the
        # distributed optimizer's; its FSDP units (TransformerLayer) gathered while they run
        # (the running one and prefetch_layers more); the other modules' parameters
        # (embedding, final norm, output layer) gathered at their forward and not released
        # before the backward's end; and one unit's unsharded gradient bucket awaiting its
        # reduce-scatter (an upper bound: it exists during that unit's backward only)
        g = rt.grad_bytes if mixed else 4
        units = min(1 + rt.prefetch_layers, n_layers) * lay_n
        parameters = D * (n_sh + units + e_n)
        gradients = g * (n_sh + (lay_n if n_layers else 0))
        optimizer_states = 4 * n_sh * (states + (1 if mixed else 0))
        adam = 4 * max_shard if states == 2 else -1
    else:
        parameters, gradients = D * n_param, (rt.grad_bytes if mixed else 4) * n_grad
        if zero >= 3 and rt is not REFERENCE and n_layers and not rt.fp32_weights_autocast:
            kept = 1 + rt.prefetch_layers
            if rt.zero3_reuse_elems and lay_n:
                # DeepSpeed keeps a layer gathered whose next use lies within the reuse
                # distance: the last layers of the forward, reused by the backward after
                # about twice their own parameters (predictor.runtimes)
                kept = max(kept, rt.zero3_reuse_elems // (2 * lay_n))
            parameters += D * min(kept, n_layers) * lay_n
        optimizer_states = 4 * n_shard * (states + (1 if mixed else 0))
        adam = 4 * max_shard if states == 2 else -1
    if not torch_adam and opt is not Optimizer.SGD:  # 8-bit Adam, Adafactor
        own, _, adam = _optimizer_states(
            m, opt, tp, pp, dp if zero >= 1 else 1, zero, stage, n_layers,
            0 if vocab == m.vocab_size else vocab, rt.pure_low_precision and mixed)
        # the fp32 master where the runtime keeps one beside low-precision weights
        master = (4 * n_shard if mixed and not rt.pure_low_precision
                  and not rt.fp32_weights_autocast and not (rt.sharding == "fsdp2"
                                                             and zero >= 3) else 0)
        optimizer_states = master + own
    elif rt.optimizer_foreach and adam >= 0:  # one temporary per element of the shard
        adam = (D if rt.pure_low_precision else 4) * n_shard
    if rt.optimizer_fused:  # updated in place
        adam = -1
    if rt.dp_flat_allreduce and dp > 1 and zero == 0:  # torch.cat of every gradient
        adam = max(adam, 4 * n_grad)
    if rt.fp32_weights_autocast and mixed and adam >= 0 and not rt.fp32_stream:
        adam -= D * n_full  # after the backward autocast's weight copies are gone
    if rt.ddp_grad_buckets and dp > 1 and zero == 0:
        # DDP's flat buckets beside param.grad, allocated with the wrapper and kept: with
        # the gradients set to None between steps they are there before any gradient is,
        # so they count with the weights (which are always there too)
        if rt.grads_set_to_none:
            parameters += gradients
        else:
            gradients += gradients
    if rt.optimizer_offload:  # fp32 master, states and grad partitions live on the CPU
        optimizer_states, adam = 0, -1
        if mixed and not rt.pure_low_precision:
            gradients = D * n_grad
    if rt.reduce_bucket_elems and zero >= 1:  # DeepSpeed's contiguous-gradient IPG buffer(s)
        gradients += (2 if rt.overlap_comm and zero < 3 else 1) * rt.reduce_bucket_elems * D
    return parameters, gradients, optimizer_states, adam


def _gathered_layer(m: ModelSpec, tp: int, dp: int, zero: int, n_layers: int,
                    rt: RuntimeProfile, mixed: bool, full: bool) -> tuple[int, int]:
    """The built-in trainer's ZeRO-3 (``orchestrator.trainer.zero``): (bytes of the one
    layer whose fp32 weights it holds whole while that layer runs, forward or backward — it
    prefetches none —, bytes of it that it keeps from the layer's forward to its backward).
    The second is nonzero in an fp32 run without full recomputation only: there an fp32
    matmul saves a view of its weight (``weight.t()``) anyway, so the trainer keeps the
    whole gathered layer until its backward (which reuses it), as autocast's copies are
    kept in a mixed run — and like them once per micro-batch in flight (each forward
    gathered its own). (0, 0) for other runtimes, whose gathered blocks are static
    (``_static_bytes``), and below ZeRO-3."""
    if not (rt.fp32_weights_autocast and zero >= 3 and dp > 1 and n_layers):
        return 0, 0
    gathered = 4 * _static_sums(m, tp, 1, 0, 0, 0)[0]
    return gathered, 0 if mixed or full else gathered


def stage_layer_counts(num_layers: int, pp: int, split: str = "first_heavier"
                       ) -> tuple[int, ...]:
    """Layers per pipeline stage under a runtime's split rule: ``first_heavier`` gives the
    remainder to the first stages (the built-in layout), ``even`` to the last ones (as
    Megatron's ``--decoder-last-pipeline-num-layers`` would when asked; with pp dividing the
    layers both are the even split)."""
    base, rem = divmod(num_layers, pp)
    out = [base + (1 if i < rem else 0) for i in range(pp)]
    return tuple(out if split == "first_heavier" else out[::-1])


def megatron_chunk_layers(num_layers: int, pp: int, virtual_stages: int = 1, *,
                          embedding: bool = False, loss: bool = False
                          ) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of each virtual chunk of each pipeline stage, as Megatron builds
    them (``megatron.core.transformer.transformer_block.get_num_layers_to_build``) under
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``:
    the embedding and the loss each count as one layer, the ``num_layers`` (+1, +1) are split
    evenly over the ``pp`` stages and each stage's share evenly over its ``virtual_stages``
    chunks, then the first chunk of the first stage builds one transformer layer fewer
    (embedding) and the last chunk of the last stage one fewer (loss).

    ``ValueError`` (with what would fit) where Megatron's assertions fail: the accounted
    layers must divide by ``pp``, each stage's share by ``virtual_stages``, and the first
    and last chunks must keep at least zero layers."""
    total = num_layers + int(embedding) + int(loss)
    if total % pp:
        fits = [d for d in range(1, total + 1) if total % d == 0]
        raise ValueError(f"num_layers {num_layers} + {total - num_layers} accounted = {total} "
                         f"does not divide by pp={pp}; pp of {fits} would")
    per_stage = total // pp
    if per_stage % virtual_stages:
        fits = [d for d in range(1, per_stage + 1) if per_stage % d == 0]
        raise ValueError(f"{per_stage} layers per stage do not divide into virtual_stages="
                         f"{virtual_stages} chunks; virtual_stages of {fits} would")
    per = per_stage // virtual_stages
    out = [[per] * virtual_stages for _ in range(pp)]
    out[0][0] -= int(embedding)
    out[-1][-1] -= int(loss)
    if min(out[0][0], out[-1][-1]) < 0:
        raise ValueError(f"{per} layer(s) per chunk leave none for the embedding / loss "
                         "chunk; fewer stages or virtual stages would fit")
    return tuple(tuple(c) for c in out)


def interleaved_layers_in_flight(chunk_layers: Sequence[int], pp: int, stage: int,
                                 micro_batches: int) -> int:
    """The most transformer layers' activations stage ``stage`` holds at once under
    Megatron's interleaved 1F1B schedule (``forward_backward_pipelining_with_interleaving``)
    when its virtual chunks hold ``chunk_layers`` layers each, over ``micro_batches``
    micro-batches. Replays the schedule: the virtual micro-batches run in groups of ``pp``
    micro-batches per chunk (``get_schedule_table`` with the default
    ``microbatch_group_size_per_vp_stage`` = pp), the backward visits the chunks in reverse;
    the stage runs ``2·(pp − stage − 1) + (v − 1)·pp`` warm-up forwards (all when that
    reaches ``m·v``), then one forward and one backward at a time. With equal chunks this is
    the ``min(m·v, warm-up + 1)`` chunks ``estimate_stage`` counts."""
    v, m = len(chunk_layers), max(1, micro_batches)
    table = []
    for lo in range(0, m, pp):
        hi = m if lo + pp >= m else lo + pp
        table += [c for c in range(v) for _ in range(lo, hi)]
    total = m * v
    warmup = min(total, 2 * (pp - stage - 1) + (v - 1) * pp)
    live = peak = 0
    for k in range(warmup):
        live += chunk_layers[table[k]]
        peak = max(peak, live)
    for k in range(total - warmup):
        live += chunk_layers[table[warmup + k]]
        peak = max(peak, live)
        live -= chunk_layers[v - 1 - table[k]]
    return peak


@dataclass(frozen=True, slots=True)
class _Dims:
    D: int
    T: int  # tokens held by norms / residuals (sequence shard under SP)
    Tf: int  # tokens seen by the tp matmuls
    h: int
    q: int
    k: int
    f: int
    a: int
    s: int
    b: int
    vr: int


def _layer_activations(m: ModelSpec, x: _Dims, flash: bool, selective: bool) -> int:
    """Bytes one layer keeps for backward for one micro-batch (no full recompute)."""
    D, T, Tf = x.D, x.T, x.Tf
    norm_io = 3 if m.family is Family.GPT_NEOX else 4
    n = norm_io * x.h * T * D
    n += 2 * (4 * T if m.rmsnorm else 2 * T * D)  # norm statistics
    if selective:
        n += (2 * x.q + 2 * x.k) * Tf * D  # Q, K, V, re-laid output
    elif flash:
        n += (3 * x.q + 2 * x.k) * Tf * D + 4 * x.a * Tf
    else:
        kv = x.q if x.k != x.q else x.k  # GQA repeats K/V to all heads
        n += (2 * x.q + 2 * kv) * Tf * D + x.a * x.s * Tf * D
    if m.qk_norm:
        n += (x.q + x.k) * Tf * D + 4 * (x.a + x.k // m.head_dim) * Tf
    n += m.mlp_kept * x.f * Tf * D
    return n


def _backward_working_set(m: ModelSpec, x: _Dims, sp: bool, flash: bool, selective: bool
                          ) -> int:
    """Extra bytes at the worst moment of the first layer's backward (counted from the
    builder's backward code; all activations are still alive then):

    (a) MLP-out (row-parallel) backward: incoming gradient h·T, its sequence-parallel
        all-gather h·T_f, grad of the MLP hidden f·T_f and the weight gradient h·f, before the
        hook moves it into the fp32 buffer;
    (b) the activation's backward: incoming h·T plus SwiGLU's 4 (GeLU's 2) f-wide tensors,
        less the freed MLP-out input f·T_f;
    (c) explicit-softmax attention backward: the gradients of the softmax output and input
        2·a·s·T_f (3 with selective recompute, which first rebuilds the softmax output), the
        output gradient q·T_f, less the freed MLP activations and second norm's tensors.
    """
    D, T, Tf = x.D, x.T, x.Tf
    g_in = x.h * T * D
    a = g_in + (x.h * Tf * D if sp else 0) + x.f * Tf * D + x.h * x.f * D
    b = g_in + (3 if m.swiglu else 1) * x.f * Tf * D
    # (d) RMSNorm backward: three fp32 (T, h) temporaries
    d = 12 * x.h * T if m.rmsnorm else 0  # the incoming gradient replaces the freed output
    c = 0
    if not flash:
        mlp = m.mlp_kept * x.f * Tf * D
        c = (g_in + x.q * Tf * D + (3 if selective else 2) * x.a * x.s * Tf * D
             - mlp - 2 * x.h * T * D)
    return max(a, b, c, d)


def _layer_counts(m: ModelSpec, t: int, s: int, T: int, Tf: int, D: int, selective: bool,
                  flash: bool, traits: tuple[bool, bool, bool, bool, bool],
                  rt: RuntimeProfile = REFERENCE) -> tuple[int, int, int, int, int]:
    """Per-rank query width, FFN width, heads and vocabulary rows (q, f, a, vr) at tensor
    parallelism ``t``, and the bytes one layer keeps for its backward over ``T`` tokens
    (``Tf`` with sequence parallelism undone) of sequence length ``s`` (see
    ``_layer_activations``). Shared by ``estimate_stage`` (T for the whole micro-batch) and
    ``activation_terms`` (T per sequence): every count is linear in the tokens. The
    runtime adds its dropout masks (``predictor.runtimes``) and pads the vocabulary."""
    _, rmsnorm, _, neox, _ = traits
    h, hd = m.hidden_size, m.head_dim
    q = m.num_heads // t * hd
    k = max(m.num_kv_heads // t, 1) * hd
    f = m.ffn_hidden_size // t
    a = m.num_heads // t
    vr = _vocab_rows(m, t, rt)
    one_layer = (3 if neox else 4) * h * T * D + 2 * (4 * T if rmsnorm else 2 * T * D)
    if selective:
        one_layer += (2 * q + 2 * k) * Tf * D
    elif flash:
        one_layer += (3 * q + 2 * k) * Tf * D + 4 * a * Tf
    else:
        kv = q if k != q else k
        P = 4 if rt.softmax_fp32 else D  # bytes per attention probability
        one_layer += (2 * q + 2 * kv) * Tf * D + a * s * Tf * P
        if rt.attention_dropout:
            one_layer += a * s * Tf * (1 + P)  # dropout mask + dropped probabilities
    if selective and not rt.selective_keeps_core_inputs:
        one_layer -= (2 * q + 2 * k) * Tf * D
    if selective and rt.selective_op_sac:  # torchtitan's per-op SAC (predictor.runtimes)
        return q, f, a, vr, _op_sac_layer(m, h, q, k, f, a, T, Tf, D)
    if m.qk_norm:  # per-head RMSNorm of Q and K: its input and fp32 1/rms per head, token
        per = 8 if rt.eager_blocks and rt.cpu_rmsnorm else D  # composite: fp32 in and out
        one_layer += (q + k) * Tf * per + 4 * (a + k // hd) * Tf
    one_layer += m.mlp_kept * f * Tf * D
    if rt.hidden_dropout:
        one_layer += 2 * h * T  # two residual-branch dropout masks (1 byte each)
    if rt.gelu_composite:  # NewGELUActivation's chain (predictor.runtimes)
        one_layer += 12 * f * Tf
    if rt.eager_blocks:
        if flash and not selective and k != q and rt.repeat_kv:
            one_layer += 2 * (q - k) * Tf * D  # K and V repeated to every head
        if m.swiglu:
            one_layer += f * Tf * D  # SiLU's output besides gate, up and the product
        if rmsnorm and rt.cpu_rmsnorm:
            one_layer += 2 * h * T * 4  # each RMSNorm's fp32 normalised input
    if rt.fp32_stream and D == 2:
        # the residual stream stays fp32 (the embedding and the norms run on fp32 weights),
        # so the norms keep fp32 inputs, and autocast casts a norm's output once for each
        # linear reading it: Q, K and V, and the MLP's one or two input projections
        one_layer += (1 if neox else 2) * h * T * 2
        one_layer += (2 + (1 if m.swiglu else 0)) * h * T * D
    if rt.compiled:  # inductor's min-cut partition of a llama layer (predictor.runtimes)
        one_layer = 4 * h * T * D + 2 * 4 * T + 4 * q * Tf * D + 4 * a * Tf + 3 * f * Tf * D
    return q, f, a, vr, one_layer


def _op_sac_layer(m: ModelSpec, h: int, q: int, k: int, f: int, a: int, T: int, Tf: int,
                  D: int) -> int:
    """Bytes one layer keeps under torchtitan's per-op SAC (``selective_op_sac``): its input
    h·T·D, the attention kernel's output q·T_f·D and logsumexp 4·a·T_f, and the output of
    every odd-numbered ``aten.mm`` in the order the layer runs its linears (a linear with a
    bias runs as ``addmm``, which the policy neither counts nor saves); under sequence
    parallelism (T < T_f) also the two reduce-scatter outputs h·T·D."""
    width = {"q": q, "k": k, "v": k, "qkv": q + 2 * k, "o": h, "gate": f, "up": f, "down": h}
    kept = h * T * D + q * Tf * D + 4 * a * Tf
    for name, saved in m.op_sac_linears():
        if saved:
            kept += width[name] * Tf * D
    if Tf > T:  # sequence parallelism
        kept += 2 * h * T * D
    return kept


def _sac_redo(m: ModelSpec, t: int, s: int, T: int, Tf: int, D: int, selective: bool,
              flash: bool, traits: tuple[bool, bool, bool, bool, bool], rt: RuntimeProfile,
              one_layer: int) -> int:
    """Under per-op SAC, the bytes a layer's backward first rebuilds: the tensors the layer
    would keep without recomputation less those the policy saved (0 otherwise)."""
    if not (selective and rt.selective_op_sac):
        return 0
    return max(0, _layer_counts(m, t, s, T, Tf, D, False, flash, traits, rt)[4] - one_layer)


def estimate_stage(model: ModelSpec, train: TrainingSpec, par: ParallelConfig, stage: int,
                   gpu: GpuType | None = None, *, runtime: RuntimeProfile = REFERENCE,
                   layers: Sequence[int] | None = None, virtual_stages: int = 1,
                   chunks: Sequence[Sequence[int]] | None = None) -> MemoryBreakdown:
    """Peak tensor memory of one rank of pipeline stage ``stage`` under ``runtime``.

    ``layers`` (layers per stage, summing to the model's) overrides the runtime's split;
    ``virtual_stages`` > 1 is Megatron's interleaved schedule (each stage holds that many
    chunks of ``layers[stage] / virtual_stages`` layers; stage i keeps
    ``2·(pp − i − 1) + (v − 1)·pp + 1`` chunks of micro-batches in flight, at most all
    ``m·v``). ``chunks`` (per stage, the layers of each of its ``virtual_stages`` chunks,
    e.g. ``megatron_chunk_layers``) gives uneven chunks: the stage holds their sums, and the
    layers in flight are replayed from the schedule (``interleaved_layers_in_flight``).
    ``gpu`` is accepted for callers that predate ``predictor.overhead``: it sets
    ``overhead`` to the GPU's CUDA context; the calibrated non-tensor figures come from
    ``predictor.overhead.device_memory``.

    Written as straight-line arithmetic over locals (no intermediate objects): the planner
    calls it thousands of times per job."""
    m, t, dp, zero, pp = model, par.tp, par.dp, par.zero_stage, par.pp
    rt = runtime
    sp = t > 1 and par.sequence_parallel and train.sequence_parallel and rt.sequence_parallel
    mixed = train.precision is not Precision.FP32
    flash = _runs_fused_attention(m, rt, mixed, par.flash_attention and train.flash_attention)
    D = 2 if mixed else 4
    first, last = stage == 0, stage == pp - 1
    traits = _traits(m)
    swiglu, rmsnorm, bert, _, learned = traits

    # static state: one layer's tensors counted once, times the stage's layers
    if chunks is not None:
        layers = [sum(c) for c in chunks]
    if layers is None:
        if rt.stage_split == "first_heavier":
            base, rem = divmod(m.num_layers, pp)
            n_layers = base + (1 if stage < rem else 0)
        else:
            n_layers = stage_layer_counts(m.num_layers, pp, rt.stage_split)[stage]
    else:
        n_layers = layers[stage]
    parameters, gradients, optimizer_states, adam = _static_bytes(
        m, train, t, pp, dp, zero, stage, n_layers, rt)
    paged = _paged_bytes(m, train, t, pp, dp, zero, stage, n_layers, rt)

    # activations of one micro-batch (see _layer_activations / _backward_working_set, the
    # same counts inlined)
    s, b = train.seq_len, par.micro_batch
    h, hd = m.hidden_size, m.head_dim
    T = b * (s // t if sp else s)
    Tf = b * s
    recompute = par.recompute
    selective = recompute is Recompute.SELECTIVE
    q, f, a, vr, one_layer = _layer_counts(m, t, s, T, Tf, D, selective, flash, traits, rt)
    hTD = h * T * D
    full = recompute is Recompute.FULL
    per_layer = _kept_per_layer(rt, full, h, T, D, one_layer)
    mb = hTD  # the stage's output (next stage's / head's input)
    if first:
        mb += 8 * b * s  # token ids
        if rt.hidden_dropout:
            mb += h * T  # embedding dropout mask
        if bert:
            mb += hTD + 2 * T * D  # embedding LayerNorm input + statistics
    if last:
        mb += 8 * b * s  # labels
        if bert:
            mb += 3 * hTD + 2 * T * D  # dense output, GeLU output, LN output + stats
        else:
            mb += hTD + (4 * T if rmsnorm else 2 * T * D)  # final norm output + stats
    mb += _stage_stream_bytes(rt, D, h, T, last and not bert and rmsnorm)
    m_total = max(1, train.global_batch // (dp * b))
    in_flight = min(m_total, pp - stage)
    # 1F1B with m <= pp - stage micro-batches (and gradients set to None after each step): the
    # stage's first backward, with all m in flight, runs before any gradient exists, and every
    # later one in the cool-down with fewer in flight; priced as a step of one micro-batch
    # with the others beside it, and as the later backwards with one micro-batch fewer
    shallow = rt.grads_set_to_none and 1 < m_total <= pp - stage and virtual_stages == 1
    single = m_total == 1 or shallow  # the gradients appear during a backward of the step
    n_kept = n_layers  # layers whose kept tensors stay on the GPU
    if rt.activation_offload:  # torchtune's forward stash (predictor.runtimes)
        n_kept = min(n_layers, OFFLOAD_STASH if full else 1)
        if first:
            mb -= 8 * b * s  # the token ids go to the CPU too
    one_mb = mb + n_kept * per_layer  # what each micro-batch in flight holds
    activations = in_flight * one_mb
    if virtual_stages > 1 and pp > 1 and chunks is not None:
        kept = interleaved_layers_in_flight(tuple(chunks[stage]), pp, stage, m_total)
        activations = in_flight * mb + kept * per_layer
    elif virtual_stages > 1 and pp > 1:
        v = virtual_stages
        chunks = min(m_total * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
        activations = in_flight * mb + chunks * (n_layers // v) * per_layer
    if n_layers and not learned:
        activations += 2 * s * hd * D  # rotary cos/sin tables
    copies = one_copy = 0
    if rt.fp32_stream and rt.fp32_weights_autocast and mixed:
        copies, one_copy = _autocast_copies(m, t, pp, stage, n_layers, D, rt, full)
        # each micro-batch in flight keeps the copies its own forward made (autocast's
        # cache lives for one forward)
        activations += in_flight * copies
        one_mb += copies
    # ZeRO-3: the running layer's gathered weights, as its backward starts (less what the
    # forward kept, counted as copies) and ends
    gathered, kept = _gathered_layer(m, t, dp, zero, n_layers, rt, mixed, full)
    if kept:  # likewise per micro-batch in flight: each forward gathered its own
        copies, one_copy = n_layers * kept, kept
        activations += in_flight * copies
        one_mb += copies
    g_start = gathered - kept

    # backward working set of the first layer (_backward_working_set)
    g_in = hTD
    w_a = g_in + (h * Tf * D if sp else 0) + f * Tf * D + h * f * D
    w_b = g_in + (3 if swiglu else 1) * f * Tf * D
    w_d = 12 * h * T if rmsnorm else 0
    bwd = max(w_a, w_b, w_d)
    n_mlp = m.mlp_kept
    if not flash:
        w_c = (g_in + q * Tf * D + (3 if selective else 2) * a * s * Tf * D
               - n_mlp * f * Tf * D - 2 * hTD)
        bwd = max(bwd, w_c)
    if full:
        bwd += one_layer + one_copy  # the recomputed layer's activations and weight copies
    bwd += _sac_redo(m, t, s, T, Tf, D, selective, flash, traits, rt, one_layer)

    # the candidate peak moments, (gradients alive, activations, logits, transient) on top of
    # the parameters and optimizer states; the first of equal sums wins, in this order
    lg = (0 if rt.classification_head else Tf * vr) if last else 0
    low = _low_precision_logits(rt, mixed, bert)
    hb = rt.logits_head_bwd_bytes * (1 if low else 2)
    held = _held_logit_bytes(rt, hb)
    bc = _bias_grad_copy(rt, mixed, low)
    head: list[tuple[int, int, int]] = []
    if last:
        # loss forward: low-precision logits + their fp32 copy (fp32: one tensor)
        head.append((activations, _logit_bytes(rt, low, True, t) * lg, 0))
        # output-layer backward: logits gradient (fp32 runs keep the fp32 softmax buffer),
        # the weight gradient vocab/t·h and the input gradient h·T_f
        lb, tb = _logit_bytes(rt, low, False, t) * lg, vr * h * D + h * Tf * D
        if rt.compiled and rt.loss_chunks:  # one chunk's gradient beside the chunks
            lb += D * b * _cdiv(s, rt.loss_chunks) * vr
        if hb:  # the loss's buffers go before the head's matmul backward
            head += [(activations, lb, 0), (activations, hb * lg, tb)]
            if bc:
                head.append((activations, (hb + bc) * lg, 0))
            if rt.fp32_weights_autocast and mixed:
                # the weight gradient cast to fp32, the matmul's saved weight copy freed
                head.append((activations, held * lg, tb + (4 - D) * vr * h))
        else:
            head.append((activations, lb, tb))
    # at the last layer's backward one layer's activations and (without full recompute,
    # where the working set has them) weight copies are left; a tied embedding's two
    # gradients are summed into a third tensor (and an earlier micro-batch's is accumulated)
    # after that, at the embedding's backward, when no activation is left
    act_end = activations - (n_kept - 1) * per_layer if n_kept else activations
    act_end -= copies - (0 if full else one_copy)
    head_copy = copies - (0 if full else n_layers * one_copy) if last else 0  # the head's copies
    tied = 4 * vr * h if rt.eager_blocks and first and last and (
        m.tie_embeddings or bert) else 0
    if rt.grads_set_to_none and single:
        # the gradients grow as the activations go, moment by moment (_single_step_grads;
        # under ZeRO-2/3 as chunks): the first layer's backward starts with the head's
        # gradients (its weight copy freed) and ends with its own (its activations and weight
        # copies freed); the last layer's likewise; then the embedding's backward, with only
        # the ids, the labels, the logits the loop holds, the incoming gradient and the other
        # micro-batches in flight left; a tied embedding's two gradients are summed into a
        # third tensor after it, when only the logits the loop holds are left
        g_head, g_layer, g_last, before, after = _single_step_grads(
            m, train, t, pp, dp, zero, stage, n_layers, rt)
        own = per_layer + (0 if full else one_copy) if n_layers else 0
        cands = [(0, a_, l_, t_) for a_, l_, t_ in head]
        cands += [(g_head, activations - head_copy, held * lg, bwd + g_start),
                  (g_layer, activations - head_copy - own, held * lg, gathered),
                  (g_last, act_end, held * lg, bwd + g_start),
                  (before, act_end - own, held * lg, gathered)]
        if first:
            act_emb = b * _embedding_backward_bytes(rt, mixed, h, T // b, s, last)
            cands.append((after, act_emb + (in_flight - 1) * one_mb, held * lg, 0))
            if tied:  # the sum after the embedding's backward: no activation is left
                cands.append((before, 0, held * lg, 3 * tied))
    elif rt.optimizer_in_backward:
        # only the gradients in flight: the head's weight gradient buffered for a tied
        # embedding, and the tensor whose hook is running; at the end the largest tensor's
        # gradient with its optimizer temporary (predictor.runtimes)
        live, last_grad, adam = _in_backward_grads(m, train, t, pp, dp, zero, stage, n_layers,
                                                   rt)
        # (at the loss and the head's backward no gradient exists yet: the head's weight
        # gradient is that moment's transient)
        cands = [(0, a_, l_, t_) for a_, l_, t_ in head]
        cands.append((live, activations, held * lg, bwd))
        gradients = last_grad
    else:
        cands = [(gradients, a_, l_, t_) for a_, l_, t_ in head]
        cands.append((gradients, activations, held * lg, bwd + g_start))
        if tied:
            cands.append((gradients, 0, held * lg, 3 * tied))
    if shallow:  # the later backwards: one micro-batch fewer in flight, every gradient made
        cands.append((gradients, activations - one_mb, 0, bwd + g_start))
    if rt.eager_blocks and first and not last and m_total > 1 and not rt.optimizer_in_backward:
        # a pipeline's first stage under 1F1B: a later micro-batch's embedding backward
        # (its dense gradient beside the accumulated one) while the micro-batches forwarded
        # after it are still in flight (in_flight − 1 of them; one fewer when the second
        # backward is in the cool-down, m <= pp − stage); left of its own, the ids and the
        # fp32 gradient received from the next stage; under ZeRO-2/3 (the embedding is
        # handled as stage 2's) the reduce-scatter's chunk of it beside (_embedding_chunk)
        later = in_flight - (2 if shallow else 1)
        rest = later * one_mb + 8 * b * s + 4 * h * T  # one_mb: its weight copies included
        if n_layers and not learned:
            rest += 2 * s * hd * D
        cands.append((gradients, rest, 0, 4 * vr * h + _embedding_chunk(vr, h, dp, zero)))
    # the gradients an earlier micro-batch left at the forward's moments (none before the
    # first backward of a step when they are set to None: in a step of one micro-batch, or
    # with m <= pp − stage, where every forward comes before it)
    fwd_grads = 0 if rt.grads_set_to_none and single else gradients
    if full and one_copy and n_layers:
        # autocast keeps every weight copy it makes until the forward leaves it (after the
        # head's matmul), though the recomputed layers keep none for their backward: the end
        # of the forward holds all the layers' copies and the low-precision logits (with an
        # earlier micro-batch's gradients, when there is one)
        out_bytes = _residual_bytes(rt, D, h, T) if last and not bert else 0
        cands.append((fwd_grads, activations + n_layers * one_copy, D * lg + out_bytes, 0))
    if gathered:
        # ZeRO-3: the last layer's forward, its weights gathered, every layer's copies made
        # (the head's not yet), before the final norm and the logits
        layer_copies = n_layers * one_copy if full else 0
        cands.append((fwd_grads, activations + layer_copies - head_copy, 0, g_start))
    cands.append((gradients, 0, 0, adam))  # Adam's sqrt(v) temporary; activations gone
    best = cands[0]
    top = sum(best)
    for c in cands[1:]:
        if sum(c) > top:
            best, top = c, sum(c)
    return MemoryBreakdown(
        parameters=parameters, gradients=best[0], optimizer_states=optimizer_states,
        activations=best[1], logits=best[2],
        overhead=gpu.cuda_context_bytes if gpu is not None else 0,
        transient=best[3], stage=stage, paged=paged)


OFFLOAD_STASH = 5
"""torchtune ``OffloadActivations(max_fwd_stash_size=5)``: offloaded tensors kept on the GPU
until their copy to the CPU is done."""


def _in_backward_grads(m: ModelSpec, train: TrainingSpec, tp: int, pp: int, dp: int,
                       zero: int, stage: int, n_layers: int, rt: RuntimeProfile
                       ) -> tuple[int, int, int]:
    """Under ``optimizer_in_backward``: (gradient bytes alive beside the activations, the
    largest tensor's gradient bytes at the end of the backward, that tensor's optimizer
    temporary or -1). A tied embedding's head gradient waits in autograd's input buffer
    until the embedding's backward adds its share, then both are one gradient."""
    mixed = train.precision is not Precision.FP32
    if rt.pure_low_precision or not mixed:
        unit = 2 if mixed else 4
    else:
        unit = 4 if rt.fp32_weights_autocast else rt.grad_bytes
    vocab = rt.padded_vocab(m.vocab_size, tp) * (1 if rt.vocab_parallel else tp)
    _, _, lay_max, _ = _static_sums(m, tp, dp, 0, 0, 0)
    _, _, e_max, _ = _static_sums(m, tp, dp, pp, stage, 1, 0 if vocab == m.vocab_size else vocab)
    lay_max = lay_max if n_layers else 0
    biggest = max(lay_max, e_max)
    first, last = stage == 0, stage == pp - 1
    tied = (m.tie_embeddings or m.family is Family.BERT) and first and last
    held = unit * _cdiv(vocab, tp) * m.hidden_size if tied else 0
    opt = train.optimizer
    if opt in (Optimizer.ADAM, Optimizer.ADAMW) and not rt.optimizer_fused:
        # one parameter per optimizer: foreach's sqrt(v) is that tensor's
        temp = (unit if rt.pure_low_precision else 4) * biggest
    elif opt is Optimizer.ADAFACTOR:
        temp = _static_bytes(m, train, tp, pp, dp, zero, stage, n_layers,
                             replace(rt, optimizer_in_backward=False))[3]
    else:
        temp = -1
    return held + unit * lay_max, unit * biggest, temp


def _paged_bytes(m: ModelSpec, train: TrainingSpec, tp: int, pp: int, dp: int, zero: int,
                 stage: int, n_layers: int, rt: RuntimeProfile) -> int:
    """Bytes of a paged 8-bit optimizer's states in unified memory (``_optimizer_states``;
    0 for every other optimizer, or when the runtime offloads the optimizer)."""
    if not train.optimizer.paged or rt.optimizer_offload:
        return 0
    vocab = rt.padded_vocab(m.vocab_size, tp) * (1 if rt.vocab_parallel else tp)
    return _optimizer_states(m, train.optimizer, tp, pp, dp if zero >= 1 else 1, zero, stage,
                             n_layers, 0 if vocab == m.vocab_size else vocab, False)[1]


def _kept_per_layer(rt: RuntimeProfile, full: bool, h: int, T: int, D: int, one_layer: int
                    ) -> int:
    """Activation bytes one layer keeps for its backward: everything (``one_layer``), or
    under full recomputation its input alone, the fp32 residual under ``fp32_stream``."""
    return _residual_bytes(rt, D, h, T) if full else one_layer


def _residual_bytes(rt: RuntimeProfile, D: int, h: int, T: int) -> int:
    """Bytes of one [tokens, hidden] tensor of the residual stream: fp32 under
    ``fp32_stream``, else the compute dtype."""
    return h * T * (4 if rt.fp32_stream else D)


def _stage_stream_bytes(rt: RuntimeProfile, D: int, h: int, T: int, final_rmsnorm: bool
                        ) -> int:
    """What ``fp32_stream`` and ``eager_blocks`` add to a stage's per-micro-batch tensors:
    its output is the fp32 residual (2 bytes more per element than D), and a final composite
    RMSNorm keeps its fp32 normalised input."""
    out = h * T * 2 if rt.fp32_stream and D == 2 else 0
    if rt.eager_blocks and rt.cpu_rmsnorm and final_rmsnorm:
        out += h * T * 4
    return out


@functools.lru_cache(maxsize=4096)
def _autocast_copies(m: ModelSpec, tp: int, pp: int, stage: int, n_layers: int, D: int,
                     rt: RuntimeProfile, full: bool) -> tuple[int, int]:
    """(bytes of autocast's low-precision weight copies held from the forward to the
    backward, bytes of one layer's copies) under ``fp32_stream``: only what a matmul reads
    is cast — the layers' linear weights and biases and the head (BERT's dense transform
    and decoder), not the embeddings, norms or BERT's output bias; under full recomputation
    the layers' copies are dropped with their activations, and only the layer being
    recomputed has them again (counted with the backward's working set)."""
    h = m.hidden_size
    lay = _static_sums(m, tp, 1, 0, 0, 0)[0] - (2 if m.rmsnorm else 4) * h
    if m.qk_norm:  # norm weights: not a matmul's
        lay -= 2 * m.head_dim
    cast = 0
    if stage == pp - 1:
        vocab = rt.padded_vocab(m.vocab_size, tp) * (1 if rt.vocab_parallel else tp)
        cast = -(-vocab // tp) * h + (h * h + h if m.family is Family.BERT else 0)
    if not full:
        cast += n_layers * lay
    return D * cast, D * lay if n_layers else 0


@functools.lru_cache(maxsize=4096)
def _single_step_grads(m: ModelSpec, train: TrainingSpec, tp: int, pp: int, dp: int,
                       zero: int, stage: int, n_layers: int, rt: RuntimeProfile
                       ) -> tuple[int, int, int, int, int]:
    """Under ``grads_set_to_none``, the gradient bytes alive in a step of one micro-batch: as
    the first layer's backward starts (the head's) and as it ends (the head's and that
    layer's), as the last layer's backward starts (all but its own and the first stage's
    token embedding's) and as it ends (all but the embedding's), and after the embedding's
    backward. Under ZeRO-2 the built-in
    trainer reduce-scatters each gradient the moment the backward makes it and frees it
    (``orchestrator.trainer.zero``): the finished tensors' are chunks (``ceil(n/dp)`` per
    tensor; the layer's largest counted whole, as at its reduction), and the embedding's full
    gradient sits beside its chunk for a moment; otherwise the full gradients."""
    mixed = train.precision is not Precision.FP32
    if rt.pure_low_precision:
        unit = 2 if mixed else 4
    else:
        unit = rt.grad_bytes if mixed and not rt.fp32_weights_autocast else 4
    sharded = zero >= 2 and dp > 1
    grads = _static_bytes(m, train, tp, pp, dp if sharded else 1, zero if sharded else 0,
                          stage, n_layers, rt)[1]
    vocab = rt.padded_vocab(m.vocab_size, tp) * (1 if rt.vocab_parallel else tp)
    vocab_arg = 0 if vocab == m.vocab_size else vocab
    head_numels = _edge_param_numels(m, tp, 2, 1, vocab_arg) if stage == pp - 1 else []
    lay_n, lay_sh, lay_max, lay_max_sh = _static_sums(m, tp, dp, 0, 0, 0)
    if not n_layers:
        lay_n = lay_sh = lay_max = lay_max_sh = 0
    if sharded:
        head = unit * sum(-(-n // dp) for n in head_numels)
        layer, done = unit * (lay_sh + lay_max - lay_max_sh), unit * lay_sh
    else:
        head, layer = unit * sum(head_numels), unit * lay_n
        done = layer
    if stage:
        return head, head + layer, grads - done, grads, grads
    emb = _edge_param_numels(m, tp, pp, stage, vocab_arg)[0]
    if sharded:
        chunk = -(-emb // dp)
        before = grads - unit * chunk
        return head, head + layer, before - done, before, grads + unit * emb
    before = grads - unit * emb
    return head, head + layer, before - done, before, grads


def _vocab_rows(m: ModelSpec, tp: int, rt: RuntimeProfile) -> int:
    """Rows of the (padded) vocabulary one tensor-parallel rank's embedding and head hold."""
    return -(-rt.padded_vocab(m.vocab_size, tp) // (tp if rt.vocab_parallel else 1))


def _embedding_chunk(vr: int, h: int, dp: int, zero: int) -> int:
    """The built-in trainer's ZeRO-2/3 reduce-scatter output for the token embedding's
    gradient (fp32, ``ceil(n/dp)`` elements: ``orchestrator.trainer.zero``), alive beside
    the dense gradient it is reduced from while a later micro-batch's embedding backward
    is accumulated; 0 without gradient sharding."""
    return 4 * -(-vr * h // dp) if zero >= 2 and dp > 1 else 0


def _embedding_backward_bytes(rt: RuntimeProfile, mixed: bool, h: int, T: int, s: int,
                              last: bool) -> int:
    """Activation bytes per sequence left at the token embedding's backward: the token ids
    (and the labels on a last stage) and the gradient flowing into the embedding (fp32 under
    ``fp32_stream``)."""
    return 8 * s * (2 if last else 1) + h * T * (4 if rt.fp32_stream or not mixed else 2)


StaticTerms = tuple[tuple[int, int, int, tuple[int, ...], int], ...]
"""Per candidate stage (the first, and the last when pp > 1): (static bytes — parameters,
gradients, optimizer states —, the optimizer step's temporary (Adam's sqrt(v)), or -1
without one, the gradient bytes that do not exist yet during a step of one micro-batch: 0
unless the runtime sets the gradients to None between steps, and in such a step the
gradient bytes each kind of moment holds (``GRAD_KINDS``): as the first layer's backward
starts and ends, as the last layer's starts and ends, and after the embedding's backward
(``_single_step_grads``, which ZeRO-2 shards); zeros unless the runtime sets the gradients
to None; and the bytes ZeRO-2/3 adds to a pipeline's first stage at a later micro-batch's
embedding backward (``_embedding_chunk``, on top of ``activation_peaks``' embedding
figure))."""

NO_MOMENT = -(1 << 60)
"""A moment that does not exist (so no static bytes added to it make it the peak)."""

GRAD_KINDS = 6
"""Kinds of a step-of-one-micro-batch moment: 0 adds no gradients, 1-5 add
``StaticTerms``' five single-step gradient figures (``NO_MOMENT`` for the kinds that do not
apply)."""

ActivationTerms = tuple[tuple[int, int, int, tuple[tuple[int, int], ...],
                              tuple[tuple[int, int, int], ...], int,
                              tuple[tuple[int, int], ...], tuple[int, int] | None], ...]
"""Per candidate stage: (pipeline depth ``pp - stage``, activation bytes per sequence of one
micro-batch in flight, constant activation bytes, peak moments ``(bytes per sequence,
constant)`` on top of the activations: logits, the backward working set; and the moments of a
step of one micro-batch, on top of the activations and the static bytes less the gradients
that do not exist yet, each with which of ``StaticTerms``' single-step gradient figures it
adds (``GRAD_KINDS``: 0 none; 1 and 2 as the first layer's backward starts and ends, 3 and
4 as the last layer's starts and ends, 5 after the embedding's backward) — empty unless the
runtime sets the gradients to None, when a step of one micro-batch has the same moments as
any other; the constant bytes each micro-batch in flight adds (autocast's weight copies
under ``fp32_weights_autocast``), which the constant activation bytes include once; and the
moments of the backwards after a stage's first when m <= pp − stage micro-batches (on top
of one micro-batch fewer in flight and every gradient) — empty unless the runtime sets the
gradients to None; and the first stage's embedding moment alone (one of the moments, to
which ``StaticTerms``' ZeRO chunk is added), or None)."""


SPLIT_FORM_UNPRICED = ("compiled", "loss_chunks", "optimizer_in_backward",
                       "activation_offload")
"""Runtime fields only ``estimate_memory`` prices (per-job ``frenzy memory`` overrides; no
named profile sets them, so the planner never meets them)."""


def _check_split_form(rt: RuntimeProfile) -> None:
    """``ValueError`` for a profile whose options the split form does not price."""
    on = [f for f in SPLIT_FORM_UNPRICED if getattr(rt, f)]
    if on:
        raise ValueError(f"runtime {rt.name}: {', '.join(on)} priced by estimate_memory "
                         "only, not by the planner's split form")


def _candidate_stages(pp: int) -> tuple[int, ...]:
    return (0, pp - 1) if pp > 1 else (0,)


def static_terms(model: ModelSpec, train: TrainingSpec, tp: int, pp: int, dp: int, zero: int,
                 runtime: RuntimeProfile = REFERENCE) -> StaticTerms:
    """The micro-batch-independent part of ``estimate_stage`` for the stages
    ``estimate_memory`` compares (same counts as there)."""
    _check_split_form(runtime)
    base, rem = divmod(model.num_layers, pp)
    out = []
    for stage in _candidate_stages(pp):
        n_layers = base + (1 if stage < rem else 0)
        if runtime.stage_split != "first_heavier":
            n_layers = stage_layer_counts(model.num_layers, pp, runtime.stage_split)[stage]
        par, grad, opt, adam = _static_bytes(model, train, tp, pp, dp, zero, stage, n_layers,
                                             runtime)
        single = (0,) * (GRAD_KINDS - 1)
        if runtime.grads_set_to_none:
            single = _single_step_grads(model, train, tp, pp, dp, zero, stage, n_layers,
                                        runtime)
        chunk = 0
        if runtime.eager_blocks and stage == 0 and pp > 1:
            chunk = _embedding_chunk(_vocab_rows(model, tp, runtime), model.hidden_size, dp,
                                     zero)
        out.append((par + grad + opt, adam, grad if runtime.grads_set_to_none else 0, single,
                    chunk))
    return tuple(out)


def activation_terms(model: ModelSpec, train: TrainingSpec, tp: int, pp: int,
                     recompute: Recompute, sequence_parallel: bool, flash_attention: bool,
                     runtime: RuntimeProfile = REFERENCE, gathers: bool = False
                     ) -> ActivationTerms:
    """The micro-batch-dependent part of ``estimate_stage``, per sequence of the micro-batch.

    Every activation, logits and working-set count there is ``b`` times a per-sequence count
    (T and T_f are ``b`` times the per-sequence tokens) plus a few constants, so the peak on
    top of the static state is, exactly in integers, ``min(m, pp - stage)·b·c_mb + c_rot +
    max_i(b·c_i + k_i)`` with ``m`` micro-batches per replica (``activation_peaks``). Neither
    ``dp`` nor the ZeRO stage enters, except through ``gathers``: the plan is ZeRO-3 at dp > 1
    and the runtime gathers each layer's weights as it runs (the built-in trainer:
    ``_gathered_layer``), which adds the running layer to the layers' moments and, in an
    fp32 run without full recomputation, the matrices the forward keeps to the activations.
    ``sequence_parallel`` and ``flash_attention`` are the plan's knobs (ANDed with the job's
    flags, as ``estimate_stage`` does)."""
    _check_split_form(runtime)
    m = model
    t = tp
    sp = t > 1 and sequence_parallel and train.sequence_parallel and runtime.sequence_parallel
    mixed = train.precision is not Precision.FP32
    flash = _runs_fused_attention(m, runtime, mixed, flash_attention and train.flash_attention)
    D = 2 if mixed else 4
    traits = _traits(m)
    swiglu, rmsnorm, bert, _, learned = traits
    s = train.seq_len
    h, hd = m.hidden_size, m.head_dim
    T = s // t if sp else s  # per sequence of the micro-batch
    Tf = s
    rt = runtime
    selective = recompute is Recompute.SELECTIVE
    full = recompute is Recompute.FULL
    n_mlp = m.mlp_kept
    q, f, a, vr, one_layer = _layer_counts(m, t, s, T, Tf, D, selective, flash, traits, rt)
    hTD = h * T * D
    per_layer = _kept_per_layer(rt, full, h, T, D, one_layer)
    # backward working set of the first layer, (per sequence, constant) pieces
    redo = one_layer if full else _sac_redo(m, t, s, T, Tf, D, selective, flash, traits, rt,
                                            one_layer)
    bwd = [(hTD + (h * Tf * D if sp else 0) + f * Tf * D + redo, h * f * D),
           (hTD + (3 if swiglu else 1) * f * Tf * D + redo, 0),
           ((12 * h * T if rmsnorm else 0) + redo, 0)]
    if not flash:
        bwd.append((hTD + q * Tf * D + (3 if selective else 2) * a * s * Tf * D
                    - n_mlp * f * Tf * D - 2 * hTD + redo, 0))
    base, rem = divmod(m.num_layers, pp)
    out = []
    for stage in _candidate_stages(pp):
        first, last = stage == 0, stage == pp - 1
        n_layers = base + (1 if stage < rem else 0)
        if rt.stage_split != "first_heavier":
            n_layers = stage_layer_counts(m.num_layers, pp, rt.stage_split)[stage]
        c_mb = n_layers * per_layer + hTD
        if first:
            c_mb += 8 * s
            if rt.hidden_dropout:
                c_mb += h * T
            if bert:
                c_mb += hTD + 2 * T * D
        if last:
            c_mb += 8 * s
            if bert:
                c_mb += 3 * hTD + 2 * T * D
            else:
                c_mb += hTD + (4 * T if rmsnorm else 2 * T * D)
        c_mb += _stage_stream_bytes(rt, D, h, T, last and not bert and rmsnorm)
        c_rot = 2 * s * hd * D if n_layers and not learned else 0
        layer_bwd = bwd
        copies = one_copy = 0
        rot = c_rot  # the rotary tables alone
        if rt.fp32_stream and rt.fp32_weights_autocast and mixed:
            copies, one_copy = _autocast_copies(m, t, pp, stage, n_layers, D, rt, full)
            c_rot += copies
            if full:
                layer_bwd = [(c, k + one_copy) for c, k in bwd]
        gathered, kept = _gathered_layer(m, t, 2, 3 if gathers else 0, n_layers, rt, mixed,
                                         full)
        if kept:  # the forward's gathered matrices, kept to the layer's backward
            copies, one_copy = n_layers * kept, kept
            c_rot += copies
        # autocast's copies and ZeRO-3's kept matrices are made per micro-batch in flight
        # (estimate_stage): they move from the constant to each micro-batch in flight (the
        # same sum with one in flight)
        per_flight = copies
        g_start = gathered - kept
        lg = (0 if rt.classification_head else Tf * vr) if last else 0
        low = _low_precision_logits(rt, mixed, bert)
        hb = rt.logits_head_bwd_bytes * (1 if low else 2)
        held = _held_logit_bytes(rt, hb) * lg
        bc = _bias_grad_copy(rt, mixed, low)
        head = []
        if last:
            lb = _logit_bytes(rt, low, False, t) * lg
            head.append((_logit_bytes(rt, low, True, t) * lg, 0))
            if hb:
                head += [(lb, 0), (hb * lg + h * Tf * D, vr * h * D)]
                if bc:
                    head.append(((hb + bc) * lg, 0))
                if rt.fp32_weights_autocast and mixed:
                    head.append((held + h * Tf * D, vr * h * 4))
            else:
                head.append((lb + h * Tf * D, vr * h * D))
        if full and one_copy and n_layers:  # the forward's end (see estimate_stage)
            head.append((D * lg + (_residual_bytes(rt, D, h, T) if last and not bert else 0),
                         n_layers * one_copy))
        head_copy = copies - (0 if full else n_layers * one_copy) if last else 0  # head's copies
        fwd_end = ((0, (n_layers * one_copy if full else 0) - head_copy + g_start),
                   ) if gathered else ()  # ZeRO-3: the last layer's forward (estimate_stage)
        moments = [(c + held, k + g_start) for c, k in layer_bwd] + head + list(fwd_end)
        emb_moment = None  # 1F1B's embedding moment (estimate_stage), without ZeRO's chunk
        if rt.eager_blocks and first and not last:
            emb_moment = (8 * s + 4 * h * T - c_mb, rot + 4 * vr * h - c_rot)
            moments.append(emb_moment)
        drop = (n_layers - 1) * per_layer if n_layers else 0
        left = copies - (0 if full else one_copy)
        tied = 4 * vr * h if rt.eager_blocks and first and last and (
            m.tie_embeddings or bert) else 0
        if tied:  # at the embedding's backward, the last: no activation is left
            moments.append((held - c_mb, 3 * tied - c_rot))
        all_moments = tuple(moments)
        # 1F1B with m <= pp − stage: the backwards after the first (estimate_stage's
        # ``shallow``), one micro-batch fewer in flight
        later: tuple[tuple[int, int], ...] = ()
        if rt.grads_set_to_none and pp - stage > 1:
            later = tuple((c + held, k + g_start) for c, k in layer_bwd)
            if emb_moment is not None:
                later += (emb_moment,)
        alone: tuple[tuple[int, int, int], ...] = ()
        if rt.grads_set_to_none:  # (c, k, which end-of-backward gradients: see the type)
            # (see estimate_stage)
            own = (per_layer, 0 if full else one_copy) if n_layers else (0, 0)
            alone = (tuple((c, k, 0) for c, k in head)
                     + tuple((c, k, 0) for c, k in fwd_end)
                     + tuple((c + held, k - head_copy + g_start, 1) for c, k in layer_bwd)
                     + ((held - own[0], -head_copy - own[1] + gathered, 2),)
                     + tuple((c + held - drop, k - left + g_start, 3) for c, k in layer_bwd)
                     + ((held - drop - own[0], -left - own[1] + gathered, 4),))
            if first:
                emb = _embedding_backward_bytes(rt, mixed, h, T, s, last) + held - c_mb
                alone += ((emb, -c_rot, 5),)
                if tied:  # the sum after the embedding's backward: no activation is left
                    alone += ((held - c_mb, 3 * tied - c_rot, 4),)
        out.append((pp - stage, c_mb, c_rot, all_moments, alone, per_flight, later,
                    emb_moment))
    return tuple(out)


ActivationRows = tuple[tuple[int, dict[int, tuple[int, ...]]], ...]
"""Per candidate stage: (pipeline depth, micro-batch size -> (activation bytes of one
micro-batch in flight, constant activations plus the largest peak moment, the same over the
moments of the backwards after a stage's first when m <= pp − stage, the same for the
embedding moment alone, and for a step of one micro-batch the same over its moments of each
of the ``GRAD_KINDS`` kinds: ``NO_MOMENT`` where none))."""


def activation_rows(terms: ActivationTerms, micro_batches: Sequence[int]) -> ActivationRows:
    """The parts of ``activation_peaks`` that do not depend on the micro-batches in flight,
    at each size of ``micro_batches``: shared by every data-parallel size."""
    out = []
    for depth, c_mb, c_rot, moments, first, cp, later, emb in terms:
        row = {}
        for b in micro_batches:
            extra = max(b * c + k for c, k in moments)
            alone = [NO_MOMENT] * GRAD_KINDS
            if not first:
                alone[0] = c_rot + extra - cp
            for c, k, w in first:
                alone[w] = max(alone[w], c_rot + b * c + k - cp)
            rest_later = c_rot + max(b * c + k for c, k in later) - cp if later else NO_MOMENT
            rest_emb = c_rot + b * emb[0] + emb[1] - cp if emb else NO_MOMENT
            row[b] = (b * c_mb + cp, c_rot + extra - cp, rest_later, rest_emb, *alone)
        out.append((depth, row))
    return tuple(out)


def activation_peaks(terms: ActivationTerms, per_replica: int,
                     micro_batches: Sequence[int]) -> tuple[list[tuple[int, ...]], ...]:
    """Per candidate stage, the peak bytes on top of the static state (activations, logits,
    working set; not Adam's temporary) at each micro-batch size of ``micro_batches``
    (divisors of the ``per_replica`` batch: ``per_replica // b`` micro-batches of ``b``):
    the peak beside every gradient, the embedding moment's (to which ``StaticTerms``' ZeRO
    chunk is added), then ``GRAD_KINDS`` peaks of the step's first backward
    (on top of the static state less the gradients not made yet, each kind plus its
    single-step gradients from ``StaticTerms``); ``NO_MOMENT`` where none: the former for a
    step of one micro-batch, the latter for a step whose first backward is not the stage's
    peak (the gradients not set to None, or m > pp − stage)."""
    return peaks_in_flight(activation_rows(terms, micro_batches), per_replica, micro_batches)


def peaks_in_flight(rows: ActivationRows, per_replica: int, micro_batches: Sequence[int]
                    ) -> tuple[list[tuple[int, ...]], ...]:
    """``activation_peaks`` from ``activation_rows`` (which must hold every size of
    ``micro_batches``): 1F1B keeps ``min(m, pp - stage)`` micro-batches in flight, at least
    one."""
    none = (NO_MOMENT,) * GRAD_KINDS
    out = []
    for depth, row in rows:
        peaks: list[tuple[int, ...]] = []
        for b in micro_batches:
            per_mb, rest, rest_later, rest_emb, *alone = row[b]
            m = per_replica // b
            if m <= 1:
                peaks.append((NO_MOMENT, NO_MOMENT, *(per_mb + a for a in alone)))
            elif m <= depth and rest_later != NO_MOMENT:  # estimate_stage's ``shallow``
                peaks.append(((m - 1) * per_mb + rest_later, (m - 1) * per_mb + rest_emb,
                              *(m * per_mb + a for a in alone)))
            else:
                n = depth if m > depth else m
                peaks.append((n * per_mb + rest, n * per_mb + rest_emb, *none))
        out.append(peaks)
    return tuple(out)


def peak_tensor_curve(static: StaticTerms, peaks: tuple[list[tuple[int, ...]], ...]
                      ) -> list[int]:
    """``estimate_memory(...).tensors`` at each micro-batch of ``activation_peaks``: per
    stage the static bytes plus the largest activation peak (beside every gradient; the
    embedding moment with ZeRO's chunk; or at the step's first backward: less the gradients
    not made yet, plus those each of its moments holds), or the static bytes plus Adam's
    temporary, the worst stage."""
    out: list[int] | None = None
    for (fixed, adam, grads, single_grads, chunk), row in zip(static, peaks, strict=True):
        cur = []
        for beside, emb, *first in row:
            ends = (x + g for x, g in zip(first[1:], single_grads, strict=True))
            v = max(beside, emb + chunk, max(first[0], *ends) - grads)
            cur.append(max(fixed + v, fixed + adam))
        out = cur if out is None else list(map(max, out, cur))
    assert out is not None
    return out


def peak_tensors(model: ModelSpec, train: TrainingSpec, par: ParallelConfig,
                 runtime: RuntimeProfile = REFERENCE) -> int:
    """``estimate_memory(model, train, par, runtime=runtime).tensors`` through the split
    form the planner searches with (the check that both agree)."""
    per_replica = par.micro_batch * max(1, par.micro_batches(train.global_batch))
    peaks = activation_peaks(
        activation_terms(model, train, par.tp, par.pp, par.recompute,
                         par.sequence_parallel, par.flash_attention, runtime,
                         par.zero_stage >= 3 and par.dp > 1),
        per_replica, (par.micro_batch,))
    return peak_tensor_curve(
        static_terms(model, train, par.tp, par.pp, par.dp, par.zero_stage, runtime),
        peaks)[0]


@functools.lru_cache(maxsize=1024)
def _traits(m: ModelSpec) -> tuple[bool, bool, bool, bool, bool]:
    """(swiglu, rmsnorm, bert, gpt_neox, learned positions) of a model, looked up once."""
    return (m.swiglu, m.rmsnorm, m.family is Family.BERT, m.family is Family.GPT_NEOX,
            m.learned_positions)


def _low_precision_logits(rt: RuntimeProfile, mixed: bool, bert: bool) -> bool:
    """Whether the logits are in the compute dtype: under ``fp32_stream`` BERT's
    head adds its fp32 output bias to the bf16 matmul output, which promotes the logits to
    fp32 (they then count as in an fp32 run)."""
    return mixed and not (bert and rt.fp32_stream)


def _held_logit_bytes(rt: RuntimeProfile, head_bwd_bytes: int) -> int:
    """Bytes per logit the training loop still holds through the layers' backward: the
    low-precision logits, half of what is left at the head's matmul backward (the logits and
    their gradient), or none when the loop drops them before ``backward()``."""
    return 0 if rt.logits_freed_before_backward else head_bwd_bytes // 2


def _bias_grad_copy(rt: RuntimeProfile, mixed: bool, low: bool) -> int:
    """Bytes per logit that the head's backward adds when the logits are fp32 only because
    an fp32 output bias was added to the low-precision matmul output (BERT under
    ``fp32_stream``): the fp32 gradient's copy in the matmul's dtype, beside the fp32
    gradient and logits (``logits_head_bwd_bytes``), before the matmul's backward runs.
    The moment shows only where the loss's own backward holds less (the vocab-parallel
    loss at tp > 1)."""
    return 2 if rt.logits_head_bwd_bytes and mixed and not low else 0


def _logit_bytes(rt: RuntimeProfile, mixed: bool, forward: bool, tp: int = 1) -> int:
    """Bytes per logit element alive at the loss forward / the output layer's backward
    (``RuntimeProfile.logits_*``, given for mixed precision; an fp32 run has no bf16 copy;
    at tp > 1 a vocab-parallel runtime's ``logits_*_tp`` when it gives them)."""
    if rt.compiled:  # torchtune's compiled loss (predictor.runtimes)
        D = 2 if mixed else 4
        if rt.loss_chunks:
            return D  # the kept chunks; one chunk's gradient: _chunk_grad_bytes
        return (D + 4 if mixed else 4) if forward else 8
    if tp > 1 and rt.vocab_parallel and rt.logits_fwd_bytes_tp:
        if forward:
            return rt.logits_fwd_bytes_tp if mixed else rt.logits_fwd_bytes_tp_fp32
        return rt.logits_bwd_bytes_tp if mixed else rt.logits_bwd_bytes_tp_fp32
    if forward:
        return rt.logits_fwd_bytes if mixed else max(4, rt.logits_fwd_bytes - 2)
    return rt.logits_bwd_bytes if mixed else (rt.logits_bwd_bytes_fp32
                                              or max(4, rt.logits_bwd_bytes))


def estimate_memory(model: ModelSpec, train: TrainingSpec, par: ParallelConfig,
                    gpu: GpuType | None = None, *, runtime: RuntimeProfile = REFERENCE,
                    layers: Sequence[int] | None = None, virtual_stages: int = 1,
                    stages: Sequence[int] | None = None,
                    chunks: Sequence[Sequence[int]] | None = None) -> MemoryBreakdown:
    """Per-GPU tensor peak of the worst pipeline stage under ``runtime`` (the first and the
    last are the candidates: a middle stage has the first's layers with fewer micro-batches
    in flight and no embedding; with explicit ``layers`` every stage is). ``stages`` limits
    the candidates (e.g. ``(pp - 1,)`` for a measurement taken on the last rank)."""
    if stages is None:
        explicit = layers is not None or chunks is not None
        stages = range(par.pp) if explicit else _candidate_stages(par.pp)
    best = None
    for st in stages:
        cur = estimate_stage(model, train, par, st, gpu, runtime=runtime, layers=layers,
                             virtual_stages=virtual_stages, chunks=chunks)
        if best is None or cur.tensors > best.tensors:
            best = cur
    assert best is not None
    return best


def frenzy_memory(model: ModelSpec, train: TrainingSpec, par: ParallelConfig) -> int:
    """The Frenzy paper's MARP formula (§IV-A) as a baseline, in bytes:

        20·W/t + s·b·h·l·(10 + 24/t + 5·a·s/(h·t)),  W = V·h + l·(12h² + 13h),  b = B/d

    Read literally: b is the whole per-replica batch B/d (the paper folds micro-batching into
    it), l is all layers (no /p), precision and optimizer are ignored (20 bytes per parameter,
    2-byte activations), no recompute, flash attention, sequence parallelism, logits or
    runtime overhead.
    """
    W = model.frenzy_params()
    t = par.tp
    h, layers, a, s = model.hidden_size, model.num_layers, model.num_heads, train.seq_len
    b = train.global_batch / par.dp
    act = s * b * h * layers * (10 + 24 / t + 5 * a * s / (h * t))
    return int(20 * W / t + act)
