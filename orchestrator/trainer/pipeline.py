"""Pipeline stages for the built-in trainer: the non-interleaved 1F1B schedule.

Stage ``i`` of ``p`` runs ``min(p − i − 1, m)`` warm-up forwards, then alternates one forward
and one backward until its ``m`` forwards are done, then the cool-down backwards (Narayanan et
al. 2021, PipeDream-Flush; Megatron-LM's ``forward_backward_pipelining_without_interleaving``),
so it holds at most ``min(p − i, m)`` micro-batches' activations — what ``predictor.memory``
prices for the ``frenzy`` profile. The stages exchange the hidden states forward and their
gradients backward point to point; every exchange is one ``batch_isend_irecv`` of the sends
and receives it pairs (send forward + receive backward, send backward + receive forward), as
Megatron-LM does, so no stage waits on a send its neighbour posts after a receive (which
NCCL would deadlock on); gloo and NCCL both run it. gloo sends and receives host memory only
(its send/recv read the tensor's pointer directly; of its collectives only all-reduce and
broadcast take CUDA tensors), so on a CUDA device under gloo — several ranks sharing one GPU
to measure a rank's memory — the exchange goes through host copies; the device then holds
what it holds under NCCL, the received tensor. The tensors sent are the fp32 residual
stream (the trainer's weights and embeddings are fp32; autocast casts only inside the
matmuls).

Only the last stage computes the loss: it returns the sum of its micro-batches' losses
(each divided by ``m``), the other stages zero; the loop's per-step all-reduce then makes
every rank agree on the mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.trainer.parallel import Layout

STREAM_DTYPE = torch.float32
"""The dtype of the hidden states between stages (the trainer's fp32 residual stream)."""


class P2P:
    """Point-to-point exchange with the neighbouring stages of one rank (its tp and dp index
    fixed). ``shape``: a micro-batch's hidden states ``[b, s, h]``."""

    def __init__(self, layout: Layout, shape: tuple[int, ...], device: torch.device) -> None:
        self.layout = layout
        self.shape = shape
        self.device = device
        stage = layout.pp_rank
        self.prev = layout.stage_peer(stage - 1) if stage > 0 else None
        self.next = layout.stage_peer(stage + 1) if stage < layout.pp - 1 else None
        self.via_host = (device.type != "cpu" and dist.is_initialized()
                         and dist.get_backend() == "gloo")

    def _empty(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=STREAM_DTYPE,
                           device="cpu" if self.via_host else self.device)

    def _outgoing(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().cpu() if self.via_host else t.contiguous()

    def _incoming(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return t.to(self.device) if self.via_host and t is not None else t

    def exchange(self, send_next: torch.Tensor | None = None,
                 send_prev: torch.Tensor | None = None, recv_next: bool = False,
                 recv_prev: bool = False) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Post the sends and receives asked for at once and wait for all of them; returns
        (tensor received from the previous stage, from the next stage)."""
        ops = []
        from_prev = from_next = None
        if send_prev is not None and self.prev is not None:
            ops.append(dist.P2POp(dist.isend, self._outgoing(send_prev), self.prev))
        if recv_prev and self.prev is not None:
            from_prev = self._empty()
            ops.append(dist.P2POp(dist.irecv, from_prev, self.prev))
        if send_next is not None and self.next is not None:
            ops.append(dist.P2POp(dist.isend, self._outgoing(send_next), self.next))
        if recv_next and self.next is not None:
            from_next = self._empty()
            ops.append(dist.P2POp(dist.irecv, from_next, self.next))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return self._incoming(from_prev), self._incoming(from_next)


def one_f_one_b(layout: Layout, micro: int,
                forward: Callable[[int, torch.Tensor | None], tuple[torch.Tensor, Any]],
                p2p: P2P, scale: float) -> torch.Tensor:
    """Run one step's ``micro`` micro-batches through this stage under 1F1B; returns the
    sum of the (already ``1/micro``-weighted) losses on the last stage, 0 elsewhere.

    ``forward(i, x)``: micro-batch ``i``'s output on this stage — its loss (divided by
    ``micro``) on the last stage, else the hidden states — given the previous stage's
    output ``x`` (None on the first stage, which reads the tokens itself), and what the
    caller holds until that micro-batch's backward is done (the last stage's logits, as the
    one-stage loop holds them: the memory ``predictor.runtimes.FRENZY`` prices). Backward runs
    ``(loss · scale).backward()`` on the last stage and the received gradient elsewhere."""
    stage, pp = layout.pp_rank, layout.pp
    first, last = stage == 0, stage == pp - 1
    warmup = min(pp - stage - 1, micro)
    steady = micro - warmup
    total = torch.zeros((), device=p2p.device)
    # (input, output, held) of the micro-batches in flight
    pending: list[tuple[torch.Tensor | None, torch.Tensor, Any]] = []

    def run_forward(i: int, x: torch.Tensor | None) -> torch.Tensor:
        nonlocal total
        if x is not None:
            x.requires_grad_(True)
        out, held = forward(i, x)
        if last:
            total = total + out.detach()
            out = out * scale
        else:
            out = out.to(STREAM_DTYPE)
        pending.append((x, out, held))
        return out

    def run_backward(grad: torch.Tensor | None) -> torch.Tensor | None:
        x, out, held = pending.pop(0)
        if last:
            out.backward()
        else:
            assert grad is not None
            torch.autograd.backward(out, grad)
        del out, held
        return None if first or x is None else x.grad

    for i in range(warmup):
        x, _ = p2p.exchange(recv_prev=not first)
        out = run_forward(i, x)
        p2p.exchange(send_next=None if last else out.detach())
        del x, out
    x = p2p.exchange(recv_prev=not first)[0] if steady > 0 else None
    for j in range(steady):
        out = run_forward(warmup + j, x)
        x = None
        _, grad = p2p.exchange(send_next=None if last else out.detach(), recv_next=not last)
        del out
        g_in = run_backward(grad)
        del grad
        if j == steady - 1:
            p2p.exchange(send_prev=g_in)
        else:
            x = p2p.exchange(send_prev=g_in, recv_prev=not first)[0]
        del g_in
    for _ in range(warmup):
        _, grad = p2p.exchange(recv_next=not last)
        g_in = run_backward(grad)
        del grad
        p2p.exchange(send_prev=g_in)
        del g_in
    return total
