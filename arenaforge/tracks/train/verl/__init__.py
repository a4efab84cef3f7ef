"""Scale-out hand-off to verl (optional extra `verl==0.9.1`).

    agent_loop.py    ArenaAgentCore: our rollout loop driven by verl's server manager (CPU-testable,
                     no verl import); ServerManagerEngine adapts `server_manager.generate` to PolicyEngine
    verl_adapter.py  what verl's workers load by name (imports verl): ArenaAgentLoop (`arena_agent`) and
                     VerlArenaTool (a BaseTool per tool name, for verl's stock `tool_agent` loop)
    tool.py          ArenaTool: open/execute/calc_reward/release over sandbox sessions (the tool's body)
    dataset.py       the files verl reads: train/val Parquet, environments.jsonl, agent_loops.yaml,
                     tool_config.yaml
    reward.py        compute_score for verl's reward manager (used only if the loop set no score)
    job.py           hydra overrides (GRPO, no KL/entropy, clip-higher, filter_groups), job files,
                     Ray job submission

Only verl_adapter.py imports verl (or ray); the rest loads without it.
"""
