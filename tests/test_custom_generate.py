"""The Hub-style `custom_generate/` folder shipped in the package, loaded by transformers from a local model dir."""

from __future__ import annotations

import shutil
from importlib import resources

import torch
from conftest import prompt, tiny_llama
from transformers import AutoModelForCausalLM

import hf_semspec


def test_custom_generate_folder_runs_hf_semspec(tmp_path, close_draft):
    model = tiny_llama(seed=0)
    model.save_pretrained(tmp_path)
    shutil.copytree(resources.files("hf_semspec") / "custom_generate", tmp_path / "custom_generate")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)  # stock generate: nothing attached
    ids = prompt(8)
    out = reloaded.generate(
        ids, custom_generate=str(tmp_path), trust_remote_code=True, assistant_model=close_draft,
        acceptance="exact", max_new_tokens=20, return_dict_in_generate=True,
    )
    assert isinstance(out, hf_semspec.SpeculativeDecoderOnlyOutput)  # our loop ran, not stock assisted decoding
    assert out.acceptance_stats.num_drafted > 0
    plain = type(model).generate(model, ids, do_sample=False, max_new_tokens=20)
    assert torch.equal(out.sequences, plain)


def test_model_repo_with_custom_generate_loads_it_with_trust_remote_code(tmp_path, close_draft):
    model = tiny_llama(seed=0)
    model.save_pretrained(tmp_path)
    shutil.copytree(resources.files("hf_semspec") / "custom_generate", tmp_path / "custom_generate")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    out = reloaded.generate(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=10, return_dict_in_generate=True)
    assert out.acceptance_stats is not None
