"""``frenzy export ID [--step N] --format hf OUT/``: a job's checkpoint as a Hugging Face
model folder (``config.json`` + ``model.safetensors`` + the job's tokenizer).

The checkpoint folder is asked of the service (``GET /v1/jobs/{id}/artifacts``, which also
checks that the job is yours) unless ``--checkpoint-dir`` names it; the files are read from
that shared folder directly, so the command runs where the checkpoints are visible.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a job's checkpoint as a Hugging Face model folder")
    p.add_argument("job_id", help="the job's id (or a unique prefix of it)")
    p.add_argument("out", type=Path, help="output folder (created)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    p.add_argument("--format", choices=["hf"], default="hf",
                   help="hf: config.json + model.safetensors (transformers from_pretrained)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="the service's checkpoint folder (default: ask the service)")
    p.add_argument("--json", action="store_true", help="print the files written as JSON")
    p.set_defaults(handler=run_export)


def _root_from_service(job_id: str) -> Path:
    from service.serve_cli import _call

    listing = _call("GET", f"/v1/jobs/{job_id}/artifacts")
    return Path(listing["checkpoint_dir"]).parent


def run_export(args: argparse.Namespace) -> int:
    """Export; errors are one line on stderr and exit code 1."""
    from service.serve_cli import ClientError

    try:
        if args.checkpoint_dir:
            root = Path(args.checkpoint_dir)
        else:  # a short id prefix (as the dashboard shows) is resolved by the service
            from service.serve_cli import resolve_job_id

            args.job_id = resolve_job_id(args.job_id)
            root = _root_from_service(args.job_id)
        from orchestrator.trainer.export import export_hf

        files = export_hf(root, args.job_id, args.out, step=args.step)
    except (ClientError, ValueError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    if args.json:
        print(json.dumps({"job_id": args.job_id, "out": str(args.out),
                          "files": [str(f) for f in files]}))
    else:
        print(f"exported job {args.job_id} to {args.out}: "
              + ", ".join(f.name for f in files))
        print(f"  load it: transformers.AutoModelForCausalLM.from_pretrained({str(args.out)!r})")
    return 0
