"""microspec bench: metric arithmetic, answer files and report from a tiny-model run, the lossless detector."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from microspec.bench.metrics import (accept_per_position, aggregate, hard_mismatches, mismatches, question_speed,
                                     repeated_ngrams, summarize)
from microspec.cli import main


def _rec(qid, cat, new_tokens, wall, accepts=(), depths=(), token_ids=None):
    return {"question_id": qid, "category": cat, "choices": [{
        "turns": ["x"] * len(new_tokens), "new_tokens": list(new_tokens), "wall_time": list(wall),
        "accept_lengths": list(accepts), "draft_depths": list(depths),
        "token_ids": token_ids if token_ids is not None else [[1, 2, 3]] * len(new_tokens)}]}


def test_speedup_is_the_ratio_of_mean_per_question_speeds():
    ar = [_rec(1, "a", [10], [1.0]), _rec(2, "b", [30], [1.0])]  # 10 and 30 tok/s: mean 20
    fast = [_rec(1, "a", [10], [0.5]), _rec(2, "b", [30], [0.5])]  # 20 and 60 tok/s: mean 40
    out = summarize({"ar": ar, "fast": fast})["methods"]
    assert out["ar"]["overall"]["tokens_per_s"] == 20 and out["fast"]["overall"]["tokens_per_s"] == 40
    assert out["fast"]["overall"]["speedup"] == 2.0 and out["ar"]["overall"]["speedup"] == 1.0
    assert out["fast"]["categories"]["a"]["speedup"] == 2.0 and out["fast"]["categories"]["b"]["tokens_per_s"] == 60
    # not total tokens over total time (40 / 1.0 s = 40 here only by chance): make the questions unequal
    skew = [_rec(1, "a", [10], [0.1]), _rec(2, "b", [30], [3.0])]  # 100 and 10 tok/s
    assert aggregate(skew)["tokens_per_s"] == 55.0


def test_multi_turn_question_speed_sums_its_turns():
    r = _rec(1, "mt_bench", [10, 30], [1.0, 1.0])
    assert aggregate([r])["tokens_per_s"] == 20.0 and aggregate([r])["new_tokens"] == 40


def test_vllm_draft_chain_length_is_a_number():
    """bench's --depth reaches the vLLM peers as their chain's length in tokens, an integer (a string there broke
    the summary's per-position acceptance after every prompt had run); a depth that is not a count is refused."""
    from microspec.bench.methods import configure, parse_method
    from microspec.bench.runners import _vllm_fields
    from microspec.errors import MicrospecError

    spec = configure([parse_method("vllm-microspec")], "gemma-3-270m", depth="3")[0]
    assert spec.tokens == 3 and isinstance(spec.tokens, int)
    fields = _vllm_fields({"num_drafts": 4, "num_accepted_tokens_per_pos": [3, 1, 0]}, spec.tokens)
    assert accept_per_position(fields["accept_lengths"], fields["draft_depths"]) == [0.75, 0.25, 0.0]
    for bad in ("auto", "0"):
        with pytest.raises(MicrospecError, match="--depth"):
            configure([parse_method("vllm-microspec")], "gemma-3-270m", depth=bad)


def test_tau_counts_the_bonus_token_and_pools_steps():
    # two questions: steps committing (3, 1) and (2,): tau = 6 / 3 steps = 2.0 (not the mean of per-question means)
    recs = [_rec(1, "a", [4], [1.0], accepts=[3, 1], depths=[4, 4]), _rec(2, "a", [2], [1.0], accepts=[2],
                                                                        depths=[2])]
    m = aggregate(recs)
    assert m["mean_accept_len"] == 2.0
    # position 1: 3 steps reached it, 2 accepted >= 1 draft; position 2: 3 steps, 1; positions 3-4: 2 steps, 1, 0
    assert m["accept_per_position"] == [round(2 / 3, 4), round(1 / 3, 4), 0.0, 0.0]
    assert accept_per_position([1, 1], [0, 0]) == []
    assert aggregate([_rec(1, "a", [4], [1.0])])["mean_accept_len"] is None  # a peer without steps


def test_repeated_ngrams():
    assert repeated_ngrams([1, 2, 3, 4, 1, 2, 3, 4]) == (1, 5)
    assert repeated_ngrams([1, 2, 3]) == (0, 0)
    assert repeated_ngrams([7] * 10) == (6, 7)


def test_mismatch_detector_reports_the_first_differing_token():
    ref = [_rec(1, "a", [4], [1.0], token_ids=[[5, 6, 7, 8]])]
    same = [_rec(1, "a", [4], [1.0], token_ids=[[5, 6, 7, 8]])]
    bad = [_rec(1, "a", [4], [1.0], token_ids=[[5, 6, 9, 8]])]
    short = [_rec(1, "a", [2], [1.0], token_ids=[[5, 6]])]
    assert mismatches(ref, same) == []
    (m,) = mismatches(ref, bad)
    assert m["position"] == 2 and m["expected"] == [7, 8] and m["got"] == [9, 8]
    assert mismatches(ref, short)[0]["position"] == 2


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    rows = [{"question_id": 1, "category": "writing", "turns": ["w5 w6 w7 w5 w6", "w9 w10"]},
            {"question_id": 2, "category": "qa", "turns": ["w11 w12 w13 w11 w12 w13"]},
            {"question_id": 3, "category": "qa", "turns": ["w20 w21"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_bench_tiny_run_writes_results_answers_report_and_plots(capsys, tiny_model_dir, tmp_path):
    out_dir = tmp_path / "bench"
    rc, out, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                        "--methods", "ar,ngram,early-exit+microspec,early-exit+full,early-exit+microspec@lookup1",
                        "--max-new-tokens", "10",
                        "--ignore-eos", "--draft-layers", "1", "--out", out_dir)
    assert rc == 0, err
    assert "LOSSLESS MISMATCH" not in err and "bench greedy [" in err
    for dec in ("greedy", "greedy-rp1.2"):
        res = json.loads((out_dir / dec / "results.json").read_text())
        assert set(res["methods"]) == {"ar", "ngram", "early-exit+microspec", "early-exit+full",
                                       "early-exit+microspec@lookup1"}
        assert res["mismatches"] == {} and res["meta"]["repetition_penalty"] == (1.0 if dec == "greedy" else 1.2)
        ar, ms = res["methods"]["ar"], res["methods"]["early-exit+microspec"]
        assert ar["overall"]["speedup"] == 1.0 and ar["overall"]["mean_accept_len"] == 1.0
        assert set(ar["categories"]) == {"mt_bench", "qa"}
        assert "active_vocab_mean" in ms["overall"]
        assert sum(ms["overall"]["time_split"].values()) == pytest.approx(1.0, abs=0.01)
        lines = [json.loads(x) for x in (out_dir / dec / "answers" / "early-exit+microspec.jsonl").read_text()
                 .splitlines()]
        assert [x["question_id"] for x in lines] == ["1", "2", "3"]
        c = lines[0]["choices"][0]
        assert len(c["turns"]) == 2 and c["new_tokens"] == [10, 10] and len(c["wall_time"]) == 2
        assert sum(c["accept_lengths"]) == 20 - 2  # the prefill's first token of each turn belongs to no step
        ref = [json.loads(x) for x in (out_dir / dec / "answers" / "ar.jsonl").read_text().splitlines()]
        assert [x["choices"][0]["token_ids"] for x in ref] == [x["choices"][0]["token_ids"] for x in lines]
        # the report's numbers, recomputed from the answer files (Spec-Bench's conventions)
        steps = [a for x in lines for ch in x["choices"] for a in ch["accept_lengths"]]
        assert all(a >= 1 for a in steps)  # every step commits at least the target's own token
        assert ms["overall"]["mean_accept_len"] == round(sum(steps) / len(steps), 4)
        covered = sum(ch["covered"] for x in lines for ch in x["choices"])
        checked = sum(ch["coverage_tokens"] for x in lines for ch in x["choices"])
        assert checked == 4 * 10 - 4 and ms["overall"]["coverage"] == round(covered / checked, 4)

        def mean_speed(recs):
            return sum(sum(sum(ch["new_tokens"]) for ch in x["choices"]) / sum(sum(ch["wall_time"])
                                                                                 for ch in x["choices"])
                       for x in recs) / len(recs)

        assert ms["overall"]["speedup"] == pytest.approx(mean_speed(lines) / mean_speed(ref), rel=1e-3)
        assert (out_dir / dec / "speed.png").stat().st_size > 0 and (out_dir / dec / "acceptance.png").is_file()
        # prompt lookup first: its share of the steps, from the answer files; lossless like the rest
        looked = [json.loads(x) for x in (out_dir / dec / "answers" / "early-exit+microspec@lookup1.jsonl")
                  .read_text().splitlines()]
        assert [x["choices"][0]["token_ids"] for x in ref] == [x["choices"][0]["token_ids"] for x in looked]
        n_look = sum(ch["lookup_steps"] for x in looked for ch in x["choices"])
        n_steps = sum(n for x in looked for ch in x["choices"] for n in ch["decoding_steps"])
        assert 0 < n_look <= n_steps
        assert res["methods"]["early-exit+microspec@lookup1"]["overall"]["lookup_share"] == round(n_look / n_steps, 4)
        assert "lookup_share" not in ms["overall"]
    report = (out_dir / "report.md").read_text()
    assert "## greedy-rp1.2" in report and "| early-exit+microspec |" in report and "Lossless check" in report


def test_bench_reports_autos_tau_its_choosing_cost_and_each_methods_worst_question(capsys, tiny_model_dir,
                                                                                    tmp_path):
    """auto's tau is its generations' mean accepted length (every step counted, whichever arm drafted it), its
    choosing cost a share of its time, and every method's worst question its lowest speed-up over ar."""
    out_dir = tmp_path / "bench"
    rc, out, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                        "--methods", "ar,auto,ngram", "--max-new-tokens", "24", "--ignore-eos",
                        "--repetition-penalties", "1.0", "--out", out_dir)
    assert rc == 0, err
    res = json.loads((out_dir / "greedy" / "results.json").read_text())
    lines = [json.loads(x) for x in (out_dir / "greedy" / "answers" / "auto.jsonl").read_text().splitlines()]
    steps = [a for x in lines for ch in x["choices"] for a in ch["accept_lengths"]]
    chosen = sum(n for x in lines for ch in x["choices"] for n in ch["auto_steps"].values())
    auto = res["methods"]["auto"]["overall"]
    assert chosen == len(steps) and auto["mean_accept_len"] == round(sum(steps) / len(steps), 4)
    assert sum(steps) == sum(sum(ch["new_tokens"]) - len(ch["new_tokens"]) for x in lines for ch in x["choices"])
    assert 0 < auto["auto_overhead_share"] < 1 and sum(auto["auto_share"].values()) == pytest.approx(1, abs=1e-3)
    ar = {x["question_id"]: x for x in map(json.loads, (out_dir / "greedy" / "answers" / "ar.jsonl").open())}
    for name in ("auto", "ngram"):
        recs = [json.loads(x) for x in (out_dir / "greedy" / "answers" / f"{name}.jsonl").read_text().splitlines()]
        worst = min((question_speed(r) / question_speed(ar[r["question_id"]]), r["question_id"]) for r in recs)
        low = res["methods"][name]["overall"]["min_question_speedup"]
        assert (low["speedup"], low["question"]) == (round(worst[0], 4), worst[1])
        speeds = res["methods"][name]["overall"]["question_tokens_per_s"]  # each question's, to compare runs by
        assert speeds == {str(r["question_id"]): round(question_speed(r), 3) for r in recs} and len(speeds) >= 2
    report = (out_dir / "report.md").read_text()
    assert f"| {low['speedup']:.2f}x ({low['question']}) |" in report and "auto: steps by arm" in report


def test_second_turn_carries_the_methods_own_first_answer(tiny_model_dir):
    from microspec import load_model
    from microspec.api import encode_conversation, encode_prompt

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    one = encode_conversation(lm, ["w1 w2"], [])
    assert one == encode_prompt(lm, "w1 w2")
    two = encode_conversation(lm, ["w1 w2", "w5"], ["w3 w4"])
    assert two == list(lm.tokenizer("w1 w2\n\nw3 w4\n\nw5").input_ids)


class _Corrupt:
    """Wraps a runner and changes one generated token: the lossless detector must fire."""

    def __init__(self, inner):
        self.inner = inner

    def describe(self):
        return {"corrupted": True}

    def run(self, ids, cfg):
        turn = self.inner.run(ids, cfg)
        turn.token_ids = list(turn.token_ids)
        turn.token_ids[3] = (turn.token_ids[3] + 1) % 90
        return turn


def test_near_ties_are_told_apart_from_hard_mismatches():
    tie = {"question_id": 1, "turn": 0, "near_tie": True, "gap": 0.01}
    hard = {"question_id": 2, "turn": 0, "near_tie": False, "gap": 3.0}
    after = {"question_id": 2, "turn": 1, "after_divergence": True}
    after_tie = {"question_id": 1, "turn": 1, "after_divergence": True}
    unknown = {"question_id": 3, "turn": 0}  # no verdict (an output ended early): counts as hard
    found = {"a": [tie, after_tie], "b": [tie, hard, after], "c": [unknown]}
    assert hard_mismatches(found) == {"b": [hard, after], "c": [unknown]}
    assert hard_mismatches(None) == {} and hard_mismatches({"a": [tie]}) == {}


def test_mismatch_detector_fires_on_a_corrupted_run(tiny_model_dir, tmp_path, capsys):
    import torch

    from microspec import load_model
    from microspec.bench import Decoding, bench, load_questions, parse_methods
    from microspec.bench.runners import make_runner

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    specs = parse_methods("ar,ngram")
    runners = {s.name: make_runner(s, lm, dtype=torch.float32) for s in specs}
    runners["ngram"] = _Corrupt(runners["ngram"])
    res = bench(lm, specs, load_questions([str(_data(tmp_path))]), [Decoding()], tmp_path / "out",
                dtype=torch.float32, max_new_tokens=8, ignore_eos=True, warmup=0, runners=runners)
    found = res["greedy"]["mismatches"]["ngram"]
    assert len(found) == 4 and {m["position"] for m in found} == {3}  # 4 turns in 3 questions
    # each question's first divergence is diagnosed: ar took the argmax, so its token's logit is higher, by far more
    # than fp32 rounding; the multi-turn question's second turn is marked as following from its first
    firsts = [m for m in found if not m.get("after_divergence")]
    assert len(firsts) == 3 and all(m["gap"] > 0 and not m["near_tie"] for m in firsts), firsts
    assert sum(bool(m.get("after_divergence")) for m in found) == 1
    assert set(hard_mismatches(res["greedy"]["mismatches"])) == {"ngram"}
    assert "LOSSLESS MISMATCH" in capsys.readouterr().err
    assert "**LOSSLESS MISMATCH**" in (tmp_path / "out" / "report.md").read_text()


class _Failing(_Corrupt):
    """A runner that raises on its second question (the first has two turns)."""

    calls = 0

    def run(self, ids, cfg):
        self.calls += 1
        if self.calls > 2:
            raise RuntimeError("the peer's process died")
        return self.inner.run(ids, cfg)


def test_a_failing_method_keeps_what_the_others_measured(tiny_model_dir, tmp_path):
    """One method that fails leaves the others' results written and ends the bench with one error line."""
    import json

    import torch

    from microspec import load_model
    from microspec.bench import Decoding, bench, load_questions, parse_methods
    from microspec.bench.runners import make_runner
    from microspec.errors import MicrospecError

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    specs = parse_methods("ar,ngram")
    runners = {s.name: make_runner(s, lm, dtype=torch.float32) for s in specs}
    runners["ngram"] = _Failing(runners["ngram"])
    with pytest.raises(MicrospecError, match=r"ngram \(greedy\) failed \(first: RuntimeError: the peer's process "
                                             r"died \(question"):
        bench(lm, specs, load_questions([str(_data(tmp_path))]), [Decoding()], tmp_path / "out",
              dtype=torch.float32, max_new_tokens=8, ignore_eos=True, warmup=0, runners=runners)
    res = json.loads((tmp_path / "out" / "greedy" / "results.json").read_text())
    assert list(res["methods"]) == ["ar"] and res["methods"]["ar"]["overall"]["questions"] == 3
    assert "RuntimeError" in res["failed"]["ngram"] and (tmp_path / "out" / "report.md").is_file()
    assert len((tmp_path / "out" / "greedy" / "answers" / "ngram.jsonl").read_text().splitlines()) == 1


def test_a_failing_report_is_one_line_and_keeps_the_results(tiny_model_dir, tmp_path, monkeypatch):
    import torch

    import microspec.bench.report as report
    from microspec import load_model
    from microspec.bench import Decoding, bench, load_questions, parse_methods
    from microspec.errors import MicrospecError

    def broken(*a, **k):
        raise RuntimeError("no room {here}")

    monkeypatch.setattr(report, "write_report", broken)
    lm = load_model(str(tiny_model_dir), dtype="fp32")
    with pytest.raises(MicrospecError, match=r"^bench: the report failed \(RuntimeError: no room \{here\}\); every "
                                             r"decoding's results.json is written"):
        bench(lm, parse_methods("ar"), load_questions([str(_data(tmp_path))]), [Decoding()], tmp_path / "out",
              dtype=torch.float32, max_new_tokens=4, ignore_eos=True, warmup=0)
    assert (tmp_path / "out" / "greedy" / "results.json").is_file()


def test_llama_cpp_lookup_is_a_peer():
    from microspec.bench.methods import PEERS, available_methods, parse_method

    spec = parse_method("llama-cpp-lookup")
    assert (spec.name, spec.kind, spec.is_peer, spec.method) == ("llama-cpp-lookup", "llama-cpp", True, None)
    assert parse_method("llama-cpp").kind == "llama-cpp"
    assert "llama-cpp-lookup" in PEERS and "llama-cpp-lookup" in available_methods()


class _CorruptPeer(_Corrupt):
    """A corrupted runner that is a peer (as its spec says)."""

    def __init__(self, inner):
        from microspec.bench.methods import parse_method

        super().__init__(inner)
        self.spec = parse_method("llama-cpp-lookup")


def test_peer_differences_are_not_lossless_mismatches(tiny_model_dir, tmp_path, capsys):
    import torch

    from microspec import load_model
    from microspec.bench import Decoding, bench, load_questions, parse_methods
    from microspec.bench.metrics import lossless_verdict
    from microspec.bench.run import run_decoding
    from microspec.bench.runners import make_runner

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    specs = parse_methods("ar,llama-cpp-lookup")
    ar = make_runner(specs[0], lm, dtype=torch.float32)
    runners = {"ar": ar, "llama-cpp-lookup": _CorruptPeer(ar)}
    records = load_questions([str(_data(tmp_path))])
    res = bench(lm, specs, records, [Decoding()], tmp_path / "out", dtype=torch.float32, max_new_tokens=8,
                ignore_eos=True, warmup=0, runners=runners)
    found = res["greedy"]["mismatches"]
    assert set(found) == {"llama-cpp-lookup"} and len(found["llama-cpp-lookup"]) == 4  # still recorded
    err = capsys.readouterr().err
    assert "LOSSLESS MISMATCH" not in err
    assert "peer difference: llama-cpp-lookup's tokens differ from ar on question 1 (mt_bench), turn 0, token 3" in err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "LOSSLESS MISMATCH" not in report and "Lossless check: every engine method's greedy tokens" in report
    assert "Peers whose tokens differ from `ar`'s (other kernels or weights; informational): llama-cpp-lookup " \
           "(4 turns)." in report
    assert lossless_verdict([found], "report.md", peers={"llama-cpp-lookup"}) == (None, None)
    assert "LOSSLESS MISMATCH in llama-cpp-lookup" in lossless_verdict([found], "report.md")[1]  # not a peer: error
    # without the peers named, the runners' specs tell them
    lines: list[str] = []
    run_decoding(lm, {"ar": ar, "llama-cpp-lookup": _CorruptPeer(ar)}, records[:1], Decoding(), max_new_tokens=8,
                 out_dir=tmp_path / "direct", ignore_eos=True, warmup=0, log=lines.append)
    assert any(x.startswith("peer difference: llama-cpp-lookup's tokens differ") for x in lines), lines
    assert not any("LOSSLESS MISMATCH" in x for x in lines)


@pytest.mark.real
def test_llama_cpp_lookup_peer_drafts_on_gemma():
    """llama.cpp's own prompt lookup decoding on Gemma 3 270M's GGUF file, through the runner alone (the file and
    the few facts the runner reads: a whole ``microspec bench`` run would load the packed model for ar as well):
    it drafts from the prompt, and its steps become accept lengths."""
    from types import SimpleNamespace

    pytest.importorskip("llama_cpp")
    from microspec.bench.methods import parse_method
    from microspec.bench.runners import make_runner
    from microspec.decoding import GenerationConfig
    from microspec.errors import MicrospecError
    from microspec.models.registry import BUILTINS, resolve

    if importlib.util.find_spec(BUILTINS["gemma-3-270m"].package) is None:
        pytest.skip(f"needs the Gemma 3 270M GGUF package ({BUILTINS['gemma-3-270m'].install})")
    _, _, path = resolve("gemma-3-270m")
    lm = SimpleNamespace(name="gemma-3-270m", source=path, max_context=32768, eos_token_ids=(1, 106),
                         model=SimpleNamespace(spec=SimpleNamespace(vocab_size=262144)))
    runner = make_runner(parse_method("llama-cpp-lookup"), lm, dtype=None, threads=2)
    desc = runner.describe()
    assert desc["draft_model"].startswith("LlamaPromptLookupDecoding(num_pred_tokens=10,") and desc["n_ctx"] == 8192
    assert desc["cpu_features"] and all(f.isupper() or f.isalnum() for f in desc["cpu_features"])  # what it ran
    ids = runner.llm.tokenize(b"The capital of France is Paris. The capital of France is Paris. The capital of "
                              b"France is", add_bos=True)
    cfg = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    turn = runner.run(ids, cfg)
    fields = turn.choice_fields()
    assert len(turn.token_ids) == 8 and sum(fields["accept_lengths"]) == 8 - 1  # the prefill's token: no step
    assert fields["decoding_steps"] == len(fields["accept_lengths"]) == len(fields["draft_depths"])
    assert max(fields["accept_lengths"]) > 1  # the repeated sentence was drafted from the prompt
    again = runner.run(ids, cfg)  # a new turn starts afresh
    assert again.token_ids == turn.token_ids and again.fields == turn.fields
    with pytest.raises(MicrospecError, match="exceed its context of 8192"):
        runner.run([2] * 8190, cfg)


def test_hf_peers_match_ar_in_fp32(capsys, tiny_model_dir, tmp_path):
    out_dir = tmp_path / "peers"
    rc, _, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                      "--methods", "ar,hf-ar,hf-prompt-lookup,hf-early-exit", "--max-new-tokens", "8",
                      "--ignore-eos", "--draft-layers", "1", "--repetition-penalties", "1.0,1.3", "--warmup", "0",
                      "--limit", "1", "--out", out_dir)
    assert rc == 0, err
    for dec in ("greedy", "greedy-rp1.3"):
        res = json.loads((out_dir / dec / "results.json").read_text())
        assert res["mismatches"] == {}, res["mismatches"]
        assert res["methods"]["hf-ar"]["overall"]["mean_accept_len"] is None
        assert res["methods"]["hf-early-exit"]["overall"]["tokens_per_s"] > 0
    assert res["meta"]["methods"]["hf-early-exit"]["assistant_early_exit"] == 1


def test_sampling_run_reports_no_token_comparison(capsys, tiny_model_dir, tmp_path):
    rc, _, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                      "--methods", "ar,ngram", "--max-new-tokens", "6", "--temperature", "0.8",
                      "--repetition-penalties", "1.0", "--repeats", "2", "--limit", "1", "--out", tmp_path / "s")
    assert rc == 0, err
    res = json.loads((tmp_path / "s" / "T0.8" / "results.json").read_text())
    assert res["mismatches"] is None
    line = json.loads((tmp_path / "s" / "T0.8" / "answers" / "ngram.jsonl").read_text().splitlines()[0])
    assert [c["index"] for c in line["choices"]] == [0, 1]
    rc, out, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                        "--methods", "ar,ngram", "--max-new-tokens", "4", "--temperatures", "0,0.7",
                        "--repetition-penalties", "1.0,1.2", "--limit", "1", "--warmup", "0", "--out", tmp_path / "m")
    assert rc == 0, err
    assert sorted(p.name for p in (tmp_path / "m").iterdir() if p.is_dir()) == ["T0.7", "T0.7-rp1.2", "greedy",
                                                                                 "greedy-rp1.2"]
    assert json.loads((tmp_path / "m" / "greedy" / "results.json").read_text())["mismatches"] == {}
    rc, _, err = _run(capsys, "bench", "--model", tiny_model_dir, "--data", _data(tmp_path), "--temperatures",
                      "0,-1", "--out", tmp_path / "x")
    assert rc == 2 and "--temperatures" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, needle", [
    (["--methods", "ar,warp-drive"], "unknown method 'warp-drive'"),
    (["--methods", "ar,coral"], "needs --coral"),
    (["--methods", "ar,specvocab"], "needs --specvocab"),
    (["--methods", "ar,dynaspec"], "needs --dynaspec"),
    (["--methods", "ar,fr-spec-32k"], "needs --freq-file"),
    (["--methods", "ar,ngram+microspec"], "needs a drafter with an LM head"),
    (["--methods", "ar,ar"], "twice"),
    (["--methods", "ar,microspec-kpx"], "microspec options are"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--repetition-penalties", "1.0,x"], "must be numbers"),
    (["--categories", "poetry"], "no questions of categories"),
    (["--methods", "ar,llama-cpp"], "llama-cpp"),
    (["--methods", "ar,llama-cpp-lookup"], "llama-cpp-lookup"),
])
def test_bench_bad_input_is_one_line(capsys, tiny_model_dir, tmp_path, extra, needle):
    rc, _, err = _run(capsys, "bench", "--model", tiny_model_dir, "--data", _data(tmp_path), "--out",
                      tmp_path / "x", "--warmup", "0", *extra)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_bench_with_eagle_shortlists_and_microspec_variants(capsys, tiny_model_dir, tmp_path):
    from support import official_checkpoint

    from microspec.vocab.frequency import save_token_map

    head, _, _ = official_checkpoint(tmp_path / "eagle")
    fmap = tmp_path / "map.pt"
    save_token_map(list(range(95, -1, -1)), fmap)
    methods = ("ar,eagle-full,fr-spec-48,vocabtrim-24,microspec,microspec-w16-indexed,microspec-ctx,microspec-ext,"
               "microspec-kp2")
    rc, _, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                      "--methods", methods, "--max-new-tokens", "10", "--ignore-eos", "--draft", head,
                      "--freq-file", fmap, "--vocabtrim-file", fmap, "--top-k", "3", "--depth", "3",
                      "--repetition-penalties", "1.0", "--warmup", "0", "--out", tmp_path / "b")
    assert rc == 0, err
    res = json.loads((tmp_path / "b" / "greedy" / "results.json").read_text())
    m = res["methods"]
    assert res["mismatches"] == {}
    assert m["fr-spec-48"]["overall"]["active_vocab_max"] <= 48 + 4  # + the 4 special ids (pad, bos, eos, unk)
    assert m["vocabtrim-24"]["overall"]["active_vocab_max"] <= 24 + 4
    assert m["eagle-full"]["overall"]["active_vocab_mean"] == 96 and m["eagle-full"]["overall"]["coverage"] == 1.0
    assert m["microspec-w16-indexed"]["overall"]["active_vocab_max"] <= 16 + 4
    assert res["meta"]["methods"]["microspec-w16-indexed"]["gather"] == "indexed"
    assert res["meta"]["methods"]["microspec-ctx"]["sources"] == "ctx"
    assert res["meta"]["methods"]["microspec-kp2"]["k_pre_positions"] == 2


