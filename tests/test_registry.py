"""A drafter added with one registry line is a method everywhere: :func:`microspec.build` and the Python API, the
command line (``--drafter NAME`` and its options), the server and bench, with the target's own greedy tokens."""

from __future__ import annotations

import json

import pytest
from support import InProcessServer, bench_questions

from microspec.decoding.tree import DraftTree
from microspec.drafters import registry
from microspec.drafters.base import Drafter
from microspec.drafters.model_based import DEPTH
from microspec.options import DrafterSpec

PROMPT = "w5 w6 w7 w5 w6 w7 w8"


class Repeat(Drafter):
    """Proposes the last token again, ``n`` times: a chain from the text alone."""

    name = "repeat"
    cheap = True

    def __init__(self, n: int):
        self.n = n

    def propose(self, ctx) -> DraftTree:
        return DraftTree.chain([ctx.tokens[-1]] * min(self.n, ctx.max_depth))


SPEC = DrafterSpec("repeat", "the last token again, a chain (a test's drafter)", options=(DEPTH,),
                   make=lambda method, ctx: Repeat(ctx.tree["depth"]),
                   shape=lambda kind, method: {"depth": 2 if method.depth is None else method.depth})


@pytest.fixture
def repeat():
    registry.register(SPEC)  # the one line a new drafter needs
    yield SPEC
    registry.unregister(SPEC.name)


def _plain(lm, ids, **cfg):
    from microspec import build
    from microspec.decoding import GenerationConfig

    return build("ar", lm).generate_ids(ids, GenerationConfig(**cfg)).token_ids


def test_build_and_the_python_api(repeat, tiny_model_dir):
    import microspec
    from microspec.decoding import GenerationConfig
    from microspec.errors import MicrospecError
    from microspec.method import Method

    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    ids = lm.tokenizer(PROMPT).input_ids
    engine = microspec.build("repeat", lm)
    assert isinstance(engine.drafter, Repeat) and engine.tree == {"depth": 2}
    assert microspec.build(Method(drafter="repeat", depth=3), lm).tree == {"depth": 3}
    for cfg in ({"max_new_tokens": 16, "ignore_eos": True},
                {"max_new_tokens": 16, "ignore_eos": True, "repetition_penalty": 1.3}):
        r = engine.generate_ids(ids, GenerationConfig(**cfg))
        assert r.token_ids == _plain(lm, ids, **cfg) and max(r.stats.draft_depths) == 2
    assert microspec.generate(lm, PROMPT, method="repeat", max_new_tokens=8, ignore_eos=True).token_ids == \
        _plain(lm, lm.tokenizer(PROMPT).input_ids, max_new_tokens=8, ignore_eos=True)
    with pytest.raises(MicrospecError, match="--top-k applies to"):  # its spec says what it takes
        Method(drafter="repeat", top_k=2)
    with pytest.raises(MicrospecError, match="is taken"):
        registry.register(SPEC)


def test_the_command_line(repeat, tiny_model_dir, capsys):
    from microspec.cli import build_parser, main

    assert "repeat (the last token again" in build_parser()._subparsers._group_actions[0].choices[
        "generate"].format_help().replace("\n", " ").replace("  ", " ")
    outs = []
    for drafter in (["--drafter", "repeat", "--depth", "3"], ["--drafter", "none"]):
        assert main(["generate", "--json", "--model", str(tiny_model_dir), "--dtype", "fp32", "--prompt", PROMPT,
                     "--max-new-tokens", "12", "--ignore-eos", *drafter]) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outs[0]["drafter"] == "repeat" and outs[0]["token_ids"] == outs[1]["token_ids"]
    assert len(outs[0]["stats"]["accept_per_position"]) == 3  # a share per drafted level


