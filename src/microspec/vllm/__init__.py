"""MicroSpec inside vLLM: a plugin (no fork) that runs this project's EAGLE heads as vLLM drafters, scoring each
request's draft vocabulary (full, FR-Spec / VocabTrim token maps, MicroSpec's in-context window per request).

vLLM finds it through the ``vllm.general_plugins`` entry point (:func:`register`), which registers the draft
architecture ``EagleMicrospecForCausalLM`` (:mod:`microspec.vllm.model`).  ``microspec vllm-prepare MODEL``
(:mod:`microspec.vllm.prepare`) writes the two directories vLLM is given: the target's (the converted weights with
their architecture named) and the head's (the checkpoint with the plugin's architecture and settings).  The vLLM
internals the plugin touches are named in :mod:`microspec.vllm.internals`.  Nothing here imports vLLM until vLLM
itself loads the plugin.
"""

ARCHITECTURE = "EagleMicrospecForCausalLM"


def register() -> None:
    """vLLM's plugin entry point: make the draft architecture known (in every vLLM process)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, f"microspec.vllm.model:{ARCHITECTURE}")