def test_analyze_tiny_run(capsys, tiny_model_dir, tmp_path):
    from support import official_checkpoint

    from microspec.vocab.frequency import save_token_map

    head, _, _ = official_checkpoint(tmp_path / "eagle")
    fmap = tmp_path / "map.pt"
    save_token_map(list(range(96)), fmap)
    rc, out, err = _run(capsys, "analyze", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                        "--max-new-tokens", "8", "--draft", head, "--freq-file", fmap, "--sizes", "64,16",
                        "--w-max-values", "8,3072", "--warmup", "0", "--limit", "1", "--top-k", "2", "--depth", "2",
                        "--ignore-eos", "--out", tmp_path / "a")
    assert rc == 0, err
    res = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert [r["w_max"] for r in res["wmax"]] == [8, 3072]
    assert res["wmax"][0]["active_vocab_mean"] < res["wmax"][1]["active_vocab_mean"]
    assert [r["variant"] for r in res["ablation"]][0] == "Ctx. Only (packed)" and len(res["ablation"]) == 4
    assert [r["size"] for r in res["oracle"]] == ["64", "16", "full (eagle-full)"]
    for r in res["oracle"][:2]:  # the oracle keeps the run's time per step and takes the full vocabulary's tau
        assert r["oracle_tokens_per_s"] == pytest.approx(r["tokens_per_s"] * res["oracle"][-1]["tau"] / r["tau"],
                                                         rel=1e-3)
    assert list(res["coverage"]["static"]) == ["96"] and res["coverage"]["microspec"]
    assert set(res["overlap"]) == {"full", "microspec", "fr-spec-32k"}
    full = res["overlap"]["full"]
    assert full["p_S"] == 1.0 and full["overlap"] == pytest.approx(1 - full["tv"], abs=1e-3)
    ms = res["overlap"]["microspec"]
    assert ms["size"] < 96 and ms["p_S"] < 1.0 and ms["overlap"] >= ms["bound"] - 1e-4
    # the share of repeated 4-grams in the reference (ar) answers of the run the analysis made, counted here
    (ar_file,) = (tmp_path / "a" / "bench").rglob("ar.jsonl")
    assert res["meta"]["ignore_eos"] and all(  # --ignore-eos: every turn runs its whole budget
        n == 8 for line in ar_file.read_text().splitlines() for n in json.loads(line)["choices"][0]["new_tokens"])
    outputs = [ids for x in map(json.loads, ar_file.read_text().splitlines()) for ch in x["choices"]
               for ids in ch["token_ids"]]
    grams = [[tuple(ids[i : i + 4]) for i in range(len(ids) - 3)] for ids in outputs]
    total, repeated = sum(map(len, grams)), sum(len(g) - len(set(g)) for g in grams)
    assert total > 0 and res["repetition"]["overall"] == round(repeated / total, 4)
    md = (tmp_path / "a" / "analysis.md").read_text()
    assert "Ablation (MicroSpec Table 3)" in md and "Overlap bound terms" in md
    assert (tmp_path / "a" / "wmax.png").is_file() and (tmp_path / "a" / "oracle.png").is_file()


