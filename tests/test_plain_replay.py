"""A plain step as one CUDA graph replay (``Generation.plain_replay``): the forward, the full-vocabulary head, the
processors and the choice of the next token in one graph, one read of the token a step.  Here on a CPU with a
stand-in capture (tests/test_whole_draft.py's: a replay runs the captured body again over its static inputs); the
graphs themselves in tests/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from support import tiny_pair
from test_tree_device import PROMPT
from test_whole_draft import _Replayed, _stand_in_capture
from microspec.decoding import GenerationConfig, generate_ids
from microspec.decoding.loop import Generation
from microspec.decoding.replay import PlainReplay

DECODINGS = {
    "greedy": {},
    # a strong penalty: a replay that read an earlier step's (or generation's) seen ids would choose other tokens
    "penalty": {"repetition_penalty": 3.0},
    "seeded": {"temperature": 0.8, "seed": 3},
    "warped": {"temperature": 0.9, "top_p": 0.8, "top_k": 20, "min_p": 0.02, "seed": 5, "repetition_penalty": 1.5},
}


def _replayed_steps(monkeypatch) -> list[bool]:
    """Per settled step, whether its token came chosen from a replay."""
    settled, settle = [], Generation.settle

    def counted(self, hidden, first=None, chosen=None):
        settled.append(chosen is not None)
        return settle(self, hidden, first, chosen)

    monkeypatch.setattr(Generation, "settle", counted)
    return settled


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("decoding", list(DECODINGS))
def test_a_plain_step_replayed_whole_chooses_the_eager_token(monkeypatch, family, decoding):
    """Greedy, under a strong repetition penalty, seeded sampling (keyed: the uniform of each position is an input),
    and every warper with the penalty: the replayed steps' tokens are the eager steps', in the generation that
    captures the graphs and in the next one, which replays them on the pooled cache with its own seen ids; from the
    third step on every step replays (the first of a shape runs eagerly, the second captures it)."""
    _stand_in_capture(monkeypatch)
    _, eager = tiny_pair(family)
    _, nm = tiny_pair(family)
    nm.use_cuda_graphs(True)
    cfg = GenerationConfig(max_new_tokens=120, ignore_eos=True, **DECODINGS[decoding])
    ref = generate_ids(eager, PROMPT, cfg).token_ids
    settled = _replayed_steps(monkeypatch)
    first = generate_ids(nm, PROMPT, cfg)
    replayed_first, settled[:] = list(settled), []
    captures = nm.cuda_graphs.captures
    second = generate_ids(nm, PROMPT, cfg)
    assert first.token_ids == ref and second.token_ids == ref
    assert not any(replayed_first[:1]) and all(replayed_first[2:]), replayed_first
    assert all(settled) and len(settled) == len(ref) - 1  # the prefill chooses the first token
    # the next generation captures only the prompt's forward (the first ran it once: eagerly)
    assert nm.cuda_graphs.captures == captures + 1 and second.stats.graph_captures == 1


def test_what_a_replay_cannot_take_runs_eagerly(monkeypatch):
    """No-repeat-n-gram (its history grows: no fixed shape) keeps the plain step eager, with the same tokens."""
    _stand_in_capture(monkeypatch)
    _, eager = tiny_pair("llama")
    _, nm = tiny_pair("llama")
    nm.use_cuda_graphs(True)
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, no_repeat_ngram_size=2)
    settled = _replayed_steps(monkeypatch)
    assert generate_ids(nm, PROMPT, cfg).token_ids == generate_ids(eager, PROMPT, cfg).token_ids
    assert settled and not any(settled)


def test_the_replayed_body_would_not_wait_for_a_gpu(monkeypatch):
    """What the graph captures may not read the device back: the CPU audit (:mod:`microspec.sync_audit`) counts no
    would-be wait inside the replayed body (forward, head, penalty, warpers, keyed draw) at any step."""
    from microspec.models import graphs
    from microspec.sync_audit import WouldSync

    _stand_in_capture(monkeypatch)
    waits = []

    class Audited(_Replayed):
        def replay(self):
            before = audit.count
            super().replay()
            waits.append(audit.count - before)

    def capture(body, pool, refusals=None):
        out = body()
        return Audited(body, out), out

    monkeypatch.setattr(graphs, "capture", capture)
    _, nm = tiny_pair("gemma3")
    nm.use_cuda_graphs(True)
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, **DECODINGS["warped"])
    with torch.inference_mode(), WouldSync() as audit:
        generate_ids(nm, PROMPT, cfg)
    assert len(waits) >= 20 and not any(waits), (waits, dict(audit.reasons))


@pytest.mark.parametrize("decoding", ["greedy", "penalty", "warped"])
@pytest.mark.parametrize("end", ["eos", "stop", "length", "on_commit"])
def test_the_step_launched_ahead_ends_where_the_eager_generation_does(monkeypatch, decoding, end):
    """Plain decoding launches each step before the last one's token is read (its input that token on the device,
    the penalty's seen ids taking it there): the tokens, the finish reason and the streamed tokens are the eager
    generation's, whether it ends at an EOS, a stop check, its length or a stop from the stream's callback; the
    step launched past the end is undone (the cache holds the prompt and every token but the last, as after eager
    steps), and most steps were launched ahead."""
    _stand_in_capture(monkeypatch)
    _, eager = tiny_pair("llama")
    _, nm = tiny_pair("llama")
    nm.use_cuda_graphs(True)
    cfg = GenerationConfig(max_new_tokens=60, **DECODINGS[decoding])
    ref = generate_ids(eager, PROMPT, cfg).token_ids
    # a token first met past the first steps ends the generation there
    cut = next(i for i, t in enumerate(ref) if i >= 8 and ref.index(t) == i) + 1
    mark = ref[cut - 1]
    kwargs = {"eos": {"eos_token_ids": [mark]}, "stop": {"stop_check": lambda out: out[-1] == mark},
              "length": {}, "on_commit": {}}[end]
    streamed: list[int] = []

    def on_commit(tokens):
        streamed.extend(tokens)
        return end == "on_commit" and mark in tokens

    ahead, launch = [], PlainReplay._launch
    monkeypatch.setattr(PlainReplay, "_launch", lambda self, token, ahead=0: ahead_calls(self, token, ahead))

    def ahead_calls(self, token, n):
        ahead.append(n)
        return launch(self, token, n)

    lengths, result = [], Generation.result
    monkeypatch.setattr(Generation, "result", lambda self: lengths.append(self.cache.length) or result(self))
    want = generate_ids(eager, PROMPT, cfg, on_commit=None, **kwargs)
    for _ in range(2):
        streamed.clear()
        got = generate_ids(nm, PROMPT, cfg, on_commit=on_commit, **kwargs)
        assert got.token_ids == (want.token_ids if end != "on_commit" else ref[:cut]) == streamed
        assert got.finish_reason == ("stop" if end == "on_commit" else want.finish_reason)
        assert lengths[-1] == len(PROMPT) + len(got.token_ids) - 1
    assert len(ref) == 60 and (end == "length" or 1 < cut < 60) and want.token_ids == (ref[:cut] if end in (
        "eos", "stop") else ref)
    assert sum(ahead) >= (100 if end == "length" else 2 * (cut - 4)), ahead
