"""What `arenaforge serve` deploys, and how a deployment run is started from the CLI.

One deployment per `arenaforge.flows.registry.FLOWS` entry, named after the entry (`ingest`, `train-sft`,
...), on the process work pool, with:
  - the flow's typed parameters (one pydantic model per flow -> the UI's run form, with
    defaults, descriptions and server-side validation: `enforce_parameter_schema=True`);
  - schedules from `prefect.schedules` in arenaforge.toml (cron or interval, optional
    timezone/parameters/active); pause and resume them in the UI's deployment page;
  - the flow named by module path (`arenaforge.flows.sft_flows.ingest`): the installed package is
    the code, whether a checkout or a wheel; nothing is pushed or pulled;
  - the deployment's working directory = the user's project directory, so relative paths in
    parameters (and the default `./out`) resolve there, never in the install directory.
Requires the caller to have pointed PREFECT_API_URL at the server (see `arenaforge.flows.serve.Stack`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ConfigError, InputError, first_error

SYNTHESIS_FLOWS = ("ingest", "graph", "sft", "envs")  # the ones worth a schedule
_DEPLOYMENT_TAGS = {
    "ingest": ["synthesis"], "graph": ["synthesis"], "sft": ["synthesis"], "envs": ["synthesis"],
    "rollout": ["training"], "train-grpo": ["training"], "train-sft": ["training"], "warmstart": ["training"],
    "eval": ["evaluation"],
}


def registered_flows(flows: Mapping[str, str] | None = None) -> dict[str, str]:
    from arenaforge.flows.registry import FLOWS

    return dict(FLOWS if flows is None else flows)


def load_flow_from(ref: str) -> Any:
    import importlib

    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def params_model(flow: Any) -> tuple[str, type[BaseModel]] | None:
    """(parameter name, pydantic model) when the flow takes exactly one model parameter."""
    sig = inspect.signature(flow.fn)
    params = list(sig.parameters.values())
    if len(params) != 1:
        return None
    ann = params[0].annotation
    if isinstance(ann, str):  # `from __future__ import annotations`
        ann = flow.fn.__globals__.get(ann, ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return params[0].name, ann
    return None


def build_schedules(name: str, spec: Mapping[str, Any]) -> list[Any]:
    """prefect.schedules entries from one `[prefect.schedules.<name>]` table."""
    from prefect.schedules import Cron, Interval

    allowed = {"cron", "interval_s", "timezone", "parameters", "active"}
    unknown = set(spec) - allowed
    if unknown:
        raise ConfigError(f"prefect.schedules.{name}: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)})")
    if ("cron" in spec) == ("interval_s" in spec):
        raise ConfigError(f"prefect.schedules.{name}: give exactly one of cron = '...' or interval_s = N")
    common: dict[str, Any] = {"active": bool(spec.get("active", True)), "parameters": dict(spec.get("parameters", {}))}
    if spec.get("timezone"):
        common["timezone"] = spec["timezone"]
    if "cron" in spec:
        try:
            return [Cron(str(spec["cron"]), **common)]
        except ValueError as err:
            raise ConfigError(f"prefect.schedules.{name}.cron: {err}") from None
    interval = float(spec["interval_s"])
    if interval <= 0:
        raise ConfigError(f"prefect.schedules.{name}.interval_s must be > 0")
    return [Interval(interval, **common)]


def check_schedule_parameters(name: str, flow: Any, parameters: Mapping[str, Any]) -> None:
    """A one-line ConfigError unless a schedule's `parameters` are `{params: {...}}` with fields the flow's parameter
    model has and values it accepts (a misspelt field would otherwise be ignored, run after run)."""
    found = params_model(flow)
    if found is None:
        return
    pname, model = found
    where = f"prefect.schedules.{name}.parameters"
    given = parameters.get(pname)
    if set(parameters) != {pname} or not isinstance(given, Mapping):
        raise ConfigError(f"{where}: expected {{ {pname} = {{ ... }} }} (the fields of the run form), "
                          f"got {dict(parameters)}")
    unknown = sorted(set(given) - set(model.model_fields))
    if unknown:
        raise ConfigError(f"{where}: {pname} has no field {', '.join(map(repr, unknown))} "
                          f"(fields: {', '.join(model.model_fields)})")
    try:
        model.model_validate(given)
    except ValidationError as err:
        raise ConfigError(f"{where}: {pname}.{first_error(err)}") from None


def build_deployment(name: str, ref: str, cfg: Config, env: Mapping[str, str] | None = None,
                     working_dir: Path | None = None) -> Any:
    """A RunnerDeployment for one registry entry (not yet applied)."""
    from prefect.deployments.runner import EntrypointType, RunnerDeployment

    from arenaforge.flows.serve import project_root

    workdir = str(working_dir or project_root(cfg))
    flow = load_flow_from(ref)
    spec = cfg.prefect.schedules.get(name)
    schedules = build_schedules(name, spec) if spec else None
    if spec and spec.get("parameters"):
        check_schedule_parameters(name, flow, spec["parameters"])
    # The schedule's parameters are also the deployment's defaults: prefect 3.8.8's server resets a
    # schedule's own parameters to {} when its active toggle is flipped (UI pause/resume), and
    # runs scheduled after a resume would otherwise lose them.
    defaults = dict(spec.get("parameters") or {}) if spec else None
    module = ref.split(":")[0]
    deployment = RunnerDeployment.from_flow(
        flow,
        name=name,
        schedules=schedules,
        parameters=defaults,
        tags=["arenaforge", *_DEPLOYMENT_TAGS.get(name, [])],
        description=(inspect.getdoc(flow.fn) or flow.description or f"arenaforge {name}").split("\n\n")[0],
        work_pool_name=cfg.prefect.work_pool,
        job_variables={"env": dict(env or {}), "working_dir": workdir},
        enforce_parameter_schema=True,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    deployment.entrypoint = f"{module}.{flow.fn.__name__}"
    deployment._path = workdir
    return deployment


def apply_deployments(
    cfg: Config, flows: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
    working_dir: Path | None = None,
) -> dict[str, str]:
    """Create or update every deployment; {name: "flow-name/deployment-name"}."""
    flows = registered_flows(flows)
    unknown = set(cfg.prefect.schedules) - set(flows)
    if unknown:
        raise ConfigError(f"prefect.schedules names unknown deployments {sorted(unknown)}; known: {sorted(flows)}")
    out = {}
    for name, ref in sorted(flows.items()):
        deployment = build_deployment(name, ref, cfg, env, working_dir)
        deployment.apply()
        out[name] = f"{deployment.flow_name}/{name}"
    return out


def ensure_work_pool(name: str) -> None:
    """Create the process work pool if it does not exist."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(
                WorkPoolCreate(
                    name=name,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                    description="arenaforge flows, run as local processes",
                )
            )
        except ObjectAlreadyExists:
            pass


