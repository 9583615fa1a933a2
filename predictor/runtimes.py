"""Runtime profiles: what a training framework keeps in GPU memory for the same plan.

The same model, batch and (tp, pp, dp, ZeRO, recompute) plan needs different memory under
different runtimes: one keeps dropout masks, another upcasts the logits twice, pads the
vocabulary, shards parameters ZeRO-3 style or keeps FSDP2's root module unsharded. A
``RuntimeProfile`` fixes those choices so ``predictor.memory`` can count them; plans carry the
profile name they were priced for.

Sizes (bytes per element of the tensor named; T = tokens on the rank, D = compute dtype bytes,
a = heads per rank, s = sequence, f = ffn width per rank, V = vocabulary rows per rank):

* hidden dropout: one boolean mask per dropout, 1 byte per element: 2·h·T per layer (after
  attention and after the MLP) and h·T on the embedding (Korthikanti et al. 2022, the
  ``sbh`` terms of 34·s·b·h). PyTorch's ``native_dropout`` saves the mask as ``bool``.
* attention-probability dropout (explicit softmax only; flash / fused kernels regenerate it
  from the RNG state): the mask a·s·T bytes and the dropped output a·s·T·D (the
  3·a·s²·b of Korthikanti's 5·a·s²·b).
* loss: bytes per logit element (T_f·V) alive at the loss forward and at the output layer's
  backward. Built-in trainer and Megatron: the bf16 logits plus one fp32 copy forward (6),
  the gradient (2) backward; Megatron's vocab-parallel cross entropy also makes a
  contiguous transposed copy (8 forward) and keeps the fp32 softmax (6 backward). Hugging
  Face causal-LM heads under autocast keep the half logits, ``logits.float()`` and save
  ``log_softmax``'s fp32 output (8 counted forward, a moment that is not the peak in any
  measured run; 12 backward: the saved output, its gradient and the input gradient,
  measured on an H200, docs/trainer_cuda.md); a half model without autocast (DeepSpeed
  fp16) does all three in 2 bytes (6); torchtune up-casts and deletes before backward (8
  forward, 12 backward).
* vocabulary padding: Megatron pads V to a multiple of 128·tp (``--make-vocab-size-divisible-by``).
* sharding: ``zero`` (DeepSpeed / Megatron distributed optimizer: bf16 parameters plus fp32
  master shard), or ``fsdp2`` (fp32 sharded parameters are the master; the bf16 unsharded
  copy lives only while a block runs — the current and the prefetched block — and the root
  module (embedding, final norm, head) stays unsharded through forward and backward), or
  ``megatron_fsdp`` (Megatron-FSDP's ``optim_grads_params``, ``--use-megatron-fsdp``: the
  ``zero`` shards of bf16 weights, fp32 main weights, main gradients and states; each
  ``TransformerLayer`` unit gathered while it runs, with the prefetched one; the modules
  outside the units (embedding, final norm, head) gathered from their forward to the end of
  the backward; one unit's unsharded fp32 gradient bucket before its reduce-scatter).
* ``ddp_grad_buckets``: torch DDP (``gradient_as_bucket_view=False``, its default) keeps its
  flat all-reduce buckets beside ``param.grad``: a second copy of the gradients when dp > 1
  without ZeRO (Hugging Face Trainer and Lightning multi-GPU runs).
* ``optimizer_foreach``: ``torch.optim.Adam(W)``'s default multi-tensor path on CUDA
  (torch >= 2.0) takes ``sqrt(v)`` of all parameters of a group at once: a temporary the
  size of the whole state shard at the step, not of the largest tensor (fused and
  apex/TE multi-tensor Adam have none).
* ``softmax_fp32``: under autocast, eager attention's softmax (and the dropout after it)
  run in fp32 (``softmax`` is on autocast's fp32 list): 4 bytes per probability.
* ``grad_bytes``: DeepSpeed keeps fp16/bf16 gradient partitions (2), Megatron and torch DDP
  fp32 ``main_grad`` / ``param.grad`` of fp32 parameters (4).
* ``fp32_weights_autocast``: the model stays in fp32 under ``torch.autocast`` (the built-in
  trainer): 4 bytes of weights (they are the master, no separate copy), fp32 gradients and
  states, plus autocast's bf16/fp16 copy of each weight a matmul uses, alive from the
  forward to that layer's backward (2 bytes per parameter).
* ``dp_flat_allreduce``: the built-in trainer averages gradients with one ``torch.cat`` of
  all of them: a 4-byte-per-parameter temporary after the backward (without ZeRO; its ZeRO
  all-reduces or reduce-scatters each gradient in place, ``orchestrator.trainer.zero``).
* ZeRO under ``fp32_weights_autocast`` (the built-in trainer's ZeRO-1/2/3): the fp32
  weights are the master, so ZeRO-1 shards only the optimizer states (``ceil(n/dp)``
  elements of every tensor) and ZeRO-2 the fp32 gradients too; ZeRO-2 reduce-scatters each
  gradient as the backward makes it, so in a step of one micro-batch the gradients held
  grow as the activations go (``predictor.memory._single_step_grads``). ZeRO-3 also keeps
  each layer's fp32 weights as chunks and gathers one layer at a time (``prefetch_layers``
  0) while it runs, forward and backward; the embedding, the head and the final norm stay
  whole (FSDP2's root); autocast's copies are unchanged, and in an fp32 run the matmuls
  keep the forward's gathered matrices to the backward (``predictor.memory._gathered_layer``).
* ``pure_low_precision``: weights, gradients and optimizer states all in the compute dtype
  (torchtune and ms-swift full fine-tunes load the model in bf16: 2+2+4 = 8 bytes/param).
* ``logits_head_bwd_bytes``: when the loss's backward buffers are freed before the head's
  matmul backward runs (the built-in trainer: ``log_softmax``'s saved output and gradients go
  once its backward is done), the bytes per logit still alive then — the low-precision logits
  the loop still holds and their gradient (4; fp32: 8) — beside the head's weight and input
  gradients, and under ``fp32_weights_autocast`` the moment after, when the weight gradient
  is cast to fp32 (the logits only, 2 bytes, beside D + 4 bytes per head weight). 0: the
  output layer's backward is counted at ``logits_bwd_bytes`` plus those gradients. (The
  matmul's saved weight copy is freed before the cast.)
* ``logits_bwd_bytes_fp32``: the loss backward's bytes per logit in an fp32 run (the built-in
  trainer at tp = 1: the fp32 logits, ``log_softmax``'s output, its gradient and the input
  gradient, 16); 0 takes ``logits_bwd_bytes`` (at least 4).
* ``logits_*_tp``: a runtime whose loss differs at tp > 1 (the built-in trainer: plain
  ``F.cross_entropy`` at tp = 1, its vocab-parallel cross entropy on the logit shard above)
  gives that loss's bytes per logit of the shard there: ``logits_fwd_bytes_tp`` /
  ``logits_bwd_bytes_tp`` mixed, ``..._tp_fp32`` in fp32 (and for BERT's fp32 logits). 0:
  the same loss at every tp. The built-in trainer's (``parallel._VocabParallelCrossEntropy``):
  forward, the caller's logits D and one fp32 copy turned in place into the softmax and
  saved, 4 (mixed 6, fp32 8); backward, the logits, the saved softmax turned in place into
  the gradient, and (mixed only) its copy in the logits' dtype returned (mixed 2 + 4 + 2 =
  8, fp32 4 + 4 = 8); at the head's matmul backward the logits and their gradient (4, fp32
  8: ``logits_head_bwd_bytes`` as at tp = 1).
* ``fp32_stream``: with ``fp32_weights_autocast`` the embedding, the norms and the residual
  adds run in fp32, so each norm keeps an fp32 input (2 bytes more per element than D) and
  autocast casts a norm's output once per linear reading it (Q, K, V and the MLP's input
  projections: 2 or 3 copies beyond the one counted); BERT's head adds its fp32 output bias
  to the matmul output, so its logits are fp32 (counted as in an fp32 run).
* ``eager_blocks``: the layers written in eager PyTorch as the built-in model has them: under
  GQA K and V are repeated to every head before the attention kernel (which keeps the
  repeated copies: 2·(q − k)·T more), SwiGLU keeps the gate, its SiLU, the up projection and
  the product (4·f·T, one more than a fused kernel), and with ``cpu_rmsnorm`` RMSNorm keeps
  its fp32 normalised input besides the statistics (4·h·T per norm, the final one too).
* ``cpu_rmsnorm``: RMSNorm runs as torch's composite ops, as on the CPU (the emulated
  cluster), which keep the normalised input; on CUDA torch's fused RMSNorm kernel keeps the
  input and the statistics only (measured on an H200: docs/trainer_cuda.md). The ``frenzy``
  profile prices the GPU; ``FRENZY_CPU`` the same trainer on the CPU. Hugging Face's
  RMSNorm is written as composite ops, so ``hf-trainer`` keeps it on every device.
* ``model_code``: the runtime runs the model's own (Hugging Face) code, so what its
  ``config.json`` sets holds (``RuntimeProfile.for_model``): its dropouts (a mask only
  where a probability is > 0; ``ModelSpec.config_hidden_dropout``) and gpt2's ``gelu_new``
  (``gelu_composite``: transformers' NewGELUActivation, element-wise ops with ``pow`` on
  autocast's fp32 list, keeps three fp32 f-wide tensors, a half one and the half input of
  the next linear: 12 bytes per f-wide element more than a fused GeLU, in fp32 runs too).
* ``repeat_kv``: under ``eager_blocks`` a GQA model's K and V are repeated to every head
  before the attention kernel (the built-in model); Hugging Face models call sdpa with
  ``enable_gqa`` instead (false). ``sdpa_dispatch``: sdpa picks the kernel: an fp32 run has
  no flash kernel and the memory-efficient one takes no ``enable_gqa``, so a GQA model's
  fp32 attention runs the math path (explicit fp32 softmax, K and V repeated).
* ``optimizer_fused``: fused optimizer kernels (torch's ``fused=True``, the built-in trainer's
  on every device) update in place and make no temporary at the step (torch's foreach path
  would take sqrt(v), or for ``Adam``'s L2 / ``SGD``'s decay a gradient copy, of every
  parameter at once; its single-tensor path two of the largest tensor).
* ``grads_set_to_none``: the optimizer's ``zero_grad(set_to_none=True)`` frees the gradients
  after every step, so none exist during the first micro-batch's forward and loss; with one
  micro-batch per step (m = 1) they appear only during its backward (the head's first, then
  one layer at a time as that layer's activations go) and all exist only at its end and at
  the optimizer step. With m >= 2 every later micro-batch runs beside all of them — except
  that under 1F1B a stage with m <= pp − stage runs every forward, then its first backward
  with all m micro-batches in flight before any gradient exists, and the later backwards
  in the cool-down with fewer in flight.

* ``selective_op_sac``: ``recompute: selective`` is torchtitan's per-op selective activation
  checkpointing (``selective_ac_option = "op"``, its Llama configs' default): each block is
  checkpointed, and the policy saves the outputs of the ops in its save list — every
  matmul except every second one in the order the block runs them, the attention kernel's
  output and logsumexp, sequence parallelism's reduce-scatter outputs — and recomputes the
  rest at the block's backward. A llama block runs wq, wk, wv, wo, w1, w3, w2 (1st, 3rd,
  5th, 7th saved: Q, V, the gate, the MLP output); a fused-QKV block qkv, out, fc1(, fc3),
  fc2. So a layer keeps its input, those matmul outputs and the attention output and
  logsumexp; its backward first rebuilds the rest of the layer (``predictor.memory``).
* ``logits_freed_before_backward``: the training loop drops its reference to the logits
  before ``loss.backward()`` (torchtitan's ``del pred``), so no low-precision logits stay
  alive through the backward; the head's matmul backward sees only their gradient
  (``logits_head_bwd_bytes`` is then that gradient's bytes).

* ``reduce_bucket_elems`` / ``overlap_comm``: DeepSpeed's ZeRO optimizers with
  ``contiguous_gradients`` (its default) reduce gradients through a flat buffer of
  ``reduce_bucket_size`` elements of the model's dtype (default 5e8: 1 GB in fp16/bf16),
  whatever the model's size: ZeRO-1/2 allocate it at every ``backward()`` (a second one with
  ``overlap_comm``, off by default there), ZeRO-3 once at start (one buffer; ``overlap_comm``
  does not double it). Counted with the gradients under ZeRO >= 1. PyTorch Lightning's
  ``DeepSpeedStrategy`` passes 2e8 with ``overlap_comm`` on.
* ``zero3_reuse_elems``: DeepSpeed ZeRO-3 does not release a gathered parameter whose next
  use in the recorded trace comes within ``stage3_max_reuse_distance`` parameters (1e9 by
  default). At the turn from the forward to the backward, the layer j places from the end is
  used again after about 2·j layers' parameters, so the last ``reuse // (2 · layer
  parameters)`` layers stay gathered (at least the running and the prefetched one): about
  1 GB in fp16 for a model of small layers, no more than the usual two for a 7B one.

Non-tensor memory (allocator slack, CUDA context, NCCL) is not part of a profile: it is
calibrated per runtime and GPU in ``predictor.overhead``.

torchtune's memory flags (per-job overrides; ``predictor.memory`` prices them in
``estimate_memory`` only, so the planner's split form refuses a profile that sets them):

* ``compiled``: ``compile=True`` compiles every transformer layer and the loss with
  inductor. AOTAutograd's min-cut partitioner saves the matmul inputs and outputs and
  recomputes the pointwise ops in the backward: a llama layer (RMSNorm, SwiGLU, SDPA) keeps
  its input and the mid-layer residual, the two norms' outputs (4·h·T·D) and their fp32
  1/rms (2·4·T), Q, K and V repeated to every head (torchtune expands them before SDPA) and
  the attention output (4·q·T_f·D), the logsumexp (4·a·T_f), and gate, up and their product
  (3·f·T_f·D; the SiLU is recomputed). Counted on the CPU from the saved tensors of such a
  layer under inductor (docs/memory_accuracy.md, "Optimizers and torchtune flags"). The
  compiled cross entropy saves its input and two fp32 values per row (the up-cast and the
  softmax are fused): without chunks the decoder's ``.float()`` logits (eager, outside the
  compiled layers) beside the bf16 ones (6 bytes per logit) forward, the fp32 logits and
  their gradient (8) backward.
* ``loss_chunks`` (with ``compiled``): the output projection runs per chunk of the sequence
  and every bf16 chunk is kept for the compiled per-chunk loss (D bytes per logit), plus one
  chunk's gradient at the backward (D·ceil(s/chunks)·b·V).
* ``optimizer_in_backward``: each parameter steps in its post-accumulate-grad hook and its
  gradient is freed at once: beside the activations only the gradient in flight (the
  largest layer tensor) and, with tied embeddings, the head's weight gradient, which
  autograd buffers until the embedding's backward adds its share; at the end, the largest
  tensor's gradient and its optimizer temporary.
* ``activation_offload``: every saved tensor of at least 1 KiB made inside the model's
  forward goes to the CPU, except the output projection's (a ``NoOpManager`` region); the
  last ``max_fwd_stash_size`` = 5 offloaded tensors stay on the GPU until their copy is done,
  and the backward brings back one node's at a time: counted as five layers' kept tensors
  under full recomputation (a layer saves its input) and one layer's otherwise (an upper
  bound of its five largest), and the token ids leave the GPU.

What a runtime can execute is part of its profile too: ``max_pp`` (the deepest pipeline it
runs, 0 for any) and ``zero_stages`` (the ZeRO stages it runs; 0 always, since ZeRO at dp = 1
is no sharding). The planner enumerates only those plans, so a plan priced with ZeRO-3 is never
handed to a trainer that would run it without sharding (and need far more memory than
predicted). ``optimizers`` lists the optimizers it runs (the built-in trainer: torch's Adam,
AdamW and SGD); a job or spec asking another gets an error naming it. ``unrestricted`` lifts
all three for hypothetical jobs (the simulator's traces).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from typing import Any

from predictor.errors import SpecError
from predictor.spec import ModelSpec

STAGE_SPLITS = ("first_heavier", "even", "last_lighter")
SHARDING = ("zero", "fsdp2", "megatron_fsdp")
ZERO_STAGES = (0, 1, 2, 3)
OPTIMIZERS = ("adam", "adamw", "sgd", "adam8bit", "adamw8bit", "paged_adam8bit",
              "paged_adamw8bit", "adafactor")
"""``predictor.spec.Optimizer``'s values (spec.py imports nothing from here)."""
EXECUTION_FIELDS = ("max_pp", "zero_stages", "optimizers", "pp_when_needed", "own_mlp_only")
"""Fields that say which plans a runtime runs, not what they cost: not per-job overrides (a
job cannot make a trainer execute ZeRO or pipeline stages by asking)."""


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    """What one training runtime keeps per plan (see the module docstring for the sizes)."""

    name: str
    description: str
    hidden_dropout: bool = False  # dropout masks on the residual branches and embedding
    attention_dropout: bool = False  # dropout on the attention probabilities
    logits_fwd_bytes: int = 6  # bytes per logit element at the loss forward (mixed precision)
    logits_bwd_bytes: int = 2  # bytes per logit element at the output layer's backward
    vocab_pad: int = 1  # the vocabulary is padded to a multiple of vocab_pad·tp
    stage_split: str = "first_heavier"  # how layers that do not divide pp are spread
    sharding: str = "zero"  # "zero" (ZeRO / distributed optimizer), "fsdp2", "megatron_fsdp"
    prefetch_layers: int = 1  # ZeRO-3 / FSDP2: gathered blocks beyond the one running
    pure_low_precision: bool = False  # weights, grads, optimizer states in the compute dtype
    optimizer_offload: bool = False  # fp32 master weights and optimizer states on the CPU
    selective_keeps_core_inputs: bool = True  # selective recompute keeps Q, K, V (Megatron)
    selective_op_sac: bool = False  # selective = torchtitan's per-op SAC (every other matmul)
    grad_bytes: int = 4  # bytes per gradient element in mixed precision (fp32 main grads)
    optimizer_foreach: bool = False  # torch's foreach Adam: a sqrt(v) temporary of every param
    softmax_fp32: bool = False  # autocast runs eager softmax (and its dropout) in fp32
    vocab_parallel: bool = True  # embedding and head split over tp (else replicated)
    sequence_parallel: bool = True  # runs sequence parallelism when the plan asks for it
    fp32_weights_autocast: bool = False  # fp32 weights are the master; autocast casts copies
    dp_flat_allreduce: bool = False  # dp > 1: the gradients all-reduced as one flat copy
    ddp_grad_buckets: bool = False  # torch DDP's bucket copy of the gradients (dp > 1, no ZeRO)
    classification_head: bool = False  # a sequence-classification head: no vocabulary logits
    logits_head_bwd_bytes: int = 0  # bytes per logit left at the head's matmul backward
    logits_bwd_bytes_fp32: int = 0  # bytes per logit at the loss backward in fp32 (0: derived)
    logits_fwd_bytes_tp: int = 0  # tp > 1 (vocab_parallel): the loss forward's, mixed (0: as tp=1)
    logits_bwd_bytes_tp: int = 0  # tp > 1: the loss backward's bytes per logit, mixed
    logits_fwd_bytes_tp_fp32: int = 0  # tp > 1: the loss forward's in fp32
    logits_bwd_bytes_tp_fp32: int = 0  # tp > 1: the loss backward's in fp32
    grads_set_to_none: bool = False  # no gradient exists before the step's first backward
    logits_freed_before_backward: bool = False  # the loop drops its logits before backward
    reduce_bucket_elems: int = 0  # DeepSpeed ZeRO's contiguous gradient bucket (elements)
    overlap_comm: bool = False  # ZeRO-1/2 double-buffer that bucket (DeepSpeed overlap_comm)
    zero3_reuse_elems: int = 0  # DeepSpeed stage3_max_reuse_distance (0: not this runtime)
    fp32_stream: bool = False  # fp32 residual stream under autocast (fp32 embedding, norms)
    eager_blocks: bool = False  # eager layers: K/V repeated, 4 SwiGLU tensors
    cpu_rmsnorm: bool = False  # eager_blocks: RMSNorm composite (CPU), keeps its fp32 output
    optimizer_fused: bool = False  # fused optimizer kernels: no temporary at the step
    compiled: bool = False  # torchtune compile=True: each layer and the loss torch.compile'd
    loss_chunks: int = 0  # torchtune CEWithChunkedOutputLoss: head + CE in this many chunks
    optimizer_in_backward: bool = False  # per-parameter step in a post-accumulate-grad hook
    activation_offload: bool = False  # torchtune OffloadActivations: saved tensors to the CPU
    max_pp: int = 0  # the deepest pipeline the runtime executes (0: any)
    zero_stages: tuple[int, ...] = ZERO_STAGES  # the ZeRO stages it executes (always 0)
    optimizers: tuple[str, ...] = OPTIMIZERS  # the optimizers it runs
    own_mlp_only: bool = False  # it builds each family's own MLP (no ReLU gpt2, as OPT's)
    # it runs the model's own (Hugging Face) code, so a config's dropouts and activation
    # implementation hold (``for_model`` turns them into the fields above and below)
    model_code: bool = False
    gelu_composite: bool = False  # NewGELUActivation: 12 bytes per f-wide element more
    repeat_kv: bool = True  # eager_blocks under GQA: K/V repeated (False: sdpa's enable_gqa)
    sdpa_dispatch: bool = False  # torch sdpa picks the kernel: fp32 GQA runs the math path
    # the planner searches pipelines (pp > 1) only when no single-stage plan fits any GPU
    # type it plans for: every (tp, pp) pair costs the search a memory table of its own
    pp_when_needed: bool = False

    @property
    def executes(self) -> str:
        """What the runtime runs, when narrower than the planner's space ("" when it runs
        every plan the planner prices)."""
        parts = []
        if self.max_pp:
            parts.append("pp=1" if self.max_pp == 1 else f"pp<={self.max_pp}")
        if self.zero_stages != ZERO_STAGES:
            stages = [z for z in self.zero_stages if z]
            parts.append(f"ZeRO-{'/'.join(map(str, stages))} only" if stages else "no ZeRO")
        return " and ".join(parts)

    def excluded_note(self) -> str | None:
        """The plan note saying which plan dimensions this runtime excludes, or None."""
        if not self.executes:
            return None
        return (f"runtime {self.name} executes {self.executes}; plans needing more were not "
                "considered (name another runtime, or give an entrypoint, to plan them)")

    def unsupported(self, pp: int, zero_stage: int) -> str | None:
        """Why this runtime cannot execute a plan of pipeline depth ``pp`` and ZeRO stage
        ``zero_stage`` (naming the field and what would fit), or None when it can."""
        if self.max_pp and pp > self.max_pp:
            return (f"parallel.pp={pp}: runtime {self.name} executes pipelines of at most "
                    f"{self.max_pp} stage{'s' if self.max_pp > 1 else ''}; choose a plan with "
                    f"pp<={self.max_pp}")
        if zero_stage not in self.zero_stages:
            return (f"parallel.zero_stage={zero_stage}: runtime {self.name} executes ZeRO "
                    f"stage{'s' if len(self.zero_stages) > 1 else ''} "
                    f"{', '.join(map(str, self.zero_stages))}; choose a plan with one of those")
        return None

    def unsupported_optimizer(self, optimizer: str) -> str | None:
        """Why this runtime cannot run ``optimizer`` (naming what would fit), or None."""
        if str(optimizer) in self.optimizers:
            return None
        return (f"{optimizer}: runtime {self.name} runs {', '.join(self.optimizers)}; "
                "choose one of those, or name a runtime that runs it (e.g. hf-trainer, "
                "torchtune)")

    def unsupported_activation(self, model: ModelSpec) -> str | None:
        """Why this runtime cannot build ``model``'s MLP (naming what would fit), or None."""
        own = model.own_activation
        if not self.own_mlp_only or model.activation in ("", own):
            return None
        return (f"{model.activation}: runtime {self.name} builds the {model.family.value} "
                f"MLP ({own}) only; name a runtime that runs the model's own code (e.g. "
                "hf-trainer), or give an entrypoint")

    def check_runs(self, model: ModelSpec, optimizer: str) -> None:
        """A ``SpecError`` naming ``optimizer`` or ``activation`` when this runtime cannot
        run the job's optimizer or build its MLP (``unsupported_optimizer``,
        ``unsupported_activation``)."""
        why = self.unsupported_optimizer(optimizer)
        if why:
            raise SpecError("optimizer", why)
        why = self.unsupported_activation(model)
        if why:
            raise SpecError("activation", why)

    def for_model(self, model: ModelSpec) -> RuntimeProfile:
        """The profile for ``model``: under ``model_code``, the dropouts its Hugging Face
        config sets (a probability of 0 keeps no mask; a model not built from a config keeps
        the profile's) and its GeLU's implementation (``gelu_composite``); the result no
        longer consults the model, so applying it twice is the same as once."""
        if not self.model_code:
            return self
        hidden, attention = model.config_hidden_dropout, model.config_attention_dropout
        return replace(self, model_code=False,
                       hidden_dropout=self.hidden_dropout if hidden is None else hidden > 0,
                       attention_dropout=(self.attention_dropout if attention is None
                                          else attention > 0),
                       gelu_composite=self.gelu_composite or model.config_gelu_composite)

    def unrestricted(self) -> RuntimeProfile:
        """The same memory terms over the planner's whole space (every pp and ZeRO stage):
        for hypothetical jobs that no real trainer runs, such as the simulator's traces."""
        return replace(self, max_pp=0, zero_stages=ZERO_STAGES, optimizers=OPTIMIZERS,
                       pp_when_needed=False, own_mlp_only=False)

    def with_overrides(self, **changes: Any) -> RuntimeProfile:
        """The profile with per-job overrides (``dropout``: both dropouts at once)."""
        dropout = changes.pop("dropout", None)
        if dropout is not None:
            changes.setdefault("hidden_dropout", bool(dropout))
            changes.setdefault("attention_dropout", bool(dropout))
        if changes.get("pure_low_precision"):  # a model loaded in bf16: no autocast over fp32
            changes.setdefault("fp32_weights_autocast", False)
            changes.setdefault("fp32_stream", False)
        known = [f.name for f in fields(self)
                 if f.name not in ("name", "description", *EXECUTION_FIELDS)]
        for key, value in changes.items():
            if key in EXECUTION_FIELDS:
                raise SpecError(f"runtime.{key}",
                                f"not a per-job override: it says what runtime {self.name} "
                                f"executes ({self.executes or 'every plan'}); name another "
                                "runtime instead")
            if key not in known:
                raise SpecError(f"runtime.{key}", f"unknown override; one of {', '.join(known)}")
            want = type(getattr(self, key))
            if want is int and (isinstance(value, bool) or not isinstance(value, int)
                                or value < 0):
                raise SpecError(f"runtime.{key}", f"a non-negative integer, got {value!r}")
            if want is bool and not isinstance(value, bool):
                raise SpecError(f"runtime.{key}", f"true or false, got {value!r}")
            if want is str and not isinstance(value, str):
                raise SpecError(f"runtime.{key}", f"a string, got {value!r}")
        out = replace(self, **changes)
        out.check()
        return out

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """``SpecError`` naming the field whose value no runtime can have."""
        if self.stage_split not in STAGE_SPLITS:
            raise SpecError("runtime.stage_split",
                            f"{self.stage_split!r}; one of {', '.join(STAGE_SPLITS)}")
        if self.sharding not in SHARDING:
            raise SpecError("runtime.sharding", f"{self.sharding!r}; one of {', '.join(SHARDING)}")
        if self.vocab_pad < 1:
            raise SpecError("runtime.vocab_pad", f"must be >= 1, got {self.vocab_pad}")
        if isinstance(self.max_pp, bool) or not isinstance(self.max_pp, int) or self.max_pp < 0:
            raise SpecError("runtime.max_pp", f"a non-negative integer (0: any), got "
                                              f"{self.max_pp!r}")
        stages = self.zero_stages
        if (not isinstance(stages, tuple) or 0 not in stages
                or any(isinstance(z, bool) or z not in ZERO_STAGES for z in stages)
                or list(stages) != sorted(set(stages))):
            raise SpecError("runtime.zero_stages",
                            f"an ascending tuple of distinct stages from {ZERO_STAGES} that "
                            f"includes 0, got {stages!r}")
        if (not isinstance(self.optimizers, tuple) or not self.optimizers
                or any(o not in OPTIMIZERS for o in self.optimizers)):
            raise SpecError("runtime.optimizers",
                            f"a non-empty tuple from {', '.join(OPTIMIZERS)}, got "
                            f"{self.optimizers!r}")

    def padded_vocab(self, vocab: int, tp: int) -> int:
        """Vocabulary rows of the whole model after the runtime's padding."""
        mult = self.vocab_pad * tp if self.vocab_pad > 1 else 1
        return -(-vocab // mult) * mult


REFERENCE = RuntimeProfile(
    name="reference",
    description=(
        "predictor.measure's PyTorch build (the ground truth of the fake-tensor self-check): "
        "every plan dimension as the planner prices it (ZeRO, vocab-parallel head, sequence "
        "parallelism, pipeline stages), bf16 weights with an fp32 master, no dropout, bf16 "
        "logits plus one fp32 copy"),
)

FRENZY = RuntimeProfile(
    name="frenzy",
    description=(
        "the built-in trainer as it runs (orchestrator/trainer): fp32 weights under autocast, "
        "no dropout, embedding and head split over the tp ranks by vocabulary rows (no "
        "padding: the first V mod tp ranks hold a row more), no sequence parallelism; at "
        "tp = 1 cross entropy on logits.float() (bf16 logits, fp32 log_softmax output and its "
        "gradients: 10 bytes per logit forward, 14 at its backward, 16 in fp32), at tp > 1 "
        "the vocab-parallel cross entropy on the logit shard (one fp32 copy made the "
        "softmax: 6 forward, 8 at its backward, 8 and 8 in fp32); 4 left at the head's "
        "backward; one flat dp all-reduce (ZeRO-1/2: optimizer states, and gradients, in "
        "chunks over dp, the fp32 weights whole; ZeRO-3: the layers' fp32 weights in chunks "
        "too, each layer gathered while it runs forward or backward, no prefetch, the "
        "embedding, head and final norm whole), gradients set to None after each step, "
        "fused optimizers; pipeline stages under the non-interleaved 1F1B schedule (the "
        "first stages take the layers pp does not divide, autocast's weight copies kept per "
        "micro-batch in flight, a tied embedding copied to the last stage and its gradient "
        "summed between the two)"),
    logits_fwd_bytes=10, logits_bwd_bytes=14, sequence_parallel=False,
    logits_fwd_bytes_tp=6, logits_bwd_bytes_tp=8, logits_fwd_bytes_tp_fp32=8,
    logits_bwd_bytes_tp_fp32=8,
    fp32_weights_autocast=True, dp_flat_allreduce=True, logits_head_bwd_bytes=4,
    logits_bwd_bytes_fp32=16, grads_set_to_none=True, fp32_stream=True, eager_blocks=True,
    optimizer_fused=True, prefetch_layers=0,
    # orchestrator/trainer: tp, dp, pp (any depth up to the layers: 1F1B, ..trainer.pipeline),
    # ZeRO-1/2/3, recompute
    max_pp=0, zero_stages=(0, 1, 2, 3), pp_when_needed=True,
    optimizers=("adam", "adamw", "sgd"),  # orchestrator.trainer.loop._make_optimizer
    own_mlp_only=True,  # orchestrator.trainer.model.check_supported
)
FRENZY_CPU = replace(FRENZY, cpu_rmsnorm=True)
"""The built-in trainer on the CPU (the emulated cluster, the fake-tensor measurement)."""

MEGATRON = RuntimeProfile(
    name="megatron",
    description=(
        "Megatron-LM (megatron.core, pretrain_gpt.py): hidden and attention dropout 0.1 by "
        "default, vocab padded to 128·tp, vocab-parallel cross entropy with an fp32 softmax, "
        "selective recompute of the attention core, even stage split, distributed optimizer "
        "= ZeRO-1"),
    hidden_dropout=True, attention_dropout=True, logits_fwd_bytes=6, logits_bwd_bytes=6,
    vocab_pad=128, stage_split="even",
)

DEEPSPEED = RuntimeProfile(
    name="deepspeed",
    description=(
        "DeepSpeed ZeRO 0-3 around a Hugging Face model: model dropout as configured (on by "
        "default for gpt2/bert), fp16/bf16 model without autocast (logits, their shifted "
        "copy and log_softmax in the compute dtype), fp16 gradient partitions, FusedAdam, "
        "ZeRO-3 gathers the running and one prefetched block and keeps the last layers "
        "gathered within stage3_max_reuse_distance = 1e9 parameters; ZeRO-1/2/3 reduce "
        "through a contiguous bucket of reduce_bucket_size = 5e8 elements (overlap_comm off)"),
    hidden_dropout=True, attention_dropout=True, logits_fwd_bytes=6, logits_bwd_bytes=6,
    grad_bytes=2, reduce_bucket_elems=500_000_000, zero3_reuse_elems=1_000_000_000,
)

FSDP2 = RuntimeProfile(
    name="fsdp2",
    description=(
        "torchtitan-style FSDP2 (fully_shard per block, root unsharded, reshard after "
        "forward): fp32 sharded master parameters, bf16 gathered blocks (running + "
        "prefetched), no dropout; selective recompute is torchtitan's per-op SAC (a block "
        "keeps its input, every other matmul output and the attention output); loss "
        "cross_entropy(pred.float()) with the loop's logits dropped before backward (bf16 "
        "logits, the fp32 copy and log_softmax's output: 10 bytes per logit forward; the "
        "saved output, its gradient and the input gradient: 12 at its backward; 2, the bf16 "
        "gradient, at the head's)"),
    logits_fwd_bytes=10, logits_bwd_bytes=12, logits_head_bwd_bytes=2,
    logits_freed_before_backward=True, selective_op_sac=True,
    sharding="fsdp2", stage_split="even",
)

HF_TRAINER = RuntimeProfile(
    name="hf-trainer",
    description=(
        "Hugging Face Trainer / accelerate (also ms-swift, Lightning DDP): the model's own "
        "code with its config's dropouts, autocast over fp32 weights (the master; an fp32 "
        "residual stream, composite RMSNorm, half copies cast per linear), sdpa attention "
        "(math path for fp32 GQA), loss on logits.float() with an fp32 log_softmax, torch "
        "foreach AdamW, gradients set to None after each step, torch DDP buckets on "
        "several GPUs"),
    hidden_dropout=True, attention_dropout=True, logits_fwd_bytes=8, logits_bwd_bytes=12,
    ddp_grad_buckets=True, optimizer_foreach=True, softmax_fp32=True, model_code=True,
    fp32_weights_autocast=True, fp32_stream=True, eager_blocks=True, cpu_rmsnorm=True,
    repeat_kv=False, grads_set_to_none=True, sdpa_dispatch=True,
)

TORCHTUNE = RuntimeProfile(
    name="torchtune",
    description=(
        "torchtune full fine-tune recipes: pure bf16 weights, grads and AdamW states, no "
        "dropout (Llama), logits up-cast to fp32 and deleted before backward"),
    logits_fwd_bytes=8, logits_bwd_bytes=12, pure_low_precision=True, optimizer_foreach=True,
)

COLOSSALAI = RuntimeProfile(
    name="colossalai",
    description=(
        "ColossalAI LowLevelZero (ZeRO-1/2) and Gemini (ZeRO-3-like chunks) around a Hugging "
        "Face model: HF dropout and loss, HybridAdam (multi-tensor, no temporaries) fp32 "
        "master and states"),
    hidden_dropout=True, attention_dropout=True, logits_fwd_bytes=8, logits_bwd_bytes=12,
    model_code=True,
)

RUNTIMES: dict[str, RuntimeProfile] = {
    p.name: p for p in (FRENZY, REFERENCE, MEGATRON, DEEPSPEED, FSDP2, HF_TRAINER, TORCHTUNE,
                        COLOSSALAI)}

DEFAULT_RUNTIME = FRENZY.name
"""Plans of jobs that name no runtime are priced for the built-in trainer."""

CONSERVATIVE_RUNTIME = HF_TRAINER.name
"""For a job with its own entrypoint that names no runtime: the profile that keeps every
optional term (dropout masks with an fp32 softmax, up-cast and shifted logits, torch's
foreach Adam temporary, DDP's gradient buckets)."""


RUNTIME_ALIASES: dict[str, str] = {
    "megatron-lm": "megatron", "megatron-core": "megatron", "mcore": "megatron",
    "megatron-deepspeed": "deepspeed",  # Megatron's model code run by DeepSpeed's engine
    "torchtitan": "fsdp2",
    "hf": "hf-trainer", "huggingface": "hf-trainer", "transformers": "hf-trainer",
    # fine-tuning tools that run a Hugging Face model through transformers' Trainer (or,
    # accelerate, its own loop over the model's forward and loss)
    "accelerate": "hf-trainer", "trl": "hf-trainer", "ms-swift": "hf-trainer",
    "swift": "hf-trainer", "llama-factory": "hf-trainer", "llamafactory": "hf-trainer",
    "axolotl": "hf-trainer", "lightning": "hf-trainer", "pytorch-lightning": "hf-trainer",
    "nemo": "megatron",  # NeMo's language models are Megatron Core's
    "deepspeed-chat": "deepspeed",  # DeepSpeed's engine around a Hugging Face model
    "colossal-ai": "colossalai",
}
"""Other names of the profiles, as frameworks and papers write them. Plain ``fsdp`` (FSDP1's
flat parameters) is not one: ``fsdp2`` prices per-parameter sharding."""


def get_runtime(name: str | RuntimeProfile) -> RuntimeProfile:
    """A profile by name or alias (case-insensitive; ``_`` and spaces read as ``-``), with
    what would fit on error."""
    if isinstance(name, RuntimeProfile):
        return name
    key = "-".join(str(name).strip().lower().replace("_", " ").split())
    key = RUNTIME_ALIASES.get(key, key)
    if key in RUNTIMES:
        return RUNTIMES[key]
    close = difflib.get_close_matches(key, RUNTIMES, n=2)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise SpecError("runtime", f"unknown runtime {name!r}.{hint} Known: {', '.join(RUNTIMES)}")
