"""Draft vocabulary policies: which ids the draft head scores.  ``make_vocab`` builds one by name."""

from __future__ import annotations

from ..errors import MicrospecError, check
from .base import FullVocab, VocabPolicy
from .frequency import StaticShortlist, load_token_map, parse_size
from .microspec import GATHERS, MicroSpecVocab
from .packed import PackedRows
from .position import PositionAware, budget, parse_budgets

POLICIES = ("full", "fr-spec", "vocabtrim", "microspec", "dynaspec", "specvocab", "coral")


def make_vocab(name: str, *, vocab_size: int | None = None, device="cpu", eos_ids=(), w_max: int | None = None,
               k_pre: int | None = None, k_ver: int | None = None, freq_file: str | None = None,
               size: str | int | None = None, always=(), gather: str | None = None,
               position_aware: str | tuple[int, int] | None = None, k_pre_positions: int | None = None,
               sources: str | None = None, router: str | None = None,
               validate_only: bool = False) -> VocabPolicy | None:
    """A policy by name.  ``always``: ids every policy keeps (EOS, chat special tokens); ``gather``: how the
    MicroSpec head gets its rows (packed|indexed); ``position_aware``: "k0,k1" budgets of a PositionAware wrapper."""
    if name != "microspec" and k_pre_positions is not None:
        raise MicrospecError("--k-pre-positions applies to --vocab microspec")
    if sources is not None:
        from .microspec import SOURCES

        if name != "microspec":
            raise MicrospecError("sources (ctx, ext, ctx+ext) apply to --vocab microspec")
        if sources not in SOURCES:
            raise MicrospecError(f"unknown sources {sources!r}; choose from {', '.join(SOURCES)}")
    if name in ("dynaspec", "specvocab", "coral") or router is not None:
        return _make_trained(name, router, vocab_size, device, eos_ids, always, position_aware, validate_only,
                              w_max=w_max, k_pre=k_pre, k_ver=k_ver, freq_file=freq_file, size=size, gather=gather,
                              k_pre_positions=k_pre_positions, sources=sources)
    policy = _make(name, vocab_size=vocab_size, device=device, eos_ids=eos_ids, w_max=w_max, k_pre=k_pre,
                   k_ver=k_ver, freq_file=freq_file, size=size, always=always, gather=gather,
                   validate_only=validate_only)
    if sources is not None and policy is not None:
        policy.set_sources(sources)
    if k_pre_positions is not None:
        if k_pre_positions < 0:
            raise MicrospecError(f"--k-pre-positions must be >= 0, got {k_pre_positions}")
        if policy is not None:
            policy.prompt_positions = k_pre_positions
    if position_aware is None:
        return policy
    k0, k1 = parse_budgets(position_aware) if isinstance(position_aware, str) else position_aware
    if name == "full":
        raise MicrospecError("--position-aware needs a policy that ranks its ids (fr-spec, vocabtrim, microspec)")
    return None if validate_only else PositionAware(policy, k0, k1)


def _make_trained(name, router, vocab_size, device, eos_ids, always, position_aware, validate_only, **others):
    """A trained policy from ``--router DIR``: DynaSpec's cluster router (``microspec train dynaspec``; "k0,k1" of
    ``position_aware`` overrides its cluster budgets) or SpecVocab's ranker (``microspec train specvocab``)."""
    if name not in ("dynaspec", "specvocab", "coral"):
        raise MicrospecError("--router applies to --vocab dynaspec / specvocab / coral")
    bad = [k.replace("_", "-") for k, v in others.items() if v is not None]
    if name in ("specvocab", "coral") and position_aware is not None:
        bad.append("position-aware")
    if bad:
        raise MicrospecError(f"--{', --'.join(bad)} do not apply to --vocab {name}")
    if router is None:
        raise MicrospecError(f"--vocab {name} needs --router DIR (made by `microspec train {name}`)")
    from pathlib import Path

    if not Path(router).is_dir():
        raise MicrospecError(f"{name} artifact {router} not found")
    if validate_only:
        return None
    keep = sorted(set(eos_ids) | set(always))
    if name == "specvocab":
        from .specvocab import load_specvocab

        return load_specvocab(router, vocab_size, always=keep, device=device)
    if name == "coral":
        from .coral import load_coral

        return load_coral(router, vocab_size, always=keep, device=device)
    k0 = k1 = None
    if position_aware is not None:
        k0, k1 = parse_budgets(position_aware) if isinstance(position_aware, str) else position_aware
    from .dynaspec import load_dynaspec

    return load_dynaspec(router, vocab_size, always=keep, device=device, k0=k0, k1=k1)


