"""Train an EAGLE-3 head for Gemma 3 270M on a GPU machine: one command, run again until it prints ``done``.

The GPU machine has no internet and no ``gguf`` package, runs each command for at most 10 minutes, and keeps
``/tmp`` between calls only while it stays warm.  So the model arrives as its GGUF file, the few small files the
GGUF alone does not give correctly (config and tokenizer, the prompt pool) travel as a carried folder, and the
training runs as ``microspec train eagle3 ... --resume --time-budget SECONDS`` over the same ``--out`` folder,
call after call: each call answers prompts (bf16 target, batched greedy decoding, each pool prompt once plain and once
with repetition penalty 1.2), then captures the target's features with the three tapped layers (only once every
prompt is answered), then trains the head (a checkpoint after an optimizer step), and stops at the next safe point
once its budget is spent; the next call goes on from there.

1. Here (CPU), once:

       python benchmarks/gpu_train.py --prepare-assets .stage-assets

   copies into ``.stage-assets/`` the converted cache's ``config.json``, ``tokenizer_config.json`` and
   ``tokenizer.json`` (gzipped) of ``gemma-3-270m`` (built by any first load of the model here, e.g.
   ``microspec generate``) and the prompt pool ``../shared/data/prompt_pool/prompts_permissive.jsonl`` (or its
   ``.gz``) gzipped, about 6.5 MB in all; adds ``/.stage-assets/`` to ``.git/info/exclude`` (it travels only when
   carried) and prints its size.

2. Stage the GGUF with ``benchmarks/gpu_stage.py`` (its docstring): it ends at
   ``/tmp/microspec-stage/gemma-3-270m-q4_k_m.gguf`` on the warm machine.

3. Each device call, carrying ``.stage-assets`` (and within the machine's idle window, so that ``/tmp`` survives):

       PYTHONPATH=src python3 benchmarks/gpu_train.py --gguf /tmp/microspec-stage/gemma-3-270m-q4_k_m.gguf \\
           --assets .stage-assets --out /tmp/e3 --time-budget 540 --export $OUT/head

   Exit status 3 with ``{"status": "stopped", "stage": ...}``: not finished, make the same call again; 0 with
   ``{"status": "done", ...}``: the head is in ``/tmp/e3/head`` (and copied to ``--export``; about 60 MB in bf16
   by its shapes, most of it the 32k-row LM head); 2: an error (one line).  The budget counts from the start of
   the training command (after Python's imports) and a stop comes at the next safe point after it (an answer
   saved, a feature shard written, an optimizer step), so 540 s leaves the 600 s call some margin.  The first
   call builds the dense safetensors cache of the GGUF under ``$MICROSPEC_CACHE`` (default here
   ``/tmp/microspec-cache``) from microspec's own GGUF reader and the carried config and tokenizer
   (``MICROSPEC_GGUF_ASSETS``); transformers' GGUF conversion is never used (it needs ``gguf``, and transformers 5.17
   builds a character-level Gemma tokenizer from the file).

``--dry-run`` runs the same pipeline on the CPU in seconds on a tiny random Gemma 3 model written as a GGUF file
(F32 tensors) with its assets folder: the GGUF path, the budget's stops and the resumes, without a GPU or the real
model; run it on the GPU machine first to check the environment.

``--arch eagle --answers /tmp/e3 --init DIR`` trains an EAGLE-1/2 head (``train eagle``) on the answers an EAGLE-3
run wrote, in a folder of its own (capture and training only), warm-started from ``DIR``; ``--pack $OUT/NAME`` cuts
the finished head into sha256-checked parts of just under 16 MiB (the most a device call brings back), and
``--unpack PARTS DIR`` here puts it together.

Measured on one H100 (2026-11-26), in one device call after staging (``--limit 1500 --draft-vocab 24576``, then
``--arch eagle --answers /tmp/e3 --init src/microspec/heads/gemma-3-270m --epochs 2 --lr 3e-4``):

- EAGLE-3, 166 s in all: the GGUF's dense cache built, 2,998 answers (549,808 answer tokens; batched generation
  reaches ~23,000 answer tok/s at 2,048 rows), their tapped features captured one sequence at a time, and 63
  training steps of 16,384 positions at ~51,000 positions/s with seven training-time-test steps each (~20 s);
- EAGLE-1 on the same answers, 127 s: the capture and 63 steps at ~66,000 positions/s.

On one H200 (2026-11-27), in one call after the GPU suite (``--limit 1500 --epochs 7 --draft-vocab 24576
--time-budget 290``): 198 s in all for the same 2,998 answers (549,644 tokens; generation up to ~30,000 answer
tok/s), their capture, and 167 optimizer steps of 16,384 positions at 46,000-68,000 positions/s; held-out top-1
0.442 at training-time-test step 0 and 0.252 at step 6 (0.293 and 0.152 after the H100's 63 steps).

EAGLE-1 alone (``--arch eagle --init src/microspec/heads/gemma-3-270m``, its own answers, no EAGLE-3 run first), on
one H200 (2026-11-27), each one call after the GPU suite: ``--limit 1500 --epochs 3`` 73 s (2,998 answers, 548,977
tokens, 83 steps), ``--limit 3500 --epochs 2`` 126 s (6,994 answers, 1,287,967 tokens at ~22,000 answer tok/s,
145 steps at 60,000-80,000 positions/s); benchmarks/results/2026-11-27-gpu-heads-h200-eagle1/ has their τ (greedy
+5%, penalty 1.2 -4% against the shipped head, whose last fine-tunes used ``--penalty-loss``: not shipped).

So the training itself is a small share of a call.  Sizing by these rates (a projection, to be checked by the run
itself): in a 15-minute device budget, of which the machine's start and the GGUF staged in five calls took about
1.5 minutes here, ``--limit 6000`` (about 4x the answers above) with 4-6 epochs should fit one call of under 9
minutes.  The default settings (6,000 prompts x 2 penalties, 256 new tokens, decoding batch
2,048, 2 epochs of 16,384-position steps) come from the EAGLE-1/2 run recorded in
``src/microspec/heads/gemma-3-270m/training.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STAGED = "/tmp/microspec-stage/gemma-3-270m-q4_k_m.gguf"
POOL = "prompts_permissive.jsonl"
POOL_SOURCE = REPO.parent / "shared" / "data" / "prompt_pool" / POOL
EXIT_STOPPED = 3


def train_argv(model: str, prompts: Path, out: Path, budget: float | None, device: str, tiny: bool,
               arch: str = "eagle3", sizes: dict | None = None) -> list[str]:
    """The ``microspec train eagle3`` (``arch`` eagle3) or ``train eagle`` (``arch`` eagle: the EAGLE-1/2 head) command
    line of one call (``tiny``: the dry run's small settings); ``sizes``: flags that replace the defaults
    (``{"limit": 2000, "draft_vocab": 24576, "init": DIR, "stages": "capture,train"}``; True: a flag without a
    value, ``{"penalty_loss": True}``)."""
    argv = ["train", arch, "--model", model, "--prompts", str(prompts), "--out", str(out), "--shuffle",
            "--repetition-penalty", "1.0", "1.2", "--device", device]
    if tiny:
        argv += ["--limit", "3", "--max-new-tokens", "8", "--gen-batch", "4", "--gen-dtype", "fp32", "--dtype", "fp32",
                 "--max-len", "32", "--epochs", "1", "--tokens-per-step", "8", "--warmup-steps", "1",
                 "--heldout", "0.2", "--save-every", "2", "--head-dtype", "fp32", "--batch-tokens", "40",
                 "--threads", "1"]
        if arch == "eagle3":
            argv += ["--ttt-steps", "2", "--draft-vocab", "48", "--feature-layers", "1,2,3"]
    elif arch == "eagle3":
        argv += ["--limit", "6000", "--max-new-tokens", "256", "--gen-batch", "2048", "--gen-dtype", "bf16",
                 "--dtype", "bf16", "--max-len", "512", "--epochs", "2", "--lr", "6e-4", "--warmup-steps", "50",
                 "--tokens-per-step", "16384", "--batch-tokens", "16384", "--heldout", "0.02", "--save-every", "20"]
    else:  # the EAGLE-1/2 head's GPU settings (src/microspec/heads/gemma-3-270m/training.json), answers only
        argv += ["--limit", "6000", "--max-new-tokens", "256", "--gen-batch", "2048", "--gen-dtype", "bf16",
                 "--dtype", "bf16", "--max-len", "512", "--epochs", "2", "--lr", "6e-4", "--warmup-steps", "50",
                 "--tokens-per-step", "16384", "--batch-tokens", "16384", "--heldout", "0.02", "--save-every", "20",
                 "--loss-on", "answer", "--ce-vocab", "full"]
    for name, value in (sizes or {}).items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv += [] if flag in argv else [flag]
        elif flag in argv:
            argv[argv.index(flag) + 1] = str(value)
        else:
            argv += [flag, str(value)]
    if "--init" not in argv:  # --init and --resume exclude each other: a warm start begins anew each time
        argv.append("--resume")
    if budget is not None:
        argv += ["--time-budget", str(budget)]
    return argv


def run(gguf: Path, assets: Path, out: Path, budget: float | None, device: str = "cuda", tiny: bool = False,
        export: Path | None = None, cache: Path | None = None, arch: str = "eagle3", sizes: dict | None = None,
        answers: Path | None = None, pack: Path | None = None) -> int:
    """One call: the training command over ``out`` (``MICROSPEC_GGUF_ASSETS`` = ``assets`` and, where given,
    ``MICROSPEC_CACHE`` = ``cache`` while it runs; ``tiny``: the dry run's settings, without the compiled CPU
    kernels, whose first build would take minutes); its exit status (0 done, 3 stopped by the budget, 2 error)."""
    from microspec.cli import main

    prompts = assets / (POOL + ".gz")
    if not gguf.is_file():
        print(f"gpu_train: error: {gguf} not found (stage it with benchmarks/gpu_stage.py)", file=sys.stderr)
        return 2
    if not prompts.is_file():
        print(f"gpu_train: error: {prompts} not found (make the folder with --prepare-assets)", file=sys.stderr)
        return 2
    if answers is not None:  # another run's answers: copied once, then this run captures and trains on them
        given = answers / "responses.jsonl"
        if not given.is_file():
            print(f"gpu_train: error: no answers at {given}", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        if not (out / "responses.jsonl").is_file():
            shutil.copyfile(given, out / "responses.jsonl")
        sizes = {**(sizes or {}), "stages": "capture,train"}
    saved = {k: os.environ.get(k) for k in ("MICROSPEC_GGUF_ASSETS", "MICROSPEC_CACHE", "MICROSPEC_CPU_KERNEL")}
    os.environ["MICROSPEC_GGUF_ASSETS"] = str(assets)
    if cache is not None:
        os.environ["MICROSPEC_CACHE"] = str(cache)
    if tiny:
        os.environ["MICROSPEC_CPU_KERNEL"] = "off"
    try:
        rc = main(train_argv(str(gguf), prompts, out, budget, device, tiny, arch, sizes))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if rc == 0 and export is not None:
        shutil.copytree(out / "head", export, dirs_exist_ok=True)
        print(f"gpu_train: head copied to {export}", file=sys.stderr)
    if rc == 0 and pack is not None:
        pack_dir(out / "head", pack)
    return rc


PART = (16 << 20) - (64 << 10)  # a file the device tool brings back is at most 16 MiB


def pack_dir(src: Path, dest: Path, part: int = PART) -> list[Path]:
    """``src`` as an uncompressed tar cut into parts of at most ``part`` bytes (``head.tar.000``, ...) with a
    ``SHA256SUMS`` of the parts and of the whole tar, in ``dest``: what the device tool brings back (files of at most
    16 MiB).  ``unpack_dir`` puts it together again and checks it."""
    import hashlib
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(src.iterdir()):
            tar.add(f, arcname=f.name)
    data = buf.getvalue()
    dest.mkdir(parents=True, exist_ok=True)
    sums, parts = [f"{hashlib.sha256(data).hexdigest()}  head.tar"], []
    for i in range(0, len(data), part):
        p = dest / f"head.tar.{i // part:03d}"
        p.write_bytes(data[i : i + part])
        sums.append(f"{hashlib.sha256(data[i : i + part]).hexdigest()}  {p.name}")
        parts.append(p)
    (dest / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print(f"gpu_train: {src} packed into {len(parts)} parts in {dest} ({len(data):,} bytes)", file=sys.stderr)
    return parts


def unpack_dir(src: Path, dest: Path) -> Path:
    """The folder :func:`pack_dir` packed, from its parts in ``src``, into ``dest``, every sha256 checked."""
    import hashlib
    import io
    import tarfile

    sums = dict(reversed(line.split("  ", 1)) for line in (src / "SHA256SUMS").read_text().splitlines() if line)
    parts = sorted(src.glob("head.tar.[0-9][0-9][0-9]"))
    for p in parts:
        if hashlib.sha256(p.read_bytes()).hexdigest() != sums.get(p.name):
            raise SystemExit(f"gpu_train: error: {p} does not match its sha256")
    data = b"".join(p.read_bytes() for p in parts)
    if hashlib.sha256(data).hexdigest() != sums.get("head.tar"):
        raise SystemExit(f"gpu_train: error: the parts in {src} do not make the packed tar (sha256)")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


# ------------------------------------------------------------------------------------------- assets (here, CPU)
def prepare_assets(dest: Path, model: str = "gemma-3-270m") -> int:
    """Copy the config, the tokenizer (gzipped) and the prompt pool (gzipped) into ``dest``; git-ignore it."""
    from microspec.models.registry import _gguf_cache_dir, resolve

    name, kind, path = resolve(model)
    cache = _gguf_cache_dir(name, path)
    if not (cache / "tokenizer.json").is_file():
        print(f"gpu_train: error: no converted cache of {model} at {cache}: load the model once here first",
              file=sys.stderr)
        return 2
    pool = POOL_SOURCE if POOL_SOURCE.is_file() else POOL_SOURCE.with_name(POOL + ".gz")
    if not pool.is_file():
        print(f"gpu_train: error: the prompt pool {POOL_SOURCE} (or .gz) is missing", file=sys.stderr)
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (cache / f).is_file():
            shutil.copyfile(cache / f, dest / f)
    _gzip(cache / "tokenizer.json", dest / "tokenizer.json.gz")
    if pool.suffix == ".gz":
        shutil.copyfile(pool, dest / (POOL + ".gz"))
    else:
        _gzip(pool, dest / (POOL + ".gz"))
    _exclude(dest)
    size = sum(p.stat().st_size for p in dest.iterdir() if p.is_file())
    print(f"{dest}: {size:,} bytes ({size / (1 << 20):.1f} MiB): "
          + ", ".join(sorted(p.name for p in dest.iterdir())))
    return 0


def _gzip(src: Path, dst: Path) -> None:
    with src.open("rb") as a, gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as b:
        shutil.copyfileobj(a, b)


def _exclude(dest: Path) -> None:
    """Add ``dest`` (inside the repository) to .git/info/exclude, so that it travels only when carried."""
    try:
        rel = dest.resolve().relative_to(REPO)
    except ValueError:
        return
    exclude = REPO / ".git" / "info" / "exclude"
    line = f"/{rel.as_posix()}/"
    lines = exclude.read_text().splitlines() if exclude.is_file() else []
    if line not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join(lines + [line]) + "\n")


# ------------------------------------------------------------------------------------------------ the dry run
# Gemma 3 layer tensors: GGUF short name -> Hugging Face name under model.layers.N
_GEMMA_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
                "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def write_gguf(path: Path, arch: str, metadata: dict[str, int], tensors: dict[str, "object"]) -> None:
    """A GGUF v3 file of F32 tensors (``tensors``: name -> fp32 torch tensor in Hugging Face's dimension order) and
    uint32 ``metadata`` beside ``general.architecture``."""
    align = 32

    def string(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata) + 1)
    head += string("general.architecture") + struct.pack("<I", 8) + string(arch)
    for k, v in metadata.items():
        head += string(k) + struct.pack("<II", 4, v)
    data, offset = [], 0
    for name, t in tensors.items():
        dims = tuple(reversed(t.shape))
        head += string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", 0, offset)
        raw = t.detach().float().contiguous().numpy().tobytes()
        pad = -len(raw) % align
        data.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    head += b"\0" * (-len(head) % align)
    path.write_bytes(head + b"".join(data))


def tiny_model(root: Path) -> tuple[Path, Path]:
    """A tiny random Gemma 3 model as a GGUF file (norms stored as 1 + w, as llama.cpp stores them) and its assets
    folder (config, word-level tokenizer, a prompt pool): (gguf, assets)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        PreTrainedTokenizerFast,
    )

    vocab = 96
    cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           num_key_value_heads=2, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16,
                           max_position_embeddings=256, sliding_window=6, bos_token_id=1, eos_token_id=2,
                           pad_token_id=0, layer_types=["sliding_attention", "full_attention"] * 2,
                           tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if "norm" in n else 0.08))
    assets = root / "assets"
    hf.config.save_pretrained(str(assets))
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(vocab - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(str(assets))
    with gzip.open(assets / (POOL + ".gz"), "wt", encoding="utf-8") as f:
        for i in range(5, 50, 7):
            f.write(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2} w{i + 1}"}) + "\n")
    tensors = {"token_embd.weight": hf.model.embed_tokens.weight, "output_norm.weight": hf.model.norm.weight + 1}
    for i in range(cfg.num_hidden_layers):
        for short, name in _GEMMA_LAYER.items():
            w = hf.get_parameter(f"model.layers.{i}.{name}.weight")
            tensors[f"blk.{i}.{short}.weight"] = w + 1 if short.endswith("norm") else w
    gguf = root / "tiny-gemma3.gguf"
    write_gguf(gguf, "gemma3", {"gemma3.embedding_length": cfg.hidden_size,
                                "gemma3.block_count": cfg.num_hidden_layers}, tensors)
    return gguf, assets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, default=Path(STAGED), help=f"the staged model (default {STAGED})")
    p.add_argument("--assets", type=Path, default=REPO / ".stage-assets",
                   help="the carried folder --prepare-assets made (default .stage-assets)")
    p.add_argument("--out", type=Path, default=Path("/tmp/e3"), help="the training folder, the same every call")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop at the next safe point after this many seconds (exit 3: call again)")
    p.add_argument("--export", type=Path, default=None, metavar="DIR", help="copy the finished head there")
    p.add_argument("--pack", type=Path, default=None, metavar="DIR",
                   help="the finished head as a tar in parts of just under 16 MiB with their sha256 (for $OUT); "
                        "--unpack puts it together here")
    p.add_argument("--unpack", nargs=2, type=Path, default=None, metavar=("PARTS", "DIR"),
                   help="here: check and unpack the parts --pack wrote into DIR, then exit")
    p.add_argument("--arch", choices=("eagle3", "eagle"), default="eagle3",
                   help="eagle3 (default): an EAGLE-3 head; eagle: an EAGLE-1/2 head (train eagle)")
    p.add_argument("--answers", type=Path, default=None, metavar="DIR",
                   help="train on the answers of another run's --out (its responses.jsonl): capture and train only")
    p.add_argument("--init", type=Path, default=None, metavar="DIR", help="warm start from this head")
    p.add_argument("--limit", type=int, default=None, help="prompts answered (default 6,000, each twice)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the answers (default 2)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 6e-4)")
    p.add_argument("--draft-vocab", type=int, default=None, help="eagle3: the draft vocabulary (default 32,768)")
    p.add_argument("--penalty-loss", action="store_true",
                   help="train draft and target under each answer's own repetition penalty (as the shipped EAGLE "
                        "head's last fine-tunes; `microspec train eagle --penalty-loss`)")
    p.add_argument("--prepare-assets", type=Path, default=None, metavar="DIR",
                   help="here, on the CPU: make the folder to carry, then exit")
    p.add_argument("--dry-run", action="store_true",
                   help="the same pipeline on a tiny random model on the CPU, in --out (seconds)")
    args = p.parse_args(argv)
    if args.prepare_assets is not None:
        return prepare_assets(args.prepare_assets)
    if args.unpack is not None:
        print(unpack_dir(*args.unpack))
        return 0
    if args.draft_vocab is not None and args.arch != "eagle3":
        p.error("--draft-vocab is an EAGLE-3 head's")
    if args.penalty_loss and args.arch != "eagle":
        p.error("--penalty-loss is an EAGLE-1/2 head's (--arch eagle)")
    sizes = {"limit": args.limit, "epochs": args.epochs, "lr": args.lr, "draft_vocab": args.draft_vocab,
             "init": args.init, "penalty_loss": True if args.penalty_loss else None}
    common = dict(export=args.export, arch=args.arch, answers=args.answers, pack=args.pack)
    if args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
        gguf, assets = (args.out / "tiny-gemma3.gguf", args.out / "assets")
        if not gguf.is_file():
            gguf, assets = tiny_model(args.out)
        return run(gguf, assets, args.out / ("train" if args.arch == "eagle3" else "train-eagle"), args.time_budget,
                   "cpu", tiny=True, cache=args.out / "cache", sizes=sizes, **common)
    cache = None if os.environ.get("MICROSPEC_CACHE") else Path("/tmp/microspec-cache")
    return run(args.gguf, args.assets, args.out, args.time_budget, cache=cache, sizes=sizes, **common)


if __name__ == "__main__":
    sys.exit(main())