def test_overlap_terms_bound_holds_at_every_step(tiny_model_dir, tmp_path):
    """A(c) >= p_c(S) - TV(p_c(.|S), q_c(.|S)) (DynaSpec Thm 5.1 with the restricted proposal, beta = 0), and for
    S = V: p_c(S) = 1 and A = 1 - TV."""
    import torch
    from support import official_checkpoint

    from microspec import load_model
    from microspec.bench.analyze import overlap_terms
    from microspec.drafters import EagleHead

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    head = EagleHead.load(official_checkpoint(tmp_path / "eagle")[0])
    seq = list(range(5, 30))
    g = torch.Generator().manual_seed(0)
    steps = [(n, torch.randperm(96, generator=g)[:20]) for n in range(3, 25)] + [(10, None)]
    rows = overlap_terms(lm.model, head, seq, steps)
    assert len(rows) == len(steps)
    for r in rows[:-1]:
        assert 0 < r["p_S"] < 1 and r["overlap"] >= r["bound"] - 1e-6 and r["size"] == 20
    assert rows[-1]["p_S"] == 1.0 and rows[-1]["overlap"] == pytest.approx(1 - rows[-1]["tv"], abs=1e-6)


def test_turn_seeds_fixed_per_question_and_distinct_between_questions():
    from microspec.bench.run import turn_seed

    assert turn_seed(0, "q1", 0, 0) == turn_seed(0, "q1", 0, 0)  # every method gets the same seed
    seeds = {turn_seed(0, q, r, t) for q in ("q1", "q2", 81, 82) for r in range(2) for t in range(2)}
    assert len(seeds) == 16 and all(0 <= s < 2**63 for s in seeds)
    assert turn_seed(1, "q1", 0, 0) != turn_seed(0, "q1", 0, 0)


