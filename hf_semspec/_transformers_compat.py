"""Every use of transformers' private API goes through this module (checked by tests/test_transformers_compat.py).

Tested with the transformers versions declared in setup.cfg. The private state touched: `GenerationConfig.
_from_model_config` (below), `GenerationConfig._mask_length` (the length of a passed attention mask that transformers
dropped for being all ones), the cache layers' `record_past` flag (turned off before the cache is returned, as
transformers does: it has no public switch), and, to save a model loaded from GGUF, `PreTrainedModel.hf_quantizer` and
`config.quantization_config`, and `GenerationConfig._get_default_generation_params()` (`transformers_default`). One
private behaviour is mirrored, in `hf_semspec.call_fields`: the order in which `_prepare_generation_config` merges a
call into a passed and the model's config (`CallFields.merged`, pinned here on `do_sample`). Everything else the
package uses is public:
`GenerationMixin.generate(custom_generate=<callable>)`, `GenerationConfig`, `LogitsProcessorList`,
`StoppingCriteriaList` with `EosTokenCriteria.eos_token_id`, `DynamicCache` (`crop` with a negative count,
`get_seq_length`, `activate_past_recording`), `GenerateDecoderOnlyOutput` and the models' `forward`, whose cache
argument and output field are named by `CACHE_ARGUMENT` (renamed in transformers 5.24). The one class attribute
replaced: `GenerationMixin.generate` (`class_generate` / `set_class_generate`), by the guard that `import hf_semspec`
installs and by `hf_semspec.enable()` (hf_semspec/enabling.py), each of which forwards to what it replaced.

The static-cache path adds: `GenerationMixin._valid_auto_compile_criteria` (transformers' own rule for when
`generate()` compiles the forward: `compile_config`, `disable_compile`, the device, quantizers and offloading), which
`compiles_forward` asks, and `CompileConfig._compile_all_devices`, its switch for compiling off a GPU, which
`compiling_off_gpus` sets for `hf_semspec.cpu_compile_config`; a static layer's `cumulative_length` (the next write position, a tensor), which
`rewind_cache` moves back on transformers before 5.24, whose `StaticLayer` has no `crop` yet (5.24 added it, doing
the same); and `GenerationConfig._pad_token_tensor` (the pad id `generate()` settled on, EOS where none was set),
which batched outputs are padded with.
"""

from __future__ import annotations

import torch
import transformers
from packaging.version import Version
from transformers import CompileConfig, DynamicCache, GenerationConfig, GenerationMixin
from transformers.cache_utils import Cache, StaticLayer

# transformers 5.24 renamed the cache from `past_key_values` to `cache` everywhere the loop meets it: the keyword of
# `generate()` and of the models' `forward`, the key of the `model_kwargs` that `generate()` hands the decoding loop,
# and the field of the outputs. The old name stays a deprecated alias there (removed in 5.40 / 6.0) that logs a
# warning, except as the `model_kwargs` key, which is gone. One name, the installed version's, is used throughout.
CACHE_ARGUMENT = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"

# `GenerationConfig.__init__` drops every custom key (such as `acceptance`) from a config dict carrying
# `"_from_model_config": true`, which `save_pretrained` writes for a config derived from the model config.
FROM_MODEL_CONFIG_FLAG = "_from_model_config"


def class_generate():
    """`GenerationMixin.generate` as the class holds it now (transformers' own, or what replaced it)."""
    return GenerationMixin.__dict__["generate"]


def set_class_generate(function) -> None:
    """Replaces `GenerationMixin.generate`, which every model class that does not define its own inherits."""
    GenerationMixin.generate = function


def generation_defaults() -> dict:
    """`GenerationConfig._get_default_generation_params()`: the values transformers' `generate()` gives fields that
    neither the call nor the model sets (`num_beams` 1, `assistant_confidence_threshold` 0.4, ...); {} where the
    installed transformers has no such method."""
    get_defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    return get_defaults() if callable(get_defaults) else {}


def transformers_default(generation_config: GenerationConfig | None, name: str):
    """The value transformers gives `name` where neither the call nor the model sets it, when `generation_config` is
    one that transformers already prepared (`GenerationMixin._prepare_generation_config` fills every field of
    `GenerationConfig._get_default_generation_params()`: `assistant_confidence_threshold` 0.4, `num_assistant_tokens`
    20, ...), as the text-generation pipeline of transformers before 5.24 passes it to `generate()`; None otherwise:
    for a config with any of those fields unset (one a user built)."""
    defaults = generation_defaults()
    if generation_config is None or not defaults:
        return None
    if any(getattr(generation_config, key, None) is None for key, value in defaults.items() if value is not None):
        return None
    return defaults.get(name)


