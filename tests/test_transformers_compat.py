"""Pins the private transformers behaviour hf_semspec relies on (all of it is named in hf_semspec/_transformers_compat.py).

If one of these fails after a transformers upgrade, update `_transformers_compat.py` and the range in setup.cfg.
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch
import transformers
from conftest import prompt, tiny_llama, tiny_tokenizer
from packaging.version import Version
from transformers import GenerationConfig, GenerationMixin
from transformers.cache_utils import DynamicCache
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.modeling_outputs import CausalLMOutputWithPast

from hf_semspec import _transformers_compat as compat


def test_version_is_in_the_declared_range():
    from packaging.specifiers import SpecifierSet

    from hf_semspec._versions import SUPPORTED

    assert Version(transformers.__version__) in SpecifierSet(SUPPORTED["transformers"])


def test_a_config_transformers_prepared_asks_for_nothing_its_defaults_say(attached, close_draft):
    """transformers' pipelines before 5.24 pass `generate()` a config that `_prepare_generation_config` filled with
    `GenerationConfig._get_default_generation_params()` (`assistant_confidence_threshold` 0.4, `num_assistant_tokens`
    20, ...): those are transformers' defaults, not the caller's settings. A config a user built is read as given."""
    defaults = GenerationConfig._get_default_generation_params()
    assert defaults["assistant_confidence_threshold"] == 0.4 and defaults["num_assistant_tokens"] == 20
    prepared = GenerationConfig(**{**defaults, "max_new_tokens": 12, "do_sample": False}, acceptance="exact")
    assert compat.transformers_default(prepared, "num_assistant_tokens") == 20
    out = attached.generate(prompt(8), assistant_model=close_draft, generation_config=prepared,
                            return_dict_in_generate=True)
    assert out.acceptance_stats.drafted_per_round[0] == 5  # the rule's default, not transformers' 20

    built = GenerationConfig(max_new_tokens=12, acceptance="exact", num_assistant_tokens=20)
    assert compat.transformers_default(built, "num_assistant_tokens") is None
    out = attached.generate(prompt(8), assistant_model=close_draft, generation_config=built, return_dict_in_generate=True)
    assert out.acceptance_stats.drafted_per_round[0] == 11  # γ = 20, cut to leave the target its token of the 12


def test_the_cache_is_named_as_the_installed_transformers_names_it():
    """`CACHE_ARGUMENT` is the cache's name everywhere the loop meets it: the key in the `model_kwargs` that
    `generate()` hands a custom decoding loop, the keyword of the models' `forward`, and the field of their outputs and
    of `generate()`'s. transformers 5.24 renamed `past_key_values` to `cache` in all four; a loop that read the old
    key failed with a KeyError."""
    model = tiny_llama(seed=0)
    handed = {}

    def recording_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        handed.update(model_kwargs)
        return input_ids

    model.generate(torch.ones(1, 3, dtype=torch.long), custom_generate=recording_loop, max_new_tokens=2)
    assert isinstance(handed[compat.CACHE_ARGUMENT], DynamicCache)
    other_name = ({"cache", "past_key_values"} - {compat.CACHE_ARGUMENT}).pop()
    assert other_name not in handed
    assert compat.CACHE_ARGUMENT in inspect.signature(model.forward).parameters
    for output_class in (CausalLMOutputWithPast, GenerateDecoderOnlyOutput):
        assert compat.CACHE_ARGUMENT in {field.name for field in dataclasses.fields(output_class)}


def test_from_model_config_flag_drops_custom_keys_and_clearing_it_keeps_them(tmp_path):
    model = tiny_llama(seed=0)
    assert compat.is_derived_from_model_config(model.generation_config)
    model.generation_config.acceptance = "exact"
    model.generation_config.save_pretrained(tmp_path / "flagged")
    saved = json.loads((tmp_path / "flagged" / "generation_config.json").read_text())
    assert saved[compat.FROM_MODEL_CONFIG_FLAG] is True
    loaded = GenerationConfig.from_pretrained(tmp_path / "flagged")
    assert getattr(loaded, "acceptance", None) is None  # the behaviour we work around

    compat.mark_as_user_config(model.generation_config)
    model.generation_config.save_pretrained(tmp_path / "cleared")
    assert GenerationConfig.from_pretrained(tmp_path / "cleared").acceptance == "exact"


def test_public_api_we_build_on_exists():
    assert "custom_generate" in inspect.signature(GenerationMixin.generate).parameters
    cache = DynamicCache()
    assert hasattr(cache, "activate_past_recording") and hasattr(cache, "crop")


def test_a_dequantized_model_without_its_quantizer_saves_and_reloads(tmp_path):
    """What `forget_gguf_quantization` relies on: a model whose config says it is quantized is refused by (or
    re-quantized on) a round trip; without `hf_quantizer` and `quantization_config` it saves as plain weights."""
    from transformers import AutoModelForCausalLM

    model = tiny_llama(seed=0)
    model.hf_quantizer = object()  # stands in for the GGUF quantizer a GGUF load leaves behind
    model.config.quantization_config = {"quant_method": "gguf"}
    compat.forget_gguf_quantization(model)
    assert model.hf_quantizer is None and not hasattr(model.config, "quantization_config")
    model.save_pretrained(tmp_path)
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert getattr(reloaded, "hf_quantizer", None) is None  # loaded as plain weights, nothing to re-quantize


def test_an_all_ones_mask_reaches_the_loop_as_its_length_only():
    """What `passed_mask_length` relies on: transformers (5.24; 5.17 hands the mask over) drops an all-ones
    attention mask before the decoding loop and records its length in `generation_config._mask_length`; a mask with
    padding is handed over. Either way the loop learns the passed mask's length."""
    model = tiny_llama(seed=0)
    seen = {}

    def loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        seen["mask"] = model_kwargs.get("attention_mask")
        seen["length"] = compat.passed_mask_length(generation_config, seen["mask"], input_ids.shape[1])
        return input_ids

    ids = torch.tensor([[1, 5, 6, 7]])
    GenerationMixin.generate(model, ids, attention_mask=torch.ones(1, 10, dtype=torch.long), custom_generate=loop,
                             max_new_tokens=2)
    assert seen["length"] == 10
    assert seen["mask"] is None or seen["mask"].shape == (1, 10)
    padded = torch.tensor([[0, 1, 1, 1]])
    GenerationMixin.generate(model, ids, attention_mask=padded, custom_generate=loop, max_new_tokens=2)
    assert torch.equal(seen["mask"], padded) and seen["length"] == 4


