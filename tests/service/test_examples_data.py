"""The example job files: every one is a valid submission, and the data flow of the README
works end to end without the service: prepare the data, check the text job's inputs as
submission does, train it with the options the service hands the trainer, export it, and
check the fine-tuning job that starts from the export."""

from __future__ import annotations

import runpy
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.trainer.loop import RunConfig, apply_options, train
from service.api.job_inputs import check_inputs, trainer_options
from service.api.planning import resolve_specs
from service.cli import main as cli_main
from service.schemas import JobCreate
from service.serve_cli import load_job_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_is_a_valid_submission(name: str) -> None:
    body = JobCreate.model_validate(load_job_file(EXAMPLES / name))
    assert body.training.global_batch > 0


def test_text_example_trains_exports_and_seeds_the_finetune_example(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    shutil.copytree(EXAMPLES, tmp_path / "examples")  # with the repository's text beside it
    shutil.copyfile(EXAMPLES.parent / "README.md", tmp_path / "README.md")
    shutil.copytree(EXAMPLES.parent / "docs", tmp_path / "docs",
                    ignore=lambda d, names: [n for n in names if not n.endswith(".md")])
    argv = sys.argv
    sys.argv = ["prepare_data.py", "--out", str(tmp_path / "var" / "data")]
    try:
        runpy.run_path(str(tmp_path / "examples" / "prepare_data.py"), run_name="__main__")
    finally:
        sys.argv = argv
    request = load_job_file(tmp_path / "examples" / "gpt2-tiny-text.yaml")
    assert request["data"]["path"] == str(tmp_path / "var" / "data" / "docs")
    body = JobCreate.model_validate(request)
    model, train_spec, _ = resolve_specs(body)
    notes = check_inputs(body, model, train_spec)
    # prepare_data's train.bin holds the same documents, each followed by end-of-text
    tokens = (tmp_path / "var" / "data" / "tokens" / "train.bin").stat().st_size // 2
    docs = len(list((tmp_path / "var" / "data" / "docs").iterdir()))  # README + docs/*.md
    assert notes[0].startswith(f"data: {tokens:,} tokens in {docs} file(s)")

    opts = trainer_options(request, total_steps=2)
    cfg = apply_options(RunConfig(job_id="text", model=model, global_batch=8, seq_len=128,
                                  total_steps=2, checkpoint_dir=str(tmp_path / "ckpt")), opts)
    assert cfg.data.kind == "text" and cfg.lr == 1e-3 and cfg.warmup_steps == 20
    assert train(replace(cfg, warmup_steps=0), 0).finished
    out = tmp_path / "var" / "export" / "gpt2-tiny-text"
    assert cli_main(["export", "text", str(out), "--checkpoint-dir",
                     str(tmp_path / "ckpt")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "tokenizer.json"]
    assert cli_main(["export", "nope", str(tmp_path / "x"), "--checkpoint-dir",
                     str(tmp_path / "ckpt")]) == 1
    assert "job nope has no checkpoint under" in capsys.readouterr().err

    ft = load_job_file(tmp_path / "examples" / "finetune-hf.yaml")
    ft_body = JobCreate.model_validate(ft)
    ft_model, ft_train, source = resolve_specs(ft_body)
    assert source == "init_from" and ft_model.vocab_size == 512
    assert check_inputs(ft_body, ft_model, ft_train)[0].startswith(f"data: {tokens:,} tokens")
    ft_opts = trainer_options(ft, total_steps=1)
    assert ft_opts["data"]["tokenizer"] == ft["init_from"]  # the exported folder's tokenizer
    ft_cfg = apply_options(RunConfig(job_id="ft", model=ft_model, global_batch=8, seq_len=128,
                                     total_steps=1, checkpoint_dir=str(tmp_path / "ckpt")),
                           ft_opts)
    assert train(ft_cfg, 0).finished
