"""Every vLLM internal the plugin touches, named here and nowhere else.

vLLM (pinned: :data:`PINNED`) has no public hook for a draft vocabulary that changes per request, so the plugin
leans on these internals; :func:`problems` checks each of them against the installed vLLM and the plugin's test
fails loudly, naming what moved, when an upgrade breaks one.

- :class:`GPUModelRunner` ``.propose_draft_token_ids`` (the CPU runner inherits it): wrapped once, so that before
  each proposal the per-request draft vocabularies learn what the step verified, and after it what was drafted.
  It reads the runner's ``input_batch.req_ids`` / ``input_batch.num_computed_tokens_cpu``, ``requests[id]``
  (``prompt_token_ids``, ``sampling_params``), ``model`` (the target, whose ``compute_logits`` is wrapped to keep
  the step's verification logits), ``drafter`` (the proposer: ``model``, ``use_local_argmax_reduction``), the
  scheduler's ``num_scheduled_tokens`` and the spec-decode metadata's ``num_draft_tokens``.
- The draft architecture is built from vLLM's EAGLE decoder layer (``llama_eagle.LlamaDecoderLayer``, input norm
  dropped), ``ReplicatedLinear``, ``default_weight_loader`` and ``maybe_prefix``, and registered with
  ``ModelRegistry``; the EAGLE proposer shares the target's embedding and LM head into it when it declares
  ``has_own_embed_tokens = has_own_lm_head = False``.
"""

from __future__ import annotations

import functools
import inspect
import time

from vllm import ModelRegistry
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama_eagle import LlamaDecoderLayer
from vllm.model_executor.models.utils import maybe_prefix
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

PINNED = "0.32.0"

PROPOSE_PARAMETERS = ("scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states",
                      "sample_hidden_states", "aux_hidden_states", "spec_decode_metadata", "common_attn_metadata",
                      "slot_mappings")
REQUEST_FIELDS = ("prompt_token_ids", "sampling_params", "num_computed_tokens")

__all__ = ["PINNED", "LlamaDecoderLayer", "ModelRegistry", "ReplicatedLinear", "default_weight_loader",
           "install", "maybe_prefix", "problems", "Step"]


class Step:
    """What one engine step scheduled and verified, as the runner holds it just before the proposal: the requests
    in batch order, each one's prompt, tokens computed before this step, tokens scheduled in it, draft tokens it
    verified, and the target's final hidden states for all scheduled tokens (rows in batch order); ``logits`` the
    target's logits of this step's sampled positions (None where they could not be matched to requests)."""

    def __init__(self, runner, args: dict):
        batch = runner.input_batch
        sched = args["scheduler_output"].num_scheduled_tokens
        meta = args["spec_decode_metadata"]
        self.req_ids = list(batch.req_ids)
        n = len(self.req_ids)
        self.prompts = [runner.requests[r].prompt_token_ids or [] for r in self.req_ids]
        self.params = [runner.requests[r].sampling_params for r in self.req_ids]
        self.computed = [int(batch.num_computed_tokens_cpu[i]) for i in range(n)]
        self.scheduled = [int(sched.get(r, 0)) for r in self.req_ids]
        self.verified = list(meta.num_draft_tokens) if meta is not None else [0] * n
        self.hidden = args["hidden_states"]
        self.alive = set(runner.requests)
        logits = getattr(runner.model, "_microspec_logits", None)
        runner.model._microspec_logits = None
        self.logits = logits if logits is not None and logits.shape[0] == sum(v + 1 for v in self.verified) else None


def _keep_logits(target) -> None:
    """Wrap the target's ``compute_logits`` (once) so the step's verification logits stay readable until the
    proposal (a reference, no copy)."""
    if getattr(target, "_microspec_wrapped", False):
        return
    original = target.compute_logits

    @functools.wraps(original)
    def compute_logits(hidden_states, *args, **kwargs):
        logits = original(hidden_states, *args, **kwargs)
        target._microspec_logits = logits
        return logits

    target.compute_logits = compute_logits
    target._microspec_logits = None
    target._microspec_wrapped = True


_ORIGINAL = GPUModelRunner.propose_draft_token_ids
_SIGNATURE = inspect.signature(_ORIGINAL)


@functools.wraps(_ORIGINAL)
def _propose(self, *args, **kwargs):
    drafter = getattr(self, "drafter", None)
    model = getattr(drafter, "model", None)
    if not hasattr(model, "microspec_before"):  # another drafter: vLLM's own behaviour
        return _ORIGINAL(self, *args, **kwargs)
    bound = _SIGNATURE.bind(self, *args, **kwargs)
    _keep_logits(self.model)
    drafter.use_local_argmax_reduction = True  # greedy drafts: the draft model's get_top_tokens (ids, no [R, V])
    t0 = time.perf_counter()
    model.microspec_before(Step(self, bound.arguments))
    t1 = time.perf_counter()
    drafts = _ORIGINAL(self, *args, **kwargs)
    model.microspec_after(drafts)
    # (what the vocabularies heard, the whole draft step: that, vLLM's draft passes and the draft head)
    model.draft_time.append((t1 - t0, time.perf_counter() - t0))
    return drafts


def install() -> None:
    """Wrap the runner's proposal step (idempotent; a pass-through for every drafter but the plugin's)."""
    if GPUModelRunner.propose_draft_token_ids is not _propose:
        GPUModelRunner.propose_draft_token_ids = _propose


def draft_model(llm):
    """The plugin's draft model inside an in-process ``LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni``
    executor), for measurements; None where it cannot be reached."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter.model
    except AttributeError:
        return None


def problems() -> list[str]:
    """What no longer matches in the installed vLLM (empty when everything the plugin touches is where it was)."""
    import vllm

    out = []
    if vllm.__version__ != PINNED:
        out.append(f"vLLM {vllm.__version__} installed; the plugin was written against {PINNED}")
    params = tuple(p for p in _SIGNATURE.parameters if p != "self")
    if params != PROPOSE_PARAMETERS:
        out.append(f"GPUModelRunner.propose_draft_token_ids takes {params}, not {PROPOSE_PARAMETERS}")
    fields = {f for f in getattr(CachedRequestState, "__dataclass_fields__", {})}
    out += [f"CachedRequestState has no {f!r}" for f in REQUEST_FIELDS if f not in fields]
    for name in ("req_ids", "num_computed_tokens_cpu"):
        if name not in inspect.getsource(InputBatch):
            out.append(f"InputBatch has no {name!r}")
    source = inspect.getsource(SpecDecodeBaseProposer)
    for name in ("use_local_argmax_reduction", "get_top_tokens", "has_own_embed_tokens", "has_own_lm_head"):
        if name not in source:
            out.append(f"the EAGLE proposer no longer reads {name!r}")
    runner = inspect.getsource(GPUModelRunner)
    for name in ("self.model.compute_logits(", "self.drafter.propose(", "num_draft_tokens"):
        if name not in runner:
            out.append(f"GPUModelRunner no longer calls {name!r}")
    if "disable_input_layernorm" not in inspect.signature(LlamaDecoderLayer.__init__).parameters:
        out.append("llama_eagle.LlamaDecoderLayer no longer takes disable_input_layernorm")
    return out
