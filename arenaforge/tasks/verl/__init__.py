"""Scale-out hand-off to verl (optional extra `verl==0.9.1`).

    agent_loop.py    ArenaAgentCore: our rollout loop driven by verl's server manager (CPU-testable,
                     no verl import); ServerManagerEngine adapts `server_manager.generate` to PolicyEngine
    verl_adapter.py  the thin AgentLoopBase subclass, importable only where verl is installed
    tool.py          ArenaTool: BaseTool-style create/execute/calc_reward/release over sandbox sessions
    dataset.py       the Parquet dataset verl reads (prompt, agent_name, reward_model, extra_info)
    reward.py        compute_score for verl's reward manager (used only if the loop set no score)
    job.py           hydra overrides (GRPO, no KL/entropy, clip-higher, filter_groups), job files,
                     Ray job submission

Nothing here imports verl or ray at module import time.
"""