def ensure_concurrency_limits(limits: Mapping[str, int]) -> None:
    """Global limits `name` (for `with limit(...)`) and tag limits (for task tags), upserted."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name, slots in limits.items():
            client.upsert_global_concurrency_limit_by_name(name, slots)
            client.create_concurrency_limit(tag=name, concurrency_limit=slots)


# ---------------------------------------------------------------------- starting runs
def parse_params(pairs: list[str]) -> dict[str, Any]:
    """`k=v` pairs -> dict; values parse as JSON when they can (numbers, bools, lists), else str.

    Dotted keys nest: `model.temperature=0.2` -> {"model": {"temperature": 0.2}}.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--param {pair!r}: expected key=value")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def flow_parameters(flow: Any, given: dict[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate CLI parameters against the flow's pydantic model; the run's parameters dict.

    For a flow `f(params: Model)`, `--param steps=3` means `params.steps = 3`; the whole
    model (defaults filled) is sent so the run's parameters are explicit.
    """
    found = params_model(flow)
    if found is None:
        return given
    pname, model = found
    inner = given.get(pname) if set(given) == {pname} and isinstance(given[pname], dict) else given
    base = dict((defaults or {}).get(pname) or {})
    try:
        value = model.model_validate({**base, **inner})
    except ValidationError as err:
        raise InputError(f"{flow.name}: invalid parameter {first_error(err)}") from None
    return {pname: value.model_dump(mode="json")}


def start_run(
    api_url: str,
    name: str,
    params: dict[str, Any],
    flows: Mapping[str, str] | None = None,
    wait_s: float | None = 0,
) -> Any:
    """Create a flow run of deployment `name` (a FLOWS key or "flow/deployment"); the FlowRun.

    `wait_s=0` returns at once; `None` waits for the run to finish.
    """
    from arenaforge.flows.serve import require_api

    require_api(api_url)
    flows = registered_flows(flows)
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if name in flows:
        flow = load_flow_from(flows[name])
        params = flow_parameters(flow, params)
        full_name = f"{flow.name}/{name}"
    elif "/" in name:
        full_name = name
    else:
        raise InputError(f"unknown deployment {name!r}; known: {', '.join(sorted(flows)) or '(none registered)'}")
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        try:
            return run_deployment(full_name, parameters=params, timeout=wait_s, as_subflow=False, poll_interval=1)
        except Exception as err:  # prefect raises its own types for 404/409/422: one line for the user
            from prefect.exceptions import ObjectNotFound

            if isinstance(err, ObjectNotFound):
                raise InputError(f"deployment {full_name!r} is not registered; run `arenaforge serve` first") from None
            if "422" in str(err) or "409" in str(err):
                raise InputError(f"{full_name}: parameters rejected by the server: {str(err).splitlines()[0]}") from None
            raise
