"""EAGLE-3: a draft head fed the target's low, middle and high features, with a draft vocabulary of its own.

For the pair (F_t, x_{t+1}) — F_t the target's residual stream entering three of its layers (by default 2, L/2 and
L-3 of L, as vLLM and SGLang tap them), concatenated [3d] — the head computes ``g = fc(F_t)`` and runs one decoder
layer whose attention reads ``[input_layernorm(embed(x_{t+1})); hidden_norm(g)]`` [2d] and whose residual is ``g``;
the layer's output ``o`` goes through the head's final ``norm`` and its own ``lm_head`` [V_draft, d] to score the
next token, draft id i standing for target id ``i + d2t[i]``.  Deeper draft steps feed ``o`` itself (not normed)
back in place of ``g``: the head was trained on its own outputs (training-time test), not on the target's features.

Checkpoints: the official EAGLE-3 layout, as SpecForge writes it too — ``config.json`` (a Llama config with
``num_hidden_layers: 1`` and ``draft_vocab_size``; the tapped layers optionally in
``eagle_config.eagle_aux_hidden_state_layer_ids`` or ``eagle_aux_hidden_state_layer_ids``, vLLM's meaning) and
``model.safetensors`` or ``pytorch_model.bin`` with ``fc.weight`` [d, 3d], ``midlayer.{input_layernorm,hidden_norm,
post_attention_layernorm}.weight``, ``midlayer.self_attn.{q,k,v}_proj.weight`` [., 2d], ``midlayer.self_attn.o_proj``,
``midlayer.mlp.{gate,up,down}_proj``, ``norm.weight``, ``lm_head.weight`` [V_draft, d], ``d2t`` [V_draft] and ``t2d``
[V] (optional: derived from ``d2t``), and optionally ``embed_tokens.weight`` (a copy of the target's; the target's own
is used).

Vocabulary policies see the draft vocabulary as rows of the full one (:class:`~microspec.drafters.head.DraftVocabRows`):
a restricted set (MicroSpec's in-context vocabulary, a static shortlist) is intersected with the ids the head can
score, and ids outside it are never proposed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..decoding.adaptive import ADAPTIVE
from ..errors import MicrospecError, check
from ..models.layers import Linear, RMSNorm
from ..models.native import NativeCausalLM
from ..models.taps import Taps
from ..models.registry import read_weights
from ..options import DrafterSpec, Option
from .base import DRAFT
from .eagle import EagleDrafter, EagleHead, _layer_config
from .head import DraftVocabRows
from .lookup_first import LOOKUP
from .model_based import CHAIN_DEPTH, TREE_OPTIONS, check_shape, tree_shape

D2T_MODES = ("intersect", "replace")  # a restricted set against the head's draft vocabulary (Eagle3Drafter)
D2T = Option("d2t", choices=D2T_MODES,
             help="an EAGLE-3 head's own draft vocabulary against a restricted set: intersect (default: only the "
                  "set's ids the head has rows for) or replace (the set's other ids scored with the target's LM head "
                  "rows)")


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The layers EAGLE-3 taps when its config names none (vLLM's and SGLang's default)."""
    return 2, num_layers // 2, num_layers - 3


class _Eagle3Body(NativeCausalLM):
    """The head's decoder layer: its input rows are ``[embedding; feature]`` [2d], its residual the feature."""

    def layer(self, i, layer, x, rope, attend):
        d = self.spec.hidden_size
        emb, feature = x[..., :d].contiguous(), x[..., d:].contiguous()
        h = torch.cat((layer.input_layernorm(emb), layer.hidden_norm(feature)), dim=-1)
        x = feature + self.attention(i, layer.self_attn, h, rope, attend)
        return x + self._mlp(layer.mlp, layer.post_attention_layernorm(x))

    def _fused_layers(self):
        return None  # the fused CPU layer kernel knows only d-wide attention inputs


