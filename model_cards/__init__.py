"""Model-card templates (`string.Template` Markdown), installed as the package data `hf_semspec.model_cards`."""
