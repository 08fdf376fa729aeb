"""The training commands as library functions: ``microspec train eagle`` (self-distillation, feature capture,
EAGLE-1/2 training, export) and ``microspec train dynaspec | specvocab | coral`` (trained policies on the features
``train eagle`` saved).  Each takes the command's options as attributes of ``opts`` (an ``argparse.Namespace`` or
any object with the same names: see ``microspec train ... --help``) and returns the summary the command prints."""

from __future__ import annotations

import json

from ..compose import eagle_head_path, set_threads
from ..devices import profile
from ..drafters import load_eagle_head
from ..drafters.eagle import EagleHead
from ..errors import MicrospecError


def extra_feature_shards(paths: list[str], tapped: bool = False) -> list:
    """The shard files named by --extra-features (a directory stands for the shards of its features/; ``tapped``:
    the shards `train eagle3` captured there)."""
    from pathlib import Path

    from .stages import feature_shards

    out: list[Path] = []
    for p in map(Path, paths):
        found = feature_shards(p, tapped) if p.is_dir() else [p] if p.is_file() else []
        if not found:
            raise MicrospecError(f"--extra-features {p}: no feature shards there (a .pt shard, or a `train eagle "
                                 f"--out` directory with features/)")
        out += found
    return out


def _policy_setup(opts, positive: tuple[str, ...]):
    """What train dynaspec / specvocab share: checks, the EAGLE head, the model and the saved features."""
    from pathlib import Path

    from ..models.registry import load_model
    from .stages import feature_shards, load_features

    for name in positive:
        if getattr(opts, name) is not None and getattr(opts, name) < 1:
            raise MicrospecError(f"--{name.replace('_', '-')} must be >= 1")
    if opts.epochs <= 0 or opts.lr <= 0 or not 0 < opts.heldout < 1:
        raise MicrospecError("--epochs and --lr must be > 0 and --heldout in (0, 1)")
    set_threads(opts.threads)
    shards = feature_shards(Path(opts.features))
    if not shards:
        raise MicrospecError(f"no features under {Path(opts.features) / 'features'}: run `microspec train eagle` "
                             "(its generate/capture stages) first")
    draft = eagle_head_path(opts.draft, opts.model)
    head = EagleHead.load(draft)
    lm = load_model(opts.model, dtype=opts.dtype, device=opts.device, cuda_graphs=False)
    if head.hidden_size != lm.model.spec.hidden_size:
        raise MicrospecError(f"EAGLE head hidden size {head.hidden_size} does not match the target's "
                             f"{lm.model.spec.hidden_size}")
    return lm, head, draft, load_features(shards, lm.model.spec.hidden_size)


def _save_trained(opts, art, report: dict, lm, draft, t0: float, shown: dict) -> dict:
    """Write a trained policy with its training.json (command, data, held-out numbers, wall time); the summary:
    ``shown`` (the artifact's path in its None entry) and the held-out numbers."""
    import time

    import torch

    report.update(model=opts.model, features=str(opts.features), draft=str(draft), device=str(lm.model.device),
                  torch=torch.__version__, wall_s=round(time.perf_counter() - t0, 1),
                  command="microspec " + " ".join(getattr(opts, "argv", [])))
    out = art.save(opts.out, {"training": {k: v for k, v in report.items() if k != "history"}})
    (out / "training.json").write_text(json.dumps(report, indent=2, default=str))
    return {**{k: (str(out) if v is None else v) for k, v in shown.items()}, "heldout": report["heldout"]}


def train_specvocab(opts) -> dict:
    import time

    import torch

    from .eagle import log_stderr
    from .specvocab import build_specvocab

    t0 = time.perf_counter()
    lm, head, draft, data = _policy_setup(opts, ("k", "positions", "q_top", "batch", "rank"))
    v = lm.model.spec.vocab_size
    if opts.k > v or (opts.rank or 1) > lm.model.spec.hidden_size:
        raise MicrospecError("--k must not exceed the vocabulary, nor --rank the hidden size")
    art, report = build_specvocab(lm.model, head, data, rank=opts.rank, k=opts.k, positions=opts.positions,
                                  heldout=opts.heldout, q_top=opts.q_top, epochs=opts.epochs, lr=opts.lr,
                                  batch=opts.batch, seed=opts.seed, log=log_stderr)
    art.ranker.to(torch.bfloat16)
    return _save_trained(opts, art, report, lm, draft, t0, {"ranker": None, "k": art.k})


