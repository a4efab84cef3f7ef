"""What the sandbox runtime raises, by whose fault it is.

    SandboxError                    (arenaforge.schemas.errors) the runtime itself failed or was misused
    ├── EnvLoadError                the environment's code does not load: the environment is broken
    │   └── RequirementUnavailable  no wheel for a requirement it declares, in the wheel dir or a reachable registry
    └── EnvironmentFailure          the sandbox, not the tool nor the agent, failed this request:
        ├── Overloaded              no answer in time because the machine was busy (the worker lives on)
        ├── WorkerLost              the worker died with the request in flight
        ├── SessionLost             the session's state was lost between calls (its next call is not run)
        └── IsolationFailure        a session could not be confined as configured
    UntrustedCodeRefused            (a ConfigError) model-written code on the process backend, not opted in

An `EnvironmentFailure` is never the agent's doing: rollouts end such an episode as `env_failure`,
which training and evaluation leave out of their averages and count. After one, the session
starts again from its environment's initial state at its next call.
"""

from __future__ import annotations

from arenaforge.schemas.errors import ConfigError, FailureKind, SandboxError


class EnvLoadError(SandboxError):
    """An environment's tool code could not be loaded (syntax error, import failure, missing class, too slow)."""

    kind = FailureKind.QUALITY  # the environment's own code, not the sandbox

    def __init__(self, env_name: str, detail: str) -> None:
        super().__init__(f"environment {env_name!r}: tool code failed to load:\n{detail}")
        self.detail = detail


class RequirementUnavailable(EnvLoadError):
    """A requirement the environment declares has no installable wheel here (`requirement` names it)."""

    def __init__(self, env_name: str, requirement: str, detail: str) -> None:
        SandboxError.__init__(self, f"environment {env_name!r}: requirement {requirement} is unavailable: {detail}")
        self.detail = f"requirement {requirement} is unavailable: {detail}"
        self.requirement = requirement


class EnvironmentFailure(SandboxError):
    """The sandbox failed a request (`kind` infrastructure); `failure` says how."""

    failure = "sandbox"

    def __init__(self, detail: str) -> None:
        super().__init__(f"sandbox failure ({self.failure}): {detail}")
        self.detail = detail


class Overloaded(EnvironmentFailure):
    failure = "overloaded"


class WorkerLost(EnvironmentFailure):
    failure = "worker_lost"


class SessionLost(EnvironmentFailure):
    failure = "state_lost"


class IsolationFailure(EnvironmentFailure):
    failure = "isolation"


class SpawnFailure(EnvironmentFailure):
    failure = "spawn"


# the worker's `failure` codes (worker/protocol.py FAILURES) -> what the pool raises
FAILURES: dict[str, type[EnvironmentFailure]] = {
    "overloaded": Overloaded,
    "state_lost": SessionLost,
    "isolation": IsolationFailure,
    "spawn": SpawnFailure,
}


class UntrustedCodeRefused(ConfigError):
    """Model-written tool code asked of the process backend without `sandbox.process_allows_model_code`."""