def _make(name, *, vocab_size, device, eos_ids, w_max, k_pre, k_ver, freq_file, size, always, gather,
          validate_only) -> VocabPolicy | None:
    if name != "microspec" and any(v is not None for v in (w_max, k_pre, k_ver)):
        raise MicrospecError("--w-max, --k-pre and --k-ver apply to --vocab microspec")
    if gather is not None and gather not in GATHERS:
        raise MicrospecError(f"unknown --gather {gather!r}; choose from {', '.join(GATHERS)}")
    if gather is not None and name == "full":
        raise MicrospecError("--gather applies to a restricted draft vocabulary, not --vocab full")
    if gather == "fused":
        from ..kernels.gather_matmul import available

        if not available(device):
            raise MicrospecError("--gather fused needs Triton and a CUDA device (or TRITON_INTERPRET=1 on a CPU)")
    policy = _make_base(name, vocab_size=vocab_size, device=device, eos_ids=eos_ids, w_max=w_max, k_pre=k_pre,
                        k_ver=k_ver, freq_file=freq_file, size=size, always=always, gather=gather,
                        validate_only=validate_only)
    if policy is not None:
        policy.fused = gather == "fused"
    return policy


def _make_base(name, *, vocab_size, device, eos_ids, w_max, k_pre, k_ver, freq_file, size, always, gather,
               validate_only) -> VocabPolicy | None:
    if name not in ("fr-spec", "vocabtrim") and (freq_file is not None or size is not None):
        raise MicrospecError("--freq-file and --vocab-size apply to --vocab fr-spec / vocabtrim")
    if name == "full":
        return FullVocab()
    if name in ("fr-spec", "vocabtrim"):
        if freq_file is None:
            raise MicrospecError(f"--vocab {name} needs --freq-file (a token map made by `microspec freq`"
                                 f"{' --generate' if name == 'vocabtrim' else ''})")
        k = parse_size(size if size is not None else "32k")
        if validate_only:
            return None
        token_map = load_token_map(freq_file, vocab_size)
        need = k if vocab_size is None else min(k, vocab_size)
        check(len(token_map) >= need, f"token map {freq_file} has {len(token_map)} ids, fewer than the {need} of "
                                      f"{name}-{size or '32k'} (a smaller --vocab-size, or a map filled up with "
                                      f"`microspec freq --fill`)")
        return StaticShortlist(token_map, k, always=sorted(set(eos_ids) | set(always)), name=name, device=device)
    if name == "microspec":
        return MicroSpecVocab(vocab_size or 1, w_max=3072 if w_max is None else w_max,
                              k_pre=3 if k_pre is None else k_pre, k_ver=3 if k_ver is None else k_ver,
                              always=sorted(set(eos_ids) | set(always)), device=device,
                              gather="packed" if gather in (None, "packed") else "indexed")
    raise MicrospecError(f"unknown vocabulary policy {name!r}; choose from {', '.join(POLICIES)}")


__all__ = ["GATHERS", "POLICIES", "FullVocab", "MicroSpecVocab", "PackedRows", "PositionAware", "StaticShortlist",
           "VocabPolicy", "budget", "make_vocab", "parse_budgets"]
