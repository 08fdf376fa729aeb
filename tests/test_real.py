"""Truth on the real built-in models: load offline, and greedy tokens equal transformers' own greedy (fp32); every
drafter and vocabulary policy gives the target's own greedy tokens on the real 262k vocabulary.

Two targets: dense fp32 weights, against transformers and for one speculative check of the dense path (the shipped
head's tree with MicroSpec's vocabulary, plain and under the README's processors); and the packed GGUF weights (the
CPU default, rows batch-invariant, several times faster), for the identity of every drafter x policy — the same
drafting and verification code, on the real vocabulary, at a share of the dense path's cost.

The first run converts each GGUF to the safetensors cache (about a minute for Gemma 3 270M on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from microspec import load_model
from microspec.api import encode_prompt
from microspec.decoding import GenerationConfig, generate_ids
from microspec.models.registry import _gguf_cache_dir

pytestmark = pytest.mark.real

N = 32


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma-3-270m", dtype="fp32")


def _hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_the_built_in_files_are_known_by_their_bytes(name):
    """The file keys the registry keeps are the installed packages' files' (a staged copy is recognised by them)."""
    from microspec.models.registry import builtin_copy, resolve

    assert builtin_copy(resolve(name)[2]) == name


def test_gemma_loads_with_its_real_shape(gemma):
    spec = gemma.model.spec
    assert spec.vocab_size == 262144 and spec.family == "gemma3" and spec.tie_embeddings
    assert sum(w is not None for w in spec.layer_windows) == 15  # 5:1 sliding:global
    assert gemma.tokenizer.chat_template is None  # a base model: plain prompts
    from microspec.models.registry import check_tokenizer

    check_tokenizer(gemma.tokenizer, "gemma-3-270m")  # words, not letters
    n_params = sum(p.numel() for p in gemma.model.parameters())
    assert 260e6 < n_params < 275e6


@pytest.fixture(scope="module")
def gemma_hf(gemma):
    """transformers' own Gemma 3 on the same weights (loaded once: the two comparisons below share it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(_gguf_cache_dir(gemma.name, gemma.source)),
                                                dtype=torch.float32).eval()


def test_gemma_greedy_equals_transformers(gemma, gemma_hf):
    # code here; prose through the command below (one prompt each: transformers' fp32 greedy over the 262k vocabulary
    # is the slowest part of the suite)
    ids = encode_prompt(gemma, "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.")
    ours = generate_ids(gemma.model, ids, GenerationConfig(max_new_tokens=N), gemma.eos_token_ids)
    assert ours.token_ids == _hf_greedy(gemma_hf, ids, N)


def test_smollm2_greedy_equals_transformers_loading_the_gguf_itself():
    """Against transformers loading the GGUF directly: this also checks our safetensors conversion."""
    from transformers import AutoModelForCausalLM

    from microspec.models.registry import parsed_once

    lm = load_model("smollm2-135m-instruct", dtype="fp32")
    assert lm.model.spec.vocab_size == 49152 and lm.tokenizer.chat_template
    with parsed_once(lm.source):  # transformers' config and weights loads share one parse of the file
        hf = AutoModelForCausalLM.from_pretrained(str(lm.source.parent), gguf_file=lm.source.name,
                                                  dtype=torch.float32).eval()
    ids = encode_prompt(lm, "Name three primary colors and say why they are called primary.")
    assert ids[-1] != lm.tokenizer.eos_token_id
    ours = generate_ids(lm.model, ids, GenerationConfig(max_new_tokens=N), lm.eos_token_ids)
    assert ours.token_ids == _hf_greedy(hf, ids, N)


