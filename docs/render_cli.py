"""Write ``docs/cli.md``, the command-line reference, from microspec's own argument parsers.

``python3 docs/render_cli.py`` writes the file; ``python3 docs/render_cli.py --check`` exits 1 when the file differs
from what the parsers give now (as ``tests/test_docs.py`` checks).  Usage and options come from the parsers
(:func:`microspec.cli.build_parser`), laid out at a fixed width whatever the terminal or Python version; the notes
are :data:`NOTES` below; the method names are :mod:`microspec.bench.methods`' docstring.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"
WIDTH = 100  # of the usage and option blocks
HELP_COLUMN = 30  # where an option's help starts
PROSE_WIDTH = 116  # of the descriptions, as the notes below are written

INTRO = """\
# Command-line reference

`microspec` is one command with sub-commands: `generate` decodes a prompt with a speculative method, `serve` puts
an OpenAI-compatible HTTP server in front of one, `coverage`, `bench` and `analyze` measure methods on question
files, `freq` and `train` build what the methods read (token maps, EAGLE heads, trained vocabulary policies), and
`vllm-prepare` sets up vLLM to draft with them.  Every command takes `-h` / `--help`; `python3 -m microspec.cli`
is the same command.

This file is generated from the commands' own argument parsers by `python3 docs/render_cli.py`, and
`tests/test_docs.py` checks that it still matches them: change the parsers (`src/microspec/cli/`) or the notes in
`docs/render_cli.py`, then run the script.  Where an option's help does not name its default, the default is
appended in parentheses.
"""

GENERAL = """\
## Exit status and errors

- `0`: done.
- `1`: `bench` or `analyze` found an engine method whose greedy tokens differ from plain decoding's (`ar`) other
  than at a near tie; the report says where.
- `2`: bad input (an unknown model, a missing path, a corrupt or truncated GGUF file, an empty prompt, a prompt
  beyond the context, `--max-new-tokens` <= 0, a negative temperature, top-p outside (0, 1], a port in use, ...):
  one line `microspec: error: ...` on stderr, never a traceback.
- `3`: `train eagle` / `train eagle3` stopped by `--time-budget`; the same command with `--resume` goes on.
- `4`: the system refused (a cache folder that cannot be written, a full disk, a file that cannot be read):
  one line `microspec: error: ...` naming the path, never a traceback; nothing already written is lost.
- `130`: interrupted (Ctrl-C).

## Environment variables

- `MICROSPEC_CACHE`: where microspec keeps what it builds (default `~/.cache/microspec`): GGUF models converted
  once to a safetensors cache (`models/`), assembled built-in GGUF files, compiled CPU kernels (`kernels/`).
- `MICROSPEC_API_KEY`: `serve`'s API key when `--api-key` is not given.
- `MICROSPEC_VLLM_PYTHON`: the Python of a vLLM environment with microspec installed, which runs `bench`'s `vllm*`
  peers (default: this Python, when it has vLLM).
- `MICROSPEC_GGUF_ASSETS`: a folder with a GGUF model's `config.json` and tokenizer files (each plain or gzipped);
  where the `gguf` package is missing, a `.gguf` model then loads through microspec's own dense reader.
- `MICROSPEC_CPU_KERNEL`: `0` turns microspec's compiled CPU kernels off (torch's operations instead); `1` makes a
  failed kernel build an error instead of a quiet fallback.  (The on/off switches here read `0`, `off`, `false` or
  `no` as off, in any case, when a model loads: one record, `microspec.switches`.)
- `MICROSPEC_AMX`: `0` keeps a bf16 model's products off the CPU's AMX tiles (where the CPU has AMX-BF16 they take
  them by default; the values differ from the other path's in the low bits, each path batch-invariant).
- `MICROSPEC_REPACK`: `0` keeps a GGUF file's quantized matrices in the file's layout instead of the interleaved
  8-row form they are rearranged into at load.
- `MICROSPEC_CPU_PREFETCH`: `on` or `off` sets whether the packed products of up to 4 rows prefetch their weights in
  software; unset (or `auto`), a packed model's load times its LM head both ways and keeps the faster (which
  one pays differs between CPUs; the values are the same either way).  It reads off as the switches here do.
- `MICROSPEC_DRAFT_AHEAD`: `0` makes a model drafter's next tree on CUDA wait for the step's read instead of being
  launched before it (the tokens are the same either way; an A/B switch).
- `TRITON_INTERPRET=1`: runs Triton kernels (`--gather fused`) in Triton's interpreter, without a GPU.
- The command sets `HF_HUB_OFFLINE=1`, `TRANSFORMERS_VERBOSITY=error` and `TOKENIZERS_PARALLELISM=false` unless they
  are set: nothing is ever downloaded.
"""

# Notes after a command's options: what its users need beyond each option's help (markdown).
NOTES = {
    "generate": """\
