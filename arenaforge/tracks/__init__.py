"""The tracks: sft/ (tool-use SFT data), envs/ (RL environments), train/ (rollouts, GRPO, verl).

Each holds its stages, offline rules (`offline_<stage>.py`) and prompts (`prompts/`). sft and envs
import no other track; train may import both (it consumes their data). Never imports Prefect.
"""