def test_the_server(repeat, tiny_model_dir):
    """``serve --drafter repeat``, in this process (the registration is this process's): a completion's text is
    plain decoding's."""
    import microspec
    from microspec.cli import build_parser
    from microspec.cli.common import engine_from_args
    from microspec.serve.app import create_app
    from microspec.serve.worker import Worker

    args = build_parser().parse_args(["serve", "--model", str(tiny_model_dir), "--dtype", "fp32", "--drafter",
                                      "repeat"])
    _, engine = engine_from_args(args, per_request=True)
    assert isinstance(engine.drafter, Repeat)
    server = InProcessServer(create_app(Worker(engine)))
    try:
        body = {"model": engine.lm.name, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
        status, out = server.post("/v1/completions", body)
        assert status == 200, out
        plain = microspec.generate(engine.lm, PROMPT, method="ar", max_new_tokens=10, ignore_eos=True, chat=False)
        assert out["choices"][0]["text"] == plain.text
    finally:
        server.close()


def test_bench(repeat, tiny_model_dir, tmp_path, capsys):
    from microspec.cli import main

    out = tmp_path / "bench"
    assert main(["bench", "--model", str(tiny_model_dir), "--dtype", "fp32", "--data",
                 str(bench_questions(tmp_path)), "--methods", "ar,repeat", "--max-new-tokens", "8", "--ignore-eos",
                 "--repetition-penalties", "1.0", "--out", str(out)]) == 0, capsys.readouterr().err
    res = json.loads((out / "greedy" / "results.json").read_text())
    assert set(res["methods"]) == {"ar", "repeat"} and res["mismatches"] == {}


def _subclasses(base: type) -> set[type]:
    """``base`` and every class below it (the modules defining them imported)."""
    classes, todo = set(), [base]
    while todo:
        cls = todo.pop()
        classes.add(cls)
        todo.extend(cls.__subclasses__())
    return classes


def test_every_drafter_gives_the_loop_what_it_asks():
    """The loop depends on :class:`~microspec.decoding.context.DraftSource`, not on the drafters: the base drafter
    and every drafter class has each of its members, with the parameters the loop passes."""
    import inspect

    from microspec.decoding.context import DraftSource

    asked = {n: inspect.signature(getattr(DraftSource, n)) for n in dir(DraftSource)
             if not n.startswith("_") and callable(getattr(DraftSource, n))}
    assert set(asked) == {"prefill", "feature_layers", "propose", "drafts_before_read", "commit", "finish",
                          "take_report"}
    import microspec.auto  # noqa: F401  (its Portfolio and Aside drafters)
    import microspec.drafters  # noqa: F401  (every drafter module)

    classes = _subclasses(Drafter)
    assert len(classes) >= 10, classes
    for cls in classes:
        assert hasattr(cls, "head"), cls
        for name, sig in asked.items():
            got = inspect.signature(getattr(cls, name))
            assert list(got.parameters)[:len(sig.parameters)] == list(sig.parameters), (cls, name, got)


def test_every_network_drafter_gives_its_builders_what_they_run():
    """The draft builders depend on :class:`~microspec.drafters.builders.DraftNetwork`, not on the drafter's
    class: every :class:`~microspec.drafters.model_based.ForwardDrafter` has each of its members, with the
    parameters the builders pass."""
    import inspect

    import microspec.drafters  # noqa: F401  (every drafter module)
    from microspec.drafters.builders import DraftNetwork
    from microspec.drafters.model_based import ForwardDrafter

    calls = {n: inspect.signature(getattr(DraftNetwork, n)) for n in vars(DraftNetwork)
             if not n.startswith("_") and callable(getattr(DraftNetwork, n))}
    assert {"draft_forward", "draft_cache", "route_draft", "draft_done", "sized"} <= set(calls)
    classes = _subclasses(ForwardDrafter)
    assert len(classes) >= 4, classes
    for cls in classes:
        inits = "".join(inspect.getsource(b.__init__) for b in cls.__mro__ if "__init__" in vars(b) and b is not object)
        for name in DraftNetwork.__annotations__:  # a class attribute, or one its constructors set
            assert any(name in vars(b) for b in cls.__mro__) or f"self.{name}" in inits, (cls, name)
        for name, sig in calls.items():
            got = inspect.signature(getattr(cls, name))
            assert list(got.parameters) == list(sig.parameters), (cls, name, got)
