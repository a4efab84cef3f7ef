"""Environment synthesis (ASTRA §1b.3): one verified, executable tool per tool-needing sub-question.

For every QA instance its tools are built (`build_tools.ToolBuilder`), assembled into an `Environment`
(`tool_impl.assemble`) and verified in the sandbox (`check_env.check_environment`), many environments at
once on one pool. A failing tool is rebuilt with the failure as feedback at most `max_attempts` times
(only the tools that failed); then the QA becomes a rejected row with the reasons. Provider and sandbox
failures are environment failures, never the QA's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from arenaforge.schemas.errors import FailureKind, ParseError, ProviderError, SandboxError
from arenaforge.schemas.models import QAInstance, Rejection
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.check_env import check_environment
from arenaforge.tracks.envs.tool_impl import BuildError, EnvDraft, ToolImpl, merge_same_name


@dataclass
class SynthResult:
    drafts: list[EnvDraft]
    rejections: list[Rejection]


async def synthesize_environments(builder: ToolBuilder, pool: Any, instances: list[QAInstance], max_attempts: int = 2,
                                  run_id: str | None = None, concurrency: int = 256) -> SynthResult:
    """Build and sandbox-verify one environment per QA, regenerating failing tools at most `max_attempts` times."""
    sem = asyncio.Semaphore(concurrency)

    async def one(qa: QAInstance) -> EnvDraft | Rejection:
        async with sem:
            return await synthesize_one(builder, pool, qa, max_attempts, run_id)

    results = await asyncio.gather(*(one(qa) for qa in instances))
    return SynthResult([r for r in results if isinstance(r, EnvDraft)], [r for r in results if isinstance(r, Rejection)])


async def synthesize_one(builder: ToolBuilder, pool: Any, qa: QAInstance, max_attempts: int,
                          run_id: str | None) -> EnvDraft | Rejection:
    subs = [s for s in qa.sub_qas if s.needs_tool]
    built: dict[int, ToolImpl] = {}
    feedback: dict[int, str] = {}
    history: list[str] = []
    last_reason = "sandbox_verification_failed"

    def reject(reason: str, detail: str, kind: FailureKind = FailureKind.QUALITY) -> Rejection:
        return Rejection(stage="synthesize_env", subject=qa.id, reason=reason, detail=detail[:2000], parents=[qa.id],
                         run_id=run_id, kind=kind, payload={"attempts": history[-6:]})

    for attempt in range(max_attempts + 1):
        todo = [sub for sub in subs if sub.index not in built]
        outcomes = await asyncio.gather(*(builder.build(qa, sub, attempt, feedback.get(sub.index, "")) for sub in todo),
                                        return_exceptions=True)
        for sub, got in zip(todo, outcomes, strict=True):  # the sub-QAs' tools are built concurrently
            if isinstance(got, ToolImpl):
                built[sub.index] = got
            elif isinstance(got, BuildError):
                history.append(f"attempt {attempt} sub-QA {sub.index}: {got}")
                feedback[sub.index] = str(got)
                last_reason = got.reason
            elif isinstance(got, ParseError):
                history.append(f"attempt {attempt} sub-QA {sub.index}: invalid_model_output: {got}")
                feedback[sub.index] = f"the answer was not valid JSON for the schema: {got}"
                last_reason = "invalid_model_output"
            elif isinstance(got, ProviderError):
                return reject("provider_error", str(got), got.kind)
            else:
                raise got
        if len(built) < len(subs):
            continue
        try:
            tools = merge_same_name([built[s.index] for s in subs])
        except BuildError as err:
            history.append(f"attempt {attempt}: {err}")
            last_reason = err.reason
            built.clear()
            continue
        draft = EnvDraft(qa, tools, attempt)
        env = draft.environment()
        try:
            result = await check_environment(pool, env, {t.name: t.probes for t in tools})
        except SandboxError as err:
            return reject("sandbox_failure", str(err), err.kind)
        if result.ok:
            return draft
        history.append(f"attempt {attempt}: " + "; ".join(result.details)[:600])
        last_reason = result.details[0].split(":")[0] if result.details else "sandbox_verification_failed"
        for sub in subs:  # regenerate only the tools that failed
            if built[sub.index].name in result.failing_tools or not result.checks.get("imports", True):
                feedback[sub.index] = "; ".join(result.details)[:600]
                built.pop(sub.index)
    return reject(last_reason, " | ".join(history),
                  FailureKind.INVALID_OUTPUT if last_reason == "invalid_model_output" else FailureKind.QUALITY)
