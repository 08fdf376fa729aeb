"""Draft vocabularies per request inside vLLM's drafting: the same policies as this project's engine
(:mod:`microspec.vocab`), fed from what vLLM's runner holds at each proposal.

For each request the batch keeps a policy (by default the prepared head's, or the one a request names in
``SamplingParams(extra_args={"microspec_vocab": NAME})``: ``full``, ``fr-spec-32k``, ``vocabtrim-16k``,
``microspec``, ...) and a :class:`~microspec.drafters.head.DraftHead` scoring its active rows.  MicroSpec's
Algorithm 1 sources, where they come from here:

- S_init = prompt ⊕ TopK(Z_i, K_pre): the prompt's ids, and the top K_pre of the target's LM head applied to the
  target's final hidden states at the prompt positions (vLLM hands the drafter those states; chunked prefills are
  gathered until the prompt is complete);
- C_draft: the tokens this request drafted at the previous proposal (the chain vLLM verified in this step);
- C_ver = TopK(z_verify, K_ver): the target's logits at the step's verified positions, kept from the target's own
  ``compute_logits`` call (before vLLM's sampling processors: under a repetition penalty this is the raw logits,
  where this project's engine uses the processed ones).

Where vLLM serves part of a prompt from its prefix cache, those positions' hidden states are never computed: their
ids enter S_init, their top-K_pre do not (``enable_prefix_caching=False`` keeps Algorithm 1 exact).  Either way
only the drafts change: verification is vLLM's own, over the full vocabulary.

Static policies (full, FR-Spec, VocabTrim) are shared by every request that uses them and score their rows in one
matmul; MicroSpec scores each request's packed buffer.  Rows of requests still in prefill (their drafts are thrown
away by vLLM) and rows of a dummy run are scored over the full vocabulary.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ..drafters.head import DraftHead
from ..errors import MicrospecError
from ..drafters.registry import DEFAULT_HEAD
from ..method import Method
from ..vocab.microspec import topk_ids

REQUEST_KEY = "microspec_vocab"  # SamplingParams.extra_args key naming a request's draft vocabulary
_PROMPT_BLOCK = 64  # prompt positions scored by the target's LM head at a time (bounds the [rows, V] logits)


def draft_method(name: str) -> Method:
    """The method of draft-vocabulary name ``name`` (``full``, ``fr-spec-32k``, ``microspec``, ...): the EAGLE
    drafter over that vocabulary; one clear error for a name that is not one."""
    method = Method.parse(name if name != "full" else DEFAULT_HEAD)
    if method.drafter != DEFAULT_HEAD:
        raise MicrospecError(f"{name!r} is not a draft vocabulary (full, fr-spec-32k, microspec, ...)")
    return method


def draft_policy(method: Method, vocab_size: int, device, always=()):
    """The vocabulary policy of draft method ``method`` as the plugin runs it (None: the full vocabulary); one clear
    error for a policy the plugin cannot feed (one that routes on the draft network's inputs)."""
    from ..engine import build_policy

    policy = build_policy(method, vocab_size, device, always)
    if policy is not None and policy.wants_draft_inputs:
        raise MicrospecError(f"draft vocabulary {method.vocab!r} routes on the draft network's inputs, which the "
                             "vLLM plugin does not pass on: use full, fr-spec, vocabtrim, specvocab or microspec")
    return policy


@dataclass
class _Request:
    name: str  # the vocabulary drafting (the default where the asked one could not be made)
    head: DraftHead
    shared: bool  # a static policy's head, shared by requests
    ready: bool = False  # the prompt is complete and the policy has heard it
    topk: list = field(default_factory=list)  # prompt top-k ids of the chunks seen so far
    drafted: torch.Tensor | None = None  # the last proposal's tokens (C_draft of the next step)
    asked: str = ""  # the vocabulary the request named


def _stateless(policy) -> bool:
    """Whether ``policy`` hears nothing per request (a static set: one instance serves every request)."""
    from ..vocab.base import VocabPolicy

    kind = type(policy)
    return kind.on_prefill is VocabPolicy.on_prefill and kind.on_verify is VocabPolicy.on_verify and \
        not policy.wants_draft_inputs and not policy.wants_head_input


class BatchVocab:
    """The draft vocabularies of a running batch, over the LM head ``weight`` [V, d] (the target's, shared)."""

    def __init__(self, weight: torch.Tensor, softcap: float | None, model: str | None, default: str,
                 always=(), options: dict | None = None):
        self.weight, self.softcap, self.model = weight, softcap, model
        self.vocab_size = weight.shape[0]
        self.default, self.always, self.options = default, sorted(set(always)), dict(options or {})
        self.full = DraftHead(weight, softcap)
        self.static: dict[str, DraftHead] = {}
        self.requests: dict[str, _Request] = {}
        self.order: list[_Request | None] = []  # the batch's rows: the request of each, None for a full row
        self.depth = 0
        self.refused: set[str] = set()
        self._new(default)  # a default that cannot be made (a bad name, a missing artifact) fails at start

    # ------------------------------------------------------------------ policies
    def method(self, name: str) -> Method:
        """The draft method of a vocabulary name (the EAGLE drafter, with the engine's options for its policy and
        the model's shipped artifacts)."""
        try:
            method = draft_method(name)
            options = self.options.get(method.vocab)
            if options:
                method = method.replace(**options)
            return method.for_model(self.model) if self.model else method
        except MicrospecError as exc:
            raise MicrospecError(f"draft vocabulary {name!r}: {exc}") from None

    def _for_request(self, name: str) -> _Request:
        """A request's draft vocabulary; a name that does not make one falls back to the default, with one warning
        per name (drafts only change speed, never the output; vLLM has no way to refuse one request from here)."""
        try:
            return self._new(name)
        except Exception as exc:  # noqa: BLE001 - whatever a request names, the engine goes on serving
            if not isinstance(exc, MicrospecError):
                exc = MicrospecError(f"draft vocabulary {name!r} could not be made ({type(exc).__name__}: {exc})")
            if name not in self.refused:
                self.refused.add(name)
                warnings.warn(f"microspec: {exc}; requests naming it draft with {self.default!r}", stacklevel=2)
            return self._new(self.default)

    def _new(self, name: str) -> _Request:
        if name in self.static:
            return _Request(name, self.static[name], shared=True)
        method = self.method(name)
        policy = draft_policy(method, self.vocab_size, self.weight.device, self.always)
        head = self.full if policy is None or method.vocab == "full" else DraftHead(self.weight, self.softcap, policy)
        shared = policy is None or _stateless(policy)
        if shared and head is not self.full:
            self.static[name] = head
        return _Request(name, head, shared=shared or head is self.full)

    # ------------------------------------------------------------------ what a step verified
    def before(self, step) -> None:
        """Hear step ``step`` (:class:`~microspec.vllm.internals.Step`) before its proposal: prompts completed in it,
        drafts verified in it; forget requests that ended."""
        for rid in [r for r in self.requests if r not in step.alive]:
            del self.requests[rid]
        self.order, self.depth = [], 0
        for head in (self.full, *self.static.values()):
            head.sizes.clear()  # the heads live as long as the engine: keep no per-call record
        offset = logit_row = 0
        for i, rid in enumerate(step.req_ids):
            n, verified = step.scheduled[i], step.verified[i]
            prompt = step.prompts[i]
            req = self.requests.get(rid)
            extra = getattr(step.params[i], "extra_args", None) or {}
            name = str(extra.get(REQUEST_KEY, self.default))
            if req is None or req.asked != name or (step.computed[i] == 0 and n):
                req = self.requests[rid] = self._for_request(name)  # a new (or recomputed) request
                req.asked = name
            rows = step.hidden[offset: offset + n]
            if not req.ready and n:
                self._prefill(req, prompt, step.computed[i], rows)
            elif req.ready and verified and req.drafted is not None and not req.shared:
                logits = step.logits[logit_row: logit_row + verified + 1] if step.logits is not None else \
                    torch.empty(0, self.vocab_size)
                req.head.policy.on_verify(req.drafted[:verified], logits.float())
            offset += n
            logit_row += verified + 1
            self.order.append(req if req.ready else None)

    def _prefill(self, req: _Request, prompt, computed: int, rows: torch.Tensor) -> None:
        policy = req.head.policy
        part = max(0, min(rows.shape[0], len(prompt) - computed))
        k = 0 if policy is None or req.shared else policy.prompt_topk
        if k and part:
            first = computed if policy.prompt_positions is None else max(computed, len(prompt) - policy.prompt_positions)
            for s in range(first - computed, part, _PROMPT_BLOCK):
                h = rows[s: min(part, s + _PROMPT_BLOCK)]
                req.topk.append(topk_ids(self.full.logits(h), k))  # the target's logits Z_i (its own LM head)
        if computed + rows.shape[0] >= len(prompt):
            if policy is not None and not req.shared:
                policy.reset()
                ids = torch.as_tensor(prompt, dtype=torch.long)
                policy.on_prefill(ids, torch.cat(req.topk) if req.topk else None)
            req.topk, req.ready = [], True

    def after(self, drafts) -> None:
        """Keep each request's proposal: the C_draft its next verification reports."""
        if not isinstance(drafts, torch.Tensor) or drafts.dim() != 2:
            return
        for i, req in enumerate(self.order[: drafts.shape[0]]):
            if req is not None and not req.shared:
                req.drafted = drafts[i].to(torch.long).cpu()

    # ------------------------------------------------------------------ scoring the draft rows
    def _groups(self, rows: int):
        """(head, row indices) of each head scoring the ``rows`` rows of this call."""
        order = self.order if len(self.order) == rows else [None] * rows
        groups: dict[int, tuple[DraftHead, list[int]]] = {}
        for i, req in enumerate(order):
            head = self.full if req is None else req.head
            groups.setdefault(id(head), (head, []))[1].append(i)
        return groups.values()

    def top_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """Greedy draft ids [R] (full-vocabulary ids) of the draft hidden states ``hidden`` [R, d]."""
        out = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
        for head, rows in self._groups(hidden.shape[0]):
            idx = torch.tensor(rows, device=hidden.device)
            logits = head.logits(hidden[idx], self.depth)
            out[idx] = head.to_full_ids(logits.argmax(dim=-1)).to(out.device)
        self.depth += 1
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits [R, V] (-inf outside each row's draft vocabulary): for vLLM's sampled drafts."""
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        for head, rows in self._groups(hidden.shape[0]):
            idx = torch.tensor(rows, device=hidden.device)
            logits = head.logits(hidden[idx], self.depth)
            if head.active is None:
                out[idx] = logits
                continue
            ids = head.to_full_ids(torch.arange(logits.shape[1], device=logits.device))
            ok = ids >= 0
            out[idx[:, None], ids[ok][None, :]] = logits[:, ok]
        self.depth += 1
        return out
