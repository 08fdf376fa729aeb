"""The autoregressive loop against transformers' generate() on tiny models, and its stopping rules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from support import VOCAB, tiny_pair
from microspec.decoding import GenerationConfig, generate_ids
from microspec.errors import MicrospecError

PROMPT = [1, 10, 20, 30, 11, 21, 31, 12]


def _hf_greedy(hf, prompt, n, **kw):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      eos_token_id=None, pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2},
                                        {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}])
def test_greedy_equals_hf_generate(family, processors):
    hf, nm = tiny_pair(family)
    n = 24
    ref = _hf_greedy(hf, PROMPT, n, **processors)
    got = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True, **processors))
    assert got.token_ids == ref
    assert got.stats.new_tokens == n and got.finish_reason == "length"
    assert got.stats.steps == n - 1 and got.stats.mean_accept_len == 1.0


def test_stops_at_eos_and_includes_it():
    _, nm = tiny_pair("llama")
    free = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=12, ignore_eos=True)).token_ids
    eos = free[5]
    first = free.index(eos)
    got = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=12), eos_token_ids=[eos])
    assert got.token_ids == free[: first + 1]
    assert got.finish_reason == "eos"
    via_stop_ids = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=12, stop_token_ids=(eos,)))
    assert via_stop_ids.token_ids == got.token_ids


def test_max_new_tokens_is_exact_and_stop_check():
    _, nm = tiny_pair("qwen2")
    for n in (1, 2, 7):
        r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=n, ignore_eos=True))
        assert len(r.token_ids) == n
    r = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=20, ignore_eos=True),
                     stop_check=lambda toks: len(toks) == 4)
    assert len(r.token_ids) == 4 and r.finish_reason == "stop"


def test_sampling_is_reproducible_with_a_seed():
    _, nm = tiny_pair("gemma3")
    cfg = dict(max_new_tokens=16, temperature=1.0, top_p=0.9, ignore_eos=True)
    a = generate_ids(nm, PROMPT, GenerationConfig(seed=7, **cfg)).token_ids
    b = generate_ids(nm, PROMPT, GenerationConfig(seed=7, **cfg)).token_ids
    c = generate_ids(nm, PROMPT, GenerationConfig(seed=8, **cfg)).token_ids
    assert a == b and a != c


def test_sampled_first_tokens_follow_the_model_distribution():
    """Chi-square test of 3000 first tokens against the exact (temperature 0.8) distribution."""
    hf, nm = tiny_pair("llama", scale=0.04)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([PROMPT])).logits[0, -1].float() / 0.8, -1)
    counts = torch.zeros(VOCAB)
    for seed in range(3000):
        t = generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=1, temperature=0.8, seed=seed)).token_ids[0]
        counts[t] += 1
    expected = p * 3000
    keep = expected >= 5  # pool rare tokens into one bin
    obs, exp = counts[keep], expected[keep]
    if not bool(keep.all()):
        obs = torch.cat([obs, counts[~keep].sum().view(1)])
        exp = torch.cat([exp, expected[~keep].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    from scipy.stats import chi2 as chi2_dist  # noqa: PLC0415

    assert chi2_dist.sf(chi2, dof) > 0.01, (chi2, dof)
    tv = 0.5 * float((counts / 3000 - p).abs().sum())
    assert tv < 0.1 + math.sqrt(VOCAB / 3000) / 2


def test_prompt_checks():
    _, nm = tiny_pair("llama")
    with pytest.raises(MicrospecError, match="empty"):
        generate_ids(nm, [], GenerationConfig())
    with pytest.raises(MicrospecError, match="context"):
        generate_ids(nm, list(range(300)), GenerationConfig())  # tiny models have a 256-token context
    with pytest.raises(MicrospecError, match="exceeds"):
        generate_ids(nm, PROMPT, GenerationConfig(max_new_tokens=250))
    with pytest.raises(MicrospecError, match="vocabulary"):
        generate_ids(nm, [1, VOCAB + 5], GenerationConfig())


# ------------------------------------------------ caches kept for the next generation (CUDA graphs are theirs)
def test_the_cache_pool_hands_back_a_cache_of_the_same_class_empty():
    from microspec.models.kv_cache import CachePool, KVCache

    assert [CachePool.size_class(n) for n in (1, 300, 512, 513, 1500)] == [512, 512, 512, 1024, 2048]
    made = []

    def make(capacity):
        made.append(KVCache(2, 1, 4, capacity, torch.float32, "cpu"))
        return made[-1]

    pool = CachePool(keep=2)
    a = pool.take(300, make)
    a.length = 200
    pool.give(a)
    pool.give(a)  # given twice: held once
    assert pool.take(400, make) is a and a.length == 0 and a.capacity == 512 and pool.reused == 1
    b = pool.take(400, make)  # a is out: a new one
    assert b is not a and len(made) == 2
    big = pool.take(900, make)
    assert big.capacity == 1024
    for c in (a, b, big):
        pool.give(c)
    assert pool.free == [b, big]  # at most two, the oldest dropped


@pytest.mark.parametrize("drafter", [None, "eagle"])
def test_a_graphed_model_reuses_a_finished_generations_caches(tmp_path, drafter):
    """A model replaying CUDA graphs (on a CPU its forward stays eager, so only the caches' path is exercised here;
    tests/test_cuda.py counts the captures) gives the next generation the caches the last one gave back, target
    and EAGLE draft alike, and the output is that of a model with fresh caches; without graphs, each generation
    gets a new cache of exactly its size."""
    from microspec.decoding.loop import Generation, Setup, cache_slots
    from microspec.drafters import EagleDrafter, EagleHead
    from support import official_checkpoint

    _, plain = tiny_pair("llama")
    _, graphed = tiny_pair("llama")
    graphed.use_cuda_graphs(True)
    path = official_checkpoint(tmp_path / "ck", d=plain.spec.hidden_size)[0] if drafter else None
    heads = {id(m): EagleHead.load(path) for m in (plain, graphed)} if drafter else {}  # a head serves requests

    def run(model, prompt):
        d = EagleDrafter(heads[id(model)], depth=3, top_k=2, total_tokens=5) if drafter else None
        gen = Generation(model, prompt, GenerationConfig(max_new_tokens=12, ignore_eos=True), Setup(drafter=d))
        gen.prefill()
        while gen.finish is None:
            ids, positions, mask = gen.verify_inputs(gen.plan())
            gen.settle(model(ids, gen.cache, positions=positions, mask=mask, taps=gen.taps))
        res = gen.result()
        assert res.stats.graph_captures == (0 if model is graphed else None)  # a CPU forward captures nothing
        return res.token_ids, gen.cache, None if d is None else d.eagle.body.cache_pool

    prompts = ([1, 10, 20, 30, 11, 21, 31, 12], [1, 40, 41, 42, 43, 44, 12, 10, 20])
    first, cache, _ = run(graphed, prompts[0])
    assert cache.capacity == 512 and graphed.cache_pool.free == [cache]
    second, again, body_pool = run(graphed, prompts[1])
    assert again is cache and graphed.cache_pool.reused == 1
    if drafter:
        assert body_pool is not None and body_pool.reused == 1  # the draft cache came back too
    assert (first, second) == (run(plain, prompts[0])[0], run(plain, prompts[1])[0])
    _, fresh, _ = run(plain, prompts[0])
    assert fresh.capacity == cache_slots(len(prompts[0]), GenerationConfig(max_new_tokens=12)) \
        and plain.cache_pool is None


def test_a_caches_graphs_of_every_span_stay_for_the_next_request(monkeypatch):
    """A pooled cache grows through the attention spans again in each request: capturing a longer span keeps the
    shorter spans' graphs (no capture again next request); past MAX_GRAPHS the least recently used goes first."""
    from microspec.models import graphs

    state = graphs._CacheGraphs()

    def capture(key):
        assert state.lookup(key) is None  # first use: eager
        assert state.lookup(key) is True  # second use: capture it
        state.graphs[key] = f"graph {key}"

    short, long = (1, 256, "bf16", 0, 1024), (1, 512, "bf16", 0, 1024)
    capture(short)
    capture(long)
    assert state.lookup(short) == f"graph {short}" and state.lookup(long) == f"graph {long}"
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 3)
    state.lookup(short)  # used last: the long span's graph is now the least recently used
    capture((5, 256, "bf16", 0, 1024))
    capture((5, 512, "bf16", 0, 1024))
    assert list(state.graphs) == [short, (5, 256, "bf16", 0, 1024), (5, 512, "bf16", 0, 1024)]


