"""Faults a user meets: killed builds and conversions, two processes on one fresh cache, a cache that cannot be
written, damaged cache files, an unsupported architecture, a failure inside the server's batched step, absurd
options from a client.  Each gets one clear line (or an error object) and leaves the next run whole."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from support import InProcessServer

from microspec.errors import MicrospecError

TINY_CPP = r"""
#include <Python.h>
#define MS_CAT2(a, b) a##b
#define MS_CAT(a, b) MS_CAT2(a, b)
#define MS_STR2(x) #x
#define MS_STR(x) MS_STR2(x)
static struct PyModuleDef tiny_def = {PyModuleDef_HEAD_INIT, MS_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC MS_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&tiny_def); }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("MICROSPEC_CACHE", str(root))
    return root


def _in_thread(fn, timeout: float):
    """``fn()`` on a thread: (finished within ``timeout``, its result or exception)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive(), out.get("error", out.get("value"))


# ------------------------------------------------------------------------------------------------ kernel builds
def _tiny_extension(tmp_path: Path, tag: str):
    """A one-file extension; ``tag`` makes its hash (so its module's name) its own: torch builds a module name once
    per process."""
    from microspec.kernels._build import Extension, cpu_ok

    if not cpu_ok():
        pytest.skip("the CPU kernels are built on AVX2 Linux CPUs only")
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "tiny.cpp").write_text(f"{TINY_CPP}// {tag}\n")
    return Extension("tiny", ["tiny.cpp"], "test kernel", root=src)


def test_a_killed_builds_lock_does_not_hang_the_next_build(cache, tmp_path, capfd):
    """A build killed mid-way leaves torch's ``lock`` file in its folder; the next build removes it (holding a lock
    of its own that dies with its process) instead of waiting for it forever, and says what it builds."""
    ext = _tiny_extension(tmp_path, "stale lock")
    folder = cache / "kernels" / f"tiny-{ext.key()}"
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")
    done, result = _in_thread(ext.load, timeout=240)
    assert done, "the build waited on a dead build's lock"
    assert result is not None and ext.failed is None, ext.failed
    assert "building the test kernel (one time only" in capfd.readouterr().err


def test_a_built_kernel_loads_without_taking_a_lock(cache, tmp_path):
    """A kernel built before loads from a cache where no lock can be taken (read-only, or, here, its lock path a
    folder), and a built file cut short by a killed build is built again."""
    ext = _tiny_extension(tmp_path, "no lock")
    assert ext.load() is not None
    folder = cache / "kernels" / f"tiny-{ext.key()}"
    lock = folder.with_name(folder.name + ".lock")
    lock.unlink()
    lock.mkdir()  # no lock can be taken here
    again = type(ext)("tiny", ["tiny.cpp"], "test kernel", root=ext.root)
    assert again.load() is not None and again.failed is None, again.failed
    lock.rmdir()
    built = folder / f"microspec_tiny_{ext.key()}.so"
    head = built.read_bytes()[:100]
    built.unlink()  # (this process has the whole file mapped: a new file takes its name)
    built.write_bytes(head)  # cut short
    # another process (torch builds a module name once per process): it builds the file again
    code = ("import sys; from pathlib import Path; from microspec.kernels._build import Extension; "
            "e = Extension('tiny', ['tiny.cpp'], 'test kernel', root=Path(sys.argv[1])); "
            "sys.exit(0 if e.load() is not None else f'not loaded: {e.failed}')")
    proc = subprocess.run([sys.executable, "-c", code, str(ext.root)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert built.stat().st_size > 100


# ------------------------------------------------------------------------------------------------ model caches
@pytest.fixture
def fake_conversion(cache, tmp_path, monkeypatch):
    """A GGUF "file" whose conversion (counted, slow enough for two threads to meet) writes a cache folder the way
    the real one does."""
    from microspec.models import registry

    calls = []

    def convert(path, out):
        calls.append(out)
        with registry._cache_dir_written(out, path) as tmp:
            time.sleep(0.5)
            (tmp / "config.json").write_text("{}")
            (tmp / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(registry, "_convert_gguf", convert)
    monkeypatch.setattr(registry, "_check_gguf", lambda path: None)
    monkeypatch.setattr(registry, "_check_architecture", lambda path: None, raising=False)
    monkeypatch.delenv(registry.ASSETS_ENV, raising=False)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(4096))
    return path, calls


def test_two_processes_converting_one_model_both_get_it_whole(fake_conversion):
    """Two loads of one GGUF at once on a fresh cache: one converts, the other waits and reads its cache; a killed
    conversion's temporary folder is removed; the cache is readable by other users (not mode 0700)."""
    from microspec.models.registry import _gguf_cache_dir, model_directory

    path, calls = fake_conversion
    umask = os.umask(0o022)
    os.umask(umask)
    target = _gguf_cache_dir("m", path)
    leftover = target.with_name(target.name + ".killed1")  # what a killed conversion leaves
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    results = []
    threads = [threading.Thread(target=lambda: results.append(model_directory("m", "gguf", path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [target, target] and len(calls) == 1
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert not leftover.exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~umask


def test_a_cache_that_cannot_be_written_is_one_line(fake_conversion, cache, tmp_path, monkeypatch, capsys):
    from microspec.cli import main

    path, _ = fake_conversion
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MICROSPEC_CACHE", str(blocker / "cache"))  # a path under a regular file
    rc = main(["generate", "--model", str(path), "--weights", "fp32", "--prompt", "hi", "--max-new-tokens", "1"])
    err = capsys.readouterr().err
    assert rc == 4 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("microspec: error: cannot write the cache folder") and "MICROSPEC_CACHE" in lines[-1]


def _tiny_gguf(path, arch: str):
    """A GGUF file of architecture ``arch`` holding one small tensor: ``path``."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_unsupported_architecture_is_refused_before_any_conversion(cache, tmp_path):
    from microspec.models.registry import model_directory

    path = _tiny_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(MicrospecError, match="architecture 'mamba' is not supported"):
        model_directory("mamba", "gguf", path)
    assert not any((cache / "models").glob("mamba-*/*"))


def test_a_conversion_parses_its_gguf_file_once(cache, tmp_path, monkeypatch):
    """The check and transformers' loads (config, weights, tokenizer) read one parse of the file: each full parse of
    a large vocabulary's metadata is slow.  Another file, or another mode, gets a reader of its own, and the gguf
    package's reader is itself again afterwards, even when the conversion fails."""
    import gguf

    from microspec.models import registry

    path, other = _tiny_gguf(tmp_path / "m.gguf", "llama"), _tiny_gguf(tmp_path / "other.gguf", "llama")
    made, parses, seen = gguf.GGUFReader, [], []

    class Counted(made):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)

    def convert(p, out):  # what transformers does: a reader of its own for each of three loads
        from gguf import GGUFReader

        seen.extend(GGUFReader(str(p)) for _ in range(3))
        assert GGUFReader(other) is not seen[0] and GGUFReader(p, "c") is not seen[0]
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(registry, "_convert_gguf", convert)
    monkeypatch.delenv(registry.ASSETS_ENV, raising=False)
    with pytest.raises(RuntimeError, match="conversion failed"):
        registry.model_directory("m", "gguf", path)
    assert len({id(r) for r in seen}) == 1 and len(parses) == 3  # the check's parse, the other file, mode "c"
    assert gguf.GGUFReader is Counted


def test_a_damaged_cache_file_names_what_to_delete(cache, tiny_model_dir):
    import shutil

    from microspec.models.registry import read_weights

    broken = cache / "models" / "tiny-0123"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(MicrospecError, match=f"delete {broken}"):
        read_weights(broken)


def test_a_damaged_assembled_gguf_is_assembled_again(cache, tmp_path, monkeypatch, capsys):
    from microspec.models import registry

    package = tmp_path / "pkgs" / "fake_gguf_parts"
    package.mkdir(parents=True)
    content = b"GGUF" + bytes(range(256)) * 64
    (package / "__init__.py").write_text(
        "def assemble(path, overwrite=False):\n"
        f"    open(path, 'wb').write({content!r})\n")
    monkeypatch.syspath_prepend(str(package.parent))
    whole = tmp_path / "whole.gguf"
    whole.write_bytes(content)
    b = registry.BuiltinModel(name="fake", package="fake_gguf_parts", filename="fake.gguf", install="-",
                              assemble=True, file_key=registry._file_key(whole), size=len(content))
    target = registry._builtin_gguf(b)
    assert target.read_bytes() == content
    target.write_bytes(content[:100])  # cut short (a disk error, a copy stopped half-way)
    assert registry._builtin_gguf(b).read_bytes() == content
    assert "damaged" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from support import write_tiny_model_dir

    from microspec.cli import build_parser
    from microspec.cli.common import engine_from_args

    d = write_tiny_model_dir(tmp_path_factory.mktemp("faults") / "tiny")
    args = build_parser().parse_args(["serve", "--model", str(d), "--dtype", "fp32", "--drafter", "ngram"])
    return engine_from_args(args, per_request=True)[1]


def test_a_failure_of_the_batched_step_fails_its_requests_and_the_server_goes_on(engine, monkeypatch):
    """An exception from the forward every running request shares (out of memory, say) answers each of them 500
    (an error object, no trace) and the worker serves the next request."""
    from microspec.serve.app import create_app
    from microspec.serve.worker import Worker
    from slow_steps import slow_steps

    model = engine.lm.model
    real = model.forward_many
    armed = threading.Event()

    def forward_many(rows, taps):
        if armed.is_set() and len(rows) >= 2:
            armed.clear()
            raise RuntimeError("CUDA out of memory (injected)")
        return real(rows, taps)

    monkeypatch.setattr(model, "forward_many", forward_many)
    slow_steps(0.01, monkeypatch.setattr)  # each request lasts long enough to share steps
    server = InProcessServer(create_app(Worker(engine, max_num_seqs=4), access_log=False))
    try:
        body = {"prompt": "w1 w2 w3", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        armed.set()
        answers: list = [None, None]

        def ask(k):
            answers[k] = server.post("/v1/completions", body)

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(60)
        assert all(a is not None for a in answers), "a request was never answered"
        assert [a[0] for a in answers] == [500, 500], answers
        for _, obj in answers:
            message = obj["error"]["message"]
            assert "Traceback" not in message and "RuntimeError" not in message and "CUDA" not in message
        status, obj = server.post("/v1/completions", {**body, "max_tokens": 5})
        assert status == 200 and obj["usage"]["completion_tokens"] == 5
        assert server.get("/health")[0] == 200
    finally:
        server.close()


# ------------------------------------------------------------------------------------------------ vLLM's drafting
def test_a_vllm_request_with_an_absurd_vocabulary_option_drafts_with_the_default():
    """A request's ``microspec_vocab`` is the client's to name: a window of ten million ids (gigabytes) is refused
    with one warning and the request drafts with the default; the engine goes on."""
    import torch

    from microspec.vllm.vocab import BatchVocab

    batch = BatchVocab(torch.randn(96, 16), None, None, "microspec")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        req = batch._for_request("microspec-w10000000")
    assert req.name == "microspec"
    assert any("--w-max must be <= " in str(w.message) for w in seen)


def test_vllm_prepare_refuses_a_default_vocabulary_it_cannot_make(tmp_path, tiny_model_dir, capsys):
    """A default draft vocabulary the plugin cannot feed fails at ``vllm-prepare``, not at vLLM's first request;
    a folder that is not empty and not its own is never written into without --force."""
    from support import official_checkpoint

    from microspec.cli import main

    head, _, _ = official_checkpoint(tmp_path / "head", fmt="safetensors")
    assert main(["vllm-prepare", "--model", str(tiny_model_dir), "--draft", str(head), "--vocab", "fr-spec-32k",
                 "--out", str(tmp_path / "a")]) == 2
    assert "fr-spec" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    (mine / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert main(["vllm-prepare", "--model", str(tiny_model_dir), "--draft", str(head), "--vocab", "full",
                 "--out", str(mine)]) == 2
    assert "--force" in capsys.readouterr().err
    assert json.loads((mine / "config.json").read_text()) == {"architectures": ["LlamaForCausalLM"]}
    fresh = tmp_path / "fresh"
    assert main(["vllm-prepare", "--model", str(tiny_model_dir), "--draft", str(head), "--vocab", "full",
                 "--out", str(fresh)]) == 0
    assert main(["vllm-prepare", "--model", str(tiny_model_dir), "--draft", str(head), "--vocab", "full",
                 "--out", str(fresh)]) == 0  # its own folder: written again
    assert main(["vllm-prepare", "--model", str(tiny_model_dir), "--draft", str(head), "--vocab", "full",
                 "--out", str(mine), "--force"]) == 0
    capsys.readouterr()


def test_requests_are_admitted_by_kv_cache_memory(engine, monkeypatch):
    """With a KV budget: a request that needs more than all of it answers 400 (code kv_budget), never an allocation
    the machine cannot make; two that do not fit together run one after the other, both answered."""
    from microspec.decoding import GenerationConfig
    from microspec.serve.app import create_app
    from microspec.serve.worker import Worker

    model = engine.lm.model
    real, widest = model.forward_many, [0]

    def forward_many(rows, taps):
        widest[0] = max(widest[0], len(rows))
        return real(rows, taps)

    monkeypatch.setattr(model, "forward_many", forward_many)
    prompt = [1, 5, 6, 7]
    one = Worker(engine).kv_need(len(prompt), GenerationConfig(max_new_tokens=100))
    server = InProcessServer(create_app(Worker(engine, max_num_seqs=4, kv_budget=int(one * 1.2)), access_log=False))
    try:
        body = {"prompt": prompt, "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        status, obj = server.post("/v1/completions", {**body, "max_tokens": 200})
        assert status == 400 and obj["error"]["code"] == "kv_budget", obj
        answers: list = [None, None]
        threads = [threading.Thread(target=lambda k=k: answers.__setitem__(k, server.post("/v1/completions", body)))
                   for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [a[0] for a in answers] == [200, 200], answers
        assert widest[0] == 1, "two requests that do not fit the budget together ran together"
    finally:
        server.close()


def test_a_long_prompt_does_not_stop_the_other_streams(engine, monkeypatch):
    """A prompt of many prefill forwards takes one per step: a short request that comes while it is prefilled
    decodes meanwhile; both answers are those each gets alone."""
    from microspec.decoding import GenerationConfig, prefill
    from microspec.serve.app import create_app
    from microspec.serve.worker import Worker
    from slow_steps import slow_steps

    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 8)
    slow_steps(0.01, monkeypatch.setattr)
    model, events = engine.lm.model, []
    forward, forward_many = model.forward, model.forward_many

    def logged_forward(ids, cache, *args, **kwargs):
        if cache.length == 0 or len(ids) > 1 and kwargs.get("positions") is None:
            events.append(("prefill", cache.length + len(ids)))
        return forward(ids, cache, *args, **kwargs)

    def logged_many(rows, taps):
        events.append(("step", len(rows)))
        return forward_many(rows, taps)

    monkeypatch.setattr(model, "forward", logged_forward)
    monkeypatch.setattr(model, "forward_many", logged_many)
    long_prompt = [1] + [(5 * i) % 90 + 3 for i in range(199)]
    server = InProcessServer(create_app(Worker(engine, max_num_seqs=4), access_log=False))
    try:
        answers: dict = {}
        bodies = {"long": {"prompt": long_prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True},
                  "short": {"prompt": [1, 5, 6, 7], "max_tokens": 20, "temperature": 0, "ignore_eos": True}}
        threads = []
        for name in ("long", "short"):
            threads.append(threading.Thread(target=lambda n=name: answers.__setitem__(
                n, server.post("/v1/completions", bodies[n]))))
            threads[-1].start()
            time.sleep(0.1)
        for t in threads:
            t.join(60)
        assert answers["long"][0] == 200 and answers["short"][0] == 200, answers
        long_forwards = [k for k, (what, n) in enumerate(events) if what == "prefill" and n > 8]
        assert len(long_forwards) >= 20
        between = events[long_forwards[0]:long_forwards[-1]]
        assert ("step", 1) in between, "the short request waited for the whole long prefill"
    finally:
        server.close()
    for name, body in bodies.items():  # (the same prefill forwards: PREFILL_CHUNK is still 8)
        alone = engine.generate_ids(body["prompt"], GenerationConfig(max_new_tokens=body["max_tokens"],
                                                                     ignore_eos=True)).token_ids
        text = engine.lm.tokenizer.decode(alone, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert answers[name][1]["choices"][0]["text"] == text, name
