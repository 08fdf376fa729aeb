"""The data stages of head training: the target's own answers (``generate``) and its features and top-K next
tokens over answers and text (``capture``), written under a run's ``--out`` so that every stage resumes; the
progress line each stage prints.

1. ``generate``: the target answers each training prompt (formatted as at inference: the chat template when the
   tokenizer has one) in each decoding asked for; answers go to ``responses.jsonl`` one line per answer, so an
   interrupted run resumes.
2. ``capture``: one target forward over prompt + answer (or a text window) gives the final (post-norm) hidden states
   f_0..f_{L-1} and, with ``topk``, the target's top-K next tokens at every position, stored in shards with the ids
   and the prompt length.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from ..api import encode_prompt
from ..decoding.config import GenerationConfig
from ..decoding.loop import generate_ids
from ..errors import MicrospecError, check
from ..models.native import NativeCausalLM
from ..models.taps import Taps
from .batch_generate import generate_batched
from .budget import Progress, hms, record_rate, stop_if_late
from .data import append_jsonl, read_jsonl

def generate_responses(lm, prompts: list[str], out: Path, cfg: GenerationConfig, chat: bool | None = None,
                       batch: int = 1, max_prompt_len: int | None = None, max_len: int | None = None,
                       shard_size: int = 64, log=print, penalties: list[float] | None = None,
                       deadline: float | None = None, temperatures: list[float] | None = None) -> list[dict]:
    """Stage 1 (resumable): the target's own answers, as token ids, one JSONL line per answer (with its index, as
    batched generation finishes answers out of order).  ``batch`` > 1 decodes that many answers together
    (:func:`generate_batched`, greedy with the repetition penalty only); 1 uses the generation loop itself.
    ``penalties`` (default: ``cfg``'s one): every prompt is answered once per repetition penalty; answer
    ``index`` = prompt number * len(penalties) + penalty number, and each line records its penalty.
    Prompts longer than ``max_prompt_len`` tokens are skipped (their answers would be cut away by ``--max-len``).
    Batched generation also keeps the final hidden states it computes on the way (when ``max_len`` is given): the
    features of prompt + answer[:-1], cut to ``max_len``, written as ``features/genNNNNN.pt`` shards together with
    the answers (``"features"`` names the shard), which spares the capture stage a second forward over them.
    ``deadline``: :class:`OutOfTime` once it has passed, checked each time answers are saved (with features: a
    shard at a time).  ``temperatures`` (default: ``cfg``'s one): every prompt is answered once per (temperature,
    penalty) pair, the decodings users run (0: greedy; a sampled answer is seeded by its index); answer ``index`` =
    prompt number * pairs + pair number, the pairs temperature-major.  Where the target's weights are packed or an
    answer is sampled, ``batch`` > 1 steps that many answers together through the inference engine itself
    (:func:`generate_engine_batched`)."""
    path = out / "responses.jsonl"
    pens = [(p, t) for t in (list(temperatures) if temperatures else [cfg.temperature])
            for p in (list(penalties) if penalties else [cfg.repetition_penalty])]
    jobs = len(prompts) * len(pens)
    done = read_jsonl(path, repair=True)
    check(len(done) <= jobs, f"{path} has more answers than there are prompts: wrong directory?")
    have = {rec.get("index", i) for i, rec in enumerate(done)}
    encoded: dict[int, list[int]] = {}
    limit = lm.model.spec.max_position - cfg.max_new_tokens
    if max_prompt_len is not None:
        limit = min(limit, max_prompt_len)
    for i, p in enumerate(prompts):
        todo = [i * len(pens) + j for j in range(len(pens)) if i * len(pens) + j not in have]
        if todo:
            ids = encode_prompt(lm, p, chat)
            if len(ids) <= limit:
                for k in todo:
                    encoded[k] = ids
    t0, tokens, n, last_log = time.perf_counter(), 0, len(done), 0.0
    first_n = n
    fdir = out / "features"
    pending: list[tuple[dict, dict]] = []

    def save(rec: dict, feat: dict | None) -> None:
        nonlocal tokens, n, last_log
        if feat is not None:  # answers and their features land together, a shard at a time
            pending.append((rec, feat))
            saved = len(pending) >= shard_size
            if saved:
                flush()
        else:
            append_jsonl(path, rec)
            done.append(rec)
            saved = True
        tokens += len(rec["response_ids"])
        n += 1
        now = time.perf_counter()
        if now - last_log >= 5.0 or n == jobs:
            last_log = now
            rate = (n - first_n) / max(now - t0, 1e-9)
            log(f"generate {n}/{jobs}: {tokens} answer tokens, {tokens / (now - t0):.1f} tok/s | ETA "
                f"{hms((jobs - n) / rate) if rate else '?'}")
        if saved:
            stop_if_late(deadline, "generate")

    def flush() -> None:
        if not pending:
            return
        fdir.mkdir(parents=True, exist_ok=True)
        name = f"gen{len(list(fdir.glob('gen*.pt'))):05d}.pt"
        tmp = fdir / (name + ".tmp")
        torch.save([f for _, f in pending], tmp)
        tmp.replace(fdir / name)
        for rec, _ in pending:
            rec["features"] = name
            append_jsonl(path, rec)
            done.append(rec)
        pending.clear()

    def record(k: int, answer: list[int]) -> dict:
        rec = {"index": k, "prompt_ids": encoded[k], "response_ids": answer}
        pen, temp = pens[k % len(pens)]
        if len({p for p, _ in pens}) > 1 or pen != 1.0:
            rec["repetition_penalty"] = pen
        if temp > 0:
            rec["temperature"] = temp
        return rec

    def decoding(k: int) -> GenerationConfig:
        pen, temp = pens[k % len(pens)]
        return replace(cfg, repetition_penalty=pen, temperature=temp,
                       seed=(cfg.seed or 0) + k if temp > 0 else cfg.seed)

    try:
        if batch > 1 and (lm.model.quantized or any(t > 0 for _, t in pens)):
            from .batch_generate import generate_engine_batched

            for k, ans in generate_engine_batched(lm.model, [(k, encoded[k], decoding(k)) for k in sorted(encoded)],
                                                  lm.eos_token_ids, batch):
                save(record(k, ans), None)
        elif batch > 1:
            check(cfg.greedy and cfg.no_repeat_ngram_size == 0 and not cfg.stop_strings,
                  "batched answer generation is greedy with a repetition penalty only; use --gen-batch 1")
            order = sorted(encoded)
            answers = generate_batched(lm.model, [encoded[k] for k in order], cfg.max_new_tokens, lm.eos_token_ids,
                                       [pens[k % len(pens)][0] for k in order], batch, features=max_len is not None)
            for j, ans, hidden in answers:
                k = order[j]
                feat = None
                if hidden is not None:
                    ids = (encoded[k] + ans[:-1])[:max_len]
                    feat = {"ids": torch.tensor(ids), "features": hidden[: len(ids)], "prompt_len": len(encoded[k]),
                            **_penalty_entry(pens[k % len(pens)][0])}
                save(record(k, ans), feat)
            flush()
        else:
            for k, ids in encoded.items():
                save(record(k, generate_ids(lm.model, ids, decoding(k), lm.eos_token_ids).token_ids), None)
    finally:
        record_rate(out, "generate", tokens, time.perf_counter() - t0)
    skipped = jobs - len(done)
    log(f"generate: {len(done)} answers, {sum(len(r['response_ids']) for r in done)} answer tokens"
        + (f"; {skipped} prompt answers skipped (prompt over {limit} tokens)" if skipped else ""))
    return done


@torch.inference_mode()
def capture_features(target: NativeCausalLM, samples: list[dict], out: Path, max_len: int, shard_size: int = 64,
                     log=print, prefix: str = "shard", taps: tuple[int, ...] | None = None,
                     deadline: float | None = None, topk: int = 0) -> list[Path]:
    """Stage 2 (resumable by shard): final hidden states of prompt + answer, bf16, for the answers whose features
    batched generation did not already keep (those are its ``features/gen*.pt``), as ``features/<prefix>NNNNN.pt``.
    With ``taps`` (an EAGLE-3 head's layers) every answer is captured, and each record also keeps ``taps``: the
    inputs of those layers, concatenated.  Each shard is written whole (a temporary file renamed); ``deadline``:
    :class:`OutOfTime` between shards once it has passed (one shard is always computed first, so that every call
    goes on).  ``topk`` > 0: each record also keeps the target's ``topk`` most likely next tokens at every position
    (``top_ids`` int32 and their log-probabilities renormalised over the K, ``top_logp`` fp16, [T, topk]), which the
    ``ce_vocab="batch"`` loss trains on without the target's LM head.  Returns the shards of ``samples``."""
    fdir = out / "features"
    fdir.mkdir(parents=True, exist_ok=True)
    if taps is None:
        samples = [rec for rec in samples if "features" not in rec]
    shards: list[Path] = []
    todo = sum(1 for s0 in range(0, len(samples), shard_size)
               if not _shard_path(fdir, prefix, s0, shard_size, len(samples)).is_file())
    meter = Progress(f"capture {prefix}", todo, "shards", log)
    try:
        _capture_shards(target, samples, fdir, max_len, shard_size, prefix, taps, deadline, topk, shards, meter)
    finally:
        record_rate(out, "capture", meter.positions, time.perf_counter() - meter.t0)
    return shards


def _capture_shards(target, samples, fdir, max_len, shard_size, prefix, taps, deadline, topk, shards, meter) -> None:
    """The shards of :func:`capture_features` not written yet, in order (``shards`` collects every path)."""
    computed = 0
    for s0 in range(0, len(samples), shard_size):
        path = _shard_path(fdir, prefix, s0, shard_size, len(samples))
        shards.append(path)
        if path.is_file():
            continue
        # a shorter last shard of a run over fewer samples: replaced by this one once it is written
        stale = [p for p in fdir.glob(f"{prefix}{s0 // shard_size:05d}-*.pt") if p != path]
        if computed:
            stop_if_late(deadline, "capture")
        computed += 1
        recs = []
        for rec in samples[s0 : s0 + shard_size]:
            ids = (rec["prompt_ids"] + rec["response_ids"])[:max_len]
            if len(ids) < 3 or len(rec["prompt_ids"]) >= len(ids):
                continue
            t = torch.tensor(ids, dtype=torch.long, device=target.device)
            tapped = Taps(taps) if taps is not None else None
            hidden = target(t, target.new_cache(len(ids)), taps=tapped)
            recs.append({"ids": t.cpu(), "features": hidden.to("cpu", torch.bfloat16),
                         "prompt_len": len(rec["prompt_ids"]), **_penalty_entry(rec.get("repetition_penalty", 1.0)),
                         **({"taps": tapped.out.to("cpu", torch.bfloat16)} if tapped is not None else {}),
                         **(target_topk(target, hidden, topk) if topk > 0 else {})})
        tmp = path.with_name(path.name + ".tmp")
        torch.save(recs, tmp)
        tmp.replace(path)
        for p in stale:
            p.unlink()
        meter.advance(1, sum(len(r["ids"]) for r in recs), f"{path.name}, {len(recs)} sequences")


def _shard_path(fdir: Path, prefix: str, s0: int, shard_size: int, total: int) -> Path:
    """The shard of samples ``s0 ..``: ``<prefix>NNNNN.pt`` when it holds ``shard_size`` samples, else (the last
    one) ``<prefix>NNNNN-<count>.pt``, so that a later run over more samples computes it again, whole."""
    n = min(shard_size, total - s0)
    return fdir / f"{prefix}{s0 // shard_size:05d}{'' if n == shard_size else f'-{n}'}.pt"


@torch.inference_mode()
def target_topk(target: NativeCausalLM, hidden: torch.Tensor, k: int, rows: int = 256) -> dict:
    """The target's ``k`` most likely next tokens after each of ``hidden``'s rows [T, d]: ``top_ids`` [T, k] int32
    and ``top_logp`` [T, k] fp16, their log-probabilities under the target's distribution restricted to those k
    (its top-k renormalised: the loss's target; a full-vocabulary log-sum-exp would cost as much as the head's
    product again).  The LM head runs ``rows`` rows at a time, so no [T, V] tensor exists (through the packed
    kernels where the target's weights are packed)."""
    ids, logp = [], []
    k = min(k, target.spec.vocab_size)
    for c in range(0, hidden.shape[0], rows):
        logits = target.head(hidden[c : c + rows])
        top = logits.topk(k, -1)
        ids.append(top.indices.to(torch.int32))
        logp.append(torch.log_softmax(top.values, -1).to(torch.float16))
        del logits
    return {"top_ids": torch.cat(ids).cpu(), "top_logp": torch.cat(logp).cpu()}


def _penalty_entry(penalty: float) -> dict:
    """A feature record's ``penalty``: the repetition penalty its answer was decoded with (absent: none), which
    ``TrainConfig.penalty_loss`` trains under."""
    return {"penalty": float(penalty)} if float(penalty) != 1.0 else {}


FEATURE_SHARDS = ("gen*.pt", "shard*.pt", "text*.pt")  # batched generation's, capture's, the text corpora's
TAPPED_SHARDS = ("e3shard*.pt", "e3text*.pt")  # `train eagle3`'s: with the tapped layers' features


def feature_shards(out: Path, tapped: bool = False) -> list[Path]:
    """Every feature shard a `train eagle --out` directory holds (under features/), in a fixed order; ``tapped``:
    `train eagle3`'s."""
    return [p for pat in (TAPPED_SHARDS if tapped else FEATURE_SHARDS)
            for p in sorted((Path(out) / "features").glob(pat))]


def load_features(shards: list[Path], hidden_size: int | None = None) -> list[dict]:
    """The captured sequences of every shard; ``hidden_size`` checks they come from a target of that width."""
    out = []
    for p in shards:
        try:
            part = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 — any unreadable file is the same user error
            raise MicrospecError(f"{p}: not a feature shard ({type(e).__name__})") from None
        if not isinstance(part, list) or not all(isinstance(r, dict) and {"ids", "features"} <= r.keys()
                                                 for r in part):
            raise MicrospecError(f"{p}: not a feature shard (a list of ids/features records)")
        if hidden_size is not None:
            width = next((w for w in (r["features"].shape[-1] for r in part) if w != hidden_size), None)
            if width is not None:
                raise MicrospecError(f"{p}: features of width {width}, but the target's hidden size is "
                                     f"{hidden_size} (captured for another model?)")
        kind = "text" if "text" in p.name else "answers"  # text*.pt / e3text*.pt: --texts windows; else answers
        for r in part:
            r["source"] = kind
        out.extend(part)
    return out


def positions_by_source(data: list[dict]) -> dict:
    """Sequences and positions of loaded feature records (:func:`load_features`) by where they came from: the
    target's answers or teacher-forced text."""
    out: dict[str, dict] = {}
    for r in data:
        c = out.setdefault(r.get("source", "answers"), {"sequences": 0, "positions": 0})
        c["sequences"] += 1
        c["positions"] += len(r["ids"])
    return out


__all__ = ["FEATURE_SHARDS", "TAPPED_SHARDS", "capture_features", "feature_shards", "generate_responses",
           "positions_by_source",
           "load_features", "target_topk"]
