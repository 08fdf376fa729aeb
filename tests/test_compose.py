"""The composition layer: one validated method description, one builder, the Python API's reach."""

from __future__ import annotations

import pytest
import torch

from support import official_checkpoint
from microspec.compose import Method, build, build_policy
from microspec.method import as_method
from microspec.errors import MicrospecError
from microspec.vocab import MicroSpecVocab, PositionAware, StaticShortlist


def test_method_names_parse_to_descriptions():
    assert Method.parse("ar") == Method()
    assert Method.parse("eagle-full") == Method(drafter="eagle")
    assert Method.parse("microspec") == Method.parse("eagle+microspec") == Method(drafter="eagle", vocab="microspec")
    assert Method.parse("fr-spec-16k") == Method(drafter="eagle", vocab="fr-spec", shortlist_size="16k")
    assert Method.parse("early-exit+vocabtrim") == Method(drafter="early-exit", vocab="vocabtrim",
                                                          shortlist_size="32k")
    m = Method.parse("microspec-w1024-indexed-ctx-kp8", depth=3, top_k=2)
    assert (m.w_max, m.gather, m.sources, m.k_pre_positions, m.depth, m.top_k) == (1024, "indexed", "ctx", 8, 3, 2)
    assert Method.parse("microspec-w8", w_max=16).w_max == 16  # an explicit option wins over the name's
    assert Method(drafter="eagle", top_k=2, total_tokens="6").total_tokens == 6  # the CLI's string, as an int
    assert Method.parse("microspec@adaptive") == Method(drafter="eagle", vocab="microspec", adaptive=True)
    with pytest.raises(MicrospecError, match="--adaptive applies to --drafter ngram"):
        Method.parse("ar@adaptive")
    assert Method.parse("microspec@lookup") == Method(drafter="eagle", vocab="microspec", lookup=2)
    assert Method.parse("eagle-full@lookup3@adaptive") == Method(drafter="eagle", lookup=3, adaptive=True)
    assert Method.parse("early-exit+microspec@adaptive@lookup1").lookup == 1
    for bad in ("ngram@lookup", "ar@lookup"):
        with pytest.raises(MicrospecError, match="--lookup applies to --drafter early-exit, eagle or model"):
            Method.parse(bad)
    with pytest.raises(MicrospecError, match="must be >= 1"):
        Method.parse("microspec@lookup0")
    with pytest.raises(MicrospecError, match="@lookup given twice"):
        Method.parse("microspec@lookup@lookup3")
    for bad, needle in (("foo", "unknown method"), ("ngram+microspec", "LM head"), ("microspec-zz", "options are"),
                        ("eagle+fr-spec-lots", "unknown vocabulary")):
        with pytest.raises(MicrospecError, match=needle):
            Method.parse(bad)
    with pytest.raises(MicrospecError, match="^a method is a name or a Method, not a dict$"):
        as_method({"drafter": "eagle"})  # e.g. the arguments of build(method, lm) swapped: one short line


@pytest.mark.parametrize("options, needle", [
    (dict(drafter="ngram", top_k=2), "--top-k applies to --drafter early-exit, eagle or model, not to --drafter ngram"),
    (dict(drafter="eagle", total_tokens=8), "needs --top-k"),
    (dict(drafter="eagle", total_tokens="auto"), "auto needs --top-k"),
    (dict(drafter="eagle", total_tokens="many", top_k=2), "integer or 'auto'"),
    (dict(drafter="eagle", draft_layers=2), "--draft-layers applies to --drafter early-exit"),
    (dict(drafter="model"), "needs --draft"),
    (dict(drafter="ngram", draft="x"), "--draft applies to --drafter eagle or model"),
    (dict(drafter="eagle", depth=0), "--depth must be >= 1"),
    (dict(drafter="eagle", head_mode="some"), "--head-mode"),
    (dict(drafter="eagle", vocab="dynaspec", w_max=5), "--w-max applies to --vocab microspec, not to --vocab dynaspec"),
    (dict(drafter="eagle", vocab="microspec", artifact="d"), "reads no file"),
    (dict(drafter="eagle", vocab="microspec", gather="rows"), "--gather"),
    (dict(drafter="eagle", vocab="full", position_aware="4,2"), "--position-aware applies to --vocab fr-spec"),
    (dict(drafter="eagle", vocab="microspec", position_aware="4"), "two budgets"),
])
def test_bad_methods_fail_in_one_line_before_any_model(options, needle):
    with pytest.raises(MicrospecError, match=needle) as info:
        Method(**options)
    assert "\n" not in str(info.value)


