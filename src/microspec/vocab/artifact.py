"""Directories of the trained policies: ``config.json`` (with ``"method"``) and ``model.safetensors``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import MicrospecError, check
from ..options import Artifact, PolicySpec


def save_artifact(directory: str | Path, cfg: dict, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(d / "model.safetensors"))
    return d


def load_artifact(directory: str | Path, method: str, build):
    """``build(cfg, state)`` on the directory's config and tensors; one clear error when it is not a ``method``
    artifact or does not load."""
    from safetensors.torch import load_file

    d = Path(directory)
    try:
        cfg = json.loads((d / "config.json").read_text())
        check(cfg.get("method") == method, f"not a {method} artifact")
        return build(cfg, load_file(str(d / "model.safetensors")))
    except MicrospecError as exc:
        raise MicrospecError(f"{directory} is not a {LABELS.get(method, method)} artifact ({exc})") from None
    except Exception as exc:
        raise MicrospecError(f"{directory} is not a {LABELS.get(method, method)} artifact "
                             f"({type(exc).__name__}: {exc})") from None


LABELS = {"dynaspec": "DynaSpec", "specvocab": "SpecVocab", "coral": "CORAL"}


def trained_artifact(name: str, what: str) -> Artifact:
    """The directory trained policy ``name`` reads: flag ``--<name>``, made by ``microspec train <name>``; the one
    shipped beside the shipped EAGLE head fills in for that head."""
    def shipped(model: str):
        from ..models.registry import shipped_policy

        return shipped_policy(model, name)

    return Artifact(f"--{name}", "dir", what, f"`microspec train {name}`", shipped=shipped, for_eagle_head_only=True)


def trained_spec(name: str, summary: str, what: str, load) -> PolicySpec:
    """A trained policy with no option but its artifact, named by its name alone and built by ``load(path,
    vocab_size, always=..., device=...)``."""
    return PolicySpec(name, summary, artifact=trained_artifact(name, what), names=(name,),
                      parse_name=lambda text, method: {"vocab": name} if text == name else None,
                      build=lambda method, vocab_size, device, always: load(method.artifact, vocab_size,
                                                                            always=always, device=device))
