"""What a drafter's factory is built from: the method and a :class:`BuildContext`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import MicrospecError
from ..models.registry import load_model
from .eagle3 import load_eagle_head


@dataclass
class BuildContext:
    """What a drafter's factory (:attr:`DrafterSpec.make <microspec.options.DrafterSpec.make>`) gets beside its
    method: the device ``kind`` (:mod:`microspec.devices`), the resolved ``tree`` (its spec's ``shape``), the loaded
    ``target`` and its ``tokenizer``, and loaders of what the method names: :meth:`eagle_head` (loaded once into
    ``heads``, a dict engines built together share) and :meth:`draft_model`.  ``head`` / ``draft``: an EAGLE head or
    draft model given as objects instead (tests, scripts)."""

    kind: str = "cpu"
    tree: dict = field(default_factory=dict)
    target: Any = None
    tokenizer: Any = None
    heads: dict = field(default_factory=dict)
    head: Any = None
    draft: Any = None

    def eagle_head(self, path) -> Any:
        """The EAGLE head in directory ``path`` (EAGLE-1/2 or EAGLE-3, by its config), loaded once."""
        if self.head is not None:
            return self.head
        if path is None:
            raise MicrospecError("the eagle drafter needs its EAGLE head (--draft DIR)")
        if str(path) not in self.heads:
            self.heads[str(path)] = load_eagle_head(path)
        return self.heads[str(path)]

    def draft_model(self, name) -> Any:
        """The draft model ``name`` (built-in name, .gguf or HF directory) in the target's dtype and device; one
        clear error when its tokenizer is not the target's."""
        if self.draft is not None:
            return self.draft
        draft = load_model(name, dtype=self.target.dtype, device=self.target.device)
        if self.tokenizer is not None and draft.tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise MicrospecError(f"draft model {draft.name!r} uses another tokenizer than the target")
        return draft.model


__all__ = ["BuildContext"]
