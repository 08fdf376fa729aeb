"""microspec: lossless speculative decoding for large-vocabulary language models."""

from .errors import MicrospecError
from .models.registry import BUILTINS, DEFAULT_MODEL, LoadedModel, load_model

__version__ = "0.1.0"

__all__ = ["BUILTINS", "DEFAULT_MODEL", "LoadedModel", "MicrospecError", "load_model", "__version__"]