The text goes to stdout and one summary line to stderr (tokens per second, steps, mean accepted length, the method
and, for `--drafter auto`, each arm's share of the steps).  The model, drafter and vocabulary options above are
also `serve`'s and `coverage`'s, and these notes apply to them there too.

- **Models.** `--model` takes `gemma-3-270m` (the default: a base model, so prompts are plain text; vocabulary
  262,144), `smollm2-135m-instruct` (a chat model; vocabulary 49,152), a local `.gguf` file or a local Hugging Face
  model directory.  A built-in model's GGUF file comes with its pip package; nothing is ever downloaded.  A GGUF
  model is converted once into a safetensors cache under `$MICROSPEC_CACHE`, which later loads read (with
  `--weights gguf` the quantized matrices still come from the file itself).
- **Weights.** `--weights gguf` (the default for a GGUF model on a CPU) keeps the file's quantized blocks as they
  are (memory-mapped, never dequantized as a whole) and multiplies them with activations rounded to int8 per
  32-value block, as llama.cpp's CPU kernels do; most quantized types are rearranged at load into an interleaved
  form, 8 rows' blocks side by side (`MICROSPEC_REPACK=0` keeps the file's layout).  Types: F32, F16, BF16, Q4_0,
  Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; another type is refused (use `--weights bf16`).  `gguf-f32` multiplies
  the same blocks by fp32 activations (the exact dequantized values; slower).  `bf16` / `fp32` are dense weights
  (training, CUDA, exact comparisons with transformers); `benchmarks/measure/int_path_distance.py` measures the
  integer path's distance from the fp32 reference.  With `gguf` and `gguf-f32` a row's result never depends on the
  other rows of the call, so speculative greedy output is bit-identical to plain greedy output.