def test_stop_past_recording_turns_off_every_recording_layer():
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, use_sliding_window=True, sliding_window=6,
                         max_window_layers=1)
    cache = DynamicCache(config=config)
    cache.activate_past_recording()
    recording = [layer for layer in cache.layers if hasattr(layer, "record_past")]
    assert recording and all(layer.record_past for layer in recording)
    compat.stop_past_recording(cache)
    assert not any(layer.record_past for layer in recording)


def test_a_call_s_fields_merge_in_generates_order():
    # `CallFields.merged` mirrors `_prepare_generation_config`: the kept draft-length policies are per decoding mode,
    # known before generate() resolves the config, and prompt lookup and the ensemble weight are read the same way.
    from hf_semspec.call_fields import CallFields

    model = tiny_llama(seed=0)
    for model_default in (None, True, False):
        model.generation_config.do_sample = model_default
        for passed in (None, GenerationConfig(), GenerationConfig(do_sample=True), GenerationConfig(do_sample=False)):
            for kwargs in ({}, {"do_sample": True}, {"do_sample": False}, {"do_sample": None}):  # None: greedy
                resolved, _ = model._prepare_generation_config(passed, **kwargs)
                merged, _ = CallFields(model.generation_config, passed, kwargs).merged("do_sample")
                assert bool(merged) is bool(resolved.do_sample), (model_default, passed and passed.do_sample, kwargs)


@pytest.mark.parametrize("kind", ["model", "pruned drafter"])
def test_the_static_path_s_compile_switch_is_transformers_own(kind):
    """`compiles_forward` asks `_valid_auto_compile_criteria`: a static cache on a GPU, or anywhere with
    `compile_config._compile_all_devices`; never a dynamic cache, nor with `disable_compile`. A pruned drafter is no
    `GenerationMixin`: the rule is applied to its backbone, so it compiles where a whole model would."""
    from transformers import CompileConfig, StaticCache

    from hf_semspec.drafters import prune_vocabulary

    model = tiny_llama(seed=0)
    if kind == "pruned drafter":
        model = prune_vocabulary(model, tiny_tokenizer(), keep_ids=list(range(0, 64)))
    static = StaticCache(config=model.config, max_cache_len=16)
    config = GenerationConfig(compile_config=CompileConfig(backend="aot_eager"))
    assert not compat.compiles_forward(model, static, config)  # a CPU, without the switch
    config.compile_config._compile_all_devices = True
    assert compat.compiles_forward(model, static, config)
    assert not compat.compiles_forward(model, DynamicCache(config=model.config), config)
    config.disable_compile = True
    assert not compat.compiles_forward(model, static, config)


def test_rewinding_a_static_cache_moves_every_layer_s_write_position():
    """The next forward after a rewind overwrites the forgotten positions: its logits equal a fresh cache's."""
    from transformers import StaticCache

    model = tiny_llama(seed=0)
    ids = torch.arange(4, 14)[None]

    def cache_after(chunks):
        cache = StaticCache(config=model.config, max_cache_len=16)
        for chunk in chunks:
            model(chunk, use_cache=True, **{compat.CACHE_ARGUMENT: cache})
        return cache

    rewound = cache_after([ids[:, :6], ids[:, 6:10]])  # 10 cached, then forget the last 4
    compat.rewind_cache(rewound, 4)
    assert [int(layer.cumulative_length) for layer in rewound.layers] == [6, 6]
    fresh = cache_after([ids[:, :6]])
    new = torch.tensor([[50, 51]])
    positions = torch.arange(6, 8)[None]
    a = model(new, position_ids=positions, use_cache=True, **{compat.CACHE_ARGUMENT: rewound}).logits
    b = model(new, position_ids=positions, use_cache=True, **{compat.CACHE_ARGUMENT: fresh}).logits
    torch.testing.assert_close(a, b)


def test_generate_settles_the_pad_id_the_batched_outputs_use():
    """transformers fills `_pad_token_tensor` (EOS when no pad id is set) before the decoding loop runs."""
    model = tiny_llama(seed=0, pad_token_id=None)
    model.generation_config.pad_token_id = None
    handed = {}

    def recording_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        handed["config"] = generation_config
        return input_ids

    model.generate(torch.ones(1, 3, dtype=torch.long), custom_generate=recording_loop, max_new_tokens=2,
                   eos_token_id=7)
    assert compat.pad_token_id(handed["config"]) == 7
    assert compat.pad_token_id(GenerationConfig(pad_token_id=5)) == 5