def test_a_graphed_call_never_replays_a_graph_for_another_owner_under_the_same_key(monkeypatch):
    """The packed draft head's graphs are keyed by id(active): a new request's buffer object may get the id of a
    freed one; the graph held for the old owner (reading its freed buffers) must not replay for the new one, and
    the graphs of owners that are gone are dropped."""
    from microspec.models import graphs

    captures = []

    monkeypatch.setattr(graphs, "capture", lambda body, pool, refusals=None: (
        captures.append(1) or (lambda out: (type("G", (), {"replay": lambda self: None})(), out))(body())))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())

    class Owner:
        def __init__(self, value):
            self.rows = torch.full((2,), float(value))

    def add(owner):
        return lambda h: h + owner.rows

    call = graphs.GraphedCall()
    x = torch.zeros(2)
    owners = {"a": Owner(1)}
    assert torch.equal(call("k", add(owners["a"]), x, owner=owners["a"]), torch.ones(2)) and len(captures) == 1
    call("k", add(owners["a"]), x, owner=owners["a"])
    assert len(captures) == 1 and call.replays == 2  # the same owner: replayed, not captured again
    del owners["a"]
    owners["b"] = Owner(2)  # under the same key (as a reused id would give)
    assert torch.equal(call("k", add(owners["b"]), x, owner=owners["b"]), torch.full((2,), 2.0))
    assert len(captures) == 2
    owners["c"] = Owner(3)
    call("other", add(owners["c"]), x, owner=owners["c"])
    del owners["b"]
    call("third", add(owners["c"]), x, owner=owners["c"])
    assert set(call.graphs) == {"other", "third"}  # the gone owner's graph dropped


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings (Linux)")
def test_a_cpu_cache_is_a_mapping_of_its_own_returned_when_it_goes():
    """A CPU KV cache's keys and values live in a memory mapping of their own (zero-filled), grown into a new one
    with the live slots copied, and unmapped as soon as the last tensor over it goes — a server's memory follows
    its requests' caches without forcing the allocator's threshold for everything else."""
    import gc

    from microspec.models.kv_cache import KVCache

    def mapping(addr: int) -> tuple[int, int] | None:
        for line in Path("/proc/self/maps").read_text().splitlines():
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= addr < hi:
                return lo, hi
        return None

    cache = KVCache(3, 2, 8, 4096, torch.bfloat16, "cpu")
    kv = cache.kv
    assert kv.shape == (3, 2, 2, 4096, 8) and kv.dtype == torch.bfloat16 and not kv.any()
    lo, hi = mapping(kv.data_ptr())
    assert lo == kv.data_ptr() and hi - lo >= kv.numel() * 2  # the mapping starts at the cache: its own
    kv[:, :, :, :5] = 1.5
    cache.length = 5
    cache.grow(9000)
    assert cache.capacity >= 9000 and torch.equal(cache.kv[:, :, :, :5], kv[:, :, :, :5])
    assert not cache.kv[:, :, :, 5:].any() and mapping(cache.kv.data_ptr())[0] == cache.kv.data_ptr()
    old, new = kv.data_ptr(), cache.kv.data_ptr()
    del kv
    gc.collect()
    assert mapping(old) is None  # the first mapping went with its last tensor
    view = cache.kv[1]
    del cache
    gc.collect()
    assert mapping(new) is not None  # a view still holds it
    del view
    gc.collect()
    assert mapping(new) is None


def test_a_generation_has_the_state_its_prefill_and_replay_read():
    """:class:`~microspec.decoding.state.GenerationState` names what the prefill and the plain replay read and call
    of a generation (so that they never import the loop): a generation has each of its members, with the
    parameters they pass."""
    import inspect

    from microspec.decoding.loop import Generation
    from microspec.decoding.state import GenerationState

    _, model = tiny_pair("llama")
    gen = Generation(model, [1, 5, 9], GenerationConfig(max_new_tokens=4, ignore_eos=True))
    names = set(GenerationState.__annotations__) | {n for n in vars(GenerationState) if not n.startswith("_")}
    assert {"model", "cache", "tokens", "commit", "settle", "prompt_out"} <= names
    for name in names:
        assert hasattr(gen, name), name
    for name in ("commit", "settle"):
        want = list(inspect.signature(getattr(GenerationState, name)).parameters)[1:]
        assert list(inspect.signature(getattr(gen, name)).parameters) == want, name
