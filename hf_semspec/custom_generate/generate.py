"""hf_semspec as a Hub `custom_generate` decoding method.

A model repository that carries this folder as `custom_generate/` runs hf_semspec's speculative decoding with

    model.generate(**inputs, custom_generate="<repo or local dir>", trust_remote_code=True,
                   assistant_model=draft, acceptance="exact")

transformers calls `generate(model=model, **generate_arguments)` below, or, when the repo was loaded with
`from_pretrained(..., trust_remote_code=True)`, installs `partial(generate, model=model)` as `model.generate`; so
`model` is keyword-only and a positional prompt stays positional. The package itself is listed in
`requirements.txt`, which transformers checks before running this file.
"""

import hf_semspec


def generate(*args, model, **kwargs):
    return hf_semspec.generate(model, *args, **kwargs)
