"""`PrunedVocabDrafter`: a causal LM whose output head keeps K of the vocabulary's N tokens, and `prune_vocabulary`.

Only the output side is pruned. The drafter runs the base model's backbone unchanged (full input embedding, so every
target token can still be read) and multiplies the final hidden state by a `(K, hidden)` head, the base head's rows
of the kept ids: a draft step costs K·hidden multiply-adds in the head instead of N·hidden. It satisfies the
pruned-drafter protocol of `hf_semspec.drafting.ModelDrafter`: `.config` (the base config, full `vocab_size`),
`.device`, `kept_token_ids` `(K,)`, optional `rdk_indices` / `rdk_weights` `(K, m + 1)`, and
`forward(input_ids, use_cache, attention_mask, position_ids, logits_to_keep)` and the cache (keyword `cache`, or
`past_key_values` before transformers 5.24) returning `.logits` of shape `(batch, seq, K)`.

Saved folder (`save_pretrained`, `push_to_hub`):

| file | content |
| --- | --- |
| `config.json`, `generation_config.json` | the base model's, unchanged (full `vocab_size`) |
| `model.safetensors` | the backbone, keys as in the base causal LM (`model.layers.0...`), no LM head |
| `pruned_head.safetensors` | `kept_token_ids` (int64, K); `lm_head.weight` (K × hidden) only when the head is not tied to the input embedding (and `lm_head.bias` if any); `rdk_indices` / `rdk_weights` with a kernel |
| `pruning_config.json` | how the keep set and kernel were chosen (for the model card) |
| tokenizer files | when a tokenizer is known |

Tied embeddings (e.g. Qwen2.5-0.5B, `tie_word_embeddings=True`): the head rows are the input embedding's rows of the
kept ids, so only the ids are stored and the rows are rebuilt from the embedding at load. The drafter is a plain
`torch.nn.Module` holding the backbone and its own sliced head, not a `PreTrainedModel`, so transformers' tie logic
(`tie_weights`, run by `from_pretrained` and by resizing) never sees the sliced head and cannot replace it with the
full embedding.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import TRANSFORMERS_DYNAMIC_MODULE_NAME

from .._transformers_compat import CACHE_ARGUMENT
from ..errors import invalid_value
from . import keep_set as ks
from .kernel import DEFAULT_CHUNK_ELEMENTS, DEFAULT_NEIGHBOURS, DEFAULT_TEMPERATURE, build_rdk_kernel, check_rdk_kernel

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
PRUNING_CONFIG_NAME = "pruning_config.json"
HEAD_WEIGHTS_NAME = "pruned_head.safetensors"
BACKBONE_WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
REQUIRED_FILES = (PRUNING_CONFIG_NAME, CONFIG_NAME, BACKBONE_WEIGHTS_NAME, HEAD_WEIGHTS_NAME)
DEFAULT_CALIBRATION_MAX_NEW_TOKENS = 64
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class PrunedVocabDrafter(torch.nn.Module):
    """A draft model with a pruned output vocabulary (see the module docstring). Build one with `prune_vocabulary`
    or load one with `from_pretrained`.

    Args:
        backbone (`PreTrainedModel`): the base model without its LM head (`causal_lm.base_model`, e.g. `Qwen2Model`);
            it returns the final hidden states (after the final norm).
        config (`PretrainedConfig`): the base causal LM's config (full `vocab_size`).
        kept_token_ids (`torch.LongTensor` of shape `(K,)`): sorted target ids of the K output logits.
        head_weight (`torch.Tensor` of shape `(K, hidden)`): the head rows of the kept ids.
        head_bias (`torch.Tensor` of shape `(K,)`, *optional*): the head bias of the kept ids.
        tied (`bool`): the base head is the input embedding (only the ids are saved).
        rdk_indices / rdk_weights (`torch.Tensor` of shape `(K, m + 1)`, *optional*): the RDK kernel.
        pruning_info (`dict`): what `pruning_config.json` records.
        generation_config (`GenerationConfig`, *optional*): the base model's.
        tokenizer (*optional*): saved with the drafter.
        base_model_prefix (`str`): key prefix of the backbone in the base causal LM's state dict (`"model"`).
    """

    def __init__(
        self,
        backbone: torch.nn.Module,
        config: Any,
        kept_token_ids: torch.LongTensor,
        head_weight: torch.Tensor,
        head_bias: torch.Tensor | None = None,
        *,
        tied: bool,
        rdk_indices: torch.LongTensor | None = None,
        rdk_weights: torch.FloatTensor | None = None,
        pruning_info: dict | None = None,
        generation_config: Any = None,
        tokenizer: Any = None,
        base_model_prefix: str = "model",
    ):
        super().__init__()
        self.model = backbone
        self.config = config
        self.generation_config = generation_config
        self.tokenizer = tokenizer
        self.tied = tied
        self.base_model_prefix = base_model_prefix
        self.pruning_info = dict(pruning_info or {})
        kept = kept_token_ids.to(torch.long).cpu()
        self.register_buffer("kept_token_ids", kept.to(head_weight.device))
        # Built on the meta device and given the (already sliced, unshared) rows: no full-size random init.
        self.lm_head = torch.nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=head_bias is not None, device="meta")
        self.lm_head.weight = torch.nn.Parameter(head_weight.detach())
        if head_bias is not None:
            self.lm_head.bias = torch.nn.Parameter(head_bias.detach().to(device=head_weight.device, dtype=head_weight.dtype))
        self.rdk_indices: torch.LongTensor | None = None
        self.rdk_weights: torch.FloatTensor | None = None
        if (rdk_indices is None) != (rdk_weights is None):
            raise invalid_value("rdk_indices/rdk_weights", "one of the two", "both or neither", "pass both tensors")
        if rdk_indices is not None:
            self._install_rdk_kernel(rdk_indices, rdk_weights, "rdk_indices/rdk_weights")

    # -- the pruned-drafter protocol ---------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def num_kept(self) -> int:
        """K, the number of output logits."""
        return self.kept_token_ids.numel()

    @property
    def vocab_size(self) -> int:
        """N, the base (target) vocabulary size; inputs may be any of these ids."""
        return _text_config(self.config).vocab_size

    def set_rdk_kernel(self, indices: torch.Tensor, weights: torch.Tensor) -> None:
        """Installs a kernel of your own after checking it (`check_rdk_kernel`), and records it in `pruning_info["rdk"]`
        so that `pruning_config.json` and the model card say the drafter carries one (what `prune_vocabulary(...,
        rdk=True)` knows of its own kernel, the similarity and τ, is not known here). Weights stay float32 whatever the
        model dtype."""
        self._install_rdk_kernel(indices, weights, "set_rdk_kernel")
        on_own_id = self.rdk_indices == self.kept_token_ids.to(self.rdk_indices.device)[:, None]
        self.pruning_info["rdk"] = {
            "form": "set with set_rdk_kernel",
            "entries_per_row": int(self.rdk_indices.shape[1]),
            "mean_self_weight": float((self.rdk_weights * on_own_id).sum(-1).mean()),
        }

    def _install_rdk_kernel(self, indices: torch.Tensor, weights: torch.Tensor, source: str) -> None:
        check_rdk_kernel(indices, weights, self.kept_token_ids, self.vocab_size, source)
        self.rdk_indices = indices.to(device=self.device, dtype=torch.long)
        self.rdk_weights = weights.to(device=self.device, dtype=torch.float32)

    def _apply(self, fn, recurse=True):
        # `.to(dtype)` would round the kernel's probabilities; move the kernel by device only.
        super()._apply(fn, recurse)
        if self.rdk_indices is not None:
            device = fn(torch.empty(0, device=self.rdk_weights.device)).device
            self.rdk_indices = self.rdk_indices.to(device)
            self.rdk_weights = self.rdk_weights.to(device)
        return self

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Linear:
        """The sliced `(K, hidden)` head."""
        return self.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        *,  # keywords only: a cache passed second, as the old signature took it, fails rather than land in use_cache
        use_cache: bool | None = True,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """As the base causal LM's forward, but `.logits` has shape `(batch, seq, K)`: logits of the kept ids, in
        the order of `kept_token_ids`. `logits_to_keep` as in transformers (`0`: every position). The cache goes to the
        backbone in `kwargs` under the name it came with, so that each transformers version reads its own (`cache`
        from 5.24, which still takes `past_key_values` with a deprecation warning; `past_key_values` before)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden = outputs[0]
        positions = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, positions, :])
        text_config = _text_config(self.config)
        softcap = getattr(text_config, "final_logit_softcapping", None)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        scale = getattr(text_config, "logit_scale", None)
        if isinstance(scale, (int, float)) and not isinstance(scale, bool):
            logits = logits * scale
        return CausalLMOutputWithPast(logits=logits, **{CACHE_ARGUMENT: getattr(outputs, CACHE_ARGUMENT, None)})

    # -- saving and loading -----------------------------------------------------------------------------------

    def _head_is_embedding(self) -> bool:
        """Whether the head is still the input embedding's kept rows (a tied base, head and embedding untouched
        since pruning): then `save_pretrained` stores only the ids. A head or an embedding trained since is stored."""
        if not self.tied:
            return False
        embedding = self.model.get_input_embeddings().weight.detach()
        return torch.equal(self.lm_head.weight.detach(), embedding[self.kept_token_ids.to(embedding.device)])

    def _head_tensors(self, head_is_embedding: bool) -> dict[str, torch.Tensor]:
        tensors = {"kept_token_ids": self.kept_token_ids.detach().cpu().contiguous()}
        if not head_is_embedding:
            tensors["lm_head.weight"] = self.lm_head.weight.detach().cpu().contiguous()
        if self.lm_head.bias is not None:
            tensors["lm_head.bias"] = self.lm_head.bias.detach().cpu().contiguous()
        if self.rdk_indices is not None:
            tensors["rdk_indices"] = self.rdk_indices.detach().cpu().contiguous()
            tensors["rdk_weights"] = self.rdk_weights.detach().cpu().float().contiguous()
        return tensors

    def save_pretrained(self, save_directory: str | os.PathLike, tokenizer: Any = None) -> list[str]:
        """Writes the folder described in the module docstring; returns the file names written.

        `tokenizer` defaults to the drafter's own (`self.tokenizer`, set by `prune_vocabulary`/`from_pretrained`).
        """
        return self._save(save_directory, tokenizer, self._head_is_embedding())

    def _save(self, save_directory: str | os.PathLike, tokenizer: Any, head_is_embedding: bool,
              for_hub: bool = False) -> list[str]:
        """`save_pretrained` with `_head_is_embedding()` already known (`push_to_hub` needs it for the card too, and
        it compares the whole kept embedding). `for_hub`: the files are uploaded, so the base model's local path
        (which names the user's folders) is left out, as transformers leaves `_name_or_path` out of config.json."""
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        remote = [type(obj).__module__ for obj in (self.config, self.model, tokenizer)
                  if type(obj).__module__.startswith(TRANSFORMERS_DYNAMIC_MODULE_NAME)]
        if remote:
            # from_pretrained would need the base model's own code, which is not saved with the drafter.
            raise invalid_value(
                "the base model's classes",
                remote,
                "classes transformers ships (a drafter of a model or tokenizer loaded with trust_remote_code cannot be "
                "loaded again)",
                "use this drafter in memory, or prune a model whose architecture transformers ships (many custom-code "
                "models also have a native port: load it without trust_remote_code)",
            )
        folder = pathlib.Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(self.config)
        # A native model keeps the auto_map of a repo that also ships code (Phi-3's): saved, it would ask
        # from_pretrained for that code, which the drafter's folder does not hold.
        if getattr(config, "auto_map", None):
            del config.auto_map
        config.dtype = self.dtype  # what the weights are saved in, so that from_pretrained(dtype="auto") loads it
        config.save_pretrained(folder)
        if self.generation_config is not None:
            self.generation_config.save_pretrained(folder)
        prefix = f"{self.base_model_prefix}." if self.base_model_prefix else ""
        backbone = _without_shared_storage({prefix + k: v for k, v in self.model.state_dict().items()})
        save_file(backbone, folder / BACKBONE_WEIGHTS_NAME, metadata={"format": "pt"})
        save_file(self._head_tensors(head_is_embedding), folder / HEAD_WEIGHTS_NAME, metadata={"format": "pt"})
        info = dict(self.pruning_info)
        info.update(
            format_version=FORMAT_VERSION,
            vocab_size=self.vocab_size,
            keep_size=self.num_kept,
            keep_fraction=self.num_kept / self.vocab_size,
            tied_head=head_is_embedding,
            head_bias=self.lm_head.bias is not None,
            base_model_prefix=self.base_model_prefix,
        )
        base_path = info.get("base_model_path") or ""
        if for_hub and (os.path.isdir(base_path) or not _REPO_ID.match(base_path)):
            info["base_model_path"] = ""
        with open(folder / PRUNING_CONFIG_NAME, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2, sort_keys=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return sorted(p.name for p in folder.iterdir())

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        load_tokenizer: bool = True,
    ) -> "PrunedVocabDrafter":
        """Loads a drafter saved by `save_pretrained`, from a local folder or a Hub repo id (downloaded with
        `huggingface_hub.snapshot_download(repo_id, revision=, token=, cache_dir=, local_files_only=)`).

        Args:
            dtype (`torch.dtype` or `str`, *optional*): dtype of the weights; default: as saved.
            device (*optional*): where to put the drafter; default: CPU.
            load_tokenizer (`bool`): also load the tokenizer saved with it (as `drafter.tokenizer`), if any.

        Raises:
            `SemSpecConfigError`: the folder or repo is not a pruned drafter (names the missing file or key), or its
                RDK kernel is not row-stochastic.
        """
        from transformers import AutoConfig, AutoModel, GenerationConfig

        folder = _resolve_folder(pretrained_model_name_or_path, revision, token, cache_dir, local_files_only)
        missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
        if missing:
            raise invalid_value(
                "pretrained_model_name_or_path",
                str(pretrained_model_name_or_path),
                f"a pruned-drafter folder with {list(REQUIRED_FILES)} (missing: {missing})",
                "point to a folder written by PrunedVocabDrafter.save_pretrained / push_to_hub, or build one from a "
                "plain model with hf_semspec.drafters.prune_vocabulary(model, tokenizer, ...)",
            )
        try:
            info = json.loads((folder / PRUNING_CONFIG_NAME).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise invalid_value(
                PRUNING_CONFIG_NAME, f"unreadable ({err})", "a JSON object written by save_pretrained",
                "save the drafter again with PrunedVocabDrafter.save_pretrained",
            ) from err
        if not isinstance(info, dict):
            raise invalid_value(
                PRUNING_CONFIG_NAME, f"a JSON {type(info).__name__}", "a JSON object written by save_pretrained",
                "save the drafter again with PrunedVocabDrafter.save_pretrained",
            )
        version = info.get("format_version")
        if version != FORMAT_VERSION:
            raise invalid_value(
                f"{PRUNING_CONFIG_NAME} ['format_version']",
                version,
                f"{FORMAT_VERSION} (this hf_semspec)",
                "save the drafter again with this version of hf_semspec, or upgrade hf_semspec",
            )
        config = AutoConfig.from_pretrained(folder)
        backbone = AutoModel.from_pretrained(folder, config=config, dtype=dtype if dtype is not None else "auto")
        backbone.eval()
        with safe_open(folder / HEAD_WEIGHTS_NAME, framework="pt") as f:
            head = {key: f.get_tensor(key) for key in f.keys()}
        tied = bool(info.get("tied_head", False))
        required = ["kept_token_ids"] + ([] if tied else ["lm_head.weight"])
        missing_keys = [key for key in required if key not in head]
        if ("rdk_indices" in head) != ("rdk_weights" in head):
            missing_keys.append("rdk_weights" if "rdk_indices" in head else "rdk_indices")
        if missing_keys:
            raise invalid_value(
                f"{HEAD_WEIGHTS_NAME} in {pretrained_model_name_or_path}",
                sorted(head),
                f"a file with the keys {required} (missing: {missing_keys})",
                "save the drafter again with PrunedVocabDrafter.save_pretrained",
            )
        kept = head["kept_token_ids"]
        vocab_size = _text_config(config).vocab_size
        if (
            kept.dim() != 1
            or kept.dtype.is_floating_point
            or kept.numel() == 0
            or not bool((kept[1:] > kept[:-1]).all())
            or int(kept[0]) < 0
            or int(kept[-1]) >= vocab_size
            or kept.numel() != info.get("keep_size", kept.numel())
        ):
            raise invalid_value(
                f"{HEAD_WEIGHTS_NAME}['kept_token_ids']",
                f"shape {tuple(kept.shape)}, dtype {kept.dtype}",
                f"strictly increasing integer ids in [0, {vocab_size}), {info.get('keep_size')} of them",
                "save the drafter again with PrunedVocabDrafter.save_pretrained",
            )
        embedding = backbone.get_input_embeddings().weight
        if tied:
            head_weight = embedding.detach()[kept.to(embedding.device)].clone()
        else:
            head_weight = head["lm_head.weight"].to(device=embedding.device, dtype=embedding.dtype)
        if head_weight.shape != (kept.numel(), embedding.shape[1]):
            raise invalid_value(
                f"{HEAD_WEIGHTS_NAME}['lm_head.weight']",
                tuple(head_weight.shape),
                f"shape ({kept.numel()}, {embedding.shape[1]})",
                "save the drafter again with PrunedVocabDrafter.save_pretrained",
            )
        bias = head.get("lm_head.bias")
        if bias is not None and tuple(bias.shape) != (kept.numel(),):
            raise invalid_value(
                f"{HEAD_WEIGHTS_NAME}['lm_head.bias']",
                tuple(bias.shape),
                f"shape ({kept.numel()},), one per kept id",
                "save the drafter again with PrunedVocabDrafter.save_pretrained",
            )
        if "rdk_indices" in head:
            check_rdk_kernel(head["rdk_indices"], head["rdk_weights"], kept, vocab_size, HEAD_WEIGHTS_NAME)
        generation_config = None
        if (folder / "generation_config.json").is_file():
            generation_config = GenerationConfig.from_pretrained(folder)
        tokenizer = None
        if load_tokenizer and any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(folder)
        drafter = cls(
            backbone,
            config,
            kept,
            head_weight,
            None if bias is None else bias.to(device=embedding.device, dtype=embedding.dtype),
            tied=tied,
            rdk_indices=head.get("rdk_indices"),
            rdk_weights=head.get("rdk_weights"),
            pruning_info=info,
            generation_config=generation_config,
            tokenizer=tokenizer,
            base_model_prefix=info.get("base_model_prefix", "model"),
        )
        drafter.name_or_path = str(pretrained_model_name_or_path)
        if device is not None:
            drafter.to(device)
        return drafter.eval()

    # -- the Hub ---------------------------------------------------------------------------------------------

    def model_card(self, license: str | None = None, repo_id: str | None = None):
        """The README of this drafter as a validated `huggingface_hub.ModelCard` (see `cards.pruned_drafter_card`);
        its file list names tokenizer files when the drafter has a tokenizer (`self.tokenizer`)."""
        return self._model_card(self._head_is_embedding(), license, repo_id, self.tokenizer is not None)

    def _model_card(self, head_is_embedding: bool, license: str | None, repo_id: str | None, with_tokenizer: bool):
        from .cards import pruned_drafter_card

        info = dict(self.pruning_info, keep_size=self.num_kept, vocab_size=self.vocab_size, tied_head=head_is_embedding)
        return pruned_drafter_card(info, license=license, repo_id=repo_id, with_tokenizer=with_tokenizer)

    def push_to_hub(
        self,
        repo_id: str,
        token: str | bool | None = None,
        private: bool | None = None,
        *,
        commit_message: str | None = None,
        license: str | None = None,
        tokenizer: Any = None,
        revision: str | None = None,
        create_pr: bool = False,
        api: Any = None,
    ) -> Any:
        """Uploads the drafter to a Hub model repo: weights, config, tokenizer, `pruning_config.json`, the
        `custom_generate/` folder of hf_semspec (so the repo works as `generate(custom_generate=repo_id, ...)`), and
        a README model card (validated; `license` defaults to the base model's when it was recorded, else "other").

        Args:
            private (`bool`, *optional*): visibility of a repo this creates; default (`None`) the account's or
                organization's default, as `HfApi.create_repo` (an existing repo keeps its visibility).
            revision (`str`, *optional*): the branch to push to; created from the default branch when it does not
                exist, as transformers' `push_to_hub` does (a `refs/pr/...` revision must exist).
            api (`huggingface_hub.HfApi`, *optional*): the client to use; default `HfApi(token=token)`. Tests pass a
                recording stand-in.

        Returns:
            What `api.upload_folder` returns (a `CommitInfo`).
        """
        from huggingface_hub import HfApi

        if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id):
            raise invalid_value(
                "repo_id", repo_id, "a Hub repo id 'owner/name'", 'pass e.g. "your-name/qwen-0.5b-pruned32k"'
            )
        head_is_embedding = self._head_is_embedding()
        with_tokenizer = tokenizer is not None or self.tokenizer is not None
        card = self._model_card(head_is_embedding, license, repo_id, with_tokenizer)
        api = api if api is not None else HfApi(token=token)
        with tempfile.TemporaryDirectory(prefix="hf_semspec_push_") as tmp:
            folder = pathlib.Path(tmp)
            self._save(folder, tokenizer, head_is_embedding, for_hub=True)
            copy_custom_generate(folder / "custom_generate")
            card.save(folder / "README.md")
            api.create_repo(repo_id=repo_id, token=token, private=private, repo_type="model", exist_ok=True)
            if revision is not None and not revision.startswith("refs/pr"):
                # upload_folder does not create a missing branch (the Hub answers 404).
                api.create_branch(repo_id=repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=str(folder),
                commit_message=commit_message or f"Upload pruned drafter ({self.num_kept}/{self.vocab_size} tokens)",
                token=token,
                repo_type="model",
                revision=revision,
                create_pr=create_pr,
            )


