"""The benchmark loop: every question, turn by turn, through every method, for each decoding configuration.

Questions go in the outer loop and methods in the inner one, so that slow drifts of a shared machine (other load,
clock changes) fall on all methods alike; each method's conversation carries its own previous answers.  Warm-up
generations (excluded from every number) run once per method and configuration before the first question.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..api import encode_conversation
from ..errors import MicrospecError
from ..decoding import GenerationConfig
from ..decoding.processors import LogitsPipeline
from ..models.registry import LoadedModel
from .metrics import mismatches, question_speed, summarize


@dataclass(frozen=True)
class Decoding:
    """One decoding configuration of a run."""

    temperature: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def name(self) -> str:
        base = "greedy" if self.temperature == 0 else f"T{self.temperature:g}"
        return base if self.repetition_penalty == 1.0 else f"{base}-rp{self.repetition_penalty:g}"

    def config(self, max_new_tokens: int, seed: int | None, **kw) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=max_new_tokens, temperature=self.temperature,
                                repetition_penalty=self.repetition_penalty,
                                seed=seed if self.temperature > 0 else None, **kw)


def turn_seed(seed: int, question_id, repeat: int, turn: int) -> int:
    """The sampling seed of one turn: fixed per question (a stable hash of its id), repeat and turn, the same for
    every method, so that methods sample against the same seeds and questions do not share one."""
    return (seed + zlib.crc32(str(question_id).encode()) * 1000 + 100 * repeat + turn) % 2**63


def _log(msg: str) -> None:
    print(f"[microspec] {msg}", file=sys.stderr, flush=True)


def run_decoding(lm: LoadedModel, runners: dict[str, object], records: Sequence[dict], decoding: Decoding, *,
                 max_new_tokens: int, out_dir: Path, repeats: int = 1, warmup: int = 1, seed: int = 0,
                 chat: bool | None = None, model_id: str = "", ignore_eos: bool = False,
                 log: Callable[[str], None] = _log, resume: bool = False,
                 peers: Collection[str] | None = None, profile: bool = False) -> dict:
    """Run ``records`` through ``runners`` under one decoding configuration; write ``answers/<method>.jsonl``
    (Spec-Bench's answer format, plus our per-step fields) under ``out_dir`` and return
    ``{"methods": ..., "mismatches": ...}`` (mismatches only for greedy decoding, against ``ar``).  ``resume``:
    keep the answers already in those files (a run that was interrupted) and run only the questions they lack.
    ``peers``: the methods whose differing tokens are logged as peer differences, not lossless mismatches (default:
    the runners whose spec is a peer).  ``profile``: each engine method's step profiled on the first question
    (:mod:`microspec.bench.profile`), under ``"profile"``."""
    if peers is None:
        peers = {n for n, r in runners.items() if getattr(getattr(r, "spec", None), "is_peer", False)}
    answers_dir = out_dir / "answers"
    answers_dir.mkdir(parents=True, exist_ok=True)
    wanted = {str(r["id"]) for r in records}
    done = {name: read_answers(answers_dir / f"{name}.jsonl", wanted) if resume else {} for name in runners}
    files = {name: (answers_dir / f"{name}.jsonl").open("w", encoding="utf-8") for name in runners}
    for name, answers in done.items():  # rewritten whole: a line cut by the interruption is dropped
        for answer in answers.values():
            files[name].write(json.dumps(answer) + "\n")
        files[name].flush()
    if any(done.values()):
        log(f"bench {decoding.name}: resuming, " + ", ".join(f"{n} {len(a)}/{len(records)} done"
                                                             for n, a in done.items()))
    results: dict[str, list[dict]] = {name: [] for name in runners}
    cfg = decoding.config(max_new_tokens, seed, ignore_eos=ignore_eos)
    # not a timed question: a method that learns from earlier answers (suffix decoding, auto) would know its answer
    warm_prompt = encode_conversation(lm, [WARMUP_PROMPT], [], chat)
    for name, runner in runners.items():
        for _ in range(warmup):
            runner.run(warm_prompt, cfg)
    found: dict[str, list[dict]] = {}
    failed: dict[str, str] = {}  # a method that raised: left out of the rest of this decoding and of the summary
    try:
        names = list(runners)
        for qi, rec in enumerate(records, 1):
            # the methods in turn, from a different one at each question: none always follows the same one
            for name in names[(qi - 1) % len(names):] + names[:(qi - 1) % len(names)]:
                runner = runners[name]
                if name in failed:
                    continue
                if str(rec["id"]) in done[name]:
                    results[name].append(done[name][str(rec["id"])])
                    continue
                try:
                    answer = _answer(lm, runner, name, rec, cfg, decoding, repeats, seed, ignore_eos, max_new_tokens,
                                     chat, model_id)
                except MicrospecError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one method's failure: the others go on, it is reported
                    failed[name] = f"{type(exc).__name__}: {exc} (question {rec['id']})"
                    log(f"bench {decoding.name}: {name} failed on question {rec['id']}: {failed[name]}")
                    continue
                results[name].append(answer)
                files[name].write(json.dumps(answer) + "\n")
                files[name].flush()
            for name in [n for n in names if n not in failed and "ar" not in failed]:  # against ar's answer
                _check(lm, rec, name, results[name][-1], results, decoding, cfg, chat, found, log, name in peers)
            log(_progress(decoding.name, qi, len(records), rec["category"], results))
    finally:
        for f in files.values():
            f.close()
    summary = summarize({n: r for n, r in results.items() if n not in failed})
    summary["mismatches"] = found if decoding.temperature == 0 else None
    if failed:
        summary["failed"] = failed
    if profile and records:
        from .profile import profile_method

        ids = encode_conversation(lm, records[0]["turns"][:1], [], chat)
        summary["profile"] = {name: profile_method(runner, ids, cfg) for name, runner in runners.items()
                              if hasattr(runner, "engine")}
        log(f"bench {decoding.name}: profiled " + ", ".join(summary["profile"]))
    return summary


def _answer(lm, runner, name: str, rec: dict, cfg, decoding: Decoding, repeats: int, seed: int, ignore_eos: bool,
            max_new_tokens: int, chat, model_id: str) -> dict:
    """One method's answer record to one question (every repeat and turn)."""
    choices = []
    # each repeat drafts from what the first did: a method that keeps earlier answers (suffix decoding,
    # auto's suffix arm) would otherwise draft the repeat from the answer it gave to the same question
    held = runner.remembered(cfg) if repeats > 1 and hasattr(runner, "remembered") else None
    for r in range(repeats):
        if r and held:
            runner.recall(held)
        answers: list[str] = []
        choice: dict = {"index": r, "turns": [], "token_ids": [], "new_tokens": [], "wall_time": [],
                        "accept_lengths": [], "draft_depths": [], "decoding_steps": []}
        for ti in range(len(rec["turns"])):
            ids = encode_conversation(lm, rec["turns"][: ti + 1], answers, chat)
            turn_cfg = cfg if decoding.temperature == 0 else \
                decoding.config(max_new_tokens, turn_seed(seed, rec["id"], r, ti), ignore_eos=ignore_eos)
            turn = runner.run(ids, turn_cfg)
            text = lm.tokenizer.decode(turn.token_ids, skip_special_tokens=True)
            answers.append(text)
            choice["turns"].append(text)
            choice["token_ids"].append(turn.token_ids)
            choice["new_tokens"].append(len(turn.token_ids))
            choice["wall_time"].append(round(turn.wall_s, 6))
            extra = turn.choice_fields()
            choice["accept_lengths"] += extra.pop("accept_lengths")
            choice["draft_depths"] += extra.pop("draft_depths")
            choice["decoding_steps"].append(extra.pop("decoding_steps"))
            for k, v in extra.items():
                if k == "active_vocab":
                    acc = choice.setdefault(k, {"sum": 0, "calls": 0, "max": 0})
                    acc["sum"] += v["sum"]
                    acc["calls"] += v["calls"]
                    acc["max"] = max(acc["max"], v["max"])
                elif isinstance(v, dict):  # auto: steps per arm
                    acc = choice.setdefault(k, {})
                    for arm, n in v.items():
                        acc[arm] = acc.get(arm, 0) + n
                else:
                    choice[k] = choice.get(k, 0) + v
        choices.append(choice)
    return {"question_id": rec["id"], "category": rec["category"], "answer_id": f"{name}-{rec['id']}",
            "model_id": f"{model_id}-{name}", "choices": choices, "tstamp": time.time()}


def read_answers(path: Path, wanted: set[str]) -> dict[str, dict]:
    """The complete answer records of an answers file, by question id (only questions of this run; a line cut
    short by an interruption, or anything unreadable, is left out: that question runs again)."""
    out: dict[str, dict] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(answer, dict) and str(answer.get("question_id")) in wanted and answer.get("choices"):
            out[str(answer["question_id"])] = answer
    return out


def _check(lm, rec: dict, name: str, answer: dict, results: dict, decoding: Decoding, cfg, chat, found: dict,
           log, peer: bool = False) -> None:
    """Greedy decoding: ``answer``'s tokens against ``ar``'s answer to the same question (found mismatches, with the
    logit gap where they first diverge, go into ``found``).  A ``peer``'s differences are logged as such: other
    kernels or weights, informational, never a lossless mismatch."""
    if decoding.temperature != 0 or name == "ar" or not results.get("ar"):
        return
    ref = results["ar"][-1]
    if str(ref["question_id"]) != str(rec["id"]):
        return
    bad = mismatches([ref], [answer])
    if bad:
        bad[0].update(divergence_gap(lm, rec, ref, bad[0], cfg, chat))
        for later in bad[1:]:  # later turns continue from a different conversation
            later["after_divergence"] = True
        found.setdefault(name, []).extend(bad)
        where = (f"on question {rec['id']} ({rec['category']}), turn {bad[0]['turn']}, token {bad[0]['position']}"
                 + (f"; {describe_gap(bad[0])}" if "gap" in bad[0] else ""))
        if peer:
            log(f"peer difference: {name}'s tokens differ from ar {where} (its own kernels or weights; "
                "informational)")
        else:
            log(f"LOSSLESS MISMATCH: {name} differs from ar {where}")


# How close two logits may be and still count as a tie that the dtype's rounding can flip, relative to the largest
# |logit| at that position: bf16 keeps 8 significant bits (relative step 2^-8 ~ 0.4%) and the verify pass and the
# one-token decode step round differently through every layer; fp32 keeps 24.
# the untimed warm-up generations' prompt (none of the questions: see run_decoding)
WARMUP_PROMPT = "Explain in a few sentences how a bicycle's gears work, then give one tip for riding uphill."
TIE_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}


