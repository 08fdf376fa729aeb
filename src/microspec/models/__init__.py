"""Model backends: loading (registry; GGUF files: gguf), the native forward (native, over the architecture spec and
the layers of layers) and its KV cache (kv_cache), packed GGUF matrices (quant)."""

from .kv_cache import KVCache
from .native import NativeCausalLM
from .registry import BUILTINS, DEFAULT_MODEL, LoadedModel, load_model
from .spec import ArchSpec, spec_from_config

__all__ = ["ArchSpec", "BUILTINS", "DEFAULT_MODEL", "KVCache", "LoadedModel", "NativeCausalLM", "load_model",
           "spec_from_config"]