def copy_custom_generate(destination: pathlib.Path) -> list[str]:
    """Copies hf_semspec's `custom_generate/` folder (`generate.py`, `requirements.txt`) to `destination`."""
    source = pathlib.Path(__file__).resolve().parent.parent / "custom_generate"
    destination.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted(source.iterdir()):
        if path.is_file() and path.suffix in (".py", ".txt"):
            shutil.copy2(path, destination / path.name)
            copied.append(path.name)
    return copied


def _resolve_folder(
    name: str | os.PathLike, revision: str | None, token: Any, cache_dir: Any, local_files_only: bool
) -> pathlib.Path:
    path = pathlib.Path(name)
    if path.is_dir():
        return path
    text = str(name)
    if not _REPO_ID.match(text) or path.exists():
        raise invalid_value(
            "pretrained_model_name_or_path",
            text,
            "an existing folder or a Hub repo id 'owner/name'",
            "check the path (the folder does not exist), or pass a repo id",
        )
    from huggingface_hub import snapshot_download

    try:
        return pathlib.Path(
            snapshot_download(
                text, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
            )
        )
    except Exception as err:  # noqa: BLE001 - network, auth, missing repo: one clear message
        raise invalid_value(
            "pretrained_model_name_or_path",
            text,
            "a Hub repo id that can be downloaded (or is in the local Hub cache)",
            f"check the id, the token and the network, or pass a local folder ({type(err).__name__}: {err})",
        ) from err


