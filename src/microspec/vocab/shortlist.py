"""The static shortlists as methods see them: FR-Spec (the top K of corpus token frequencies) and VocabTrim (the top
K of the target's own generations), each a :class:`~microspec.vocab.frequency.StaticShortlist` over a token map."""

from __future__ import annotations

import re

from ..errors import check
from ..options import Artifact, Option, PolicySpec
from .frequency import StaticShortlist, load_token_map, parse_size
from .packed import GATHER, check_fused
from .position import POSITION_AWARE, check_ranked, with_budgets

DEFAULT_SIZE = "32k"
def _checked_size(value):
    """A shortlist size as given (``"16k"``, ``3000``), checked."""
    parse_size(value)
    return value


SHORTLIST_SIZE = Option("shortlist_size", convert=_checked_size, aliases=("--vocab-size",),
                        help=f"fr-spec / vocabtrim: K, the shortlist's size, e.g. 8k, 16k, {DEFAULT_SIZE} (default) "
                             "or 3000")
_SIZE = r"(\d+(?:\.\d+)?[kK]?)"


def _shipped_map(model: str):
    from ..models.registry import shipped_token_map

    return shipped_token_map(model)


FR_SPEC_MAP = Artifact("--freq-file", "file", "token map (SGLang format)", "`microspec freq`", shipped=_shipped_map)
VOCABTRIM_MAP = Artifact("--vocabtrim-file", "file", "token map of the target's own generations",
                         "`microspec freq --generate`", older_flag=FR_SPEC_MAP.flag)


def _parser(name: str):
    plain = re.compile(rf"^{name}(?:-{_SIZE})?$")
    pa_fr = re.compile(rf"^pa-fr(?:-{_SIZE})?$")

    def parse_name(text: str, method: str) -> dict | None:
        """``<name>[-K]`` (default K 32k); for fr-spec also ``pa-fr[-K]``: FR-Spec with DynaSpec's App. A.3
        schedule (K ids at depths 0 and 1, floor(K / (t + 1)) after)."""
        m = plain.match(text)
        if m:
            return {"vocab": name, "shortlist_size": m.group(1) or DEFAULT_SIZE}
        m = pa_fr.match(text) if name == "fr-spec" else None
        if m:
            size = m.group(1) or DEFAULT_SIZE
            return {"vocab": "fr-spec", "shortlist_size": size, "position_aware": f"pa-fr:{size}"}
        return None

    return parse_name


def _build(method, vocab_size: int, device, always):
    fused = check_fused(method.gather, device)
    size = method.shortlist_size if method.shortlist_size is not None else DEFAULT_SIZE
    k = parse_size(size)
    token_map = load_token_map(method.artifact, vocab_size)
    need = min(k, vocab_size)
    check(len(token_map) >= need, f"token map {method.artifact} has {len(token_map)} ids, fewer than the {need} of "
                                  f"{method.vocab}-{size} (a smaller --shortlist-size, or a map filled up with "
                                  "`microspec freq --fill`)")
    policy = StaticShortlist(token_map, k, always=always, name=method.vocab, device=device, fused=fused)
    return with_budgets(policy, method)


FR_SPEC = PolicySpec(
    "fr-spec", "FR-Spec: a static top-K of corpus token frequencies", options=(SHORTLIST_SIZE, GATHER, POSITION_AWARE),
    artifact=FR_SPEC_MAP, names=("fr-spec-K", "pa-fr-K"), parse_name=_parser("fr-spec"), build=_build,
    check=check_ranked)
VOCABTRIM = PolicySpec(
    "vocabtrim", "VocabTrim: a static top-K of the target's own generations",
    options=(SHORTLIST_SIZE, GATHER, POSITION_AWARE), artifact=VOCABTRIM_MAP, names=("vocabtrim-K",),
    parse_name=_parser("vocabtrim"), build=_build, check=check_ranked)