@torch.inference_mode()
def divergence_gap(lm: LoadedModel, rec: dict, reference: dict, item: dict, cfg: GenerationConfig,
                   chat: bool | None) -> dict:
    """How far apart the target's two candidates are where a method first left the reference: one prefill over the
    conversation and the common prefix, the decoding's logits processors applied, then the processed logits of the
    reference's token and of the method's token.  A gap within the dtype's rounding (:data:`TIE_TOLERANCE`) is a
    near tie that differently shaped kernels can decide either way; a wider one is a real loss of exactness."""
    t, pos = item["turn"], item["position"]
    ref = reference["choices"][0]
    if not item["expected"] or not item["got"]:  # one output ended early: no pair of tokens to compare
        return {}
    ids = encode_conversation(lm, rec["turns"][: t + 1], ref["turns"][:t], chat)
    seq = ids + ref["token_ids"][t][:pos]
    model = lm.model
    cache = model.new_cache(len(seq))
    hidden = model.forward(torch.as_tensor(seq, dtype=torch.long, device=model.device), cache)
    logits = model.head(hidden[-1:]).float()
    pipe = LogitsPipeline(cfg, logits.shape[-1], logits.device)
    if pipe.active:
        pipe.start(ids)
        pipe.commit(seq[len(ids):])
        logits = pipe.process(logits)
    a, b = int(item["expected"][0]), int(item["got"][0])
    gap = float(logits[0, a] - logits[0, b])
    scale = float(logits[0].abs().max())
    rel = abs(gap) / max(scale, 1e-12)
    return {"gap": round(gap, 5), "relative_gap": round(rel, 6),
            "near_tie": bool(rel <= TIE_TOLERANCE.get(model.dtype, 1e-4)), "dtype": str(model.dtype).split(".")[-1]}


def describe_gap(item: dict) -> str:
    what = (f"a near tie within {item['dtype']} rounding" if item["near_tie"]
            else f"NOT a tie at {item['dtype']} precision")
    return (f"the target's logits of the two tokens differ by {item['gap']:.4g} "
            f"({100 * item['relative_gap']:.2f}% of the largest): {what}")


def _progress(decoding: str, done: int, total: int, category: str, results: dict[str, list[dict]]) -> str:
    width = 20
    bar = "#" * (width * done // total) + "." * (width - width * done // total)
    parts = []
    for name, recs in results.items():
        if not recs:  # a method that failed on its first question
            continue
        speed = sum(question_speed(r) for r in recs) / len(recs)
        acc = [a for r in recs for c in r["choices"] for a in c["accept_lengths"]]
        tau = f"tau {sum(acc) / len(acc):.2f} " if acc and name != "ar" else ""
        parts.append(f"{name} {tau}{speed:.1f} tok/s")
    return f"bench {decoding} [{bar}] {done}/{total} {category} | " + " | ".join(parts)