def train_coral(opts) -> dict:
    import time

    from .coral import build_coral
    from .eagle import log_stderr

    if not 0 < opts.coverage <= 1:
        raise MicrospecError("--coverage must be in (0, 1]")
    t0 = time.perf_counter()
    lm, head, draft, data = _policy_setup(opts, ("partitions", "kmeans_iters", "positions", "batch", "r"))
    if opts.partitions > lm.model.spec.vocab_size:
        raise MicrospecError("--partitions must not exceed the vocabulary size")
    art, report = build_coral(lm.model, head, data, partitions=opts.partitions, kmeans_iters=opts.kmeans_iters,
                              positions=opts.positions, heldout=opts.heldout, epochs=opts.epochs, lr=opts.lr,
                              batch=opts.batch, coverage=opts.coverage, r=opts.r, seed=opts.seed, log=log_stderr)
    return _save_trained(opts, art, report, lm, draft, t0, {"router": None, "r": art.r})


def train_dynaspec(opts) -> dict:
    import time

    import torch

    from .dynaspec import build_dynaspec
    from .eagle import log_stderr

    if not 0 < opts.coverage <= 1:
        raise MicrospecError("--coverage must be in (0, 1]")
    if (opts.k0 is not None and opts.k0 < 1) or (opts.k1 is not None and opts.k1 < 1):
        raise MicrospecError("--k0 and --k1 must be >= 1")
    t0 = time.perf_counter()
    lm, head, draft, data = _policy_setup(opts, ("clusters", "kmeans_iters", "top_l", "positions",
                                                        "router_width"))
    if opts.top_l > lm.model.spec.vocab_size or opts.clusters > lm.model.spec.vocab_size:
        raise MicrospecError("--top-l and --clusters must not exceed the vocabulary size")
    art, report = build_dynaspec(
        lm.model, head, data, num_clusters=opts.clusters, kmeans_iters=opts.kmeans_iters, top_l=opts.top_l,
        positions=opts.positions, heldout=opts.heldout, width=opts.router_width, epochs=opts.epochs,
        lr=opts.lr, coverage=opts.coverage, k0=opts.k0, k1=opts.k1, seed=opts.seed, log=log_stderr)
    art.router.to(torch.bfloat16)
    return _save_trained(opts, art, report, lm, draft, t0,
                         {"router": None, "k0": report["k0"], "k1": report["k1"]})


def _feature_layers(opts, target) -> tuple[int, ...]:
    """``--feature-layers`` (default: vLLM's 2, L/2, L-3), checked against the target."""
    from ..drafters.eagle3 import default_feature_layers

    layers = tuple(opts.feature_layers) if opts.feature_layers else default_feature_layers(target.spec.num_layers)
    if len(layers) < 1 or not all(0 <= i <= target.spec.num_layers for i in layers) or len(set(layers)) != len(layers):
        raise MicrospecError(f"--feature-layers must be distinct layers in 0..{target.spec.num_layers}, got "
                             f"{list(layers)}")
    return layers


def _bf16_training(choice: str, device) -> bool:
    """``--train-dtype``: bf16 or fp32 as asked; auto: bf16 where the device multiplies it in hardware."""
    from ..devices import native_bf16

    return choice == "bf16" or (choice == "auto" and native_bf16(device))


def assign_penalty(data: list[dict], share: float, penalty: float, seed: int) -> int:
    """Train ``share`` of the sequences that carry no repetition penalty of their own (teacher-forced text, answers
    decoded without one) under ``penalty``: the penalised distribution after any history is the target's, whether
    or not the history was decoded under it.  The same sequences on every call with this ``seed`` (a resumed run
    trains what it started with); returns how many it gave a penalty."""
    import random

    rng = random.Random(seed * 7919 + 1)
    given = 0
    for r in data:
        if rng.random() < share and "penalty" not in r:
            r["penalty"] = float(penalty)
            given += 1
    return given


def train_eagle3(opts) -> dict:
    """``microspec train eagle3``: ``train eagle``'s stages for an EAGLE-3 head (see :mod:`.eagle3`)."""
    opts.arch = "eagle3"
    return train_eagle(opts)