- **bf16 on a CPU.** Every product with a bf16 weight runs through an AVX2 + FMA kernel that widens the weights to
  fp32 in registers and sums in a fixed order, so a row's result does not depend on how many rows share the call
  (attention stays torch's: a bf16 near tie can still go either way; `fp32` is the exact mode).  It is compiled
  once with the system C++ compiler and kept under `$MICROSPEC_CACHE/kernels/`; without a compiler or AVX2 the
  models keep torch's matmul.
- **Decoding.** `--temperature 0` (the default) is greedy; otherwise sampling with temperature, then top-p
  (Hugging Face's order).  `--repetition-penalty` and `--no-repeat-ngram-size` follow Hugging Face's `generate`
  exactly, prompt included; Gemma 3 270M's plain greedy text loops, and `--repetition-penalty 1.2` gives ordinary
  prose.  Drafts are scored under the same processors (each tree node with its own path as history) and, when
  sampling, ranked by the warped distribution.  Greedy output is identical to `--drafter none`'s; sampled output
  follows exactly the same distribution.  `--seed` fixes the text: each position's sample is the draw of a uniform
  that the seed and the position alone decide, and a drafted token is accepted exactly when it is that draw, so
  every drafter, `auto` included, returns the same text for the same seed (a different text than versions before
  this rule gave).
- **`--drafter auto`** (the default of `generate` and `serve`) chooses the method online, per request and per step,
  by measured speed.  Its arms: plain decoding, prompt lookup (the device's chain, and an 8-token one where the
  device's is shorter), suffix decoding and, for a model with an EAGLE head (the shipped one or `--draft`), the head
  with MicroSpec's vocabulary (or `--vocab`'s, with the tree options given).  Prompt lookup and suffix decoding
  propose before each step (while plain decoding is taken, as often as 1.5% of a plain step pays for, the cheaper
  first) and are scored against the text that follows whether or not they are taken; the EAGLE head is probed now
  and then, and its switching cost (the features it catches up on) is measured and charged.  What choosing costs
  is bounded: the proposals not taken, their scoring, the bookkeeping and the probes are charged as they are spent,
  within 3% of a request's time; a probe runs only where its expected gain covers its cost; a model arm whose
  steps lose three plain steps' time in a request is left out of it until a probe finds it paying, and one the
  request would not take (measured clearly slower, or a probe its budget cannot pay for) is not kept ready at all
  (no features or vocabulary policy fed at each step).  Where four requests in a row of a decoding kind lost to
  plain decoding (their drafted steps' tokens at a plain step each, less those steps' time, less choosing), the
  next requests of that kind run plainly, choosing nothing (suffix decoding still learns their responses): four,
  then one that chooses again, then eight, up to sixteen while they keep losing; one that gains ends it.  An
  engine's requests share what they measured, separately per decoding kind (greedy, repetition penalty, sampling,
  sampling with a penalty); a fresh engine starts from a fitted table (`microspec.auto.MEASURED`).  `serve`'s `/metrics` counts the steps per arm
  (`microspec:auto_steps_total`); `bench --methods auto,...` measures it beside fixed methods (with each method's
  worst question and `auto`'s choosing cost).  `--compare` also decodes the prompt plainly (`--drafter none`) and
  prints the speed-up.
- **Drafters.** `ngram`: the tokens that followed the last 3..1 tokens' latest earlier occurrence in prompt +
  output, up to `--depth` of them (on a packed CPU target `--depth auto`: the copied chain cut where a token's
  calibrated chance, by the matched n-gram's length and its place, stops paying for its verify row; up to 10).  `suffix` (SuffixDecoding): a tree of the continuations seen most often after the
  text's longest matching suffix, in this request and in earlier responses of the same engine (a bounded cache that
  `serve`'s requests share), best first by estimated acceptance, at most `--total-tokens` (16) nodes and `--depth`
  (8) levels; model-free.  `early-exit`: the target's first `--draft-layers` layers, final norm and LM head;
  untrained, a baseline rather than a speed-up.  `model`: a separate draft model (`--draft`) with the target's
  tokenizer (another tokenizer is refused).  `eagle`: an EAGLE-1/2 head (`--draft DIR` in the official layout:
  `config.json` + `pytorch_model.bin` or `model.safetensors` with `fc.*` and `layers.0.*`; EAGLE's released Llama
  and Qwen2 heads load as they are; default: the head that ships for a built-in model,
  `src/microspec/heads/<model>/` with its `training.json`) fed the target's final hidden states and reusing its
  embedding and LM head, or an EAGLE-3 head, recognised by its config (`LlamaForCausalLMEagle3` or
  `draft_vocab_size`; the official and SpecForge layout: `fc` [d, 3d], `midlayer.*`, its own `lm_head` over
  `draft_vocab_size` ids mapped by `d2t`), fed the target's residual stream entering three layers
  (`eagle_aux_hidden_state_layer_ids`, else vLLM's 2, L/2, L-3), its own outputs fed back at deeper levels.  No
  EAGLE-3 head ships; `microspec train eagle3` trains one.  With an EAGLE-3 head a policy's set is intersected with
  the head's draft vocabulary, or, with `--d2t replace`, its other ids are scored with the target's LM-head rows;
  the trained routers (`dynaspec`, `specvocab`, `coral`) were fitted to an EAGLE-2 head and are refused with an
  EAGLE-3 one.
- **Tree shape.** Unset, `eagle` drafts an EAGLE-2 dynamic tree on CUDA and on a CPU, `early-exit` and `model` on
  CUDA only (a chain on a CPU).  The device's tree: on CUDA EAGLE-2's published shape (top-k 10, 6 draft levels, 59
  nodes + the root); on a CPU top-k 2, 4 levels, 8 nodes; on a packed GGUF target on a CPU a chain sized step by
  step (`--depth auto`).  `--depth` counts draft levels.  `--depth auto` (a model drafter's chain, on a CPU): each
  step drafts up to 8 tokens, a level's token kept where its calibrated chance of acceptance (the draft's top
  probability there, calibrated per decoding and depth by what was accepted) is worth a verify row, one level more
  where the next token's expected chance is worth a draft level and a row, the costs and the rate to beat measured
  on the generation itself (`microspec.drafters.length`).  `--total-tokens auto` times the target's verify pass at
  several tree sizes on this device and takes the size with the most expected tokens per second.
  `--head-mode`'s default follows what costs less on the device (see BENCHMARKS.md).
- **`--adaptive`** (method suffix `@adaptive`, e.g. `microspec@adaptive`): compares the tokens per second of the
  last 16 drafted and the last 16 plain steps of the generation and takes the faster kind, probing the other for 4
  steps after 8 steps, then twice as long after each probe that finds it still slower (up to 128).  The first
  drafted step after plain steps (where the drafter catches up on what it skipped) is not counted against drafting.
  A plain step feeds the vocabulary policy its committed tokens only.  `skipped_steps` in the stats counts the
  plain steps; the output is unchanged.
- **`--lookup [N]`** (eagle, early-exit and model drafters; method suffix `@lookup[N]`, e.g. `microspec@lookup`):
  where the last N or more tokens (default 2) occurred earlier in prompt + output, the step drafts the tokens that
  followed them (up to 3 on a packed CPU target, 10 elsewhere) and the model drafter drafts the other steps; it
  hears every commit, so an EAGLE head catches up on the features it missed.  `lookup_steps` in the stats counts
  the steps the lookup drafted.  `--drafter auto` runs prompt lookup alone rather than lookup first (see
  BENCHMARKS.md).
- **Vocabulary policies.** The draft head scores only the policy's ids (EOS and the tokenizer's special ids are
  always in); verification uses the full vocabulary, so output is unchanged.  `full` (the default) is EAGLE-2's
  full-vocabulary draft head.  `microspec` is the MicroSpec paper's Algorithm 1: the unique ids among the last
  `--w-max` entries of a candidate stream made of the prompt, the target's top `--k-pre` predictions at every
  prompt position, and after each step the draft tree's ids and the target's top `--k-ver` predictions on the
  validated branch (from the processed logits the target chose from), plus any committed token not already in.
  `--k-pre-positions N` takes the prefill's top-k at the last N prompt positions only, a departure from Algorithm 1
  for CPUs; on a packed GGUF target on a CPU the default takes none (see BENCHMARKS.md), and the method
  `microspec-kpall` takes every position on any device.  `--gather packed` (the default) keeps the active rows in
  a preallocated `[W_max, d]` buffer, copying in only the rows of ids that enter the window, and runs one dense
  matmul over the occupied prefix; `indexed` gathers `W[idx]` at every step (the paper's ablation baseline);
  `fused` reads the rows inside a Triton matmul (a GPU, or `TRITON_INTERPRET=1`; slower on a GPU, see
  BENCHMARKS.md).
- **Shortlists.** `fr-spec` / `vocabtrim`: the first `--shortlist-size` ids of a token map (`--freq-file` /
  `--vocabtrim-file`, written by `microspec freq`; SGLang's FR-Spec maps load as they are); a shortlist larger than
  its map is refused.  Both built-in models ship an FR-Spec map (the 32,768 most frequent ids of training-side text:
  OASST1 train messages, C4 and Wikipedia samples, GSM8K train; no evaluation set; its `training.json` has the
  `microspec freq` command), so `--vocab fr-spec` needs no `--freq-file` there.  `--position-aware` applies
  DynaSpec's position-aware budgets to any ranked policy (fr-spec and vocabtrim by frequency, microspec by recency).
- **Trained policies.** `dynaspec`, `specvocab` and `coral` read a directory written by `microspec train`
  (`--dynaspec`, `--specvocab`, `--coral`); the ones made for a built-in model's shipped EAGLE head ship with it:
  `generate --drafter eagle --vocab dynaspec`.
- **CUDA graphs.** With `--cuda-graphs on` (the default) the verify pass, the EAGLE head's draft levels and the
  packed draft head's product and top-k replay as CUDA graphs, one per row count and 256-slot attention bucket,
  captured at a shape's second use; more than 64 rows, EAGLE-3's tapped passes and shapes that cannot be captured
  run eagerly.  The graphs are captured on a KV cache's buffers, and a finished request's cache (target and EAGLE
  draft) goes to the next request of its size class (a power of two, at least 512 slots; two kept), so requests
  after the first replay the graphs they share instead of capturing them again.  Graphed logits can differ from
  eager ones in the last bits, as passes over different row counts already do on a GPU.
- **`--json`** prints one object: `text`, `token_ids` (the generated ids), `finish_reason`, `model`, `dtype`,
  `device`, `drafter`, the method's settings, and `stats`: `new_tokens`, `prompt_tokens`, `wall_s`, `prefill_s`,
  `tokens_per_s`, `decode_tokens_per_s`, `steps` (decode steps after the prefill), `mean_accept_len` (τ: tokens
  committed per step including the bonus token; 1.0 for plain decoding), `accept_per_position` (entry k-1: the share
  of steps whose draft reached depth k that accepted k or more), `draft_s`, `verify_s`, `other_s`, `head_rows`,
  `skipped_steps`, `weight_bytes_per_step` (every matrix read once) and `achieved_gb_s`
  (`benchmarks/measure/bandwidth.py` measures the machine's read bandwidth to compare it with); with a drafter that
  has an LM head also `active_vocab_mean` / `active_vocab_max` (draft vocabulary size per draft-head call), `head_s`
  (time in the draft head), `vocab_s` (the policy's updates, counted in `draft_s`), `head_calls` and `coverage` (the
  share of generated tokens after the first that were in the draft vocabulary of the depth they were committed at).
  With `--compare`, `plain_stats` too.
""",
    "serve": """\
The model, drafter and vocabulary options are `generate`'s (see its notes); Starlette and uvicorn serve.

- **Routes.** `POST /v1/completions` (prompt: a string, a list of one string, or token ids) and
  `POST /v1/chat/completions` (messages through the tokenizer's chat template; text content parts), both with
  `"stream": true` as server-sent events: one chunk per committed batch of accepted tokens, then `data: [DONE]`;
  `stream_options: {"include_usage": true}` adds a last chunk with `"choices": []` and the usage.  `GET /v1/models`,
  `GET /health`, `GET /metrics` (Prometheus text).
- **Request options.** `max_tokens` (chat also `max_completion_tokens`; `null` means absent, for every option;
  default 16 for completions as OpenAI, 256 for chat, cut to what the context leaves), `temperature` (default 1.0;
  below 1e-5 greedy), `top_p`, `top_k`, `min_p` (applied in the order temperature, top-k, top-p, min-p; speculative
  sampling stays exact), `seed`, `stop` (up to 4 strings; the text ends before the stop sequence, and streamed
  deltas hold back a tail that may become one), `n` = 1, and the extensions `repetition_penalty` and `ignore_eos`.
  Every answer carries a `microspec` object (τ, tokens/s, steps).  Greedy answers equal `microspec generate
  --no-chat` (completions) and `--chat` (chat) token for token.  Under the default `--drafter auto` each decoding
  kind has its own engine and measurements.  A seeded sample's text depends on the seed and the settings alone: the
  same under every method, alone or batched (each position's sample is keyed by the seed and the position).
- **Continuous batching.** Up to `--max-num-seqs` requests are decoded together, joining and leaving at step
  boundaries; each keeps its own decoding settings, stop conditions, KV cache, drafter and vocabulary policy.  Each
  step every request drafts its own tree and all verify passes go through the target in one forward.  A new request
  is tokenized and checked off the decoding thread and prefilled at the next step boundary, in forwards of 128
  prompt tokens (those every prefill runs) between the other requests' steps, taking at most half the time while
  they run, so a long prompt never stops the other streams for long.  Requests are
  admitted while their KV caches fit `--kv-cache-bytes` (default: half the memory available at start on a CPU, 90%
  of the free memory on CUDA): one that could never fit is a 400, one that does not fit now waits.  The kernels on
  that path are row-wise, so a request's greedy tokens are those it gets alone, whatever it is batched with.  How deep the
  requests of a batch draft is measured per batch size (a depth cap of 0, 1, 2 or 4, re-probed now and then) unless
  `--batch-depth` fixes it, and each request's draft rows are charged what they cost the batch against what its
  drafts return: one whose drafts do not pay decodes plainly in the batch; a lone request drafts as its method says.
- **Limits and faults.** A request that finds `--max-queue` requests waiting gets 429, one asking for more than
  `--max-tokens` 400, one over `--max-body-bytes` 413 (a declared length over it before the body is read; a body
  of up to 32 MiB is read and thrown away first, so that clients that send it whole read the answer), one past
  `--request-timeout` 504 (a stream ends with an error event, code `timeout`); a POST body must say `Content-Type:
  application/json` (415 otherwise); a stop sequence may be at most 256 characters.  A client that disconnects
  cancels its generation at the next step.  Every bad input gets an OpenAI error object (`{"error": {"message",
  "type", "param", "code"}}`) with a 4xx, never a traceback; a failure inside the worker is a 500 for the requests
  it touched (a failure of a batched step: each request of that step), and the worker goes on.
- **One tenant.** Suffix decoding (and `auto`'s suffix arm) drafts from earlier responses of every client, and each
  response reports its speed and acceptance: a client could learn whether others' answers held a text.
  `--private-responses` keeps each request's drafts to its own text.
- **Facing a network.** `--api-key KEY` (or `MICROSPEC_API_KEY`) requires `Authorization: Bearer KEY` on every
  route but `/health` (compared in constant time; 401 otherwise); a non-loopback `--host` without a key prints a
  warning.  The port is bound before the model loads, so a port in use exits 2 at once.  One access-log line per
  request goes to stderr (method, path, status, token counts, seconds; never the prompt).  SIGTERM / SIGINT: new
  and waiting requests are answered 503, running ones finish within `--shutdown-timeout`.
- **Metrics.** `/metrics` uses vLLM's names where they exist (`vllm:spec_decode_num_drafts`,
  `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`,
  `vllm:spec_decode_num_accepted_tokens_per_pos`, `vllm:num_requests_waiting` / `running`,
  `vllm:prompt_tokens` / `generation_tokens`, `vllm:request_success`), plus
  `microspec:spec_decode_mean_acceptance_length`, `microspec:generation_tokens_per_second`,
  `microspec:decode_steps` (by batch size and depth cap), `microspec:auto_steps` (by arm),
  `microspec:requests_{cancelled,errors,rejected,timeouts}` and `process_resident_memory_bytes`; counters end in
  `_total`.
- `benchmarks/measure/serve_load.py` measures a running server under 1, 2, 4, 8 ... streaming clients (aggregate
  tokens per second, time to first token, inter-token latency, lost requests, memory).
""",
    "coverage": """\
Prompt files: Spec-Bench / MT-bench JSONL (`turns`; the first turn is used), HumanEval, any JSONL with a `prompt`
and an optional `category`, or .txt (one prompt per line).  The report gives, per category and pooled over tokens,
the ground-truth coverage (the share of committed tokens that were in the draft vocabulary: the MicroSpec paper's
Section 2.1), the mean and largest active vocabulary and τ; with `--curve-map` (or `--freq-file`) also the static
top-K coverage of that token map for K = 512 ... 65,536 (the paper's Figure 1b).  `--json` prints one object with
`coverage`, `active_vocab_mean`, `active_vocab_max`, `tokens`, `prompts`, `static_topk` and `categories` (the
same per category).  The drafter must have an LM head (`early-exit`, `eagle` or `model`).
""",
    "freq": """\
Three ways to count, each writing SGLang's FR-Spec format (`torch.save` of a list of ids, most frequent first):

- text files (FR-Spec): the target tokenizer's tokens in .txt and .jsonl files (the `--field` fields, default
  `text`; `.gz` accepted);
- `--generate --prompts FILE` (VocabTrim): the target's own greedy answers to a prompt file (Spec-Bench / MT-bench
  `turns`, HumanEval `prompt`, any JSONL with `prompt`, or .txt lines);
- `--ids-field F` with JSONL files: token ids already generated, counted as they are (e.g. the `response_ids` of
  `train eagle`'s answers in its `--out` directory).

`--fill MAP.pt` appends the ids of another map that were not counted, in its order, so that a top-K exists for every
K (a shortlist asked for more ids than its map holds is refused).  Each shipped FR-Spec map's `training.json` holds
the `microspec freq ... --top 32768` command that made it.
""",
    "train": """\
Every trained artifact is written with a `training.json` (command, data, held-out numbers, wall time).  Files whose
names look like evaluation sets (Spec-Bench, MT-bench, HumanEval, MBPP, GSM8K test, MGSM) are refused as training
data unless `--allow-eval` is given.  `--time-budget SECONDS` (`eagle`, `eagle3`) stops at the next safe point and
exits with status 3; the same command with `--resume` goes on from there.
""",
    "train eagle": """\
Three stages, each resumable, everything under `--out`:

- **generate**: the target answers the training prompts itself (`--repetition-penalty 1.2` by default, as a base
  model's plain greedy text loops; several values answer every prompt once with each; the chat template when the
  tokenizer has one).  `--gen-batch` answers are decoded together through a padded KV cache with continuous
  batching, and the final hidden states computed on the way are kept as the features (`features/gen*.pt`), so the
  capture stage only runs for answers made one at a time (`--gen-batch 1`).  On a CPU without bf16 instructions
  `--gen-dtype bf16` is slow; `--gen-dtype gguf --gen-batch 1` uses the packed weights instead.
- **capture**: the target's final hidden states over prompt + answer.
- **train**: EAGLE's objective (its `train/main.py`): SmoothL1 on the next features (`--v-w`) plus cross-entropy
  against the target's distribution through the frozen LM head (`--p-w`), uniform input noise, AdamW (betas 0.9,
  0.95), linear warm-up and decay, gradient values clipped at 0.5; right-padded micro-batches of `--batch-tokens`,
  the loss averaged over the `--tokens-per-step` positions of each optimizer step; held-out top-1 / top-3 agreement
  reported.  The head goes to `--out/head/`, in the layout `--drafter eagle --draft` loads.
  `benchmarks/data/head_training_data.py` builds the inputs of the shipped head's latest fine-tune (prompts shaped
  like Spec-Bench's and HumanEval's categories, from non-evaluation sources only).

`--texts FILES...` adds plain corpora trained at every position, teacher-forced, in BOS-led windows of `--max-len`
tokens (no answers generated for them): the label is still the target's own distribution, on varied text.
`--extra-features` trains on features captured by earlier runs beside this run's own (replay when fine-tuning on
new data); shards that are not features, or come from a target of another width, are refused.  Two departures for
small budgets, both off by default: `--loss-on all` also trains the prompt positions, and `--ce-vocab seen`
computes the cross-entropy over the ids that occur in the training data only.  `--penalty-loss` compares draft and
target after Hugging Face's repetition penalty over each answer's own history, prompt included, for the answers
generated under a penalty (the others, and `--texts`, train as before; `--penalty-share F` trains a share F of them
under `--penalty-value` too); with the packed target's top-K (`--ce-vocab batch`) the target's top-K logits are
rebuilt from its top id's logit and the captured log-probabilities.  No head trained that way ships: it did not raise
τ under the penalty on the development set (see BENCHMARKS.md).
""",
    "train eagle3": """\
The capture keeps the inputs of the tapped layers (`--feature-layers`) beside the final hidden states (shards
`features/e3*.pt`; batched generation does not keep them, so every answer is captured).  Training drops EAGLE's
feature regression and trains on the token loss alone with training-time test: step j feeds each position the head's
own step j-1 output at the position before, as drafting j levels below a root does, each step weighted 0.8^j against
the target's next-token distribution restricted to the draft vocabulary.  The draft vocabulary is the
`--draft-vocab` ids most frequent in the training tokens (EAGLE-3's `d2t`), its LM-head rows initialised from the
target's and trained.  One departure: EAGLE-3 also masks positions whose target top-1 falls outside the draft
vocabulary; here every position is trained.  The head goes to `--out/head/` in the official EAGLE-3 layout.
`benchmarks/gpu_train.py` runs this training for Gemma 3 270M on a GPU machine in `--time-budget` slices.
""",
    "train dynaspec": """\
As the DynaSpec paper's Section 4.2: M clusters by spherical k-means (k-means++ seeding, no balance constraint) on
the normalised LM-head rows; a two-layer ReLU router over the draft network's inputs, trained with binary
cross-entropy against the clusters of the full-vocabulary drafter's top-L tokens; at draft depth t the union of the
top k_c(t) clusters, k_c = k0, k1, floor((k1+t)/(2t)).  k0 is the smallest budget whose held-out top-1 coverage
reaches `--coverage` and k1 = k0 // 2, unless given; `--position-aware K0,K1` overrides them at run time.
Departures: the examples are depth-0 inputs teacher-forced on the saved features, not recorded from live drafting,
and the router runs after the draft layer on the same stream.  The EAGLE head stays frozen; tuning uses a held-out
split of the training sequences, never an evaluation set.  Use it with `--vocab dynaspec --dynaspec DIR`, or the
`bench` methods `dynaspec` and `dynaspec-f[-N]`.
""",
    "train specvocab": """\
s = W_vocab W_down h with d' = `--rank`; the top `--k` candidates get exact logits.  It starts from the LM head's
best rank-d' approximation and is distilled from the full-vocabulary draft distribution (its top `--q-top`
entries) with the EAGLE head frozen; the paper trains it jointly with the draft.  With several rows per call the
candidates are the union of the rows' top-k.  Use it with `--vocab specvocab --specvocab DIR`, or the `bench` method
`specvocab`.
""",
    "train coral": """\
The papers describe CORAL only as an FFN routing each draft token to sub-vocabularies partitioned offline; here P
k-means partitions of the LM head and one linear layer over the draft hidden state, trained with cross-entropy
towards the partition of the drafter's top-1 token; the top r partitions at every depth, r tuned on held-out
positions like DynaSpec's k0.  Use it with `--vocab coral --coral DIR`, or the `bench` method `coral`.
""",
    "bench": """\
- **Runs.** Batch size 1; questions in the outer loop and methods in the inner one (slow drifts of a shared machine
  fall on all alike); multi-turn questions run turn by turn with the method's own earlier answers; wall time is
  measured around generation only (the device synchronised on CUDA), after `--warmup` untimed runs per method.  One
  decoding configuration per temperature and repetition penalty: by default plain greedy (the papers' convention)
  and penalty 1.2 (readable text from a base model); a sample is seeded by `--seed`, the question, the repeat and
  the turn, the same seeds for every method.  `--protocol paper` (every question, 1,024 tokens: for GPUs) and
  `--protocol cpu` (the first 5 questions of each category and 10 of HumanEval, 256 tokens) fix sample and length.
  `--resume` keeps every answer already in `--out` (a line cut by the interruption runs again).  Method names: see
  [Method names](#method-names).
- **Output.** Per decoding configuration `OUT/<decoding>/results.json` (per method `overall` and `categories`:
  `tokens_per_s`, `speedup`, `mean_accept_len`, `accept_per_position`, `time_split`, `active_vocab_mean`,
  `coverage`, `repetition_4gram`, ...; `mismatches`; `meta`), `OUT/<decoding>/answers/<method>.jsonl` (Spec-Bench's
  answer format plus token ids and step fields) and PNG plots; `OUT/report.md` has per-category tables.  Tokens/s
  is the mean of per-question tokens/s, the speed-up the ratio of those means to `ar`'s, τ the mean of all accept
  lengths; beside them the mean of category means, decode-only tokens/s, the draft time per decode step and the
  spread over `--repeats`.
- **Lossless check.** Every engine method's greedy tokens are compared with `ar`'s; a mismatch is printed and put at
  the top of the report, with the target's logits of the two tokens at the first differing position.  A gap within
  the dtype's rounding (2% of the largest logit in bf16, 0.01% in fp32) is a divergence at a near tie and only
  warns; any other mismatch makes the command exit 1.  `--weights fp32` is the strict check.  Peers (other kernels,
  other weights) are compared for information only.
- **Peers.** `hf-*` run transformers' `generate()` on the same weights.  `llama-cpp` and `llama-cpp-lookup` need
  `llama-cpp-python`, which is not a dependency (`pip install llama-cpp-python` builds it from source).  `vllm*`
  run in a vLLM environment's Python (`MICROSPEC_VLLM_PYTHON`).
""",
    "analyze": """\
The analyses (`--what`): `wmax`, the MicroSpec paper's Fig. 5 (the W_max sweep; `--ignore-eos` fills the window);
`ablation`, its Table 3 (Ctx. Only / Ext. Only / indexed / packed); `oracle`, Fig. 1a (static shortlists against
their oracle: the shortlist's time per step with the full vocabulary's τ); `coverage`, Fig. 1b (static top-K
coverage against MicroSpec's points); `overlap`, DynaSpec's overlap-bound terms per policy at each step's first
draft position (the target mass kept, the total variation between target and draft on the set, and the overlap
itself); `repetition`, the reference output's repeated 4-grams per category.  The timed analyses share one `bench`
run under `OUT/bench` (with its lossless check and exit status).
""",
    "vllm-prepare": """\
The plugin comes with the `[vllm]` extra.  The printed command serves the target with the EAGLE head as vLLM's
draft model and the chosen draft vocabulary; `bench`'s `vllm-*` methods run the same set-up beside microspec's own.
""",
}

METHODS_NOTE = """\
The names `bench --methods` takes (`ar` always runs, first); each engine method is also what `--drafter` and
`--vocab` describe.  Any engine method takes the suffixes `@adaptive` (`--adaptive`), `@lookup[N]` (`--lookup N`)
and `@d2t-replace` / `@d2t-intersect` (`--d2t`), e.g. `microspec@lookup`.
"""


def subcommands(parser: argparse.ArgumentParser) -> tuple[argparse.Action | None, dict]:
    """The sub-command action of ``parser`` and its choices, name -> (help, parser), in order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return action, {name: (helps.get(name, ""), p) for name, p in action.choices.items()}
    return None, {}


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, help, parser) of every command and sub-command below ``parser``, depth first."""
    for name, (help_, sub) in subcommands(parser)[1].items():
        yield (*path, name), help_, sub
        yield from walk(sub, (*path, name))


def collapse(text: str | None) -> str:
    return " ".join((text or "").split())


def metavar(action: argparse.Action) -> str:
    """The value an action takes, as argparse names it (empty for a flag)."""
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        name = action.dest.upper() if action.option_strings else action.dest
    nargs = action.nargs
    if nargs is None:
        return name
    if nargs == argparse.OPTIONAL:
        return f"[{name}]"
    if nargs == argparse.ZERO_OR_MORE:
        return f"[{name} ...]"
    if nargs == argparse.ONE_OR_MORE:
        return f"{name} [{name} ...]"
    if nargs == argparse.PARSER:
        return f"{name} ..."
    return " ".join([name] * nargs)  # an int; 0 for a flag


def invocation(action: argparse.Action) -> str:
    value = metavar(action)
    if not action.option_strings:
        return value
    return ", ".join(action.option_strings) + (f" {value}" if value else "")


def shown_default(action: argparse.Action) -> str | None:
    """The default to append to an option's help: only for an option that takes a value, is not required, has a
    default worth naming, and whose help does not already speak of its default."""
    default = action.default
    if (not action.option_strings or action.required or action.nargs == 0 or default is None
            or default is argparse.SUPPRESS or default in ("", [], ())):
        return None
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


def help_text(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own expansion (%(default)s, %%)
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        text = text % {**params, "prog": prog}
    text = collapse(text)
    default = shown_default(action)
    if default is not None and "default" not in text.lower():
        text = f"{text} (default {default})" if text else f"default {default}"
    return text


def wrap_items(head: str, items: list[str]) -> list[str]:
    """``head`` followed by ``items``, wrapped at WIDTH without splitting an item, continuation lines aligned after
    ``head``."""
    lines, line = [], head
    indent = " " * min(len(head) + 1, 40)
    for item in items:
        if len(line) + 1 + len(item) > WIDTH and line.strip() and line != head:
            lines.append(line)
            line = indent + item
        else:
            line = f"{line} {item}"
    lines.append(line)
    return lines


def usage(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """One usage line: the required options, ``[options]`` when there are others, then the positionals."""
    required, optional, positional = [], False, []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help is argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            positional.append("{" + ",".join(action.choices) + "} ...")
        elif not action.option_strings:
            positional.append(metavar(action))
        elif action.required:
            required.append(invocation(action).split(", ")[0] if action.nargs == 0 else
                            f"{action.option_strings[0]} {metavar(action)}")
        else:
            optional = True
    return wrap_items("usage: " + " ".join(("microspec", *path)), required + ["[options]"] * optional + positional)


def entry(name: str, text: str) -> list[str]:
    """One option or sub-command with its help, the help wrapped in a column from HELP_COLUMN."""
    lead = "  " + name
    if not text:
        return [lead]
    body = textwrap.wrap(text, WIDTH - HELP_COLUMN, break_long_words=False, break_on_hyphens=False)
    pad = " " * HELP_COLUMN
    if len(lead) + 2 <= HELP_COLUMN:
        first, rest = lead.ljust(HELP_COLUMN) + body[0], body[1:]
        return [first] + [pad + b for b in rest]
    return [lead] + [pad + b for b in body]


def option_block(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """The usage line, then each group's options (and sub-commands) with their help."""
    prog = " ".join(("microspec", *path))
    lines = usage(path, parser)
    _, subs = subcommands(parser)
    if subs:
        lines += ["", "commands:"]
        for name, (help_, _sub) in subs.items():
            lines += entry(name, collapse(help_))
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS
                   and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        if group is parser._positionals:
            title = "arguments"
        elif group is parser._optionals:
            title = "options"
        else:
            title = group.title
        lines += ["", f"{title}:"]
        for action in actions:
            lines += entry(invocation(action), help_text(action, prog))
    return [line.rstrip() for line in lines]


def anchor(path: tuple[str, ...]) -> str:
    return "-".join(("microspec", *path)).lower()


def cell(text: str) -> str:
    return collapse(text).replace("|", "\\|")


def paragraph(text: str) -> list[str]:
    """A parser's description or epilog as a markdown paragraph, wrapped like the notes."""
    return textwrap.wrap(collapse(text), PROSE_WIDTH, break_long_words=False, break_on_hyphens=False) + [""]


def section(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"{'#' * (len(path) + 1)} microspec {' '.join(path)}", ""]
    if parser.description:
        lines += paragraph(parser.description)
    lines += ["```text", *option_block(path, parser), "```", ""]
    if parser.epilog:
        lines += paragraph(parser.epilog)
    note = NOTES.get(" ".join(path))
    if note:
        lines += [note.rstrip(), ""]
    return lines


def plain(line: str) -> str:
    """One line of a docstring without its reStructuredText markup: ``x`` and :role:`x` become x; a line that starts
    with a ``name`` keeps its next column where it was."""
    line = re.sub(r":\w+:`~?([^`]+)`", r"\1", line)
    head = re.match(r"``([^`]+)``(\s+)(.*)$", line)
    if head:
        width = len(head[1]) + 4 + len(head[2])
        line = head[1].ljust(width) + re.sub(r"``([^`]+)``", r"\1", head[3])
    return re.sub(r"``([^`]+)``", r"\1", line)


def method_names() -> str:
    """The ``--methods`` names: :mod:`microspec.bench.methods`'s docstring after its first paragraph, as plain text."""
    from microspec.bench import methods

    doc = textwrap.dedent(methods.__doc__ or "").strip()
    parts = doc.split("\n\n", 1)
    body = (parts[1] if len(parts) > 1 else doc).strip()
    return "\n".join(plain(line).rstrip() for line in body.splitlines())


def render() -> str:
    from microspec.cli import build_parser

    parser = build_parser()
    commands = list(walk(parser))
    lines = [INTRO.rstrip(), "", "## Commands", "", "| Command | What it does |", "| --- | --- |"]
    for path, help_, _sub in commands:
        lines.append(f"| [`microspec {' '.join(path)}`](#{anchor(path)}) | {cell(help_)} |")
    lines += ["", GENERAL.rstrip(), ""]
    for path, _help, sub in commands:
        lines += section(path, sub)
    lines += ["## Method names", "", METHODS_NOTE.rstrip(), "", "```text", method_names(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write docs/cli.md from microspec's argument parsers.")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md differs instead of writing it")
    args = ap.parse_args(argv)
    text = render()
    name = OUT.relative_to(ROOT)
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{name} is out of date: run python3 docs/render_cli.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
