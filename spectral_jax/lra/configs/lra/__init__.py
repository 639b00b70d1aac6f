"""The Long Range Arena task configs, one module per task (``--config lra/<task>[:ARG]``)."""
