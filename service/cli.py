"""The ``frenzy`` command line: plan a job, and the other sub-commands of the service.

Sub-commands register themselves through ``add_*_parser`` functions of their packages, so
this module stays a thin dispatcher.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from predictor.errors import SpecError
from predictor.gpus import GIB, get_gpu, resolve_gpu
from predictor.planner import DEFAULT_MARGIN, DEFAULT_MAX_GPUS, RANKINGS, PlanResult, plan_job
from predictor.runtimes import DEFAULT_RUNTIME, RUNTIMES, get_runtime
from predictor.spec import Family, ModelSpec, TrainingSpec

log = logging.getLogger("frenzy")

Handler = Callable[[argparse.Namespace], int]
BROKEN_PIPE_EXIT = 141
"""Exit status when stdout's reader went away (128 + SIGPIPE, what a shell reports)."""


def _model_from_args(args: argparse.Namespace) -> ModelSpec:
    given = [x for x in (args.model, args.config, args.layers) if x is not None]
    if len(given) != 1:
        raise SpecError(
            "model", "give exactly one of --model NAME, --config config.json, or --layers/... dims"
        )
    if args.model is not None:
        return ModelSpec.from_name(args.model)
    if args.config is not None:
        path = Path(args.config)
        if path.is_dir():  # a Hugging Face model folder: its config.json
            if not (path / "config.json").is_file():
                raise SpecError("config", f"{path} is a folder without a config.json; give a "
                                "config.json or a Hugging Face model folder that has one")
            path = path / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SpecError("config", f"no such file: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError("config", f"cannot read {path}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise SpecError("config", f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SpecError("config", f"{path}: expected a JSON object (a config.json)")
        if path.name == "config.json" and path.parent.name:
            return ModelSpec.from_hf_config(data, name=path.parent.name)
        return ModelSpec.from_hf_config(data, name=path.stem if path.stem != "config" else None)
    missing = [n for n in ("hidden", "heads", "vocab") if getattr(args, n) is None]
    if missing:
        raise SpecError(missing[0], "explicit dimensions need --layers, --hidden, --heads, --vocab")
    return ModelSpec(
        name=args.name or "custom",
        family=args.family,
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads or 0,
        explicit_head_dim=args.head_dim or 0,
        ffn_hidden_size=args.ffn or 0,
        vocab_size=args.vocab,
        max_seq_len=args.max_seq or max(args.seq, 2048),
        tie_embeddings=args.family in ("gpt2", "bert", "qwen3"),
    )


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="rank the parallel plans of a model on each GPU type",
        description="Predict per-GPU peak memory and step time of every plan and rank them.",
    )
    src = p.add_argument_group("model (one of)")
    src.add_argument("--model", help="catalog name, e.g. llama-2-7b (see --list-models)")
    src.add_argument("--config", help="a Hugging Face config.json (or a model folder with one)")
    src.add_argument("--layers", type=int, help="explicit dims: number of layers")
    src.add_argument("--hidden", type=int)
    src.add_argument("--heads", type=int)
    src.add_argument("--kv-heads", type=int)
    src.add_argument("--head-dim", type=int,
                     help="one head's width when not hidden / heads (e.g. Qwen3, Mistral-Nemo)")
    src.add_argument("--ffn", type=int)
    src.add_argument("--vocab", type=int)
    src.add_argument("--max-seq", type=int)
    src.add_argument("--family", default="gpt2", choices=[f.value for f in Family])
    src.add_argument("--name")
    t = p.add_argument_group("training")
    t.add_argument("--batch", type=int, required=False, help="global batch (sequences)")
    t.add_argument("--seq", type=int, default=2048, help="sequence length (tokens)")
    t.add_argument("--precision", default="bf16", help="fp32 | fp16 | bf16")
    t.add_argument("--optimizer", default="adamw", help="adam | adamw | sgd")
    t.add_argument("--steps", type=int)
    t.add_argument("--tokens", type=int)
    t.add_argument("--no-flash", action="store_true", help="plan without flash attention")
    s = p.add_argument_group("search")
    s.add_argument("--gpus", help="comma-separated GPU types (default: the whole catalog)")
    s.add_argument("--cluster", help="rank for this cluster (packaged name or YAML file): its "
                   "GPU types, and no plan needing more GPUs of a type than it has")
    s.add_argument("--max-gpus", type=int, default=DEFAULT_MAX_GPUS)
    s.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help="fraction of GPU memory kept free (default %(default)s)")
    s.add_argument("--ranking", default="gpu_seconds", choices=sorted(RANKINGS))
    s.add_argument("--runtime", default=DEFAULT_RUNTIME,
                   help="the runtime whose memory is priced: " + ", ".join(sorted(RUNTIMES))
                   + " or a framework's own name (Megatron-LM, torchtitan, transformers ...; "
                   "default %(default)s)")
    s.add_argument("--top", type=int, default=10, help="plans to print (0 = all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--list-models", action="store_true", help="list catalog models and exit")
    p.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    if args.list_models:
        from predictor.spec import MODEL_CATALOG

        for name, m in sorted(MODEL_CATALOG.items()):
            print(f"{name:16s} {m.family.value:9s} {m.num_params() / 1e9:7.2f}B params")
        return 0
    if args.batch is None:
        raise SpecError("batch", "--batch (global batch in sequences) is required")
    model = _model_from_args(args)
    train = TrainingSpec(
        global_batch=args.batch, seq_len=args.seq, precision=args.precision,
        optimizer=args.optimizer, steps=args.steps, tokens=args.tokens,
        flash_attention=not args.no_flash,
    )
    gpus = [resolve_gpu(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else None
    counts: dict[str, int] | None = None
    max_gpus = args.max_gpus
    if args.cluster is not None:
        if gpus is not None:
            raise SpecError("gpus", "give --gpus or --cluster, not both")
        counts = cluster_gpu_counts(args.cluster)
        gpus = [get_gpu(t) for t in counts]
        max_gpus = min(max_gpus, max(counts.values()))
    result = plan_job(
        model, train, gpus, max_gpus=max_gpus, margin=args.margin, ranking=args.ranking,
        runtime=get_runtime(args.runtime).name,
    )
    if counts is not None:
        result = for_cluster(result, counts, args.cluster, args.ranking)
    if args.json:
        print(json.dumps(result_to_dict(result, args.top)))
    else:
        print(format_result(result, args.top))
    return 0 if result.plans else 1


def cluster_gpu_counts(name_or_path: str) -> dict[str, int]:
    """GPUs of each type in the cluster ``name_or_path`` (``SpecError`` on ``cluster``)."""
    from orchestrator.clusters import ClusterConfigError, load_cluster, packaged_clusters

    try:
        spec = load_cluster(name_or_path)
    except (ClusterConfigError, OSError) as exc:
        raise SpecError("cluster", f"{exc} (packaged: {', '.join(packaged_clusters())})"
                        ) from None
    counts = spec.state.total_by_type()
    for t in counts:
        get_gpu(t)  # a type the predictor does not know: SpecError naming the catalog
    return counts


def for_cluster(result: PlanResult, counts: dict[str, int], cluster: str,
                ranking: str = "gpu_seconds") -> PlanResult:
    """``result`` without the plans that need more GPUs of a type than the cluster has,
    ranked again from 1 (the planner's order kept)."""
    from predictor.planner import _with_reasons

    kept = [p for p in result.plans if p.num_gpus <= counts.get(p.gpu_type, 0)]
    plans = tuple(_with_reasons(kept, ranking)) if kept else ()  # ranks, "vs #1" renumbered
    infeasible = result.infeasible
    if not plans and not infeasible:
        have = ", ".join(f"{n}x{t}" for t, n in sorted(counts.items()))
        infeasible = f"no plan fits the GPUs of cluster {cluster} ({have})"
    return replace(result, plans=plans, infeasible=infeasible)


def result_to_dict(result: PlanResult, top: int = 0) -> dict[str, Any]:
    plans = result.plans if top <= 0 else result.plans[:top]
    return {
        "model": result.model.name,
        "params": result.model.num_params(),
        "global_batch": result.train.global_batch,
        "seq_len": result.train.seq_len,
        "num_steps": result.train.num_steps,
        "feasible": bool(result.plans),
        "infeasible_reason": result.infeasible,
        "min_required_bytes": result.min_required_bytes,
        "num_plans": len(result.plans),
        "notes": list(result.notes),
        "plans": [p.to_dict() for p in plans],
    }


def format_result(result: PlanResult, top: int = 10) -> str:
    m, t = result.model, result.train
    head = (
        f"{m.name}: {m.num_params() / 1e9:.2f}B params, global batch {t.global_batch} × "
        f"{t.seq_len} tokens, {t.precision.value}, {t.optimizer.value}, {t.num_steps} steps"
    )
    notes = "".join(f"\nnote: {n}" for n in result.notes)
    if not result.plans:
        return f"{head}\nNo plan fits: {result.infeasible}{notes}"
    rows = [
        ("#", "GPUs", "tp", "pp", "dp", "mb", "recomp", "zero", "peak GiB", "of GiB",
         "params", "grads", "optim", "activ", "logits", "slack", "ovh", "step s", "job h",
         "GPU-h"),
    ]
    shown = result.plans if top <= 0 else result.plans[:top]
    for p in shown:
        mem = p.memory
        cap = get_gpu(p.gpu_type).memory_gib
        rows.append((
            str(p.rank), f"{p.num_gpus}x{p.gpu_type}", str(p.parallel.tp), str(p.parallel.pp),
            str(p.parallel.dp), str(p.parallel.micro_batch), p.parallel.recompute.value,
            str(p.parallel.zero_stage), f"{mem.total / GIB:.1f}", f"{cap:.0f}",
            f"{mem.parameters / GIB:.1f}", f"{mem.gradients / GIB:.1f}",
            f"{mem.optimizer_states / GIB:.1f}", f"{mem.activations / GIB:.1f}",
            f"{mem.logits / GIB:.1f}", f"{mem.slack / GIB:.1f}", f"{mem.overhead / GIB:.1f}",
            f"{p.step_time_s:.3f}", f"{p.job_time_s / 3600:.2f}", f"{p.gpu_seconds / 3600:.1f}",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, *(f"note: {n}" for n in result.notes),
             f"{len(result.plans)} plans fit (showing {len(shown)}); ranked best first"]
    for r in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    lines.append("")
    lines.extend(f"  {p.rank:>3}. {p.reason}" for p in shown[: min(5, len(shown))])
    return "\n".join(lines)


def _optional_parsers() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Sub-commands of other packages, added when those packages are present."""
    adders: list[Callable[[argparse._SubParsersAction], None]] = []
    for module, attr in (
        ("simulator.cli", "add_simulate_parser"),
        ("service.memory_cli", "add_memory_parser"),
        ("service.tokens_cli", "add_token_parser"),
        ("service.serve_cli", "add_serve_parsers"),
        ("service.export_cli", "add_export_parser"),
    ):
        try:
            mod = __import__(module, fromlist=[attr])
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue
            raise
        adders.append(getattr(mod, attr))
    return adders


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frenzy", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    add_plan_parser(sub)
    for add in _optional_parsers():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except SpecError as exc:
        print(f"error: {exc.field}: {exc.reason}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `frenzy jobs | head`: the reader left; no traceback
        # (as the Python docs advise: point stdout at devnull so the exit flush is quiet)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT


if __name__ == "__main__":
    raise SystemExit(main())
