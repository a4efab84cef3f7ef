"""Test doubles for what cannot run here: a scripted OpenAI-compatible server over real HTTP (`scripted_openai`,
`scripted_endpoint` in a process of its own), its envs-track responder (`envs_responder`) and a scripted policy
engine (`scripted_policy`). Benchmarks and tests use them; the product never imports them (tests/test_layers.py)."""
