"""microspec: lossless speculative decoding for large-vocabulary language models.

::

    import microspec

    lm = microspec.load_model()                 # Gemma 3 270M, packed GGUF weights on a CPU
    print(microspec.generate(lm, "The three laws of robotics are").text)
"""

from .api import build, generate
from .decoding.config import GenerationConfig
from .errors import MicrospecError
from .method import Method
from .models.registry import BUILTINS, DEFAULT_MODEL, LoadedModel, load_model

__version__ = "0.1.0"

__all__ = ["BUILTINS", "DEFAULT_MODEL", "GenerationConfig", "LoadedModel", "Method", "MicrospecError", "build",
           "generate", "load_model", "__version__"]