# ---------------------------------------------------------------------------------------------------------------------
# Building a drafter
# ---------------------------------------------------------------------------------------------------------------------


def _base_model_id(model: torch.nn.Module, base_model: str | None) -> str | None:
    """A Hub id for the model card's `base_model`: given, else `name_or_path` when it is a repo id, else the
    `upstream` of a `benchmarks/pypi_models.py` conversion folder."""
    if base_model is not None:
        return base_model
    name = str(getattr(model, "name_or_path", "") or "")
    if not name:
        return None
    path = pathlib.Path(name)
    if path.is_dir():
        manifest = path / "hf_semspec_manifest.json"
        if manifest.is_file():
            try:
                return json.loads(manifest.read_text(encoding="utf-8")).get("upstream")
            except (OSError, json.JSONDecodeError):
                return None
        return None
    return name if _REPO_ID.match(name) else None


def _without_shared_storage(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone's tensors on the CPU, each in memory of its own: safetensors refuses tensors that share memory,
    as the weights do of a block a model reuses across layers (Zamba2's shared transformer). A tensor whose memory
    an earlier one already holds is stored as a copy, so every key loads with its value whether or not the model
    ties them again on load (leaving it out, as transformers does, relies on the model declaring the tie)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[torch.device, int]] = set()
    for name, tensor in state.items():
        tensor = tensor.detach()
        memory = (tensor.device, tensor.untyped_storage().data_ptr())
        out[name] = tensor.cpu().clone().contiguous() if memory in seen else tensor.cpu().contiguous()
        seen.add(memory)
    return out


def _base_license(model: torch.nn.Module) -> dict[str, str] | None:
    """The license of the base model's own card (README.md next to its weights, or in the local Hub cache for a
    repo id; nothing is downloaded), when there is one: `{"license": ...}`, with the card's `license_name` and
    `license_link` when it has them (a license "other" names its terms there)."""
    name = str(getattr(model, "name_or_path", "") or "")
    if not name:
        return None
    readme = pathlib.Path(name) / "README.md"
    if not readme.is_file() and _REPO_ID.match(name):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "README.md")
        readme = pathlib.Path(cached) if isinstance(cached, str) else readme
    if not readme.is_file():
        return None
    try:
        from huggingface_hub import ModelCard

        data = ModelCard.load(readme).data.to_dict()
    except Exception:  # noqa: BLE001 - an unreadable card just means "unknown"
        return None
    if not data.get("license"):
        return None
    return {key: str(data[key]) for key in ("license", "license_name", "license_link") if data.get(key)}


