"""``microspec serve``: an OpenAI-compatible HTTP server with streaming speculative decoding.

:mod:`.protocol` parses and answers the OpenAI wire format, :mod:`.text` turns committed tokens into safe text
deltas, :mod:`.worker` owns the model (one thread, a bounded queue), :mod:`.metrics` counts in vLLM's names, and
:mod:`.app` is the Starlette application over them.  Starlette + uvicorn: the ASGI pair FastAPI (and so vLLM's and
SGLang's servers) stand on, both actively maintained, small (no validation framework: the OpenAI error objects are
built here), with streaming responses and disconnect detection built in.
"""

from .app import create_app
from .worker import Worker

__all__ = ["Worker", "create_app"]
