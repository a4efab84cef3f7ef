"""Executable tool environments: the package format, the sandbox runtime and the F1 reward.

Imports only `schemas`: an environment must load inside a trainer's rollout worker or a
sandbox image, where there is no DuckDB and no Prefect.
"""
