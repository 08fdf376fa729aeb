"""What a drafter or a vocabulary policy declares about itself: its options (name, default, checks, help, flag) and,
for a policy, the artifact it reads, the method names it answers to and how it is built.

Each drafter module (:mod:`microspec.drafters`) and each policy module (:mod:`microspec.vocab`) defines its own
:class:`DrafterSpec` / :class:`PolicySpec`; :mod:`microspec.drafters.registry` and :mod:`microspec.vocab.registry`
list them.  Everything else is derived from those lists: the method-name parser and validation
(:class:`microspec.method.Method`), the command-line flags of every command (:mod:`microspec.cli.common`), the bench's
method names and artifact flags.  Adding a policy is one module with its ``SPEC`` and one line in the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import MicrospecError


@dataclass(frozen=True)
class Option:
    """One option of a method: ``name`` is its keyword (``Method(w_max=...)``) and, dashed, its flag (``--w-max``).

    ``default`` is what the owner uses when the option is unset (None: nothing, or a default decided elsewhere, said
    in ``help``).  ``convert`` turns a command-line string into the value; ``low`` / ``high`` / ``choices`` are checked
    when a method is described, each failure one line naming the flag.  ``aliases``: older flag spellings still accepted."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    low: int | None = None
    high: int | None = None  # the largest value taken (a bound on what one request may make the engine allocate)
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    flag_name: str | None = None  # a flag other than --<name with dashes>
    convert: Callable[[Any], Any] | None = None  # normalises a given value (one line on a bad one)
    # (device kind, value) pairs: what an unset option means on that kind of device (microspec.devices), where
    # that differs from ``default``; the resolver (microspec.compose) fills them in
    per_device: tuple[tuple[str, Any], ...] = ()

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.name.replace("_", "-")

    def device_default(self, kind: str) -> Any:
        """What the option means unset on device kind ``kind`` (None: the owner's own default)."""
        return dict(self.per_device).get(kind)

    def value(self, method) -> Any:
        """The option's value in ``method``, or its default when unset."""
        got = getattr(method, self.name)
        return self.default if got is None else got

    def normalise(self, value: Any) -> Any:
        return value if value is None or self.convert is None else self.convert(value)

    def check(self, value: Any) -> None:
        if value is None:
            return
        if self.choices is not None and value not in self.choices:
            raise MicrospecError(f"unknown {self.flag} {value!r}; choose from {', '.join(self.choices)}")
        if self.low is not None and isinstance(value, int) and value < self.low:
            raise MicrospecError(f"{self.flag} must be >= {self.low}, got {value}")
        if self.high is not None and isinstance(value, int) and value > self.high:
            raise MicrospecError(f"{self.flag} must be <= {self.high}, got {value}")

    def add_to(self, parser) -> None:
        """This option as a flag of an argparse parser (default None: unset; the help names the owner's default)."""
        shown = self.help if self.default is None else f"{self.help} (default {self.default})"
        kwargs: dict = {"dest": self.name, "default": None, "help": shown}
        if self.type is bool:
            kwargs.update(action="store_true", default=False)
        else:
            kwargs["type"] = self.type
            if self.choices is not None:
                kwargs["choices"] = list(self.choices)
            if self.metavar is not None:
                kwargs["metavar"] = self.metavar
        parser.add_argument(self.flag, *self.aliases, **kwargs)


