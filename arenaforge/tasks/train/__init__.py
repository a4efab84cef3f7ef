"""One-node trainers (GRPO, SFT), batch filling, checkpoints, and the locally built tiny model.

    grpo.py          advantages, clip-higher token-level loss, GrpoTrainer.step
    batching.py      adaptive batch filling, env-failure repair, Resample-on-Correct
    run_grpo.py      the GRPO loop over streamed rollouts (metrics, checkpoints, resume)
    sft.py           SFT on the OpenAI messages+tools JSONL export (assistant tokens only)
    warmstart.py     gold-call replays as SFT conversations (warm start before GRPO)
    checkpoints.py   weights every k steps, optimizer state for the newest 1-2 only
    tiny_model.py    random Qwen3 + locally trained tokenizer for tests
"""
