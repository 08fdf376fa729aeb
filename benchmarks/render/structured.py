"""Structured outputs: which grammar engine (the mask's cost on Gemma 3's vocabulary), and speculation under a JSON
schema against plain constrained decoding on the structured-output prompts."""

from __future__ import annotations

from .common import Source, load, num, runs, table, x

DATA = runs("structured")  # its runs and their provenance: benchmarks/render/runs.json

RUN = DATA["RUN"]
ENGINES = DATA["ENGINES"]
VLLM = DATA["VLLM"]
NAMES = {"ar": "plain constrained decoding", "auto": "`auto`", "eagle+microspec": "EAGLE + MicroSpec"}


def _machine(meta: dict) -> str:
    """Where a run ran: ``run_meta``'s machine and threads, or (the committed runs, which named the CPU alone) the
    CPU on this project's 2-core kind with 2 threads."""
    if "threads" in meta:
        return f"{meta['machine']}, {meta['threads']} threads"
    return f"2-core {meta['machine']}, 2 threads"


def _engines() -> list[str]:
    r = load(ENGINES)
    rows = []
    for name, key in (("llguidance", "llguidance"), ("outlines-core", "outlines_core"), ("xgrammar", "xgrammar")):
        e = r[key]
        if "skipped" in e:
            rows.append([name, None, None, None, e["skipped"]])
        else:
            rows.append([name, num(e.get("setup_s"), 1), num(e["compile_ms"], 1), num(e["mask_us_per_token"], 0),
                         e.get("note", "")])
    m = r["meta"]
    return ["### Which grammar engine", "",
            f"Each engine compiled the schema of each of the {m['prompts']} structured-output prompts and walked plain "
            "constrained decoding's answer, computing the allowed ids before every token "
            f"({r['llguidance']['tokens']} tokens); a plain step of the same model takes "
            f"{num(r['plain_step_us'], 0)} µs.", "",
            table(["engine", "tokenizer set-up, s (once)", "compile, ms (per schema)", "mask, µs per token", "note"],
                  rows), "",
            Source(ENGINES, m["command"], m["date"], _machine(m), m["commit"]).markdown(), "",
            "- llguidance is the engine: a schema compiles in about a millisecond and a token's mask costs a few "
            "percent of a plain step; outlines-core builds an index per schema that takes seconds on this "
            "vocabulary and lists the allowed ids (a mask still to be made from them)."]


def _speed() -> list[str]:
    r = load(RUN)
    m = r["meta"]
    rows = [[NAMES[k], num(v["mean_tok_s"], 1), x(v["vs_plain"]),
             f"{min(v['paired_vs_plain']):.2f}–{max(v['paired_vs_plain']):.2f}", num(v["tau"]), v["forced_steps"],
             "yes" if v["same_tokens_as_plain"] else "NO"] for k, v in r["methods"].items()]
    tau = r["eagle_microspec_tau"]
    return ["### Speculation under a JSON schema", "",
            f"The {m['prompts']} structured-output prompts (`{m['data']}`: short texts with the schema of what to "
            "extract; nothing fitted on them), greedy, each generation ending at EOS once its JSON is complete, "
            f"{m['repeats']} repeats in rotated order (`auto` a fresh engine at each). Decode speed: tokens over "
            "decode seconds, all prompts together.", "",
            table(["method", "tok/s", "vs plain constrained", "repeats", "tau", "steps drafting forced tokens",
                   "same tokens as plain"], rows), "",
            Source(RUN, m["command"], m["date"], _machine(m), m["commit"]).markdown(), "",
            f"- Every answer is JSON that validates against its schema: {r['valid_json']} of {m['prompts']}.",
            f"- The grammar's mask: {num(r['mask_us_per_token'], 0)} µs a token, "
            f"{r['mask_share_of_plain_step']:.1%} of a plain unconstrained step ({num(r['plain_free_step_us'], 0)} "
            f"µs); a plain constrained step takes {num(r['plain_constrained_step_us'], 0)} µs.",
            f"- Tau of EAGLE + MicroSpec: {num(tau['masked + forced']['tau'])} with the draft masked by the grammar "
            f"and its forced tokens drafted (the default), {num(tau['masked, no forced']['tau'])} without the forced "
            f"tokens, {num(tau['unmasked draft, forced']['tau'])} with the draft's columns unmasked (the drafts the "
            "grammar forbids are then rejected by verification)."]


def _vllm() -> list[str]:
    r = load(VLLM)
    m = r["meta"]
    return ["### The same requests through vLLM", "",
            f"The {m['prompts']} structured-output prompts, greedy, JSON schema and `logprobs=2`, through vLLM "
            f"{m['vllm']}'s CPU backend (no speculation; its structured outputs with the llguidance backend and this "
            "project's JSON style, so that both sides apply the same grammar) and through `microspec serve` "
            f"(`auto`, the `openai` client); weights {m['weights']}. Requests one at a time; speed: generated tokens "
            "over the requests' wall time (prefill included).", "",
            table(["server", "tok/s", "tokens", "tau"],
                  [["vLLM (plain)", num(r["vllm_plain"]["tok_s"], 1), r["vllm_plain"]["tokens"], None],
                   ["`microspec serve` (`auto`)", num(r["microspec_serve"]["tok_s"], 1),
                    r["microspec_serve"]["tokens"], num(r["microspec_serve"]["mean_tau"])]]), "",
            Source(VLLM, m["command"], m["date"], _machine(m), m["commit"]).markdown(), "",
            f"- The same text from both for {r['same_text']} of {m['prompts']} requests"
            + (": " + "; ".join(f"{d['id']} parts at character {d['char']}" for d in r["differences"])
               if r["differences"] else ".")]


def render() -> str:
    return "\n".join(["## Structured outputs", "", *_engines(), "", *_speed(), "", *_vllm()])