def train_eagle(opts) -> dict:
    """``microspec train eagle``: the summary of the finished run (``status`` done: the exported head, its held-out
    numbers) or, where ``--time-budget`` ran out first, ``status`` stopped with the ``stage`` it stopped in (the
    answers, shards and checkpoint made so far kept: the same command with ``--resume`` goes on)."""
    import time

    from .budget import OutOfTime

    t0 = time.perf_counter()
    budget = getattr(opts, "time_budget", None)
    if budget is not None and budget <= 0:
        raise MicrospecError("--time-budget must be > 0 seconds")
    try:
        return _train_eagle(opts, None if budget is None else t0 + budget)
    except OutOfTime as stop:
        return {"status": "stopped", "stage": stop.stage, "out": str(opts.out),
                "wall_s": round(time.perf_counter() - t0, 1), **({"interrupted": True} if stop.interrupted else {})}


def _train_eagle(opts, deadline: float | None) -> dict:
    import time
    from pathlib import Path

    import torch

    from ..decoding.config import GenerationConfig
    from ..models.registry import load_model
    from ..bench import run_meta
    from .budget import OutOfTime, stage_rates
    from .data import read_training_prompts, read_training_texts, text_windows
    from .eagle import TrainConfig, Trainer, export_head, init_head, log_stderr, new_head, split_heldout
    from .stages import capture_features, feature_shards, generate_responses, load_features, positions_by_source

    stages = [s.strip() for s in opts.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in ("generate", "capture", "train")]
    if bad or not stages:
        raise MicrospecError(f"--stages takes generate, capture and/or train, got {opts.stages!r}")
    for name in ("max_new_tokens", "tokens_per_step", "max_len", "save_every", "gen_batch", "batch_tokens"):
        if getattr(opts, name) is not None and getattr(opts, name) < 1:
            raise MicrospecError(f"--{name.replace('_', '-')} must be >= 1")
    if any(not 0 < r < 10 for r in opts.repetition_penalty):
        raise MicrospecError("--repetition-penalty values must be in (0, 10)")
    if opts.epochs <= 0 or opts.lr <= 0 or not 0 <= opts.heldout < 1:
        raise MicrospecError("--epochs and --lr must be > 0 and --heldout in [0, 1)")
    share, penalty = getattr(opts, "penalty_share", 0.0) or 0.0, getattr(opts, "penalty_value", 1.2)
    if not 0 <= share <= 1 or penalty <= 0:
        raise MicrospecError("--penalty-share must lie in [0, 1] and --penalty-value be > 0")
    if share and not getattr(opts, "penalty_loss", False):
        raise MicrospecError("--penalty-share trains sequences under a repetition penalty: give --penalty-loss too")
    set_threads(opts.threads)
    if not opts.prompts and not opts.texts:
        raise MicrospecError("give training --prompts (answered by the target) and/or --texts (trained as they are)")
    if not 0 <= getattr(opts, "target_topk", 0) <= 1024:
        raise MicrospecError("--target-topk must be in 0..1024")
    if opts.text_tokens is not None and opts.text_tokens < 1:
        raise MicrospecError("--text-tokens must be >= 1")
    eagle3 = getattr(opts, "arch", "eagle") == "eagle3"
    if eagle3 and (opts.ttt_steps < 1 or opts.draft_vocab < 1):
        raise MicrospecError("--ttt-steps and --draft-vocab must be >= 1")
    temps = list(getattr(opts, "temperatures", None) or [0.0])
    if any(not 0 <= t <= 10 for t in temps):
        raise MicrospecError("--temperatures values must be in [0, 10]")
    if not opts.prompts and "generate" in stages:
        stages.remove("generate")  # nothing to answer
    prompts = read_training_prompts(opts.prompts, allow_eval=opts.allow_eval) if opts.prompts else []
    text_docs = read_training_texts(opts.texts, allow_eval=opts.allow_eval) if opts.texts else []
    if opts.shuffle:
        import random

        random.Random(opts.seed).shuffle(prompts)
        for docs in text_docs:
            random.Random(opts.seed).shuffle(docs)
    prompts = prompts[: opts.limit]
    extra = extra_feature_shards(opts.extra_features, tapped=eagle3)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    samples = None
    dtype = opts.dtype
    if dtype is None:  # the packed kernels where inference uses them (EAGLE-3's full-vocabulary loss: dense)
        from ..models.registry import default_weights

        dtype = "gguf" if default_weights(opts.model, opts.device) == "gguf" and not eagle3 else "fp32"
    if "generate" in stages:
        lm = load_model(opts.model, dtype=opts.gen_dtype or dtype, device=opts.device, cuda_graphs=False)
        cfg = GenerationConfig(max_new_tokens=opts.max_new_tokens, repetition_penalty=opts.repetition_penalty[0])
        # features kept on the way only where capture would compute the same (no top-K targets, no EAGLE-3 taps)
        samples = generate_responses(lm, prompts, out, cfg, opts.chat, opts.gen_batch, opts.max_len // 2,
                                     None if eagle3 or getattr(opts, "target_topk", 0) else opts.max_len,
                                     log=log_stderr, penalties=opts.repetition_penalty, deadline=deadline,
                                     temperatures=temps)
    lm = load_model(opts.model, dtype=dtype, device=opts.device, cuda_graphs=False)
    packed = lm.model.quantized
    if samples is None:
        from .data import read_jsonl

        samples = read_jsonl(out / "responses.jsonl")
        if not samples and opts.prompts:
            raise MicrospecError(f"no answers in {out / 'responses.jsonl'}: run the generate stage first")
    # a text window trains every position: its first token (the BOS) stands as the "prompt"
    texts = [{"prompt_ids": w[:1], "response_ids": w[1:]}
             for docs in text_docs for w in text_windows(lm.tokenizer, docs, opts.max_len, opts.text_tokens)]
    if opts.shuffle:  # the files' windows interleaved, so that the shards captured so far sample every file
        import random

        random.Random(opts.seed).shuffle(texts)
    taps = _feature_layers(opts, lm.model) if eagle3 else None
    captured = len(feature_shards(out, tapped=eagle3))
    if "capture" in stages and eagle3:  # every answer again: batched generation keeps no tapped features
        shards = capture_features(lm.model, samples, out, opts.max_len, log=log_stderr, prefix="e3shard", taps=taps,
                                  deadline=deadline)
        shards += capture_features(lm.model, texts, out, opts.max_len, log=log_stderr, prefix="e3text", taps=taps,
                                   deadline=deadline)
    elif "capture" in stages:
        shards = sorted((out / "features").glob("gen*.pt"))  # answers whose features batched generation kept
        topk = getattr(opts, "target_topk", 0) or 0
        shards += capture_features(lm.model, samples, out, opts.max_len, log=log_stderr, deadline=deadline,
                                   topk=topk)
        shards += capture_features(lm.model, texts, out, opts.max_len, log=log_stderr, prefix="text",
                                   deadline=deadline, topk=topk)
    else:
        shards = feature_shards(out, tapped=eagle3)
    if "train" not in stages:
        return {}
    if deadline is not None and time.perf_counter() >= deadline and len(feature_shards(out, tapped=eagle3)) > captured:
        raise OutOfTime("train")  # this call made progress: the features load in the next one
    shards += extra
    if not shards:
        raise MicrospecError(f"no features under {out / 'features'}: run the capture stage first")
    data = load_features(shards, lm.model.spec.hidden_size)
    if eagle3 and not all("taps" in r and r["taps"].shape[-1] == len(taps) * lm.model.spec.hidden_size
                          for r in data):
        raise MicrospecError(f"features without the taps of layers {list(taps)} (an EAGLE-1/2 capture, or other "
                             f"--feature-layers): capture again with `train eagle3`")
    ce_vocab = opts.ce_vocab
    with_topk = all("top_ids" in r for r in data)
    if ce_vocab == "auto":
        ce_vocab = "batch" if with_topk else "full"
    if ce_vocab == "batch" and not with_topk:
        raise MicrospecError("--ce-vocab batch needs the target's top-K in every feature shard: capture with "
                             "--target-topk K (shards captured before it have none)")
    if ce_vocab != "batch" and packed:
        raise MicrospecError(f"--ce-vocab {ce_vocab} computes the target's logits in training: use --dtype fp32 "
                             f"or bf16 with it")
    with_penalty = assign_penalty(data, share, penalty, opts.seed) if share else 0
    tcfg = TrainConfig(epochs=opts.epochs, lr=opts.lr, warmup_steps=opts.warmup_steps,
                       tokens_per_step=opts.tokens_per_step, max_len=opts.max_len, heldout=opts.heldout,
                       seed=opts.seed, save_every=opts.save_every, noise_std=opts.noise_std, p_w=opts.p_w,
                       v_w=opts.v_w, ce_vocab=ce_vocab, batch_tokens=opts.batch_tokens,
                       loss_on=opts.loss_on, penalty_loss=getattr(opts, "penalty_loss", False),
                       bf16=_bf16_training(getattr(opts, "train_dtype", "auto"), lm.model.device))
    if profile(lm.model.device).tf32:  # TF32 for the full-vocabulary products of the loss (fp32 elsewhere)
        torch.backends.cuda.matmul.allow_tf32 = True
    train, held = split_heldout(data, tcfg.heldout, tcfg.seed)
    torch.manual_seed(tcfg.seed)
    if opts.init is not None and opts.resume:
        raise MicrospecError("--init and --resume exclude each other")
    if eagle3:
        from dataclasses import replace

        from .eagle3 import Eagle3Loss, draft_vocabulary, new_eagle3_head

        tcfg = replace(tcfg, p_w=1.0, v_w=0.0, noise_std=0.0, ce_vocab="full")  # the token loss only
        ck = out / "checkpoint.pt"
        if opts.resume and ck.is_file():  # the draft vocabulary the checkpoint was trained over
            d2t = torch.load(ck, map_location="cpu", weights_only=False)["head"].get("d2t")
            if d2t is None:
                raise MicrospecError(f"{ck} is not an EAGLE-3 head's checkpoint (no d2t): use another --out or "
                                     f"leave out --resume")
            ids = d2t + torch.arange(d2t.numel())
        else:
            ids = draft_vocabulary(train, opts.draft_vocab, lm.model.spec.vocab_size, lm.model.spec.eos_token_ids)
        head = new_eagle3_head(lm.model, ids, opts.feature_layers, opts.intermediate_size, seed=tcfg.seed)
        if opts.init is not None:
            init_head(head, load_eagle_head(opts.init))  # its draft vocabulary too
        trainer = Trainer(lm.model, head, tcfg, out, log=log_stderr,
                          loss=Eagle3Loss(lm.model, head, tcfg, steps=opts.ttt_steps))
    else:
        head = new_head(lm.model, opts.intermediate_size, seed=tcfg.seed)
        if opts.init is not None:
            init_head(head, EagleHead.load(opts.init))
        trainer = Trainer(lm.model, head, tcfg, out, log=log_stderr)
    result = trainer.fit(train, held, resume=opts.resume, deadline=deadline)
    meta = {"model": opts.model, "prompts": opts.prompts, "prompt_count": len(prompts), "answers": len(samples),
            "answer_tokens": sum(len(r["response_ids"]) for r in samples), "texts": opts.texts,
            "extra_features": [str(p) for p in extra],
            "text_tokens": sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in texts),
            "trained_data": positions_by_source(data), "sequences": len(data), "penalised_sequences": sum(
                "penalty" in r for r in data), "penalty_assigned": with_penalty,
            "train_sequences": len(train), "heldout_sequences": len(held), "train_tokens_per_epoch":
            result["train_tokens"], "steps": result["steps"], "heldout": result["heldout"],
            **{k: result.get(k) for k in ("trained_positions", "train_s", "train_positions_per_s")},
            "stage_rates": stage_rates(out), "config": vars(tcfg), "target_weights": dtype,
            "wall_s": round(time.perf_counter() - t_start, 1),
            "device": str(lm.model.device), "torch": torch.__version__,
            "command": "microspec " + " ".join(getattr(opts, "argv", [])),
            **{k: v for k, v in run_meta().items() if k in ("date", "machine", "commit")}}
    if eagle3:
        meta.update(arch="eagle3", ttt_steps=opts.ttt_steps, draft_vocab=int(head.d2t.numel()), feature_layers=taps)
    path = export_head(head, out, torch.bfloat16 if opts.head_dtype == "bf16" else torch.float32, meta)
    load_eagle_head(path)  # the exported head loads as the eagle drafter will load it
    return {"status": "done", "head": str(path), "heldout": result["heldout"], "steps": result["steps"]}


