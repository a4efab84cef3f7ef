"""One-node trainers (GRPO, SFT), batch filling, checkpoints, and the locally built tiny model."""
