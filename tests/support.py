"""Helpers the test modules share (fixtures are in conftest.py): tiny randomly initialised models of every supported
family, built from configs in-process (each built once per session, handed out as copies), EAGLE checkpoints laid out
like the released ones, data files, a server process, and the repository's scripts as modules."""

from __future__ import annotations

import copy
import functools
import http.client
import importlib.util
import json
import os
import socket
import threading
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 96
# OpenAI's penalties and bias (processors that run in drafting and verification), as tests decode with them
OPENAI = {"presence_penalty": 0.7, "frequency_penalty": 0.5, "logit_bias": {10: 1.5, 20: -2.0, 31: 3.0}}




def tiny_config(family: str, **overrides):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if family == "gemma3":
        cfg = Gemma3TextConfig(**common, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16,
                               sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2)
    elif family == "llama":
        cfg = LlamaConfig(**common, num_hidden_layers=2, tie_word_embeddings=True)
    elif family == "qwen2":
        cfg = Qwen2Config(**common, num_hidden_layers=2)
    elif family == "qwen3":
        cfg = Qwen3Config(**common, num_hidden_layers=2, head_dim=16)
    else:
        raise ValueError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


FAMILIES = ["gemma3", "llama", "qwen2", "qwen3"]
_HF_CLASSES = {"gemma3": "Gemma3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}


def tiny_hf_model(family: str, seed: int = 0, scale: float = 0.08, **overrides):
    """A transformers model with random weights large enough to give peaked, non-trivial distributions."""
    import transformers

    torch.manual_seed(seed)
    cfg = tiny_config(family, **overrides)
    model = getattr(transformers, _HF_CLASSES[family])(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.normal_(0.0, scale)
    return model


def tiny_pair(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    """(HF model, native model) with the same weights: copies of a pair built once per session for these
    arguments (a test may change its copy).  torch's random generator is left as building the pair leaves it, as if
    it were built now (a test's later random draws are the same either way)."""
    hf, native, rng = _tiny_pair(family, seed, dtype, tuple(sorted(overrides.items())))
    torch.set_rng_state(rng)
    return copy.deepcopy((hf, native))


@functools.lru_cache(maxsize=None)
def _tiny_pair(family: str, seed: int, dtype, overrides: tuple):
    from microspec.models.native import NativeCausalLM

    hf = tiny_hf_model(family, seed, **dict(overrides)).to(dtype)
    native = NativeCausalLM.from_config(hf.config)
    native.load_hf_state_dict({k: v.clone() for k, v in hf.state_dict().items()})
    return hf, native.to(dtype).eval(), torch.get_rng_state()


def write_tiny_model_dir(path: Path, family: str = "llama", seed: int = 0, chars: bool = False,
                         **overrides) -> Path:
    """A complete local HF model directory (config, safetensors weights, a word-level tokenizer: words w0, w1, ...,
    or with ``chars`` single characters, :func:`char_tokenizer`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    hf = tiny_hf_model(family, seed, **overrides)
    path.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(path))
    if chars:
        fast = char_tokenizer()
    else:
        words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                       unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["vocab_size"] == VOCAB
    return path


CHARS = (' !"#$%\'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{}')
CHAR_EOS = 2


def char_tokenizer():
    """A tokenizer of the tiny models' 96 ids whose words are single characters (4 special ids, then the 92 of
    :data:`CHARS`): JSON, regexes and choices spell with it, so grammar tests run on the tiny models."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>", *CHARS]
    assert len(words) == VOCAB == len(set(words))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # the characters as they are, side by side
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<pad>")


def char_text(ids) -> str:
    """The text of ids of :func:`char_tokenizer` (special ids dropped)."""
    return "".join(CHARS[i - 4] for i in ids if i >= 4)


def write_checkpoint(path, cfg: dict, state: dict, fmt: str) -> None:
    """A checkpoint directory: config.json and the weights as pytorch_model.bin (``fmt`` "bin") or safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(state, path / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(path / "model.safetensors"))


def official_checkpoint(path, d=64, heads=4, kv=2, inter=96, vocab=VOCAB, fc_bias=True, qkv_bias=False, seed=0,
                        bias_key=True, fmt="bin"):
    """An EAGLE-1/2 checkpoint laid out exactly like the released ones (random weights)."""
    g = torch.Generator().manual_seed(seed)
    hd = d // heads

    def w(*shape, s=0.08):
        return torch.randn(*shape, generator=g) * s

    state = {"fc.weight": w(d, 2 * d), "embed_tokens.weight": w(vocab, d),
             "layers.0.self_attn.q_proj.weight": w(heads * hd, d), "layers.0.self_attn.k_proj.weight": w(kv * hd, d),
             "layers.0.self_attn.v_proj.weight": w(kv * hd, d), "layers.0.self_attn.o_proj.weight": w(d, heads * hd),
             "layers.0.mlp.gate_proj.weight": w(inter, d), "layers.0.mlp.up_proj.weight": w(inter, d),
             "layers.0.mlp.down_proj.weight": w(d, inter),
             "layers.0.post_attention_layernorm.weight": 1 + w(d, s=0.1)}
    if fc_bias:
        state["fc.bias"] = w(d)
    if qkv_bias:
        for n in "qkv":
            state[f"layers.0.self_attn.{n}_proj.bias"] = w(state[f"layers.0.self_attn.{n}_proj.weight"].shape[0])
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d, "intermediate_size": inter,
           "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1, "vocab_size": vocab,
           "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "rope_theta": 10000.0, "hidden_act": "silu"}
    if bias_key:
        cfg["bias"] = fc_bias
    write_checkpoint(path, cfg, state, fmt)
    return path, state, cfg


def eagle3_checkpoint(path, d=64, heads=4, kv=2, inter=96, vocab=VOCAB, draft_vocab=64, layers=(0, 1, 2), seed=0,
                      specforge=False, fmt="safetensors", t2d=True):
    """An EAGLE-3 checkpoint laid out like the released ones (random weights; draft ids a random subset of the
    vocabulary, ``draft_vocab == vocab`` with d2t all zeros for a head over the whole vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    hd = d // heads

    def w(*shape, s=0.08):
        return torch.randn(*shape, generator=g) * s

    ids = torch.arange(vocab) if draft_vocab == vocab else torch.randperm(vocab, generator=g)[:draft_vocab].sort()[0]
    state = {"fc.weight": w(d, 3 * d, s=0.05), "midlayer.input_layernorm.weight": 1 + w(d, s=0.1),
             "midlayer.hidden_norm.weight": 1 + w(d, s=0.1), "midlayer.post_attention_layernorm.weight": 1 + w(d, s=0.1),
             "midlayer.self_attn.q_proj.weight": w(heads * hd, 2 * d), "midlayer.self_attn.k_proj.weight": w(kv * hd, 2 * d),
             "midlayer.self_attn.v_proj.weight": w(kv * hd, 2 * d), "midlayer.self_attn.o_proj.weight": w(d, heads * hd),
             "midlayer.mlp.gate_proj.weight": w(inter, d), "midlayer.mlp.up_proj.weight": w(inter, d),
             "midlayer.mlp.down_proj.weight": w(d, inter), "norm.weight": 1 + w(d, s=0.1),
             "lm_head.weight": w(draft_vocab, d, s=0.3), "d2t": ids - torch.arange(draft_vocab),
             "embed_tokens.weight": w(vocab, d)}
    if t2d:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids] = True
        state["t2d"] = mask
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1,
           "vocab_size": vocab, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
           "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}
    if layers is not None:
        if specforge:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True}
        else:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(layers)
    write_checkpoint(path, cfg, state, fmt)
    return path, state, cfg, ids