@dataclass(frozen=True)
class Artifact:
    """A file or directory a policy reads (a token map, a trained router), with its one flag on every command.

    ``shipped(model)``: the one that ships for built-in ``model`` (None when none does); ``for_eagle_head_only``: the
    shipped one was made for the shipped EAGLE head, so it fills in only for that head."""

    flag: str
    kind: str  # "file" or "dir"
    what: str  # e.g. "token map"
    made_by: str  # e.g. "`microspec freq`"
    shipped: Callable[[str], Path | None] | None = None
    for_eagle_head_only: bool = False
    older_flag: str | None = None  # another artifact's flag read as this one's when this one's is not given

    @property
    def dest(self) -> str:
        return "artifact_" + self.flag.lstrip("-").replace("-", "_")

    def needed(self, policy: str) -> str:
        return f"--vocab {policy} needs {self.flag} {'DIR' if self.kind == 'dir' else 'FILE'} (a {self.what} made " \
               f"by {self.made_by})"

    def check_exists(self, path: str | None, policy: str) -> None:
        if path is None:
            raise MicrospecError(self.needed(policy))
        p = Path(path)
        if not (p.is_dir() if self.kind == "dir" else p.is_file()):
            raise MicrospecError(f"{policy} {self.what} {path} not found")

    def add_to(self, parser, policy: str) -> None:
        parser.add_argument(self.flag, dest=self.dest, default=None, metavar="DIR" if self.kind == "dir" else "FILE",
                            help=f"{policy}: the {self.what} ({self.made_by}"
                                 + (("; default: the one shipped with the model's shipped EAGLE head"
                                     if self.for_eagle_head_only else "; default: the one that ships for the model")
                                    if self.shipped else "") + ")")


@dataclass(frozen=True)
class PolicySpec:
    """A draft vocabulary policy as methods see it.

    ``parse_name(text)``: the fields a method-name part means (``"fr-spec-16k"`` -> ``{"vocab": "fr-spec",
    "shortlist_size": "16k"}``), None when ``text`` is not this policy's; ``names``: those forms as listed to users;
    ``build(method, vocab_size, device, always)``: a fresh :class:`~microspec.vocab.base.VocabPolicy`;
    ``check(method)``: rules beyond each option's own (one line each); ``restricts``: the draft head scores a subset
    (so ``--d2t replace`` applies)."""

    name: str
    summary: str
    options: tuple[Option, ...] = ()
    artifact: Artifact | None = None
    names: tuple[str, ...] = ()
    parse_name: Callable[[str, str], dict | None] | None = None
    build: Callable[..., Any] | None = None
    check: Callable[[Any], None] | None = None
    restricts: bool = True

    def takes(self, option: str) -> bool:
        return any(o.name == option for o in self.options)


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter as methods see it: its names (``aliases``: other method names for it), options, extra checks, and
    how it is built on a device.

    - ``make(method, ctx)``: the drafter (None: plain decoding), from a
      :class:`~microspec.drafters.base.BuildContext` (the loaded target, the device kind, the resolved
      :attr:`shape`, the EAGLE head or draft model the method names);
    - ``shape(kind, method)``: the settings the drafter is made with on device kind ``kind`` (``cuda``, ``cpu``,
      ``cpu-gguf``; :mod:`microspec.devices`), the method's own where set, the drafter's defaults for that device
      elsewhere (``depth``, ``top_k``, ``total_tokens``, and whatever else its factory reads);
    - capabilities: ``head``, it runs a network with an LM head (so a draft vocabulary applies); ``eagle_head``, it
      drafts with an EAGLE head (``method.draft``, else the one that ships for the model), loaded before the target
      so that a bad head fails first."""

    name: str
    summary: str
    options: tuple[Option, ...] = ()
    aliases: tuple[str, ...] = ()
    head: bool = False
    check: Callable[[Any], None] | None = None
    make: Callable[[Any, Any], Any] | None = None
    shape: Callable[[str, Any], dict] | None = None
    eagle_head: bool = False

    def takes(self, option: str) -> bool:
        return any(o.name == option for o in self.options)


def unique(groups: Sequence[Sequence[Option]]) -> list[Option]:
    """The options of ``groups`` each once, in order (two specs that share an option share the object; a name defined
    twice is a programming error, caught by a test)."""
    out: dict[str, Option] = {}
    for group in groups:
        for o in group:
            if out.setdefault(o.name, o) is not o:
                raise RuntimeError(f"option {o.name!r} is defined twice")
    return list(out.values())
