"""Options live with their owners: every drafter's and policy's options come from its own spec, and the method
checks, the method names and every command's flags are derived from those specs."""

from __future__ import annotations

import copy
import pickle

import pytest

from microspec.cli import build_parser
from microspec.drafters import registry as drafters
from microspec.errors import MicrospecError
from microspec.method import OPTIONS, Method, method_names
from microspec.options import Option, unique
from microspec.vocab import registry as policies


def _flags(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {s for a in sub._actions for s in a.option_strings}


@pytest.mark.parametrize("command", ["generate", "serve", "coverage"])
def test_every_option_of_every_spec_is_a_flag_of_the_decoding_commands(command):
    flags = _flags(command)
    missing = [o.flag for name, o in OPTIONS.items() if name != "artifact" and o.flag not in flags]
    assert not missing, missing
    for name, art in policies.ARTIFACTS.items():  # one flag per artifact, the same on every command
        assert art.flag in flags and art.flag in _flags("bench"), (name, art.flag)


def test_an_option_is_defined_once():
    a, b = Option("w_max", "one"), Option("w_max", "two")
    with pytest.raises(RuntimeError, match="defined twice"):
        unique([[a], [b]])
    assert unique([[a], [a]]) == [a]  # shared by two specs: the same object


def test_method_names_come_from_the_specs():
    names = method_names()
    for spec in policies.SPECS.values():
        if spec.name != "full":
            assert set(spec.names) <= set(names)
    for spec in drafters.SPECS.values():  # every drafter's own name parses to it
        if spec.name not in ("none", "model"):
            assert Method.parse(spec.name).drafter == spec.name
    assert Method.parse("ar") == Method() and Method.parse("eagle2") == Method(drafter="eagle")


def test_defaults_are_the_owners():
    from microspec.compose import build_policy
    from microspec.vocab.microspec import K_PRE, K_VER, W_MAX

    v = build_policy(Method(drafter="eagle", vocab="microspec"), 1000)
    assert (v.w_max, v.k_pre, v.k_ver) == (W_MAX.default, K_PRE.default, K_VER.default) == (3072, 3, 3)


def test_method_is_a_value():
    m = Method.parse("microspec-w16-indexed@lookup3", depth=3, top_k=2)
    assert pickle.loads(pickle.dumps(m)) == m and copy.deepcopy(m) == m and hash(m) == hash(m.replace())
    assert m.replace(w_max=None).w_max is None and m.replace(w_max=None) != m
    with pytest.raises(AttributeError, match="immutable"):
        m.w_max = 5
    assert Method(drafter="eagle", vocab="fr-spec", freq_file="m.pt").artifact == "m.pt"  # earlier keyword names
    with pytest.raises(MicrospecError, match="unknown method option 'wmax'"):
        Method(drafter="eagle", vocab="microspec", wmax=5)
    # plain decoding takes the shape options and ignores them (auto may choose it under a tree command line)
    assert Method(drafter="none", depth=3, top_k=2).depth == 3


def test_python_api_speculates_like_the_command_line(tiny_model_dir, capsys):
    """``microspec.generate(lm, prompt)`` runs auto, as ``microspec generate`` does: the same method and tokens."""
    import json

    import microspec
    from microspec.cli import main

    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    out = microspec.generate(lm, "w5 w6 w7 w5 w6 w7 w8", max_new_tokens=16, ignore_eos=True)
    plain = microspec.generate(lm, "w5 w6 w7 w5 w6 w7 w8", max_new_tokens=16, ignore_eos=True, method="ar")
    assert out.token_ids == plain.token_ids
    engine = lm.__dict__["_auto_engine"]  # made once, kept on the model
    assert microspec.generate(lm, "w5 w6", max_new_tokens=2, method=None).token_ids and \
        lm.__dict__["_auto_engine"] is engine
    assert main(["generate", "--json", "--model", str(tiny_model_dir), "--dtype", "fp32", "--prompt",
                 "w5 w6 w7 w5 w6 w7 w8", "--max-new-tokens", "16", "--ignore-eos"]) == 0
    cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli["token_ids"] == out.token_ids
    assert engine.engine_of("greedy").describe()["arms"] == cli["arms"] and cli["drafter"] == "auto"
    with pytest.raises(MicrospecError, match="auto chooses the drafter"):
        microspec.auto.engine(lm, drafter="eagle")
