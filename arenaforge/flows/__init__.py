"""Composition: Prefect flows, deployments and the `arenaforge` CLI.

The only package that imports Prefect. Flows are short typed lists of task calls; the
stage logic lives in `tracks/` and `services/`.
"""