def is_derived_from_model_config(generation_config: GenerationConfig) -> bool:
    return bool(getattr(generation_config, FROM_MODEL_CONFIG_FLAG, False))


def mark_as_user_config(generation_config: GenerationConfig) -> None:
    """Clears the flag so that a saved generation_config.json keeps its custom keys on reload."""
    setattr(generation_config, FROM_MODEL_CONFIG_FLAG, False)


def forget_gguf_quantization(model) -> None:
    """Makes a model loaded from a GGUF file (dequantized on load) savable as plain weights.

    transformers keeps the GGUF quantizer on the model (`hf_quantizer`) and its settings in
    `config.quantization_config`: `save_pretrained` then refuses (GGUF is not serializable), and a saved config would
    ask `from_pretrained` to quantize again on reload. The weights are ordinary tensors by now, so both go.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")


def stop_past_recording(cache: DynamicCache) -> None:
    """Turns off the past recording that `activate_past_recording` turned on for the rollbacks, before the cache goes
    back to the user: a sliding-window or linear-attention layer that records keeps every past state instead of its
    window, so later calls continuing from the cache would grow it without bound. transformers' own loops do the same
    (`layer.record_past = False`; there is no public method)."""
    for layer in cache.layers:
        if hasattr(layer, "record_past"):
            layer.record_past = False


def passed_mask_length(generation_config: GenerationConfig, attention_mask, input_length: int) -> int:
    """The length of the attention mask given to `generate()`. transformers hands the decoding loop no mask when it is
    all ones (`attention_mask` is None) and keeps its length in `generation_config._mask_length`, so that a restart
    from a cache with only the new ids (and the full mask) can be told from one with the whole sequence."""
    if attention_mask is not None:
        return attention_mask.shape[1]
    return getattr(generation_config, "_mask_length", input_length)


def compiles_forward(model, cache: Cache, generation_config: GenerationConfig) -> bool:
    """Whether transformers' `generate()` would compile `model`'s forward for decoding with `cache` under
    `generation_config` (`GenerationMixin._valid_auto_compile_criteria`): a compileable cache that is not a
    `DynamicCache` (a static one), on a GPU-like device or with `compile_config._compile_all_devices`, and neither
    `disable_compile`, a quantizer that cannot compile, nor CPU or disk offloading. A model that is not a
    `GenerationMixin` (a pruned drafter) is judged by its backbone (`model.model`, a `PreTrainedModel`, which has the
    device, quantizer and device map the rule reads but not the method: transformers' rule is applied to it)."""
    if hasattr(model, "_valid_auto_compile_criteria"):
        return bool(model._valid_auto_compile_criteria({CACHE_ARGUMENT: cache}, generation_config))
    backbone = getattr(model, "model", None)
    if not hasattr(backbone, "device"):
        return False
    return bool(GenerationMixin._valid_auto_compile_criteria(backbone, {CACHE_ARGUMENT: cache}, generation_config))


def compiling_off_gpus(config: CompileConfig) -> CompileConfig:
    """`config`, marked to compile on any device: transformers' `generate()` compiles the forward on GPU-like devices
    only, unless `CompileConfig._compile_all_devices` (private, the switch its own tests use) is set; kept through
    `to_dict()` by no one, so it is set on the object."""
    config._compile_all_devices = True
    return config


def rewind_cache(cache: Cache, num_tokens: int) -> None:
    """Forgets the last `num_tokens` positions of `cache` (`num_tokens >= 0`). A dynamic cache is cropped (`crop(0)`
    too: with past recording on, it cuts sliding-window layers back to their window); a static layer only moves its
    write position back, in place (its tensors keep their addresses for CUDA graphs), so the next forward overwrites
    the forgotten positions."""
    if any(isinstance(layer, StaticLayer) for layer in cache.layers):
        positions = [layer.cumulative_length for layer in cache.layers if getattr(layer, "is_initialized", False)]
        if num_tokens and positions:
            torch._foreach_sub_(positions, num_tokens)  # one launch for every layer's position (torch.optim's kind)
        return
    cache.crop(-num_tokens)


def pad_token_id(generation_config: GenerationConfig, fallback: int = 0) -> int:
    """The id `generate()` pads finished rows with: the one it settled on (`_pad_token_tensor`: `pad_token_id`, else
    the first EOS id, as transformers does for open-ended generation), else `fallback`."""
    pad = getattr(generation_config, "_pad_token_tensor", None)
    if pad is None:
        pad = generation_config.pad_token_id
    if pad is None:
        return fallback
    return int(pad.flatten()[0]) if isinstance(pad, torch.Tensor) else int(pad)