def test_cli_json_default_model_equals_transformers_greedy(gemma, gemma_hf):
    prompt = "Speculative decoding is"
    proc = subprocess.run([sys.executable, "-m", "microspec", "generate", "--prompt", prompt, "--dtype", "fp32",
                           "--max-new-tokens", str(N), "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["token_ids"] == _hf_greedy(gemma_hf, encode_prompt(gemma, prompt), N)
    # the default method speculates (--drafter auto: chosen online among its arms, the shipped EAGLE head with
    # MicroSpec's vocabulary among them), and the tokens are still transformers' own greedy tokens
    assert obj["model"] == "gemma-3-270m" and (obj["drafter"], obj["vocab"]) == ("auto", "microspec")
    assert "eagle" in obj["arms"] and sum(obj["stats"]["auto"]["arms"].values()) == obj["stats"]["steps"]


# tokens of the greedy references the speculative runs are compared with, bit for bit
AR_TOKENS = 40
SPEC_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    "The water cycle has four stages. The first stage is evaporation.",
    "Question: What is 12 times 7? Answer:",
]


@pytest.fixture(scope="module")
def gemma_gguf():
    return load_model("gemma-3-270m", dtype="gguf")


def test_load_model_with_nothing_said_loads_what_the_command_line_does(gemma_gguf, tiny_model_dir):
    """``microspec.load_model()`` (the README's first line of Python) loads the weights ``microspec generate`` does
    when ``--weights`` is not given: the packed GGUF blocks on a CPU where the kernel builds, not dense fp32 (several
    times slower); a Hugging Face directory, bf16."""
    from microspec.kernels import cpu_quant
    from microspec.models.registry import DEFAULT_MODEL, default_weights

    lm = load_model()
    expected = "gguf" if cpu_quant.available() else "bf16"
    assert lm.weights == default_weights(DEFAULT_MODEL) == expected
    assert lm.model.quantized == (expected == "gguf")
    assert default_weights(str(tiny_model_dir)) == "bf16"


@pytest.fixture(scope="module")
def gemma_ar(gemma_gguf):
    """Plain greedy decoding of every prompt on the packed target: the reference of the identity checks."""
    lm, cfg = gemma_gguf, GenerationConfig(max_new_tokens=AR_TOKENS)
    return {p: generate_ids(lm.model, encode_prompt(lm, p), cfg, lm.eos_token_ids).token_ids for p in SPEC_PROMPTS}


def test_gemma_fp32_speculation_is_lossless(gemma):
    """The dense fp32 path speculates losslessly on the real model: the shipped head's tree with MicroSpec's
    vocabulary gives plain greedy's tokens, plainly and under the README's processors, with drafts accepted."""
    from microspec.api import generate

    prompt = SPEC_PROMPTS[1]
    for cfg in (GenerationConfig(max_new_tokens=AR_TOKENS),
                GenerationConfig(max_new_tokens=AR_TOKENS, repetition_penalty=1.2, no_repeat_ngram_size=3)):
        ref = generate(gemma, prompt, cfg, method="ar").token_ids
        res = generate(gemma, prompt, cfg, method="microspec")
        assert res.token_ids == ref, cfg
        assert res.stats.mean_accept_len > 1.0  # drafts were accepted, not only bonus tokens


@pytest.mark.parametrize("drafter", ["ngram", "early-exit", "early-exit-tree-microspec"])
def test_gemma_speculative_greedy_identity(gemma_gguf, gemma_ar, drafter):
    from microspec.compose import make_drafter
    from microspec.vocab import MicroSpecVocab

    gemma, accepted = gemma_gguf, []
    for prompt in SPEC_PROMPTS:
        vocab = None
        if drafter == "early-exit-tree-microspec":
            d = make_drafter("early-exit", depth=2, top_k=2, total_tokens=3, draft_layers=12)
            vocab = MicroSpecVocab(262144, always=gemma.eos_token_ids)
        else:
            d = make_drafter(drafter, depth=2 if drafter == "early-exit" else None, target=gemma.model)
        r = generate_ids(gemma.model, encode_prompt(gemma, prompt), GenerationConfig(max_new_tokens=AR_TOKENS),
                         gemma.eos_token_ids, drafter=d, vocab=vocab)
        assert r.token_ids == gemma_ar[prompt]
        accepted.append(r.stats.mean_accept_len)
        if vocab is not None:
            assert 0 < r.stats.to_dict()["active_vocab_max"] <= 3072 + 1
    if drafter in ("ngram", "early-exit"):  # base-model text repeats itself; 12 of 18 layers predict some of it
        assert max(accepted) > 1.0


def test_gemma_openai_options_and_a_json_schema_are_lossless(gemma_gguf):
    """On the real 262k vocabulary (packed target): a JSON schema with OpenAI's penalties and bias, greedy, and the
    same seeded at T 0.7 with the repetition penalty: EAGLE + MicroSpec (the shipped head) and ``auto`` give plain
    decoding's tokens and log-probabilities; the greedy answer validates; the forced tokens were drafted."""
    import json

    from microspec.api import generate

    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20},
                                               "population_millions": {"type": "integer", "minimum": 0,
                                                                       "maximum": 100}},
              "required": ["city", "country", "population_millions"], "additionalProperties": False}
    prompt = "Text: Osaka is a city in Japan with 2.7 million people.\nExtract it as JSON.\nJSON:"
    options = dict(max_new_tokens=60, presence_penalty=0.4, frequency_penalty=0.2, logit_bias={1234: -5.0},
                   logprobs=2)
    for decoding in ({}, {"temperature": 0.7, "seed": 3, "repetition_penalty": 1.2}):
        kw = {**options, **decoding, "response_format": schema}
        plain = generate(gemma_gguf, prompt, method="ar", **kw)
        if not decoding:
            jsonschema.validate(json.loads(plain.text), schema)
        for method in ("eagle+microspec", "auto"):
            r = generate(gemma_gguf, prompt, method=method, **kw)
            assert r.token_ids == plain.token_ids, (method, decoding, r.text, plain.text)
            assert [e.logprob for e in r.logprobs] == pytest.approx([e.logprob for e in plain.logprobs], abs=1e-3)
            assert r.stats.forced_steps > 0, method


