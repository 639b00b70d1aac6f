"""Language-model configs (``--config lm/<name>[:ARG]``)."""
