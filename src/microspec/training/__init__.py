"""Training pipelines for draft heads (``microspec train ...``)."""
