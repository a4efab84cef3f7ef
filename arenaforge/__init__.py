"""Arenaforge: synthesize tool-use SFT data and verifiable RL environments for LLM agents, and train on them.

Sub-packages, lowest layer first (imports point one way; see docs/ARCHITECTURE.md):
`schemas` (contracts), `warehouse` (storage) and `environments` (env format, sandbox, reward),
`services` (the model seam, policy engines, the run scope), `tracks` (`sft`, `envs`, `train`: their stages),
`testing` (test doubles), `benchmarks`, `flows` (Prefect flows, deployments, the CLI).
"""

__version__ = "0.2.0"
