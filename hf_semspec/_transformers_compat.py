"""Every use of transformers' private API goes through this module (checked by tests/test_transformers_compat.py).

Tested with the transformers versions declared in setup.cfg. The private state touched: `GenerationConfig.
_from_model_config` (below), and, to save a model loaded from GGUF, `PreTrainedModel.hf_quantizer` and
`config.quantization_config`. Everything else the package uses is public:
`GenerationMixin.generate(custom_generate=<callable>)`, `GenerationConfig`, `LogitsProcessorList`,
`StoppingCriteriaList` with `EosTokenCriteria.eos_token_id`, `DynamicCache` (`crop` with a negative count,
`get_seq_length`, `activate_past_recording`), `GenerateDecoderOnlyOutput` and the models' `forward`.
"""

from __future__ import annotations

from transformers import GenerationConfig

# `GenerationConfig.__init__` drops every custom key (such as `acceptance`) from a config dict carrying
# `"_from_model_config": true`, which `save_pretrained` writes for a config derived from the model config.
FROM_MODEL_CONFIG_FLAG = "_from_model_config"


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