@pytest.mark.parametrize("policy", ["fr-spec", "microspec-device-indexed", "microspec-position-aware"])
def test_gemma_every_policy_is_lossless(gemma_gguf, gemma_ar, policy):
    """The other policies (and MicroSpec's other backend and gather) on the real 262k vocabulary, one prompt."""
    from microspec.compose import make_drafter
    from microspec.training.token_maps import count_tokens, token_map_from_counts
    from microspec.vocab import MicroSpecVocab, PositionAware, StaticShortlist

    gemma, prompt = gemma_gguf, SPEC_PROMPTS[1]
    if policy == "fr-spec":  # a deliberately small shortlist from unrelated text: drafts miss often, output same
        text = ["Rain falls on the hills and runs to the sea; the sun warms the sea and the air carries it back."]
        vocab = StaticShortlist(token_map_from_counts(count_tokens(gemma.tokenizer, text, 262144)), 64,
                                always=gemma.eos_token_ids)
    elif policy == "microspec-device-indexed":
        vocab = MicroSpecVocab(262144, always=gemma.eos_token_ids, gather="indexed", backend="device")
    else:
        vocab = PositionAware(MicroSpecVocab(262144, always=gemma.eos_token_ids), 1024, 256)
    d = make_drafter("early-exit", depth=2, top_k=2, total_tokens=3, draft_layers=12)
    r = generate_ids(gemma.model, encode_prompt(gemma, prompt), GenerationConfig(max_new_tokens=AR_TOKENS),
                     gemma.eos_token_ids, drafter=d, vocab=vocab)
    assert r.token_ids == gemma_ar[prompt]
    st = r.stats.to_dict()
    assert 0 <= st["coverage"] <= 1 and st["active_vocab_max"] <= (1024 if "position" in policy else 3073)