def bench_questions(tmp_path: Path) -> Path:
    """A small question file in Spec-Bench's shape: a two-turn question and two one-turn ones, in two categories."""
    path = tmp_path / "questions.jsonl"
    rows = [{"question_id": 1, "category": "writing", "turns": ["w5 w6 w7 w5 w6", "w9 w10"]},
            {"question_id": 2, "category": "qa", "turns": ["w11 w12 w13 w11 w12 w13"]},
            {"question_id": 3, "category": "qa", "turns": ["w20 w21"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load_script(path: Path):
    """A script of the repository (``benchmarks/``, ``docs/``) as a module, imported as Python runs it: with its own
    folder first on the module path while it loads (its sibling modules are found there)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


# ---------------------------------------------------------------------------------------- a server process
METHOD = ["--drafter", "early-exit", "--vocab", "microspec"]
CHAT_TEMPLATE = ("{% for m in messages %}<bos> {{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<bos> assistant {% endif %}")


class ScriptedChoice:
    """A chooser for :class:`~microspec.auto.Portfolio` whose picks a subclass scripts (:meth:`pick`): it counts the
    arms taken and measures nothing, so that tests can force any order of arms."""

    def __init__(self, history, start, **_):
        self.arms, self.chosen = history.arms, {}

    def take(self, arm: str) -> str:
        self.chosen[arm.split("@")[0]] = self.chosen.get(arm.split("@")[0], 0) + 1
        return arm

    def observe(self, arm, tokens, seconds, nodes=0):
        pass

    def score(self, arm, tokens, nodes, seconds=None):
        pass

    def charge(self, seconds):
        pass

    def plain_step(self):
        return None

    def summary(self):
        return {"arms": dict(self.chosen), "switches": 0, "switch_s": 0.0}


def concurrently(calls, timeout: float = 300) -> tuple[list, list[str]]:
    """Each of ``calls`` (functions of no argument) on a thread of its own, all at once: their results, in order
    (None where one raised), and the errors raised."""
    results, errors = [None] * len(calls), []

    def one(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results, errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir_with_chat_template(path: Path, template: str = CHAT_TEMPLATE, **overrides) -> Path:
    """The tiny llama of conftest with a chat template."""
    d = write_tiny_model_dir(path, **overrides)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


class _Client:
    """HTTP requests to a server on 127.0.0.1:``port`` (with ``api_key`` when set)."""

    port: int
    api_key: str | None = None

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=self.api_key or "unused",
                             max_retries=0, timeout=120)

    def headers(self, extra: dict | None = None) -> dict:
        """JSON and the API key, updated with ``extra`` (a None value drops a header)."""
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra or {})
        return {k: v for k, v in h.items() if v is not None}

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 60,
                headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request(method, path, body=body, headers=self.headers(headers))
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def get(self, path: str):
        return self.request("GET", path, timeout=5)

    def post(self, path: str, obj, headers: dict | None = None) -> tuple[int, dict]:
        status, data = self.request("POST", path, obj if isinstance(obj, bytes) else json.dumps(obj).encode(),
                                    headers=headers)
        return status, json.loads(data)

    def events(self, path: str, obj) -> list:
        """The server-sent events of a streamed request: JSON objects, then "[DONE]"."""
        status, data = self.request("POST", path, json.dumps(obj).encode())
        assert status == 200, data
        lines = [line for line in data.decode().split("\n\n") if line]
        assert all(line.startswith("data: ") for line in lines), lines
        return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]

    def metric(self, name: str) -> float:
        text = self.get("/metrics")[1].decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{"))


class Server(_Client):
    """``microspec serve`` in its own process."""

    def __init__(self, model: Path | str, *extra: str, log_dir: Path | None = None, api_key: str | None = None,
                 env: dict | None = None, step_delay: float = 0.0):
        """``step_delay``: each step of the worker at least this many seconds longer (tests/slow_steps.py)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = open((log_dir or Path(model).parent) / f"server-{self.port}.log", "w+")  # noqa: SIM115
        key = ["--api-key", api_key] if api_key else []
        extra_env, env = env, {k: v for k, v in os.environ.items() if k != "MICROSPEC_API_KEY"}
        cmd = [str(Path(__file__).with_name("slow_steps.py")), str(step_delay)] if step_delay else ["-m", "microspec"]
        self.proc = subprocess.Popen([sys.executable, *cmd, "serve", "--model", str(model), "--port",
                                      str(self.port), *key, *extra], stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**env, "PYTHONUNBUFFERED": "1", **(extra_env or {})})
        deadline = time.time() + 180
        while time.time() < deadline:
            assert self.proc.poll() is None, f"the server died: {self.output()}"
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the server did not come up: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class InProcessServer(_Client):
    """A server application (``microspec.serve.app.create_app``) run by uvicorn on a thread of this process: what
    this process changed (a registered drafter, a patched model) is the server's; :meth:`close` stops it."""

    def __init__(self, app):
        import threading

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not come up"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _runtimes_follow(monkeypatch, field: str, current) -> None:
    """For the test, every :class:`~microspec.runtime.Runtime`, resolved before or after, answers ``field`` with
    ``current(runtime)`` (what it would resolve now) instead of what it resolved: a model loaded by a fixture
    takes the test's changes without a new load."""
    from microspec.runtime import Runtime

    def store(rt, value):
        rt.__dict__[field] = value

    monkeypatch.setattr(Runtime, field, property(current, store), raising=False)


def device_as(monkeypatch, device: str = "cpu", **changes) -> None:
    """For the test, ``device``'s profile (:mod:`microspec.devices`) with ``changes``, in every runtime on it: a test
    following CUDA's path on a CPU says which of CUDA's choices it takes (``walk_on_device=True``,
    ``draft_ahead=True``, ...)."""
    from microspec import devices

    monkeypatch.setitem(devices.PROFILES, device, devices.with_changes(device, **changes))
    _runtimes_follow(monkeypatch, "profile", lambda rt: devices.profile(rt.device))


def set_switch(monkeypatch, name: str, value: str | None = None) -> None:
    """For the test, the environment's switch ``name`` set to ``value`` (None: unset) and the switches read again,
    as a model load reads them (:mod:`microspec.switches`), in every runtime too; the fixture in conftest.py reads
    them again before each test, so what one test set does not reach the next."""
    from microspec import switches

    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    switches.refresh()
    _runtimes_follow(monkeypatch, "switches", lambda rt: switches.current())


class RandomLength:
    """A :class:`~microspec.drafters.length.DraftLength` whose choices are coin flips from a generator of its own
    (seeded), a level's token taken with the probability the drafter gives for it, at least ``floor``: chains of every length from none
    to the limit, chosen as the real one chooses, before each level's token is drawn — for the losslessness and
    exact-distribution tests of sized chains.  ``lengths`` counts the chains by length."""

    def __init__(self, seed: int = 0, stop: float = 0.3, floor: float = 0.7):
        import random

        from microspec.drafters.length import DraftLength

        self.inner, self.rng, self.stop, self.floor = DraftLength(), random.Random(seed), stop, floor
        self.limit, self.lengths, self._n = self.inner.limit, {}, 0

    def sibling(self) -> "RandomLength":
        return RandomLength(self.rng.randrange(1 << 30), self.stop, self.floor)

    def restart(self) -> None:
        self.inner.restart()

    def begin(self, deterministic: bool, processed: bool) -> None:
        self.inner.begin(deterministic, processed)
        self._n = 0

    def take(self, p: float) -> bool:
        assert 0.0 <= p <= 1.0
        keep = self.rng.random() < max(p, self.floor)  # on the probability it is given (choosing on the draw
        # would bias the draws), at least ``floor``
        if keep:
            self.inner._chain.append(self.inner.bin_of(p))  # what the real one keeps of a token taken
            self._n += 1
        return keep

    def deeper(self) -> bool:
        return self._n < self.limit and self.rng.random() >= self.stop

    def level(self, seconds: float) -> None:
        self.inner.level(seconds)

    def drafted(self) -> None:
        self.inner.drafted()

    def heard(self, committed: int) -> None:
        if self.inner._chain is not None:
            self.lengths[self._n] = self.lengths.get(self._n, 0) + 1
        self.inner.heard(committed)
