"""The vLLM plugin's checks, run with a vLLM environment's Python (vLLM and this project in one virtual environment:
the [vllm] extra) by tests/first_use.py, beside the suite's first tests, on the directories ``vllm-prepare`` makes.
Writes one JSON file of what it saw; tests/test_vllm_plugin.py asserts on it.

    python tests/vllm/checks.py TARGET_DIR HEAD_DIR OUT.json [TARGET_DIR2 HEAD_DIR2]

Two engines in this process (vLLM in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0): vLLM without speculation, and vLLM
drafting with the plugin's head.  The same prompts, alone and as a batch of 4, greedy, each draft vocabulary; a
batch whose requests each use another vocabulary; seeded sampling; a request naming no vocabulary, and requests
whose vocabulary options are past their bounds; a structured output (a JSON schema, vLLM's own grammar) with
log-probabilities, plain and drafted with MicroSpec.  A second model
(SmolLM2's head), when given, gets the batch greedy with MicroSpec and the mixed batch, and vLLM's own n-gram
speculation.  Plain decoding's batches keep the target's two most likely tokens and their log-probabilities at every
position (``top2``): where a speculative run's tokens part from plain decoding's, the test reads there whether the
target was at a near tie (vLLM's bf16 kernels may then pick either token, as the batch's shape or the CPU decides).
"""

from __future__ import annotations

import json
import sys
import time

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,",
           "The three laws of robotics are"]
VOCABS = ["full", "fr-spec-32k", "microspec"]
TOKENS = 16
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                           "country": {"type": "string", "maxLength": 24},
                                           "population_millions": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["city", "country", "population_millions"], "additionalProperties": False}
STRUCTURED = "The largest city of Japan, as JSON with its country and population in millions:"


def engine(target: str, head: str | None, **overrides):
    from vllm import LLM

    from microspec.vllm.peer import engine_args

    return LLM(**engine_args(target, head, max_model_len=1024, seed=0, **overrides))


def run(llm, prompts, vocabs, temperature=0.0, seed=None, top2=None):
    """The tokens of each prompt; with ``top2`` (a list), each position's two most likely tokens and their
    log-probabilities ([[id, logprob], [id, logprob]], vLLM's raw log-probabilities) appended to it per prompt."""
    from vllm import SamplingParams

    from microspec.vllm.peer import vocab_args

    params = [SamplingParams(temperature=temperature, seed=seed, max_tokens=TOKENS, ignore_eos=True,
                             extra_args=vocab_args(v), logprobs=2 if top2 is not None else None) for v in vocabs]
    outs = llm.generate(prompts, params, use_tqdm=False)
    if top2 is not None:
        top2 += [[sorted(([t, lp.logprob] for t, lp in d.items()), key=lambda x: -x[1])[:2]
                  for d in o.outputs[0].logprobs] for o in outs]
    return [list(o.outputs[0].token_ids) for o in outs]


def structured(llm, vocab) -> dict:
    """A JSON-schema request (vLLM's structured outputs) with log-probabilities: its tokens, text and the
    log-probability of each token (vLLM's raw ones)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from microspec.vllm.peer import vocab_args

    params = SamplingParams(temperature=0, max_tokens=48, logprobs=2, extra_args=vocab_args(vocab),
                            structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
    out = llm.generate([STRUCTURED], [params], use_tqdm=False)[0].outputs[0]
    return {"tokens": list(out.token_ids), "text": out.text,
            "logprobs": [d[t].logprob for t, d in zip(out.token_ids, out.logprobs)],
            "top2": [sorted(([t, lp.logprob] for t, lp in d.items()), key=lambda x: -x[1])[:2] for d in out.logprobs]}


def main(target: str, head: str, out_path: str, second: tuple = ()) -> None:
    from microspec.vllm import internals
    from microspec.vllm.peer import counter_delta, spec_counters

    result: dict = {"problems": internals.problems(), "timing": {}}
    t0 = time.time()

    def mark(name: str) -> None:
        result["timing"][name] = round(time.time() - t0, 1)

    plain = engine(target, None)
    result["start_s"] = time.time() - t0
    top2: list = []
    result["plain"] = {"batch": run(plain, PROMPTS, [None] * 4, top2=top2), "alone": run(plain, PROMPTS[:1], [None]),
                       "top2": top2, "structured": structured(plain, None)}
    del plain
    import gc

    gc.collect()
    mark("plain")
    spec = engine(target, head)
    mark("spec engine")
    result["spec"] = {}
    for vocab in VOCABS:
        before = spec_counters(spec)
        batch = run(spec, PROMPTS, [vocab] * 4)
        result["spec"][vocab] = {"batch": batch, "metrics": counter_delta(spec_counters(spec), before),
                                 "alone": run(spec, PROMPTS[:1], [vocab])}
    mark("vocabularies")
    before = spec_counters(spec)
    result["spec_structured"] = {**structured(spec, "microspec"),
                                 "metrics": counter_delta(spec_counters(spec), before)}
    result["mixed"] = run(spec, PROMPTS, ["microspec", "full", "fr-spec-32k", "microspec"])
    result["sampled"] = run(spec, PROMPTS[:2], ["microspec", "full"], temperature=0.8, seed=7)
    result["bad_vocab"] = run(spec, PROMPTS[:1], ["no-such-vocabulary"])  # drafts with the default instead
    # options past their bounds (a window of ten million ids, gigabytes): refused, the default drafts, vLLM serves on
    result["absurd_vocab"] = run(spec, PROMPTS, ["microspec-w10000000", "microspec-w40000", "full", "microspec"])
    mark("mixed, sampled")
    del spec
    gc.collect()
    if second:
        plain = engine(second[0], None)
        top2 = []
        result["second"] = {"plain": run(plain, PROMPTS, [None] * 4, top2=top2), "top2": top2}
        del plain
        gc.collect()
        spec = engine(*second)
        before = spec_counters(spec)
        result["second"]["microspec"] = run(spec, PROMPTS, ["microspec"] * 4)
        result["second"]["metrics"] = counter_delta(spec_counters(spec), before)
        result["second"]["mixed"] = run(spec, PROMPTS, ["microspec", "full", "fr-spec-32k", "microspec"])
        del spec
        gc.collect()
        # vLLM's own speculation (prompt lookup), beside the plugin's: whether it too parts from plain decoding.  The
        # last engine made here: once its proposer has imported numba, vLLM 0.32's CPU platform fails to start another
        # engine in the process (rebinding its kernels trips over numba's objects)
        ngram = engine(second[0], None, speculative_config={
            "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
        result["second"]["vllm_ngram"] = run(ngram, PROMPTS, [None] * 4)
    mark("second model")
    result["seconds"] = time.time() - t0
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    from microspec.vllm.peer import in_process

    in_process()
    main(*sys.argv[1:4], second=tuple(sys.argv[4:6]))
