"""The sandbox runtime: a warm pool of workers that run environments' tool code in isolation.

Public API (everything else here is internal):

    pool = await create_pool(SandboxConfig())       # docker if an engine answers, else process (warned)
    session = await pool.open(env)                  # raises EnvLoadError if the code does not load
    obs = await pool.call(session, "tool", {...})   # -> ToolObservation: ok/no_output/error/timeout/limit
    await pool.close(session); await pool.shutdown()  # or: async with await create_pool(cfg) as pool
    observations = await run_calls(pool, env, env.calls)  # a fresh session, closed afterwards

When the sandbox itself fails a request, `open`/`call` raise an `EnvironmentFailure` (Overloaded,
WorkerLost, SessionLost, IsolationFailure): never the agent's fault. See docs/SANDBOX.md.
"""

from arenaforge.environments.runtime.errors import (
    EnvironmentFailure,
    EnvLoadError,
    IsolationFailure,
    Overloaded,
    RequirementUnavailable,
    SessionLost,
    SpawnFailure,
    UntrustedCodeRefused,
    WorkerLost,
)
from arenaforge.environments.runtime.image import build_image, image_ref, image_tag
from arenaforge.environments.runtime.pool import Pool, Session, create_pool, model_written, replay, run_calls

__all__ = [
    "EnvLoadError",
    "EnvironmentFailure",
    "IsolationFailure",
    "Overloaded",
    "Pool",
    "RequirementUnavailable",
    "Session",
    "SessionLost",
    "SpawnFailure",
    "UntrustedCodeRefused",
    "WorkerLost",
    "build_image",
    "create_pool",
    "image_ref",
    "image_tag",
    "model_written",
    "replay",
    "run_calls",
]