class Eagle3Head(nn.Module):
    """fc [d, k·d] + one decoder layer over [embedding; feature] + final norm + an LM head over ``draft_vocab_size``
    ids.  Parameter names map to the official layout (``midlayer.`` is ``body.model.layers.0.``)."""

    def __init__(self, layer_cfg, draft_vocab_size: int, vocab_size: int, feature_layers: tuple[int, ...] | None,
                 num_features: int = 3, fc_bias: bool = False):
        super().__init__()
        d = layer_cfg.hidden_size
        self.layer_cfg = layer_cfg
        self.feature_layers = feature_layers  # None: the default taps of the target it drafts for
        self.fc = Linear(num_features * d, d, fc_bias)
        self.body = _Eagle3Body.from_config(layer_cfg, embeddings=False, first_input_norm=True, final_norm=False)
        spec = self.body.spec
        layer = self.body.model.layers[0]
        attn = layer.self_attn
        attn.q_proj = Linear(2 * d, spec.num_heads * spec.head_dim, spec.attn_bias)
        attn.k_proj = Linear(2 * d, spec.num_kv_heads * spec.head_dim, spec.attn_bias)
        attn.v_proj = Linear(2 * d, spec.num_kv_heads * spec.head_dim, spec.attn_bias)
        layer.hidden_norm = RMSNorm(d, spec.rms_norm_eps, spec.gemma)
        self.norm = RMSNorm(d, spec.rms_norm_eps, spec.gemma)
        self.lm_head = Linear(d, draft_vocab_size, False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.vocab_size = vocab_size

    @property
    def hidden_size(self) -> int:
        return self.body.spec.hidden_size

    @property
    def num_features(self) -> int:
        return self.fc.weight.shape[1] // self.hidden_size

    def target_ids(self) -> torch.Tensor:
        """[V_draft] the target id each draft id stands for."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def taps_for(self, num_layers: int) -> tuple[int, ...]:
        layers = self.feature_layers or default_feature_layers(num_layers)
        check(len(layers) == self.num_features,
              f"EAGLE-3 head: fc takes {self.num_features} features but {len(layers)} layers are tapped")
        check(all(0 <= i <= num_layers for i in layers),
              f"EAGLE-3 head taps layers {list(layers)}, outside the target's 0..{num_layers}")
        return tuple(layers)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache, positions=None, mask=None):
        """The layer's outputs [T, d] (not normed: what deeper steps are fed) for pairs of token embeddings and
        features — the target's tapped features [T, k·d] (through fc) or the head's own outputs [T, d]."""
        if features.shape[-1] != self.hidden_size:
            features = self.fc(features.to(embeds.dtype))
        return self.body.run(torch.cat((embeds, features.to(embeds.dtype)), dim=-1), cache, positions, mask)

    # ---------------------------------------------------------------- checkpoints
    @classmethod
    def load(cls, path: str | Path) -> "Eagle3Head":
        directory = Path(path).expanduser()
        try:
            raw = json.loads((directory / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise MicrospecError(f"unreadable EAGLE-3 config in {directory}: {exc}") from exc
        state = read_weights(directory)
        return cls.from_state(raw, state, str(directory))

    @classmethod
    def from_state(cls, raw: dict, state: dict, where: str = "EAGLE-3 head") -> "Eagle3Head":
        for key in ("fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight"):
            check(key in state, f"{where} is not an EAGLE-3 checkpoint (no {key})")
        fc = state["fc.weight"]
        d = fc.shape[0]
        check(fc.shape[1] % d == 0 and fc.shape[1] // d >= 1,
              f"{where}: fc.weight must be [d, k*d], got {tuple(fc.shape)}")
        check(state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * d,
              f"{where}: the draft layer's q_proj must read 2*d = {2 * d} inputs")
        raw = {**raw, "hidden_size": raw.get("hidden_size", d)}
        check(raw["hidden_size"] == d, f"{where}: config hidden_size {raw['hidden_size']} != fc size {d} (a head "
                                       f"whose width differs from its target's is not supported)")
        draft_vocab = state["lm_head.weight"].shape[0]
        check(raw.get("draft_vocab_size", draft_vocab) == draft_vocab,
              f"{where}: config draft_vocab_size {raw.get('draft_vocab_size')} != lm_head rows {draft_vocab}")
        vocab = raw.get("vocab_size")
        check(isinstance(vocab, int) and vocab >= draft_vocab, f"{where}: config vocab_size missing or smaller than "
                                                               f"the draft vocabulary ({draft_vocab})")
        layers = raw.get("eagle_aux_hidden_state_layer_ids") or \
            (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        head = cls(_layer_config(raw, "midlayer.self_attn.q_proj.bias" in state), draft_vocab, vocab,
                   tuple(layers) if layers else None, fc.shape[1] // d, "fc.bias" in state)
        d2t = state.get("d2t")
        if d2t is None:  # a head over the whole vocabulary
            check(draft_vocab == vocab, f"{where}: no d2t map, but lm_head has {draft_vocab} rows for a vocabulary of "
                                        f"{vocab}")
            d2t = torch.zeros(draft_vocab, dtype=torch.long)
        d2t = d2t.to(torch.long)
        ids = torch.arange(draft_vocab) + d2t
        check(d2t.shape == (draft_vocab,) and bool(((ids >= 0) & (ids < vocab)).all()) and
              ids.unique().numel() == draft_vocab, f"{where}: d2t must map the {draft_vocab} draft ids to distinct "
                                                   f"ids of the vocabulary")
        if "t2d" in state:
            t2d = state["t2d"].to(torch.bool)
            check(t2d.shape == (vocab,) and int(t2d.sum()) == draft_vocab and bool(t2d[ids].all()),
                  f"{where}: t2d does not match d2t")
        mapped = {}
        for k, v in state.items():
            if k in ("t2d", "embed_tokens.weight"):
                continue
            mapped["body.model.layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k] = v
        mapped["d2t"] = d2t
        missing, unexpected = head.load_state_dict(mapped, strict=False)
        if missing or unexpected:
            raise MicrospecError(f"{where}: EAGLE-3 weights do not match their config "
                                 f"(missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})")
        return head.eval()

    def save(self, path: str | Path, extra_config: dict | None = None) -> None:
        """Write the official layout (config.json + model.safetensors with d2t and t2d)."""
        from safetensors.torch import save_file

        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = {**self.layer_cfg.to_dict(), "num_hidden_layers": 1, "architectures": ["LlamaForCausalLMEagle3"],
               "draft_vocab_size": self.d2t.numel(), "vocab_size": self.vocab_size, **(extra_config or {})}
        if self.feature_layers:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.feature_layers),
                                   "use_aux_hidden_state": True}
        (directory / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        state = {}
        for k, v in self.state_dict().items():
            state["midlayer." + k.removeprefix("body.model.layers.0.") if k.startswith("body.model.layers.0.")
                  else k] = v.detach().contiguous()
        t2d = torch.zeros(self.vocab_size, dtype=torch.bool)
        t2d[self.target_ids().cpu()] = True
        state["t2d"] = t2d
        save_file(state, str(directory / "model.safetensors"))


def is_eagle3_checkpoint(directory: Path) -> bool:
    """Whether ``directory`` holds an EAGLE-3 head (by its config: an ``*Eagle3`` architecture, or a
    ``draft_vocab_size``)."""
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if any("Eagle3" in a for a in raw.get("architectures") or ()):
        return True
    return "draft_vocab_size" in raw


class Eagle3Drafter(EagleDrafter):
    """EAGLE-2's dynamic tree (or a chain) drafted by an :class:`Eagle3Head`."""

    name = "eagle3"

    def describe(self) -> dict:
        return {"head": "EAGLE-3"}

    def __init__(self, head: "Eagle3Head", depth: int = CHAIN_DEPTH, top_k: int | None = None,
                 total_tokens: int | None = None,
                 d2t: str = "intersect"):
        check(d2t in D2T_MODES, f"unknown d2t mode {d2t!r}; choose from {', '.join(D2T_MODES)}")
        super().__init__(head, depth=depth, top_k=top_k, total_tokens=total_tokens)
        self.d2t = d2t  # how a restricted set meets the draft vocabulary: intersected with it, or replacing it

    def feature_layers(self, target: NativeCausalLM) -> tuple[int, ...]:
        return self.eagle.taps_for(target.spec.num_layers)

    def _start(self, target: NativeCausalLM, prompt_ids, hidden: torch.Tensor):
        head = self.eagle
        super()._start(target, prompt_ids, hidden)  # checks the head's width and vocabulary against the target's
        check(hidden.shape[-1] == head.num_features * head.hidden_size,
              "the EAGLE-3 drafter needs the target's tapped features (the generation loop asks for them)")
        ids = head.target_ids()
        if ids.numel() == head.vocab_size and bool((head.d2t == 0).all()):
            return head.lm_head.weight, None  # a head over the whole vocabulary: rows are ids
        # replace: ids of a restricted set outside the draft vocabulary are scored with the target's own LM head rows
        # (an EAGLE-3 head's rows start as the target's; its final norm stands where the target's was)
        fallback = target.head_weight if self.d2t == "replace" else None
        return DraftVocabRows(head.lm_head.weight, ids, head.vocab_size, fallback), None

    def prefill(self, target: NativeCausalLM, prompt_ids, hidden: torch.Tensor, vocab=None) -> None:
        check(vocab is None or not (vocab.wants_draft_inputs or vocab.wants_head_input),
              f"vocabulary policy {getattr(vocab, 'name', '')!r} routes on an EAGLE-2 head's inputs or hidden states: "
              f"it was not trained for an EAGLE-3 head")
        super().prefill(target, prompt_ids, hidden, vocab)

    def _head_norm(self):
        return self.eagle.norm


__all__ = ["Eagle3Drafter", "Eagle3Head", "Taps", "default_feature_layers", "is_eagle3_checkpoint"]


# The eagle drafter as methods see it, for both head kinds (EAGLE-1/2 and EAGLE-3: the loaded head decides).
def _check(method) -> None:
    check_shape(method)
    from ..vocab.registry import spec

    if method.d2t == "replace" and not spec(method.vocab).restricts:
        raise MicrospecError("--d2t replace needs a restricted draft vocabulary (microspec, fr-spec, vocabtrim): it "
                             "scores the set's ids outside the head's own with the target's rows")


def _shape(kind: str, method) -> dict:
    """The device's tree on every device (a tree of one token on a packed CPU target), the method's where set."""
    return tree_shape(kind, method)


def _make(method, ctx) -> EagleDrafter:
    eagle_head, t, d2t = ctx.eagle_head(method.draft), ctx.tree, method.d2t
    depth, top_k, total = t.get("depth") or CHAIN_DEPTH, t.get("top_k"), t.get("total_tokens")
    if isinstance(eagle_head, Eagle3Head):
        return Eagle3Drafter(eagle_head, depth=depth, top_k=top_k, total_tokens=total, d2t=d2t or "intersect")
    if d2t is not None:
        raise MicrospecError("--d2t applies to an EAGLE-3 head (one with a draft vocabulary of its own)")
    return EagleDrafter(eagle_head, depth=depth, top_k=top_k, total_tokens=total)


def load_eagle_head(path) -> EagleHead | Eagle3Head:
    """An EAGLE head from its checkpoint directory: EAGLE-3 (by its config) or EAGLE-1/2."""
    directory = Path(path).expanduser()
    if directory.is_dir() and is_eagle3_checkpoint(directory):
        return Eagle3Head.load(directory)
    return EagleHead.load(directory)


SPEC = DrafterSpec(
    "eagle", "a trained EAGLE head (EAGLE-1/2, or EAGLE-3 by its checkpoint) on the target's features, chain or "
             "EAGLE-2 tree", options=(DRAFT, D2T, *TREE_OPTIONS, ADAPTIVE, LOOKUP), aliases=("eagle-full", "eagle2"),
    head=True, check=_check, make=_make, shape=_shape, eagle_head=True)
