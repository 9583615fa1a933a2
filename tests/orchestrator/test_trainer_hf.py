"""Hugging Face weights out and in, for every family of the built-in trainer: a tiny model
trained a few steps on a tiny corpus, exported, loads in ``transformers`` with the trainer's
logits; and a ``transformers`` model saved with ``save_pretrained`` starts a job
(``init_from``) with its own logits. Configs are built locally: nothing is downloaded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.data import DataConfig
from orchestrator.trainer.export import artifacts, export_hf
from orchestrator.trainer.hf import hf_config, spec_from_folder
from orchestrator.trainer.loop import RunConfig, full_state, init_from_folder, resolve_numerics
from orchestrator.trainer.loop import train as train_loop
from orchestrator.trainer.model import Numerics, ParallelTransformer
from orchestrator.trainer.parallel import Layout
from predictor.spec import Family, ModelSpec
from tests.orchestrator.corpus import train_tokenizer, write_text_corpus

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

V = 320
SPECS = {
    "gpt2": ModelSpec("t-gpt2", Family.GPT2, 2, 32, 4, V, 64),
    "llama": ModelSpec("t-llama", Family.LLAMA, 2, 32, 4, V, 64, num_kv_heads=2,
                       ffn_hidden_size=48, tie_embeddings=False),
    "qwen2": ModelSpec("t-qwen2", Family.QWEN2, 2, 32, 4, V, 64, num_kv_heads=2,
                       ffn_hidden_size=48, tie_embeddings=True),
    "gpt_neox": ModelSpec("t-neox", Family.GPT_NEOX, 2, 32, 4, V, 64, tie_embeddings=False),
    # heads wider than hidden / heads: Q and the attention output 4 x 16 = 64 over hidden 32
    # (as Qwen3-0.6B's 16 x 128 over 1024), with Qwen3's q_norm / k_norm, and without
    "qwen3": ModelSpec("t-qwen3", Family.QWEN3, 2, 32, 4, V, 64, num_kv_heads=2,
                       ffn_hidden_size=48, tie_embeddings=True, explicit_head_dim=16),
    "llama_hd": ModelSpec("t-llama-hd", Family.LLAMA, 2, 32, 4, V, 64, num_kv_heads=2,
                          ffn_hidden_size=48, tie_embeddings=False, explicit_head_dim=16),
    "bert": ModelSpec("t-bert", Family.BERT, 2, 32, 4, V, 64, type_vocab_size=2),
}
# What the families' own configs set differently from the trainer's defaults.
NATIVE = {
    "gpt2": {"activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "llama": {"rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    "qwen2": {"rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "qwen3": {"rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "llama_hd": {"rms_norm_eps": 1e-5},
    "gpt_neox": {"hidden_act": "gelu", "rotary_pct": 0.25, "layer_norm_eps": 1e-5,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                     "partial_rotary_factor": 0.25}},
    "bert": {"hidden_act": "gelu", "layer_norm_eps": 1e-12},
}
TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("corpus")
    return write_text_corpus(root / "text"), train_tokenizer(root / "tok")


def _hf_class(family: str) -> object:
    if family == "bert":
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModelForCausalLM


def _trainer_logits(spec: ModelSpec, state: dict, numerics: Numerics,
                    tokens: torch.Tensor) -> torch.Tensor:
    model = ParallelTransformer(spec, Layout(0, 1, 1, 1), numerics=numerics)
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        return model(tokens)


@pytest.mark.parametrize("family", sorted(SPECS))
def test_trained_model_exports_to_transformers_with_the_same_logits(
        tmp_path: Path, corpus: tuple[Path, Path], family: str) -> None:
    text, tok = corpus
    spec = SPECS[family]
    cfg = RunConfig(job_id=f"job-{family}", model=spec, global_batch=4, seq_len=16,
                    total_steps=3, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2,
                    lr=1e-2, lr_schedule="cosine", warmup_steps=1, grad_clip=1.0,
                    data=DataConfig(kind="text", path=str(text), tokenizer=str(tok)))
    result = train_loop(cfg, 0)
    assert result.finished
    listed = artifacts(cfg.checkpoint_dir, cfg.job_id)
    assert [a.step for a in listed] == [2, 3] and all(a.size_bytes > 0 for a in listed)
    out = tmp_path / "export"
    files = export_hf(cfg.checkpoint_dir, cfg.job_id, out)
    assert {f.name for f in files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    hf = _hf_class(family).from_pretrained(out).eval()
    tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(input_ids=tokens).logits
    ours = _trainer_logits(spec, full_state(cfg), Numerics(), tokens)
    assert (theirs - ours).abs().max().item() < TOL
    if family == "bert":  # what AutoModelForCausalLM makes of it: the same MLM head
        causal = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert (causal(input_ids=tokens).logits - ours).abs().max().item() < TOL
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert fast.encode("the cluster") == __import__("tokenizers").Tokenizer.from_file(
        str(tok)).encode("the cluster").ids
    # an earlier step exports too, and differs from the last
    export_hf(cfg.checkpoint_dir, cfg.job_id, tmp_path / "step2", step=2)
    hf2 = _hf_class(family).from_pretrained(tmp_path / "step2").eval()
    with torch.no_grad():
        assert not torch.allclose(hf2(input_ids=tokens).logits, theirs)
    with pytest.raises(ValueError, match="no checkpoint at step 1; kept: 2, 3"):
        export_hf(cfg.checkpoint_dir, cfg.job_id, tmp_path / "x", step=1)


@pytest.mark.parametrize("family", sorted(SPECS))
def test_transformers_weights_start_a_job_with_the_same_logits(tmp_path: Path,
                                                               family: str) -> None:
    spec = SPECS[family]

    config = {**hf_config(spec, Numerics()), **NATIVE[family]}
    config.pop("dtype", None)
    hf_cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(1)
    hf = _hf_class(family).from_config(hf_cfg).eval()
    with torch.no_grad():  # norms and biases away from their 1/0 init: a real test
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    got_spec, numerics = spec_from_folder(folder)
    assert (got_spec.num_layers, got_spec.hidden_size, got_spec.vocab_size,
            got_spec.num_kv_heads) == (2, 32, V, spec.num_kv_heads)
    cfg = RunConfig(job_id="ft", model=got_spec, global_batch=2, seq_len=8, total_steps=1,
                    checkpoint_dir=str(tmp_path / "ckpt"), init_from=str(folder))
    assert resolve_numerics(cfg) == numerics
    model = ParallelTransformer(got_spec, Layout(0, 1, 1, 1), numerics=numerics)
    init_from_folder(cfg, model, Layout(0, 1, 1, 1))
    model.eval()
    tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (model(tokens) - hf(input_ids=tokens).logits).abs().max().item()
    assert diff < TOL
    # Through the training loop: with lr 0 the first checkpoint holds exactly those weights.
    train_loop(replace(cfg, lr=0.0), 0)
    saved = ckpt.read(ckpt.step_path(cfg.checkpoint_dir, "ft", 1))
    state = model.state_dict()
    assert all(torch.equal(saved["model"][k], state[k]) for k in state)
    assert saved["numerics"] == {**numerics.__dict__}


@pytest.mark.parametrize("family", ["qwen3", "llama_hd"])
def test_wide_heads_export_under_the_transformers_names_and_shapes(family: str) -> None:
    """The exported config builds the ``transformers`` class whose state dict has exactly
    the exported names and shapes (Qwen3's ``self_attn.q_norm.weight`` /
    ``self_attn.k_norm.weight`` included; q_proj 4 x 16 = 64 rows over hidden 32), and the
    config reads back as the same spec."""
    from orchestrator.trainer.hf import to_hf
    from orchestrator.trainer.model import init_canonical

    spec = SPECS[family]
    layout = Layout(0, 1, 1, 1)
    model = ParallelTransformer(spec, layout)
    init_canonical(model, layout, seed=0)
    ours = {k: tuple(v.shape) for k, v in to_hf(model.state_dict(), spec).items()}
    config = hf_config(spec, Numerics())
    assert config["head_dim"] == 16 and config["hidden_size"] == 32
    assert ModelSpec.from_hf_config(config, name=spec.name) == spec
    config.pop("dtype", None)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if family == "qwen3" else "LlamaForCausalLM")
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items()
              if not (spec.tie_embeddings and k == "lm_head.weight")}
    assert ours == theirs
    assert ours["model.layers.1.self_attn.q_proj.weight"] == (64, 32)
    assert ours["model.layers.1.self_attn.o_proj.weight"] == (32, 64)
    norms = {k for k in ours if k.endswith(("q_norm.weight", "k_norm.weight"))}
    assert len(norms) == (4 if family == "qwen3" else 0)
    assert all(ours[k] == (16,) for k in norms)


def test_init_from_shards_the_weights_over_tensor_parallel_ranks(tmp_path: Path) -> None:
    """At tp=2 each rank keeps its slice of the folder's weights: the first checkpoint
    (gathered, lr 0) holds exactly the folder's tensors."""
    from orchestrator.trainer.hf import load_folder
    from orchestrator.trainer.local import run_local

    spec = SPECS["llama"]
    config = {**hf_config(spec, Numerics()), **NATIVE["llama"]}
    config.pop("dtype", None)
    torch.manual_seed(2)
    transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config)).save_pretrained(tmp_path / "hf")
    got, _ = spec_from_folder(tmp_path / "hf")
    cfg = RunConfig(job_id="tp2", model=got, global_batch=2, seq_len=8, total_steps=1, tp=2,
                    checkpoint_dir=str(tmp_path / "ckpt"), init_from=str(tmp_path / "hf"),
                    lr=0.0)
    assert all(r.finished for r in run_local(cfg))
    saved = full_state(cfg)
    want = load_folder(tmp_path / "hf", got)
    assert set(saved) == set(want)
    assert all(torch.equal(saved[k], want[k]) for k in want)


def test_a_folder_of_a_type_the_trainer_does_not_build_is_refused_by_name(
        tmp_path: Path) -> None:
    # microsoft/Phi-3-mini's layers are llama's tensors (priced as llama), but its weights
    # are fused (qkv_proj, gate_up_proj): the trainer loads and exports llama names only
    import json

    folder = tmp_path / "phi3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
        "max_position_embeddings": 64}))
    with pytest.raises(ValueError, match=r"config.model_type='phi3'.*gpt2, llama"):
        spec_from_folder(folder)