def test_gemma_shipped_eagle_head_out_of_the_box(gemma_gguf, gemma_ar):
    """`microspec generate --drafter eagle` on the default model takes the head that ships in the package, returns
    the autoregressive greedy tokens, and the trained head is accepted far more often than chance."""
    from microspec.api import generate
    from microspec.models.registry import shipped_eagle_head

    assert shipped_eagle_head("gemma-3-270m") is not None, "the trained Gemma 3 270M head must ship in the package"
    taus = []
    for i, prompt in enumerate(SPEC_PROMPTS):  # the command once (a process loads the model), the library after
        if i == 0:
            proc = subprocess.run([sys.executable, "-m", "microspec", "generate", "--prompt", prompt, "--drafter",
                                   "eagle", "--max-new-tokens", str(AR_TOKENS), "--json"],
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr
            obj = json.loads(proc.stdout)
            assert (obj["drafter"], obj["vocab"], obj["dtype"]) == ("eagle", "full", "gguf")
            tokens, tau = obj["token_ids"], obj["stats"]["mean_accept_len"]
        else:
            res = generate(gemma_gguf, prompt, method="eagle-full", max_new_tokens=AR_TOKENS)
            tokens, tau = res.token_ids, res.stats.mean_accept_len
        assert tokens == gemma_ar[prompt]
        taus.append(tau)
    assert sum(taus) / len(taus) > 1.2, taus  # an untrained head: ~1.0


# the two `microspec generate` runs of the next test, as one process beside the light tests (conftest: background)
GENERATE_BY_DEFAULT = f"""
import json, subprocess, sys
base = [sys.executable, "-m", "microspec", "generate", "--prompt", {SPEC_PROMPTS[0]!r}, "--max-new-tokens", "32"]
runs = [subprocess.run([*base, *extra], capture_output=True, text=True, timeout=600)
        for extra in (["--compare", "--json"], ["--repetition-penalty", "1.2"])]
print(json.dumps([[r.returncode, r.stdout, r.stderr] for r in runs]))
"""


@pytest.mark.background("generate-by-default", [sys.executable, "-c", GENERATE_BY_DEFAULT], after_first_use=True)
def test_gemma_generate_speculates_by_default(background):
    """`microspec generate` with no drafter option on the default model (packed GGUF weights): auto, chosen online
    among plain decoding, prompt lookup and suffix decoding (each sized step by step) and the EAGLE head, starting
    with prompt lookup on plain greedy decoding (what measured fastest on this path) — the same tokens as plain
    decoding (`--compare` runs both) — and auto too with repetition penalty 1.2, the stats line saying what it
    took."""
    rc, out, err, _ = background
    assert rc == 0, err[-3000:]
    (rc1, out1, err1), (rc2, _, err2) = json.loads(out.strip().splitlines()[-1])
    assert rc1 == 0, err1
    obj = json.loads(out1)
    assert (obj["drafter"], obj["start"], obj["dtype"]) == ("auto", "lookup", "gguf")
    assert obj["arms"] == ["plain", "lookup", "suffix", "eagle"]
    assert "warning" not in err1  # --compare found the plain greedy tokens identical
    assert obj["plain_stats"]["new_tokens"] == obj["stats"]["new_tokens"]
    assert rc2 == 0 and "| auto: " in err2 and "% of steps; " in err2


@pytest.mark.parametrize("policy", ["dynaspec", "specvocab", "coral"])
def test_gemma_shipped_trained_policy_is_lossless(gemma_gguf, gemma_ar, policy):
    """The trained policies that ship beside the head load as the defaults and keep the shipped head lossless on the
    real vocabulary, with shortlists far smaller than it."""
    from microspec.compose import Method, build_policy
    from microspec.drafters import EagleDrafter, EagleHead
    from microspec.models.registry import shipped_eagle_head, shipped_policy

    gemma = gemma_gguf
    found = shipped_policy("gemma-3-270m", policy)
    assert found is not None, f"the Gemma 3 270M {policy} artifact must ship in the package"
    vocab = build_policy(Method(drafter="eagle", vocab=policy, artifact=str(found)), 262144, always=gemma.eos_token_ids)
    head = EagleHead.load(shipped_eagle_head("gemma-3-270m"))
    prompt = SPEC_PROMPTS[2]
    r = generate_ids(gemma.model, encode_prompt(gemma, prompt), GenerationConfig(max_new_tokens=AR_TOKENS),
                     gemma.eos_token_ids, drafter=EagleDrafter(head, depth=3, top_k=2, total_tokens=6), vocab=vocab)
    assert r.token_ids == gemma_ar[prompt]
    st = r.stats.to_dict()
    assert 0 < st["active_vocab_mean"] < 262144 / 4 and st["mean_accept_len"] > 1.0, st


def test_gemma_eagle_and_separate_draft_model_plumbing(gemma_gguf, gemma_ar, tmp_path):
    """On the real 262k-vocabulary model: an EAGLE head in the official layout (random weights) and a separate
    draft model (Gemma's own first two layers, packed as the target's, as a standalone model) stay lossless."""
    from dataclasses import replace

    from microspec.drafters import DraftModelDrafter, EagleDrafter, EagleHead
    from microspec.models.native import NativeCausalLM
    from support import official_checkpoint

    gemma = gemma_gguf
    path, _, _ = official_checkpoint(tmp_path / "eagle", d=640, heads=4, kv=1, inter=1024, vocab=262144)
    head = EagleHead.load(path)
    spec = gemma.model.spec
    small_spec = replace(spec, num_layers=2, layer_windows=spec.layer_windows[:2], layer_rope=spec.layer_rope[:2])
    small = NativeCausalLM(small_spec, gemma.model._rope)
    body, target = small.model, gemma.model.model  # the target's own modules: embedding, first layers, final norm
    body.embed_tokens, body.layers, body.norm = target.embed_tokens, torch.nn.ModuleList(target.layers[:2]), target.norm
    prompt = SPEC_PROMPTS[0]
    for d in (EagleDrafter(head, depth=2, top_k=2, total_tokens=3), DraftModelDrafter(small.eval(), depth=2)):
        r = generate_ids(gemma.model, encode_prompt(gemma, prompt), GenerationConfig(max_new_tokens=AR_TOKENS),
                         gemma.eos_token_ids, drafter=d)
        assert r.token_ids == gemma_ar[prompt]


def test_gemma_shipped_fr_spec_map_is_the_default_and_lossless(gemma_gguf, gemma_ar):
    """`--vocab fr-spec` / method fr-spec-K work out of the box on the default model: the shipped map (SGLang's
    format, 32k ids from training-side corpora) is taken, and the shortlisted drafts keep the output exact."""
    from microspec.api import generate
    from microspec.compose import build
    from microspec.models.registry import shipped_token_map
    from microspec.vocab.frequency import load_token_map

    path = shipped_token_map("gemma-3-270m")
    assert path is not None, "the Gemma 3 270M FR-Spec map must ship in the package"
    token_map = load_token_map(path, 262144)
    assert len(token_map) == 32768 and len(set(token_map)) == 32768
    engine = build("fr-spec-16k", gemma_gguf)
    assert engine.method.artifact == str(path)
    prompt = SPEC_PROMPTS[0]
    res = generate(gemma_gguf, prompt, method=engine, max_new_tokens=AR_TOKENS)
    assert res.token_ids == gemma_ar[prompt]
    st = res.stats.to_dict()
    assert 16384 <= st["active_vocab_max"] <= 16384 + 300  # the shortlist plus EOS and special ids


# ------------------------------------------------------------------------------ GGUF weights kept packed
@pytest.mark.parametrize("name", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_gguf_weights_match_the_dequantized_reference(gemma, name):
    """--weights gguf-f32: the file's blocks multiplied by fp32 activations equal transformers' dequantization run
    through the fp32 path (within the order of fp32 sums); --weights gguf (int8 activations per 32-element block,
    as llama.cpp does) stays within its activation rounding and picks the same next token at nearly every
    position of a real prompt."""
    from microspec.models.quant import QuantTensor

    dense = gemma if name == "gemma-3-270m" else load_model(name, dtype="fp32")
    ids = torch.tensor(encode_prompt(dense, SPEC_PROMPTS[1] + " The second stage is condensation, when"))

    def logits(lm):
        return lm.model.head(lm.model.forward(ids, lm.model.new_cache(128)))

    ref = logits(dense)
    scale = float(ref.abs().max())
    for weights, tol in (("gguf-f32", 1e-5), ("gguf", 8e-2)):  # measured 1e-6 to 3e-6 and 3e-2 to 5e-2
        lm = load_model(name, dtype=weights)
        assert isinstance(lm.model.head_weight, QuantTensor) and lm.weights == weights
        got = logits(lm)
        assert float((got - ref).abs().max()) / scale < tol, weights
        agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
        assert agree >= (1.0 if weights == "gguf-f32" else 0.9), (weights, agree)


def test_gemma_gguf_speculation_is_bit_identical_for_every_drafter_and_policy(gemma_gguf):
    """On the packed path rows are batch-invariant, so every speculative method gives plain greedy's tokens bit for
    bit — with the shipped head's full, MicroSpec and FR-Spec vocabularies, a trained router, early exit,
    n-grams and prompt lookup first — and with the README's processors."""
    from microspec.api import generate

    for cfg in (GenerationConfig(max_new_tokens=40),
                GenerationConfig(max_new_tokens=40, repetition_penalty=1.2, no_repeat_ngram_size=3)):
        for prompt in SPEC_PROMPTS[:2]:
            ref = generate(gemma_gguf, prompt, cfg).token_ids
            accepted = {}
            for method in ("eagle-full", "microspec", "fr-spec-32k", "dynaspec", "early-exit+microspec", "ngram",
                           "microspec@lookup", "dynaspec@lookup"):  # prompt lookup first, with a routed policy too
                res = generate(gemma_gguf, prompt, cfg, method=method)
                assert res.token_ids == ref, (method, prompt, cfg.repetition_penalty)
                accepted[method] = res.stats.mean_accept_len
            assert accepted["microspec"] > 1.0 and accepted["eagle-full"] > 1.0, accepted


# ------------------------------------------------------------------------------ SmolLM2-135M-Instruct's head
SMOL_PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
                "What are the three primary colors, and why are they called primary?"]


@pytest.fixture(scope="module")
def smollm2_gguf():
    return load_model("smollm2-135m-instruct", dtype="gguf")


def test_smollm2_shipped_head_and_fr_spec_map_out_of_the_box(smollm2_gguf):
    """The chat model's shipped EAGLE head, FR-Spec map and trained policies are the defaults of its eagle methods;
    every vocabulary policy over them gives plain greedy's tokens under the chat template (packed weights: rows
    batch-invariant), and the trained head is accepted far more often than chance."""
    from microspec.api import generate
    from microspec.models.registry import shipped_eagle_head, shipped_policy, shipped_token_map
    from microspec.vocab.frequency import load_token_map

    lm = smollm2_gguf
    assert shipped_eagle_head(lm.name) is not None and shipped_token_map(lm.name) is not None
    assert all(shipped_policy(lm.name, m) is not None for m in ("dynaspec", "specvocab", "coral"))
    assert len(set(load_token_map(shipped_token_map(lm.name), 49152))) == 32768
    cfg = GenerationConfig(max_new_tokens=48)
    taus = []
    for i, prompt in enumerate(SMOL_PROMPTS):
        ref = generate(lm, prompt, cfg, method="ar").token_ids
        # the trained policies (shipped beside the head) on one prompt each: they load with no path and stay lossless
        trained = (("dynaspec", "specvocab", "coral", "dynaspec-f")[i::len(SMOL_PROMPTS)])
        for method in ("eagle-full", "microspec", "fr-spec-8k", "pa-fr-8k", *trained):
            res = generate(lm, prompt, cfg, method=method)
            assert res.token_ids == ref, (prompt, method)
            if method == "eagle-full":
                taus.append(res.stats.mean_accept_len)
    assert sum(taus) / len(taus) > 1.3, taus  # an untrained head: ~1.0


def test_train_eagle_answers_with_packed_weights(smollm2_gguf, tmp_path):
    """`train eagle --gen-batch 3 --temperatures 0 0.7 --repetition-penalty 1.0 1.2`: the answers, stepped together
    through the engine on the packed weights (the default), are the packed model's own answers in each of the four
    decodings under the chat template, each as plain decoding gives it alone (a sampled one seeded by its index)."""
    from microspec.api import generate

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in SMOL_PROMPTS[:2]))
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "microspec", "train", "eagle", "--model", "smollm2-135m-instruct",
                           "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "12",
                           "--temperatures", "0", "0.7", "--repetition-penalty", "1.0", "1.2", "--gen-batch", "3",
                           "--stages", "generate"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    recs = sorted((json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines()),
                  key=lambda r: r["index"])
    assert [r["index"] for r in recs] == list(range(8))
    for rec in recs:
        prompt = SMOL_PROMPTS[rec["index"] // 4]
        temp, pen = (0.0, 0.7)[rec["index"] % 4 // 2], (1.0, 1.2)[rec["index"] % 2]
        assert rec.get("temperature", 0.0) == temp and rec["repetition_penalty"] == pen
        assert rec["prompt_ids"] == encode_prompt(smollm2_gguf, prompt)
        cfg = GenerationConfig(max_new_tokens=12, temperature=temp, repetition_penalty=pen,
                               seed=rec["index"] if temp else None)
        assert rec["response_ids"] == generate(smollm2_gguf, prompt, cfg, method="ar").token_ids


FRESH = """
import hashlib, json, torch
import microspec
from microspec.decoding import GenerationConfig
torch.set_num_threads(2)
lm = microspec.load_model("gemma-3-270m", dtype="gguf")
ids = lm.tokenizer("Write a short story about a lighthouse keeper who finds a message in a bottle on a "
                   "stormy night").input_ids[:20]
with torch.inference_mode():
    h = lm.model(torch.tensor(ids), lm.model.new_cache(64))
h = h[0] if isinstance(h, tuple) else h
rows = h.float().numpy()
out = {"forward": hashlib.md5(rows.tobytes()).hexdigest(),  # and each row's, to tell which rows differ
       "rows": [hashlib.md5(r.tobytes()).hexdigest()[:8] for r in rows]}
cfg = GenerationConfig(max_new_tokens=24, temperature=0.7, seed=11)
for method in ("ar", "auto", "eagle+microspec"):
    out[method] = microspec.generate(lm, "The three laws of robotics are", cfg, method=method).token_ids
print(json.dumps(out))
"""
def test_a_seeded_request_is_the_same_in_every_fresh_process():
    """The same request gives the same output every time: fresh processes (two threads each, one after the other:
    two at once on two cores spin-wait for each other's preempted threads, several times slower) compute the same
    bits for a 20-row forward (rows split between the threads) and the same seeded T 0.7 text for plain decoding,
    auto and EAGLE + MicroSpec."""
    outs = []
    for _ in range(2):
        ran = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        outs.append(json.loads(ran.stdout.strip().splitlines()[-1]))
    differ = [i for i, (a, b) in enumerate(zip(outs[0]["rows"], outs[1]["rows"])) if a != b]
    assert outs[0] == outs[1], (f"rows {differ} of the forward differ ({torch.backends.cpu.get_cpu_capability()}, "
                                f"{torch.get_num_threads()} threads here)", outs)
    assert outs[0]["ar"] == outs[0]["auto"] == outs[0]["eagle+microspec"]  # the seed fixes the text