def test_build_policy_by_description(tmp_path):
    torch.save(list(range(100))[::-1], tmp_path / "map.pt")
    p = build_policy(Method(drafter="eagle", vocab="fr-spec", artifact=str(tmp_path / "map.pt"), shortlist_size=5,
                            position_aware="3,2"), 100, always=[0])
    assert isinstance(p, PositionAware) and isinstance(p.policy, StaticShortlist)
    assert p.active(0).ids.tolist() == [0, 99, 98, 97]  # the always-kept 0, then the 3 most frequent ids
    m = build_policy(Method.parse("microspec-w16-indexed-kp4"), 100)
    assert isinstance(m, MicroSpecVocab) and (m.w_max, m.gather, m.prompt_positions, m.fused) == (16, "indexed", 4,
                                                                                                 False)
    with pytest.raises(MicrospecError, match="needs --freq-file"):
        build_policy(Method(drafter="eagle", vocab="fr-spec"), 100)


def test_python_api_reaches_every_method_in_one_line(tiny_model_dir, tmp_path):
    from microspec import load_model
    from microspec.api import generate

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    head, _, _ = official_checkpoint(tmp_path / "eagle")
    cfg = dict(max_new_tokens=12, ignore_eos=True, repetition_penalty=1.2)
    ref = generate(lm, "w5 w6 w7 w5 w6", method="ar", **cfg)
    assert ref.stats.steps == 11  # plain decoding: one token a step after the prefill's
    for method in ("ngram", Method.parse("eagle+microspec", draft=str(head)),
                   Method.parse("microspec-w8-indexed", draft=str(head), top_k=2, depth=3),
                   Method(drafter="early-exit", vocab="microspec", draft_layers=1, top_k=2)):
        res = generate(lm, "w5 w6 w7 w5 w6", method=method, **cfg)
        assert res.token_ids == ref.token_ids and res.text == ref.text
    engine = build(Method.parse("eagle+microspec", draft=str(head)), lm)  # built once, reused
    runs = [engine.generate("w5 w6 w7 w5 w6", **cfg) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids == ref.token_ids
    assert runs[0].stats.accept_lengths == runs[1].stats.accept_lengths  # a fresh policy each generation
    assert engine.describe()["vocab"] == "microspec" and engine.describe()["tree"]["top_k"] == 2  # the CPU tree
    other = load_model(str(tiny_model_dir), dtype="fp32")
    with pytest.raises(MicrospecError, match="another model"):
        generate(other, "w5", method=engine)
    with pytest.raises(MicrospecError, match="no EAGLE head ships"):
        generate(lm, "w5", method="eagle+microspec")  # a local model has no shipped head


def test_auto_starts_where_it_measured_faster():
    from microspec.auto import MEASURED, decoding_kind, start_arm
    from microspec.decoding import GenerationConfig

    greedy, penalty = GenerationConfig(), GenerationConfig(repetition_penalty=1.2)
    sampling = GenerationConfig(temperature=0.7)
    both = GenerationConfig(temperature=0.7, repetition_penalty=1.2)
    assert [decoding_kind(c) for c in (greedy, penalty, sampling, GenerationConfig(no_repeat_ngram_size=3), both,
                                       GenerationConfig(temperature=0.7, no_repeat_ngram_size=3))] == \
        ["greedy", "penalty", "sampling", "penalty", "sampling-penalty", "sampling-penalty"]
    # a packed CPU target: prompt lookup on greedy decoding and sampling, plain decoding where every method lost
    for head in (True, False):  # needs no head
        assert start_arm("cpu-gguf", "greedy", head)[0] == "lookup"
    assert start_arm("cpu-gguf", "penalty", True)[0] == "plain"
    assert start_arm("cpu-gguf", "sampling", True)[0] == "lookup"
    assert start_arm("cpu-gguf", "sampling-penalty", True)[0] == "plain"  # as with the penalty greedily
    # a dense CPU target: prompt lookup on greedy decoding, plain decoding with a penalty and when sampling
    assert start_arm("cpu", "greedy", True)[0] == "lookup"
    for kind in ("penalty", "sampling", "sampling-penalty"):
        assert start_arm("cpu", kind, True)[0] == "plain"
    # CUDA at batch 1: the trees' draft step is host-bound, so prompt lookup greedily and under a penalty, plain
    # decoding when sampling (with a penalty too: the slower of the two)
    for kind in ("greedy", "penalty"):
        assert start_arm("cuda", kind, True)[0] == "lookup"
    for kind in ("sampling", "sampling-penalty"):
        assert start_arm("cuda", kind, True)[0] == "plain"
    for kind in ("greedy", "penalty", "sampling", "sampling-penalty"):  # a device kind without rows: the head
        assert ("mps", kind) not in MEASURED
        assert start_arm("mps", kind, True)[0] == "eagle"
    with pytest.raises(MicrospecError, match="unknown decoding kind"):
        start_arm("cpu", "beam", True)
    arm, why = start_arm("mps", "sampling", False)
    assert arm == "plain" and "no EAGLE head" in why


def test_auto_engine_runs_each_request_on_its_decodings_engine(tiny_model_dir, tmp_path):
    """A server's ``--drafter auto`` (the decoding is each request's): one engine per decoding kind on one model,
    the request's kind picks it, and every kind's output is plain decoding's."""
    from microspec import load_model
    from microspec.auto import AutoEngine
    from microspec.decoding import GenerationConfig

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    head, _, _ = official_checkpoint(tmp_path / "eagle")
    eagle = build(Method.parse("eagle+microspec@adaptive", draft=str(head)), lm)
    auto = AutoEngine({"greedy": build("ngram@adaptive", lm), "penalty": eagle, "sampling": build("ar", lm),
                       "sampling-penalty": build("ngram", lm)})
    assert auto.lm is lm
    assert auto.summary() == ("greedy: ngram (adaptive); penalty: eagle+microspec (adaptive); sampling: plain; "
                              "sampling-penalty: ngram")
    ids = lm.tokenizer("w5 w6 w7 w5 w6").input_ids
    plain = build("ar", lm)
    for cfg, want in ((GenerationConfig(max_new_tokens=10, ignore_eos=True), "ngram"),
                      (GenerationConfig(max_new_tokens=10, ignore_eos=True, repetition_penalty=1.3), "eagle"),
                      (GenerationConfig(max_new_tokens=10, ignore_eos=True, temperature=0.8, seed=3), "none"),
                      (GenerationConfig(max_new_tokens=10, ignore_eos=True, temperature=0.8, seed=3,
                                        repetition_penalty=1.3), "ngram")):
        assert auto.engine_for(cfg).method.drafter == want
        assert auto.generate_ids(ids, cfg).token_ids == plain.generate_ids(ids, cfg).token_ids
    with pytest.raises(MicrospecError, match="every decoding kind"):
        AutoEngine({"greedy": plain})
    # prompt lookup first, around the EAGLE drafter: built from the method, described, lossless
    from microspec.drafters.lookup_first import LookupFirst

    looked = build(Method.parse("eagle+microspec@lookup", draft=str(head)), lm)
    assert isinstance(looked.drafter, LookupFirst) and looked.tree["lookup"] == {"min_ngram": 2, "tokens": 10}
    assert looked.describe()["lookup"] == 2
    assert AutoEngine({"greedy": looked, "penalty": plain, "sampling": plain,
                       "sampling-penalty": plain}).summary().startswith(
        "greedy: eagle+microspec, prompt lookup first;")
    cfg = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    r = looked.generate_ids(ids, cfg)
    assert r.token_ids == plain.generate_ids(ids, cfg).token_ids and r.stats.lookup_steps > 0  # "w5 w6" repeats


def test_prompt_lookup_draft_length_by_device():
    """Prompt lookup drafts up to 10 tokens; on a packed CPU target a chain sized step by step (measured), 3 fixed
    tokens inside composites (auto's short arm, lookup first); what --depth says otherwise."""
    from microspec.drafters import spec
    from microspec.drafters.ngram import chain_length

    ngram = spec("ngram").shape
    assert ngram("cpu", Method(drafter="ngram")) == {"depth": 10} == ngram("cuda", Method(drafter="ngram"))
    assert ngram("cpu-gguf", Method(drafter="ngram")) == {"depth": "auto"}
    assert chain_length("cpu-gguf") == {"depth": 3} and chain_length("cuda") == {"depth": 10}
    assert ngram("cpu-gguf", Method(drafter="ngram", depth=7)) == {"depth": 7}
