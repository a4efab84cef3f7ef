"""Benchmarks, one module per capability, each with `main(**options) -> dict` printed as JSON by
`arenaforge bench <name>`. They measure; they never assert."""