def _check_int(name: str, value: Any, low: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise invalid_value(name, value, f"an int ≥ {low}", f"pass e.g. {name}={example}")
    return value


def _check_same_tokenizer(tokenizer: Any, target_tokenizer: Any) -> None:
    from .same_tokenizer import assert_same_tokenizer

    try:
        assert_same_tokenizer(target_tokenizer, tokenizer, check_chat_template=False)
    except ValueError as err:
        raise invalid_value(
            "target_tokenizer",
            getattr(target_tokenizer, "name_or_path", type(target_tokenizer).__name__),
            "a tokenizer mapping text to the same ids as the drafter's (vocabulary, merges, special tokens)",
            f"prune a draft model that shares the target's tokenizer ({err})",
        ) from None


@torch.no_grad()
def _check_against_base(model: torch.nn.Module, drafter: PrunedVocabDrafter) -> None:
    """The drafter's logits must be the base model's logits of the kept ids (catches architectures that transform
    logits in ways `PrunedVocabDrafter.forward` does not reproduce). Both run in eval mode, since dropout (a model
    built from a config, or left training) would make the two forwards differ; each module's mode is restored."""
    ids = drafter.kept_token_ids[: min(6, drafter.num_kept)].reshape(1, -1).to(drafter.device)
    modes = {module: module.training for module in [*model.modules(), *drafter.modules()]}
    model.eval()
    drafter.eval()
    try:
        full = model(input_ids=ids, use_cache=False).logits.float()[..., drafter.kept_token_ids]
        pruned = drafter(input_ids=ids, use_cache=False).logits.float()
    finally:
        for module, training in modes.items():
            module.training = training
    tolerance = (1e-3 if drafter.dtype == torch.float32 else 3e-2) * max(1.0, float(full.abs().max()))
    if pruned.shape != full.shape or float((pruned - full).abs().max()) > tolerance:
        raise invalid_value(
            "model",
            type(model).__name__,
            "a causal LM whose logits are its LM head applied to its backbone's last hidden state",
            "this architecture post-processes its logits in a way PrunedVocabDrafter does not reproduce; "
            "please report it",
        )


def _keep_ids_tensor(keep_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """`keep_ids` flattened to a 1-D long tensor (a tokenizer's `(1, n)` ids do); integers only: a float or bool id
    would silently become another token."""
    fix = "pass integer token ids: a list (e.g. keep_ids=[5, 9]) or an integer tensor"
    if not isinstance(keep_ids, torch.Tensor):
        if isinstance(keep_ids, (str, bytes)) or not hasattr(keep_ids, "__iter__"):
            raise invalid_value("keep_ids", keep_ids, "integer token ids", fix)
        items = list(keep_ids)
        if any(isinstance(i, bool) for i in items):
            raise invalid_value("keep_ids", items[:8], "integer token ids (True / False are not)", fix)
        try:
            keep_ids = torch.as_tensor(items) if items else torch.zeros(0, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError) as error:  # ragged lists, strings, None...
            raise invalid_value("keep_ids", items[:8], f"integer token ids ({error})", fix) from error
    if keep_ids.dtype == torch.bool or keep_ids.is_floating_point() or keep_ids.is_complex():
        raise invalid_value("keep_ids", f"a {keep_ids.dtype} tensor of shape {tuple(keep_ids.shape)}",
                            "integer token ids", fix)
    return keep_ids.flatten().to(torch.long)


def prune_vocabulary(
    model: torch.nn.Module,
    tokenizer: Any,
    corpus: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    keep: int | float | None = None,
    keep_ids: Sequence[int] | torch.Tensor | None = None,
    corpus_label: str | None = None,
    calibration_prompts: Sequence[str] | None = None,
    calibration_model: torch.nn.Module | None = None,
    calibration_max_new_tokens: int = DEFAULT_CALIBRATION_MAX_NEW_TOKENS,
    calibration_chat_template: bool = True,
    target_model: torch.nn.Module | None = None,
    target_tokenizer: Any = None,
    rdk: bool = False,
    rdk_neighbours: int = DEFAULT_NEIGHBOURS,
    rdk_temperature: float = DEFAULT_TEMPERATURE,
    rdk_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    base_model: str | None = None,
    license: str | None = None,
) -> PrunedVocabDrafter:
    """Builds a `PrunedVocabDrafter` from a causal LM by keeping K of its output tokens.

    The keep set is every special token (`keep_set.special_token_ids`: the tokenizer's special and special-flagged
    added tokens, BOS/EOS/PAD of the model's (generation) config, and the chat template's control tokens such as
    Qwen's `<|im_start|>`/`<|im_end|>`), then the most frequent other tokens, counted over `corpus` and over the
    greedy generations of `calibration_model` on `calibration_prompts`, ties (and tokens never seen) by lower id
    first. Or pass `keep_ids` to choose the ids yourself (special tokens are added).

    The drafter reuses `model`'s backbone modules (no copy); `model`'s full LM head is not referenced by it.

    Args:
        model (`PreTrainedModel`): the draft causal LM to prune.
        tokenizer: its tokenizer (used for counting, special tokens, and saved with the drafter).
        corpus: a JSONL/.txt path (`keep_set.RECORD_LAYOUTS`: Spec-Bench `turns`, `text`, `prompt`, GSM8K
            `question`/`answer`, chat `messages`), or a list of texts (`str`) and/or paths (`pathlib.Path`); a text
            in the list that is the path of an existing .jsonl/.json/.txt file is an error (pass it as a `Path`).
        keep (`int` or `float`): K as a number of tokens (special tokens included), or as a fraction in (0, 1] of
            the vocabulary.
        keep_ids (`list[int]` or integer `torch.Tensor`, flattened): explicit ids to keep instead of `keep` (with
            the special tokens; neither a corpus nor calibration prompts, which only a `keep` counts).
        corpus_label (`str`, *optional*): how the saved config and model card describe the corpus.
        calibration_prompts (`list[str]`, *optional*): prompts whose greedy continuations are counted too.
        calibration_model (*optional*): the model generating them (default: `model`; the target is another choice).
        calibration_max_new_tokens (`int`): tokens generated per calibration prompt.
        calibration_chat_template (`bool`): wrap calibration prompts in the tokenizer's chat template, if any.
        target_model (*optional*): the target; its LM-head rows define the RDK similarities, and its vocabulary
            size must match.
        target_tokenizer (*optional*): the target's tokenizer; it must map text to the same ids.
        rdk (`bool`): also build the RDK kernel (`kernel.build_rdk_kernel`), for `acceptance="rdk"`.
        rdk_neighbours (`int`): m, pruned neighbours per kept token (default 8, `kernel.DEFAULT_NEIGHBOURS`).
        rdk_temperature (`float`): τ (default `kernel.DEFAULT_TEMPERATURE`).
        rdk_chunk_elements (`int`): similarities held at once while building the kernel.
        base_model (`str`, *optional*): Hub id of the model that was pruned, for the model card (default: the
            model's `name_or_path` when it is a repo id, or the upstream id of a `benchmarks/pypi_models.py` model).
        license (`str`, *optional*): license of the base model, for the model card (default: read from the base
            model's local README.md when there is one).

    Raises:
        `SemSpecConfigError`: `keep` out of range (more than the vocabulary, fewer than the special tokens, a
            fraction outside (0, 1]), no or an empty corpus, tokenizer or vocabulary mismatch with the target, bad
            RDK options.
    """
    if not (isinstance(model, torch.nn.Module) and hasattr(model, "config") and hasattr(model, "base_model")):
        raise invalid_value(
            "model", type(model).__name__, "a transformers causal LM", "pass e.g. AutoModelForCausalLM.from_pretrained(...)"
        )
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise invalid_value("model", type(model).__name__, "a causal LM with an LM head", "pass a *ForCausalLM model")
    if model.base_model is model:
        # The drafter runs `base_model` and its own sliced head; here that would be the whole LM, head included
        # (Llama4ForCausalLM names its backbone "language_model" in base_model_prefix but stores it as .model).
        raise invalid_value(
            "model", type(model).__name__,
            f"a causal LM whose backbone is the attribute its base_model_prefix names ({model.base_model_prefix!r})",
            "this architecture is not supported by PrunedVocabDrafter; please report it",
        )
    if tokenizer is None or not hasattr(tokenizer, "__len__"):
        raise invalid_value(
            "tokenizer", tokenizer if tokenizer is None else type(tokenizer).__name__, "the model's tokenizer",
            "pass AutoTokenizer.from_pretrained(...) of the model being pruned",
        )
    vocab_size = _text_config(model.config).vocab_size
    if head.weight.shape[0] != vocab_size:
        raise invalid_value(
            "model (LM head rows)", head.weight.shape[0], f"config.vocab_size = {vocab_size}", "pass an unpruned model"
        )
    if len(tokenizer) > vocab_size:
        raise invalid_value(
            "tokenizer", f"{len(tokenizer)} tokens", f"at most the model's vocab_size {vocab_size}",
            "pass the draft model's own tokenizer",
        )
    if target_tokenizer is not None:
        _check_same_tokenizer(tokenizer, target_tokenizer)
    if target_model is not None and _text_config(target_model.config).vocab_size != vocab_size:
        raise invalid_value(
            "target_model (vocab_size)",
            _text_config(target_model.config).vocab_size,
            f"the drafter's vocab_size {vocab_size}",
            "use a target that shares the drafter's vocabulary",
        )
    if not isinstance(rdk, bool):
        raise invalid_value("rdk", rdk, "True or False", "pass rdk=True to build the RDK kernel")
    if rdk:
        _check_int("rdk_neighbours", rdk_neighbours, 1, str(DEFAULT_NEIGHBOURS))
        if isinstance(rdk_temperature, bool) or not isinstance(rdk_temperature, (int, float)) or not rdk_temperature > 0:
            raise invalid_value("rdk_temperature", rdk_temperature, "a float > 0", f"pass e.g. {DEFAULT_TEMPERATURE}")
        _check_int("rdk_chunk_elements", rdk_chunk_elements, 1, str(DEFAULT_CHUNK_ELEMENTS))

    specials = ks.special_token_ids(tokenizer, model, vocab_size)
    selection: dict[str, Any] = {"tie_break": "lower token id first", "special_token_ids": specials}
    if (keep is None) == (keep_ids is None):
        raise invalid_value(
            "keep/keep_ids",
            {"keep": keep, "keep_ids": None if keep_ids is None else "given"},
            "exactly one of the two",
            "pass keep=32768 (or keep=0.25) with a corpus, or keep_ids=[...]",
        )
    if keep_ids is not None:
        if corpus is not None or calibration_prompts is not None:
            given = [name for name, value in (("corpus", corpus), ("calibration_prompts", calibration_prompts))
                     if value is not None]
            raise invalid_value(
                "keep_ids", "given with " + " and ".join(given), "keep_ids alone: explicit ids are kept (with the "
                "special tokens), nothing is counted", f"drop {' and '.join(given)}, or pass keep=... instead of keep_ids to count them",
            )
        ids = _keep_ids_tensor(keep_ids)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise invalid_value(
                "keep_ids", f"ids in [{int(ids.min())}, {int(ids.max())}]", f"ids in [0, {vocab_size})", "drop them"
            )
        kept = torch.unique(torch.cat([ids, torch.tensor(specials, dtype=torch.long)]))
        if kept.numel() == 0:
            raise invalid_value(
                "keep_ids", [], "at least one id (this tokenizer and config name no special token to add)",
                "pass the ids to keep, e.g. keep_ids=[5, 9]",
            )
        selection.update(method="explicit", requested={"keep_ids": int(torch.unique(ids).numel())})
        counts = None
    else:
        keep_size = ks.resolve_keep_size(keep, vocab_size, len(specials))
        counts = torch.zeros(vocab_size, dtype=torch.long)
        methods = []
        if corpus is not None:
            gathered = ks.gather_corpus(corpus, corpus_label)
            corpus_counts = ks.count_tokens(tokenizer, gathered.texts, vocab_size)
            num_tokens = int(corpus_counts.sum())
            if num_tokens == 0:
                raise invalid_value(
                    "corpus",
                    f"{len(gathered.texts)} texts, 0 tokens ({gathered.label})",
                    "a corpus with at least one token",
                    "pass non-empty texts or a non-empty JSONL file",
                )
            counts += corpus_counts
            methods.append("frequency")
            selection["corpus"] = {
                "source": gathered.label,
                "num_texts": len(gathered.texts),
                "num_tokens": num_tokens,
                "distinct_tokens": int((corpus_counts > 0).sum()),
            }
        if calibration_prompts is not None:
            prompts = [calibration_prompts] if isinstance(calibration_prompts, str) else list(calibration_prompts)
            if not prompts or not all(isinstance(p, str) for p in prompts):
                raise invalid_value(
                    "calibration_prompts", calibration_prompts, "a non-empty list of prompt strings", "pass prompts"
                )
            _check_int("calibration_max_new_tokens", calibration_max_new_tokens, 1, "64")
            generator = calibration_model if calibration_model is not None else model
            generated = ks.calibration_counts(
                generator, tokenizer, prompts, calibration_max_new_tokens, vocab_size, calibration_chat_template
            )
            counts += generated
            methods.append("calibration")
            selection["calibration"] = {
                "model": str(getattr(generator, "name_or_path", "") or type(generator).__name__),
                "is_drafter": generator is model,
                "num_prompts": len(prompts),
                "max_new_tokens": calibration_max_new_tokens,
                "num_tokens": int(generated.sum()),
                "chat_template": bool(calibration_chat_template and getattr(tokenizer, "chat_template", None)),
            }
        if not methods:
            raise invalid_value(
                "corpus",
                None,
                "a corpus (texts or a JSONL path) and/or calibration_prompts when keep is given",
                "pass corpus=[...] or corpus='data.jsonl', or keep_ids=[...] to choose the ids yourself",
            )
        kept = ks.select_kept_ids(counts, specials, keep_size)
        total = int(counts.sum())
        selection.update(
            method="+".join(methods),
            requested={"keep": keep},
            coverage=float(counts[kept].sum()) / total if total else None,
            kept_unseen=int((counts[kept] == 0).sum()),
        )

    weight = head.weight.detach()
    input_embedding = model.get_input_embeddings().weight
    tied = weight.data_ptr() == input_embedding.data_ptr() and weight.shape == input_embedding.shape
    bias = getattr(head, "bias", None)
    rdk_indices = rdk_weights = None
    rdk_info = None
    if rdk:
        reachable = min(len(tokenizer), vocab_size)
        is_candidate = torch.zeros(vocab_size, dtype=torch.bool)
        is_candidate[:reachable] = True
        is_candidate[kept] = False
        candidates = torch.nonzero(is_candidate).flatten()
        similarity_model = target_model if target_model is not None else model
        rdk_indices, rdk_weights = build_rdk_kernel(
            similarity_model.get_output_embeddings().weight,
            kept,
            candidates,
            neighbours=rdk_neighbours,
            temperature=float(rdk_temperature),
            chunk_elements=rdk_chunk_elements,
        )
        rdk_info = {
            "neighbours": rdk_indices.shape[1] - 1,
            "requested_neighbours": rdk_neighbours,
            "temperature": float(rdk_temperature),
            "self_score": 1.0,
            "similarity": "cosine of "
            + ("the target's LM-head rows" if target_model is not None else "the drafter's LM-head rows (unsliced)"),
            "similarity_model": str(getattr(similarity_model, "name_or_path", "") or type(similarity_model).__name__),
            "candidates": f"pruned ids below the tokenizer size {reachable} ({candidates.numel()} tokens)",
            "mean_self_weight": float(rdk_weights[:, 0].mean()),
            "form": "sparse first-order: each kept token → itself + its m most similar pruned tokens",
        }
    info = {
        "library": "hf_semspec",
        "base_model": _base_model_id(model, base_model),
        "base_model_path": str(getattr(model, "name_or_path", "") or ""),
        **({"license": license} if license is not None else (_base_license(model) or {"license": None})),
        "tokenizer_size": len(tokenizer),
        "selection": selection,
        "rdk": rdk_info,
    }
    device = weight.device
    drafter = PrunedVocabDrafter(
        model.base_model,
        model.config,
        kept.to(device),
        weight[kept.to(device)],  # advanced indexing copies: the rows do not share the full head's storage
        None if bias is None else bias.detach()[kept.to(device)],
        tied=tied,
        rdk_indices=rdk_indices,
        rdk_weights=rdk_weights,
        pruning_info=info,
        generation_config=getattr(model, "generation_config", None),
        tokenizer=tokenizer,
        base_model_prefix=getattr(model, "base_model_prefix", "model") or "model",
    )
    drafter.name_or_path = info["base_model_path"]
    _check_against_base(model, drafter)
    return drafter.eval()
