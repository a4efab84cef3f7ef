"""The train track: rollouts (`rollout/`), one-node trainers (GRPO, SFT), batch filling, checkpoints, the locally
built tiny model, and the hand-off to verl (`verl/`). It consumes the sft and envs tracks' data.

    grpo.py          advantages, clip-higher token-level loss, GrpoTrainer.step
    batching.py      adaptive batch filling, env-failure repair, Resample-on-Correct
    run_grpo.py      the GRPO loop over streamed rollouts (metrics, checkpoints, resume)
    sft.py           SFT on the OpenAI messages+tools JSONL export (assistant tokens only)
    warmstart.py     gold-call replays as SFT conversations (warm start before GRPO)
    checkpoints.py   weights every k steps, optimizer state for the newest 1-2 only
    tiny_model.py    random Qwen3 + locally trained tokenizer for tests

The jobs (a training run scope and typed params in, a small summary out; shared by the CLI, the flows and the
benchmarks; `job_config.open_job_scope` opens the scope and records the run), one per module:

    rollout_job.py     `rollout`                 evaluation.py      `eval` (evaluate_policy: one eval run)
    grpo_job.py        `train grpo`              warmstart_jobs.py  `warmstart` data, the warm-start SFT
    sft_job.py         `train sft`               verl_handoff.py    `train grpo` written/submitted as a verl job
and what they share: job_config.py (config, run scope, out dir), model_paths.py (--model-path), env_selection.py
(envs and split), policy_engines.py (the engine, by its declared traits).
"""
