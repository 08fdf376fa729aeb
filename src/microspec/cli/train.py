"""``microspec train eagle | eagle3 | dynaspec | specvocab | coral``: argument handling for :mod:`microspec.training.jobs`."""

from __future__ import annotations

import json

from ..models.registry import DEFAULT_MODEL
from .common import Parser

STOPPED = 3  # exit status of a run its --time-budget stopped: not finished, run the same command again


def _run(what: str):
    def run(args) -> int:
        from ..training import jobs

        summary = getattr(jobs, f"train_{what}")(args)
        if summary:
            print(json.dumps(summary))
        return STOPPED if summary and summary.get("status") == "stopped" else 0

    return run


def _policy_args(p) -> None:
    """What every trained policy's command takes: the target, the features and head it trains on, where it goes."""
    p.add_argument("--model", default=DEFAULT_MODEL, help="the target (built-in name or HF model directory)")
    p.add_argument("--features", required=True, help="a `microspec train eagle --out` directory (its features/)")
    p.add_argument("--draft", default=None, help="EAGLE head directory (default: the model's shipped head)")
    p.add_argument("--out", required=True, help="output directory (the trained artifact)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the target's weights")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")


def _eagle_args(e) -> None:
    """What train eagle and train eagle3 share: the data, the answers, the capture, the optimisation."""
    e.add_argument("--model", default=DEFAULT_MODEL, help="the target (built-in name or HF model directory)")
    e.add_argument("--prompts", nargs="+", default=[],
                   help="training prompt files (JSONL with prompt / OASST1 messages / self-instruct / .txt); "
                        "evaluation sets are refused")
    e.add_argument("--texts", nargs="+", default=[],
                   help="text corpora trained on at every position, teacher-forced, beside the answers (JSONL with "
                        "text / .txt with blank-line-separated documents): the target's distribution on varied "
                        "text, which its own greedy answers to a small pool lack; evaluation sets are refused")
    e.add_argument("--text-tokens", type=int, default=None,
                   help="at most this many tokens from each --texts file (documents shuffled with --shuffle)")
    e.add_argument("--allow-eval", action="store_true", help="accept a file whose name looks like an evaluation set")
    e.add_argument("--extra-features", nargs="+", default=[], metavar="PATH",
                   help="features captured by earlier runs, trained on beside this run's own (replay): shard files, "
                        "or `train eagle --out` directories (every shard of their features/)")
    e.add_argument("--out", required=True, help="output directory (responses, features, checkpoint, head/)")
    e.add_argument("--limit", type=int, default=None, help="use the first N prompts (after --shuffle)")
    e.add_argument("--shuffle", action="store_true", help="shuffle the prompts (by --seed) before --limit, so a "
                   "limited run samples every file and category")
    e.add_argument("--max-new-tokens", type=int, default=256, help="answer length per prompt")
    e.add_argument("--repetition-penalty", type=float, nargs="+", default=[1.2],
                   help="for the answers (default 1.2: a base model's plain greedy text loops); several values answer "
                        "every prompt once with each (e.g. 1.0 1.2: the plain and the penalised decodings)")
    e.add_argument("--temperatures", type=float, nargs="+", default=[0.0],
                   help="for the answers: 0 (greedy) and/or sampling temperatures; every prompt is answered once per "
                        "temperature and repetition penalty (e.g. --temperatures 0 0.7 --repetition-penalty 1.0 1.2: "
                        "the four decodings users run), a sampled answer seeded by its index")
    e.add_argument("--chat", dest="chat", action="store_true", default=None,
                   help="apply the chat template to the prompts (default: when the tokenizer has one)")
    e.add_argument("--no-chat", dest="chat", action="store_false", help="do not apply the chat template")
    e.add_argument("--gen-dtype", choices=["fp32", "bf16", "gguf"], default=None,
                   help="weights for generating answers (default: what inference uses, as --dtype): dense fp32 / "
                        "bf16, or gguf (a GGUF target's packed weights)")
    e.add_argument("--gen-batch", type=int, default=16,
                   help="answers decoded together (one read of the weights a step for every row); 1 = one at a time")
    e.add_argument("--dtype", choices=["gguf", "fp32", "bf16"], default=None,
                   help="the target's weights for capture and training (default: what inference uses, the packed "
                        "gguf kernels for a GGUF model on a CPU, else bf16 / fp32 as --weights)")
    e.add_argument("--target-topk", type=int, default=32, metavar="K",
                   help="capture keeps the target's K most likely next tokens at every position, the targets of "
                        "--ce-vocab batch (0: none)")
    e.add_argument("--head-dtype", choices=["fp32", "bf16"], default="bf16", help="dtype of the exported head")
    e.add_argument("--train-dtype", choices=["auto", "fp32", "bf16"], default="auto",
                   help="the head's products in training: bf16 (autocast; fp32 weights, optimizer and loss sums) or "
                        "fp32; auto: bf16 on CUDA and on a CPU with bf16 instructions (AVX-512 BF16, AMX), else fp32")
    e.add_argument("--device", default="cpu", help="cpu or cuda")
    e.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    e.add_argument("--stages", default="generate,capture,train", help="comma-separated subset, in order")
    e.add_argument("--resume", action="store_true", help="continue training from --out/checkpoint.pt")
    e.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop at the next safe point once this many seconds have passed (answers saved, a feature "
                        "shard written, a checkpoint after an optimizer step): prints status stopped with the stage "
                        "and exits with status 3; the same command with --resume goes on from there")
    e.add_argument("--init", default=None, metavar="DIR",
                   help="start from the weights of an EAGLE head (e.g. a shipped one, to go on with more data)")
    e.add_argument("--intermediate-size", type=int, default=None, help="head MLP width (default: the target's)")
    e.add_argument("--loss-on", choices=["answer", "all"], default="answer",
                   help="positions trained: the answers (EAGLE) or every position, prompts included (more data "
                        "from the same forward passes: teacher-forced prompt text)")
    e.add_argument("--ce-vocab", choices=["auto", "batch", "full", "seen"], default="auto",
                   help="the token loss: batch (the target's captured top-K against the draft's softmax over the "
                        "micro-batch's candidate ids: no target LM head in training, |candidates| rows of the "
                        "draft's), full (EAGLE: both over the full vocabulary), seen (both over the ids present in "
                        "the data); auto: batch where every feature shard holds top-K targets, else full")
    for name, default, kind, what in (
            ("epochs", 2.0, float, "passes over the training data"),
            ("lr", 3e-4, float, "AdamW's peak learning rate"),
            ("warmup-steps", 50, int, "optimizer steps of linear warm-up (then linear decay)"),
            ("tokens-per-step", 2048, int, "trained positions per optimizer step"),
            ("max-len", 512, int, "sequences (and --texts windows) are cut to this many tokens"),
            ("heldout", 0.05, float, "share of the sequences held out for evaluation"),
            ("seed", 0, int, "seed of the shuffles, the held-out split, the new head's weights and the noise"),
            ("save-every", 50, int, "optimizer steps between checkpoints"),
            ("noise-std", 0.2, float, "EAGLE's uniform noise on the input features"),
            ("p-w", 0.1, float, "weight of the cross-entropy (token) loss"),
            ("v-w", 1.0, float, "weight of the feature regression (SmoothL1) loss")):
        e.add_argument(f"--{name}", type=kind, default=default, help=what)
    e.add_argument("--batch-tokens", type=int, default=None,
                   help="padded tokens per training micro-batch (default: 1024 on a CPU, 16384 on CUDA)")


