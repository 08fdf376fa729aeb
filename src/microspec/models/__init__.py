"""Model backends: loading (registry), the native forward (native) and its KV cache (kv_cache)."""

from .kv_cache import KVCache
from .native import ArchSpec, NativeCausalLM, spec_from_config
from .registry import BUILTINS, DEFAULT_MODEL, LoadedModel, load_model

__all__ = ["ArchSpec", "BUILTINS", "DEFAULT_MODEL", "KVCache", "LoadedModel", "NativeCausalLM", "load_model",
           "spec_from_config"]
