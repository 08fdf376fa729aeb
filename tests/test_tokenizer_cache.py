"""A model's tokenizer is built by transformers once, then read back from the cache's pickled copy: the same tokens
and text both ways, rebuilt when its files, its libraries or the copy change, and loaded whether or not the cache can
be written."""

from __future__ import annotations

import json
import os

import pytest
from support import write_tiny_model_dir

from microspec.models.registry import model_directory, resolve
from microspec.models.tokenizer import load_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\nand newlines\n\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    return n if n < 2 else fibonacci(n - 1)",
    "Die Würde des Menschen ist unantastbar. L'été à Paris — naïve façade.",
    "日本語のテキストと中文文本, 한국어, русский текст, العربية, हिन्दी.",
    "emoji 🙂🚀 and bytes \u0000\u0007 and <bos> <eos> <start_of_turn>user\nhi<end_of_turn>",
]


def _same(a, b, texts=TEXTS) -> None:
    """``a`` and ``b`` tokenize and detokenize every text alike and name the same special tokens."""
    assert type(a) is type(b)
    for text in texts:
        for special in (True, False):
            ids = a(text, add_special_tokens=special).input_ids
            assert ids == b(text, add_special_tokens=special).input_ids, text
            for skip in (True, False):
                assert a.decode(ids, skip_special_tokens=skip) == b.decode(ids, skip_special_tokens=skip)
    assert a.all_special_ids == b.all_special_ids and a.all_special_tokens == b.all_special_tokens
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id)
    assert (a.padding_side, a.chat_template, len(a)) == (b.padding_side, b.chat_template, len(b))


def _copies(cache) -> list:
    return sorted((cache / "tokenizers").glob("*.pickle")) if (cache / "tokenizers").is_dir() else []


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("MICROSPEC_CACHE", str(root))
    return root


def test_the_copy_is_the_tokenizer_and_follows_its_files(tmp_path, cache, monkeypatch):
    from transformers import AutoTokenizer

    model = write_tiny_model_dir(tmp_path / "m")
    words = ["w1 w2 w3", "w7 w0 <eos> w9", "unknown words here"]
    built = load_tokenizer(model)
    assert len(_copies(cache)) == 1
    _same(built, AutoTokenizer.from_pretrained(str(model), local_files_only=True), words)
    with monkeypatch.context() as m:  # read back without transformers building anything
        m.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("built again"))
        read = load_tokenizer(model)
    assert read is not built
    _same(read, built, words)

    # a changed tokenizer file is a new key: built again, the old copy removed
    config = model / "tokenizer_config.json"
    cfg = json.loads(config.read_text())
    cfg["eos_token"] = "<pad>"
    config.write_text(json.dumps(cfg))
    changed = load_tokenizer(model)
    assert changed.eos_token == "<pad>" and built.eos_token == "<eos>"
    assert len(_copies(cache)) == 1 and load_tokenizer(model).eos_token == "<pad>"


def test_a_damaged_copy_is_built_again(tmp_path, cache):
    model = write_tiny_model_dir(tmp_path / "m")
    load_tokenizer(model)
    (copy,) = _copies(cache)
    copy.write_bytes(copy.read_bytes()[:100])  # cut short, as by a full disk or a killed writer
    assert load_tokenizer(model)("w4 w5").input_ids == [8, 9]
    (again,) = _copies(cache)
    assert again.stat().st_size > 100


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_cache_still_loads(tmp_path, cache):
    model = write_tiny_model_dir(tmp_path / "m")
    cache.mkdir()
    cache.chmod(0o500)
    try:
        assert load_tokenizer(model)("w4 w5").input_ids == [8, 9]
        assert _copies(cache) == []
    finally:
        cache.chmod(0o700)


def test_a_cache_path_that_is_a_file_still_loads(tmp_path, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("MICROSPEC_CACHE", str(blocker / "cache"))  # a path under a regular file
    model = write_tiny_model_dir(tmp_path / "m")
    assert load_tokenizer(model)("w4 w5").input_ids == [8, 9]


@pytest.mark.real
@pytest.mark.parametrize("name", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_the_built_in_tokenizers_are_the_same_read_back(name, tmp_path, monkeypatch):
    directory = model_directory(*resolve(name))  # the model's own cache; its tokenizer's copy in a fresh one
    cache = tmp_path / "cache"
    monkeypatch.setenv("MICROSPEC_CACHE", str(cache))
    built = load_tokenizer(directory)  # by transformers: the cache holds no copy yet
    assert len(_copies(cache)) == 1
    read = load_tokenizer(directory)
    _same(read, built)
    if built.chat_template:
        chat = [{"role": "user", "content": TEXTS[3]}, {"role": "assistant", "content": TEXTS[2]}]
        assert (read.apply_chat_template(chat, tokenize=True, add_generation_prompt=False)
                == built.apply_chat_template(chat, tokenize=True, add_generation_prompt=False))