def add(sub) -> None:
    p = sub.add_parser("train", help="train a draft head (eagle, eagle3) or a trained vocabulary policy (dynaspec, "
                       "specvocab, coral)", description="Train a draft head for a target.")
    tsub = p.add_subparsers(dest="what", required=True, parser_class=Parser)
    e = tsub.add_parser("eagle", help="EAGLE-1/2 head by self-distillation",
                        description="Generate the target's answers to training prompts, capture its features, and "
                                    "train an EAGLE-1/2 head (resumable; everything goes under --out).")
    _eagle_args(e)
    e.add_argument("--penalty-loss", action="store_true",
                   help="train each answer under the repetition penalty it was generated with: the loss compares "
                        "draft and target after HF's penalty over the answer's own history (the acceptance of a "
                        "draft under that penalty), not their raw distributions")
    e.add_argument("--penalty-share", type=float, default=0.0, metavar="F",
                   help="with --penalty-loss: train this share of the sequences that have no penalty of their own "
                        "(teacher-forced text, answers decoded without one) under --penalty-value (default: 0)")
    e.add_argument("--penalty-value", type=float, default=1.2, metavar="P",
                   help="the repetition penalty --penalty-share trains under (default: 1.2)")
    e.set_defaults(func=_run("eagle"))
    e3 = tsub.add_parser("eagle3", help="EAGLE-3 head (tapped features, training-time test, a draft vocabulary)",
                         description="train eagle's stages for an EAGLE-3 head: capture the inputs of three target "
                                     "layers, train with training-time test on the token loss alone, over a draft "
                                     "vocabulary of the most frequent training ids (d2t); the head goes to "
                                     "--out/head in the official EAGLE-3 layout.")
    _eagle_args(e3)
    e3.add_argument("--ttt-steps", type=int, default=7,
                    help="training-time-test steps (default 7, the paper's; each step adds a head pass and a loss)")
    e3.add_argument("--draft-vocab", type=int, default=32768,
                    help="draft vocabulary: this many of the most frequent training ids (default 32768, EAGLE-3's)")
    e3.add_argument("--feature-layers", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    metavar="A,B,C", help="target layers whose inputs are fused (default: 2, L/2, L-3, as vLLM)")
    e3.set_defaults(func=_run("eagle3"), dtype="fp32")  # its loss is over the full vocabulary: dense weights
    d = tsub.add_parser("dynaspec", help="DynaSpec cluster router over an EAGLE head's inputs",
                        description="Cluster the LM head (spherical k-means), label the features `train eagle` saved "
                                    "with the full-vocabulary drafter's top-L tokens, train the router (BCE) and pick "
                                    "the cluster budgets on a held-out split.")
    _policy_args(d)
    d.add_argument("--k0", type=int, default=None, help="clusters at draft depth 0 (default: tuned, --coverage)")
    d.add_argument("--k1", type=int, default=None, help="clusters at draft depth 1 (default: k0 // 2)")
    for name, default, kind, what in (
            ("clusters", 1024, int, "M, the clusters of LM-head rows (spherical k-means)"),
            ("kmeans-iters", 15, int, "k-means iterations"),
            ("top-l", 8, int, "L: each example's label is the clusters of the full-vocabulary drafter's top-L tokens"),
            ("positions", 100_000, int, "training examples (positions) drawn from the features"),
            ("heldout", 0.05, float, "share of the sequences held out (budget tuning, evaluation)"),
            ("router-width", 1024, int, "hidden width of the two-layer router"),
            ("epochs", 3.0, float, "passes over the examples"),
            ("lr", 1e-3, float, "learning rate"),
            ("coverage", 0.97, float, "k0 is the smallest budget whose held-out top-1 coverage reaches this"),
            ("seed", 0, int, "random seed")):
        d.add_argument(f"--{name}", type=kind, default=default, help=what)
    d.set_defaults(func=_run("dynaspec"))
    v = tsub.add_parser("specvocab", help="SpecVocab low-rank vocabulary ranker on an EAGLE head's outputs",
                        description="Distil the full-vocabulary draft distribution into a low-rank ranker "
                                    "s = W_vocab W_down h (EAGLE head frozen; starts from the LM head's SVD).")
    _policy_args(v)
    v.add_argument("--rank", type=int, default=None, help="d' (default d/16; d/8 is the paper's other option)")
    for name, default, kind, what in (
            ("k", 2048, int, "candidates per draft-head call (the ranker's top-k, scored exactly)"),
            ("positions", 50_000, int, "training examples (positions) drawn from the features"),
            ("heldout", 0.05, float, "share of the sequences held out for evaluation"),
            ("q-top", 256, int, "the draft distribution's largest entries distilled at each position"),
            ("epochs", 3.0, float, "passes over the examples"),
            ("lr", 1e-3, float, "learning rate"),
            ("batch", 256, int, "examples per optimizer step"),
            ("seed", 0, int, "random seed")):
        v.add_argument(f"--{name}", type=kind, default=default, help=what)
    v.set_defaults(func=_run("specvocab"))
    c = tsub.add_parser("coral", help="CORAL-style router: one linear layer choosing fixed vocabulary partitions",
                        description="Partition the vocabulary offline (spherical k-means on the LM head) and train a "
                                    "one-layer router over the draft's hidden state to pick partitions (the simplest "
                                    "faithful variant of CORAL's description).")
    _policy_args(c)
    c.add_argument("--r", type=int, default=None, help="partitions per draft token (default: tuned, --coverage)")
    for name, default, kind, what in (
            ("partitions", 64, int, "P, the vocabulary partitions (spherical k-means on the LM head)"),
            ("kmeans-iters", 15, int, "k-means iterations"),
            ("positions", 100_000, int, "training examples (positions) drawn from the features"),
            ("heldout", 0.05, float, "share of the sequences held out (tuning r, evaluation)"),
            ("epochs", 3.0, float, "passes over the examples"),
            ("lr", 1e-3, float, "learning rate"),
            ("batch", 512, int, "examples per optimizer step"),
            ("coverage", 0.97, float, "r is the smallest count whose held-out top-1 coverage reaches this"),
            ("seed", 0, int, "random seed")):
        c.add_argument(f"--{name}", type=kind, default=default, help=what)
    c.set_defaults(func=_run("coral"))