def test_protocol_averages_task_means_decode_speed_draft_time_and_repeat_spread():
    def rec(qid, cat, tokens, wall, prefill, draft, steps, repeats=1):
        c = {"turns": ["x"], "new_tokens": [tokens], "wall_time": [wall], "accept_lengths": [1] * steps,
             "draft_depths": [0] * steps, "token_ids": [[1, 2, 3]], "prefill_s": prefill, "draft_s": draft,
             "decoding_steps": [steps]}
        return {"question_id": qid, "category": cat, "choices": [dict(c) for _ in range(repeats)]}

    ar = [rec(1, "a", 11, 1.0, 0.5, 0.0, 10), rec(2, "a", 11, 0.5, 0.0, 0.0, 10), rec(3, "b", 11, 2.0, 1.0, 0.0, 10)]
    # question speeds 11, 22, 5.5: mean over questions 12.83; task means a = 16.5, b = 5.5 -> 11.0
    m = summarize({"ar": ar, "x": [rec(1, "a", 11, 0.5, 0.25, 0.1, 5), rec(2, "a", 11, 0.5, 0.0, 0.2, 5),
                                   rec(3, "b", 11, 1.0, 0.5, 0.05, 5)]})["methods"]
    o = m["ar"]["overall"]
    assert o["tokens_per_s"] == pytest.approx((11 + 22 + 5.5) / 3, abs=1e-3)
    assert o["task_mean_tokens_per_s"] == pytest.approx(11.0)
    # decode-only: the 10 tokens after the prefill's over the time after it: 20, 20, 10
    assert o["decode_tokens_per_s"] == pytest.approx(50 / 3, abs=1e-3)
    x = m["x"]["overall"]
    assert x["task_mean_speedup"] == pytest.approx((((22 + 22) / 2 + 11) / 2) / 11.0, abs=1e-3)
    assert x["decode_speedup"] == pytest.approx(x["decode_tokens_per_s"] / o["decode_tokens_per_s"], abs=1e-3)
    assert x["draft_ms_per_step"] == {"mean": pytest.approx(70 / 3, abs=1e-3), "min": 10.0, "max": 40.0}
    assert "draft_ms_per_step" not in o and "tokens_per_s_std_over_repeats" not in o
    two = [rec(1, "a", 10, 1.0, 0.0, 0.0, 9, repeats=2)]
    two[0]["choices"][1]["wall_time"] = [0.5]  # repeats at 10 and 20 tok/s: std 7.07
    assert aggregate(two)["tokens_per_s_std_over_repeats"] == pytest.approx(50 ** 0.5, abs=1e-3)
    # each repeat's speed-up against the reference's same repeat: 20 / 10 tok/s in repeat 0, 20 / 20 in repeat 1
    fast = [rec(1, "a", 10, 0.5, 0.0, 0.0, 9, repeats=2)]
    both = summarize({"ar": two, "x": fast})["methods"]
    assert both["x"]["overall"]["speedup_over_repeats"] == [2.0, 1.0]
    assert both["ar"]["overall"]["speedup_over_repeats"] == [1.0, 1.0]
    assert "speedup_over_repeats" not in m["x"]["overall"]  # one repeat: no spread


def test_cpu_protocol_and_resume_of_an_interrupted_run(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": "qa", "turns": [f"w{10 + i} w{20 + i}"]} for i in range(7)]
    rows += [{"question_id": 100 + i, "category": "humaneval", "turns": [f"w{30 + i}"]} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "b"
    base = ["bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", path, "--methods", "ar,ngram",
            "--repetition-penalties", "1.0", "--protocol", "cpu", "--max-new-tokens", "6", "--ignore-eos",
            "--out", out]
    rc, _, err = _run(capsys, *base)
    assert rc == 0, err
    res = json.loads((out / "greedy" / "results.json").read_text())
    assert res["meta"]["questions"] == 5 + 10 and res["meta"]["max_new_tokens"] == 6  # 5 per category, 10 HumanEval
    assert "| method | speedup: questions / task means |" in (out / "report.md").read_text()
    answers = out / "greedy" / "answers" / "ngram.jsonl"
    full = answers.read_text().splitlines()
    ar_full = (out / "greedy" / "answers" / "ar.jsonl").read_text().splitlines()
    # interrupt: ngram had answered 4 questions, the 5th line cut short; ar had answered all
    answers.write_text("\n".join(full[:4]) + "\n" + full[4][: len(full[4]) // 2])
    rc, _, err = _run(capsys, *base, "--resume")
    assert rc == 0, err
    assert "resuming, ar 15/15 done, ngram 4/15 done" in err
    again = answers.read_text().splitlines()
    assert [json.loads(x)["question_id"] for x in again] == [json.loads(x)["question_id"] for x in full]
    assert again[:4] == full[:4]  # kept as they were, not run again
    assert (out / "greedy" / "answers" / "ar.jsonl").read_text().splitlines() == ar_full
    assert [json.loads(x)["choices"][0]["token_ids"] for x in again] == \
        [json.loads(x)["choices"][0]["token_ids"] for x in ar_full]
    assert json.loads((out / "greedy" / "results.json").read_text())["mismatches"] == {}


def test_graph_captures_are_reported_per_turn():
    """A graphed target's captures in the timed turns (a generation's stats carry them): per turn, so that a cache
    the next request reuses shows as ~0 after the first; absent where graphs are off."""
    def rec(qid, captures):
        c = {"turns": ["x", "y"], "new_tokens": [4, 4], "wall_time": [1.0, 1.0], "accept_lengths": [1] * 6,
             "draft_depths": [0] * 6, "token_ids": [[1], [2]], "decoding_steps": [3, 3]}
        return {"question_id": qid, "category": "a", "choices": [c | ({} if captures is None else
                                                                       {"graph_captures": captures})]}

    assert aggregate([rec(1, 6), rec(2, 0)])["graph_captures_per_turn"] == 1.5  # 6 captures over 4 turns
    assert "graph_captures_per_turn" not in aggregate([rec(1, None)])


def test_bench_profile_reports_each_engine_methods_step(capsys, tiny_model_dir, tmp_path):
    """``--profile``: per engine method (not a peer), one untimed generation of the first question: its steps and
    wall ms per step; on a CPU no device waits or busy time (None); in results.json and report.md."""
    out_dir = tmp_path / "prof"
    rc, _, err = _run(capsys, "bench", "--model", tiny_model_dir, "--dtype", "fp32", "--data", _data(tmp_path),
                      "--methods", "ar,ngram,hf-ar", "--max-new-tokens", "8", "--ignore-eos", "--repetition-penalties",
                      "1.0", "--warmup", "0", "--limit", "1", "--profile", "--out", out_dir)
    assert rc == 0, err
    res = json.loads((out_dir / "greedy" / "results.json").read_text())
    prof = res["profile"]
    assert set(prof) == {"ar", "ngram"}  # the transformers peer has no steps of ours to profile
    for p in prof.values():
        assert p["steps"] >= 1 and p["wall_ms_per_step"] > 0
        assert p["host_waits_per_step"] is None and p["device_busy_share"] is None
    assert "wall ms / step" in (out_dir / "report.md").read_text()


def test_the_profiles_kernel_census():
    """``bench --profile``'s census of a CUDA profile (here from stand-in events): launches a step, counted over every
    timed event, the top ones by device time with their ms and launches a step; in the report's table and list."""
    from types import SimpleNamespace

    from microspec.bench.profile import census, profile_lines

    events = [SimpleNamespace(key="gemm", count=70, self_device_time_total=7000.0),
              SimpleNamespace(key="rms_norm_kernel", count=250, self_device_time_total=500.0),
              SimpleNamespace(key="cudaLaunchKernel", count=900, self_device_time_total=0.0),  # host-side: no time
              SimpleNamespace(key="Memcpy HtoD", count=30, self_device_time_total=30.0)]
    got = census(events, steps=10, top=2)
    assert got["kernels_per_step"] == 35.0
    assert got["top_kernels"] == [{"name": "gemm", "ms_per_step": 0.7, "per_step": 7.0},
                                  {"name": "rms_norm_kernel", "ms_per_step": 0.05, "per_step": 25.0}]
    lines = profile_lines({"ar": {"steps": 10, "wall_ms_per_step": 1.0, "host_waits_per_step": 1.0,
                                  "device_ms_per_step": 0.753, "device_busy_share": 0.75, **got},
                           "cpu": {"steps": 3, "wall_ms_per_step": 2.0, "host_waits_per_step": None,
                                   "device_ms_per_step": None, "device_busy_share": None}})
    assert lines[2].endswith("| 35.0 |") and lines[3].endswith("| – |")
    assert lines[-1] == "- ar: `gemm` 0.700 ms, 7; `rms_norm_kernel` 0.050 ms, 25"


def _ab_run(root: Path, speeds: dict[str, dict[str, float]], texts: dict[str, list]) -> Path:
    """A ``bench --out`` folder of one decoding: results.json and per-method answer files (one turn of 100 tokens a
    question, ``speeds``: method -> question -> tokens/s)."""
    folder = root / "greedy"
    (folder / "answers").mkdir(parents=True)
    overall = {}
    for m, per_q in speeds.items():
        lines = [_rec(q, "code", [100], [100 / s], token_ids=[texts[q]]) for q, s in per_q.items()]
        (folder / "answers" / f"{m}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        overall[m] = sum(per_q.values()) / len(per_q)
    plain = overall["ar"]
    results = {"methods": {m: {"overall": {"speedup": v / plain, "tokens_per_s": v}} for m, v in overall.items()},
               "mismatches": {}, "meta": {"date": "2026-11-28 00:00 UTC", "machine": "cpu", "threads": 2,
                                          "command": "microspec bench", "commit": root.name}}
    (folder / "results.json").write_text(json.dumps(results))
    return root


def test_cpu_ab_flags_only_questions_whose_ranges_fell_apart(tmp_path):
    """benchmarks/measure/cpu_ab.py: ratios taken within each run; a question counts as fallen only where every
    new run's ratio lies below every old run's; answers that differ between the commits are counted."""
    spec = importlib.util.spec_from_file_location("cpu_ab", Path(__file__).parents[1] / "benchmarks" / "measure" /
                                                  "cpu_ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    texts = {"q1": [1, 2], "q2": [3, 4]}
    old = [_ab_run(tmp_path / f"old{i}", {"ar": {"q1": 10, "q2": 10}, "m": {"q1": 20 + i, "q2": 15 + 3 * i}}, texts)
           for i in range(2)]  # m: q1 2.0-2.1x, q2 1.5-1.8x
    new = [_ab_run(tmp_path / f"new{i}", {"ar": {"q1": 20, "q2": 20}, "m": {"q1": 38 + i, "q2": 31 + 2 * i}},
                   {"q1": [1, 2], "q2": [9]}) for i in range(2)]  # q1 1.9-1.95x: below; q2 1.55-1.65x: lower mean,
    # but within the old range
    res = ab.compare(ab.load([str(p) for p in old]), ab.load([str(p) for p in new]))["greedy"]
    assert [f["question"] for f in res["fell"]["m"]] == ["q1"]
    assert res["per_question"]["m"]["q2"] == {"old": [1.5, 1.8], "new": [1.55, 1.65]}
    assert res["same_plain_text"] == {"questions": 2, "same": 1}
    assert res["plain_tok_s"] == {"old": [10, 10], "new": [20, 20]}
    assert abs(res["methods"]["m"]["change"] - (1.7625 / 1.85 - 1)) < 1e-9  # the means of the runs' ratios
    assert ab.main(["--old", str(old[0]), "--new", str(tmp_path / "none")]) == 2  # nothing to compare: one line


def test_repeats_do_not_draft_from_the_answers_to_their_own_question(tiny_model_dir, tmp_path):
    """A method that keeps earlier answers (suffix decoding) answers each repeat of a question from what its first
    answer drafted from, not from that answer: greedy repeats then take the same steps.  The answers are kept for the
    questions after it."""
    import torch

    from microspec import load_model
    from microspec.bench import Decoding, load_questions, parse_methods
    from microspec.bench.run import run_decoding
    from microspec.bench.runners import make_runner

    lm = load_model(str(tiny_model_dir), dtype="fp32")
    runners = {s.name: make_runner(s, lm, dtype=torch.float32) for s in parse_methods("ar,suffix,auto")}
    records = load_questions([str(_data(tmp_path))])
    res = run_decoding(lm, runners, records, Decoding(), max_new_tokens=24, out_dir=tmp_path / "out", repeats=3,
                       warmup=0, ignore_eos=True, log=lambda _: None)
    assert not res["mismatches"]
    answers = [json.loads(x) for x in (tmp_path / "out" / "answers" / "suffix.jsonl").read_text().splitlines()]
    for answer in answers:
        first, *rest = answer["choices"]
        assert all(c["token_ids"] == first["token_ids"] for c in rest)
        assert all(c["accept_lengths"] == first["accept_lengths"] for c in rest), answer["question_id"]
    turns = sum(len(r["turns"]) for r in records)
    for name in ("suffix", "auto"):  # one answer a turn, each kept once (auto: its greedy engine's suffix arm)
        cache, = runners[name].engine.responses()
        assert cache.tokens == 24 * turns and len(cache.responses) == turns, name
