"""Every setting is declared once (issue 32): a params model's field (or a Config section's) holds its one default;
CLI options, Prefect forms, GrpoConfig, VerlJobSpec and the recipes derive from it.

`settings()` enumerates them. Each rule below finds a second declaration in the source, and each has a check that
it sees a planted one, like tests/test_layers.py."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from arenaforge.flows.sft_params import GraphParams, IngestParams
from arenaforge.flows.sft_params import SftParams as SftSynthParams
from arenaforge.schemas.config import Config
from arenaforge.tracks.envs.distractors import DistractorMix
from arenaforge.tracks.envs.pipeline import EnvsSpec
from arenaforge.tracks.train.grpo import GrpoConfig
from arenaforge.tracks.train.params import (
    RECIPE,
    EpisodeParams,
    EvalParams,
    GrpoParams,
    RolloutParams,
    SftParams,
    WarmstartParams,
    recipe,
)
from arenaforge.tracks.train.rollout.episodes import RolloutConfig
from arenaforge.tracks.train.run_grpo import GrpoRunConfig
from arenaforge.tracks.train.sft import SftConfig
from arenaforge.tracks.train.verl.job import VerlJobSpec

PACKAGE = Path(__file__).resolve().parents[1] / "arenaforge"
PARAMS_MODELS: list[type[BaseModel]] = [GrpoParams, SftParams, WarmstartParams, RolloutParams, EvalParams, EnvsSpec,
                                        SftSynthParams, IngestParams, GraphParams, Config]
# classes built from a params model (`from_params`, `rollout_config`, `mix`): they keep no default for a setting the
# model declares; a field's setting is named `<prefix><field>` (DistractorMix.high is EnvsSpec.distractors_high)
DERIVED: dict[type, tuple[type[BaseModel], str]] = {
    GrpoConfig: (GrpoParams, ""), GrpoRunConfig: (GrpoParams, ""), VerlJobSpec: (GrpoParams, ""),
    RolloutConfig: (EpisodeParams, ""), DistractorMix: (EnvsSpec, "distractors_"), SftConfig: (SftParams, "")}
COMMAND_MODULES = sorted((PACKAGE / "flows" / "commands").glob("*.py")) + [PACKAGE / "flows" / "cli.py"]
FLOW_MODULES = sorted((PACKAGE / "flows").glob("*_flows.py")) + [PACKAGE / "flows" / "deployments.py",
                                                                 PACKAGE / "flows" / "registry.py"]
JOB_MODULES = [PACKAGE / "tracks" / "train" / f"{name}.py" for name in  # the jobs: what turns params into work
               ("rollout_job", "evaluation", "grpo_job", "warmstart_jobs", "sft_job", "verl_handoff")]
PENDING: set[str] = set()
# Options named like a setting that are another setting
UNRELATED = {"train.py: build_tiny_model_cmd: --seed 0"}  # the tiny model's weight-initialisation seed


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def settings(model: type[BaseModel], at: str = "", default: BaseModel | None = None) -> dict[str, Any]:
    """{"GrpoParams.envs.split": "train", ...}: every field with its default; a nested model's fields with the
    default of the field that holds it (GrpoParams' `envs` is the train split)."""
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        value = getattr(default, name) if default is not None else field.get_default(call_default_factory=True)
        where = f"{at or model.__name__}.{name}"
        if _is_model(field.annotation):
            found.update(settings(field.annotation, where, value))
        else:
            found[where] = value
    return found


def all_settings() -> dict[str, Any]:
    return {k: v for model in PARAMS_MODELS for k, v in settings(model).items()}


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except ValueError:
        return False, None


def _defaults(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.AST]]:
    args = fn.args
    positional = args.posonlyargs + args.args
    return ([(a.arg, d) for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults)]
            + [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None])


def _functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _by_leaf(found: dict[str, Any]) -> dict[str, list[Any]]:
    leaves: dict[str, list[Any]] = {}
    for where, value in found.items():
        leaves.setdefault(where.rsplit(".", 1)[-1], []).append(value)
    return leaves


def restated_options(source: str, found: dict[str, Any]) -> list[str]:
    """`typer.Option(<literal>)` for a parameter named like a setting, with that setting's default (None, "not
    given", declares nothing)."""
    leaves = _by_leaf(found)
    bad = []
    for fn in _functions(source):
        for name, default in _defaults(fn):
            if not (isinstance(default, ast.Call) and ast.unparse(default.func) == "typer.Option" and default.args):
                continue
            ok, value = _literal(default.args[0])
            if ok and value not in (None, ...) and any(value == v for v in leaves.get(name, [])):
                bad.append(f"{fn.name}: --{name.replace('_', '-')} {value!r}")
    return bad


def redeclared_fields(derived: type, model: type[BaseModel], prefix: str = "") -> list[str]:
    """Fields of `derived` named like a setting of `model` (after `prefix`) that keep a default of their own."""
    names = set(_by_leaf(settings(model)))
    if dataclasses.is_dataclass(derived):
        own = {f.name: f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
               for f in dataclasses.fields(derived)}
    else:
        own = {n: not f.is_required() for n, f in derived.model_fields.items()}
    return [f"{derived.__name__}.{name}" for name, has_default in own.items()
            if has_default and prefix + name in names]


def job_keyword_defaults(source: str, found: dict[str, Any], module: str) -> list[str]:
    """A job function's keyword default for a parameter named like a setting (None, "not given", declares nothing)."""
    leaves = _by_leaf(found)
    bad = []
    for fn in _functions(source):
        for name, default in _defaults(fn):
            ok, value = _literal(default)
            if name in leaves and ok and value is not None:
                bad.append(f"{module}: {fn.name}({name}={value!r})")
    return bad


def flow_form_defaults(source: str) -> list[str]:
    """A flow or deployment parameter whose default builds its model with values (`GrpoParams(steps=3)`): the
    form's defaults are the model's own."""
    bad = []
    for fn in _functions(source):
        for name, default in _defaults(fn):
            if isinstance(default, ast.Call) and (default.args or default.keywords) and \
                    ast.unparse(default.func).endswith("Params"):
                bad.append(f"{fn.name}({name}={ast.unparse(default)})")
    return bad


# --------------------------------------------------------------------------- the project obeys the rules


def test_every_setting_has_one_default_here():
    found = all_settings()
    assert found["GrpoParams.lr"] == 5e-5 and found["GrpoParams.group_size"] == 8
    assert found["GrpoParams.envs.split"] == "train" and found["EvalParams.episode.temperature"] == 0.0
    assert found["GrpoParams.verl.ray_address"] is None and found["Config.model.backend"]
    assert len(found) > 150  # the walk reaches nested models and Config's sections


def test_no_option_restates_a_setting():
    found = all_settings()
    bad = {f"{p.name}: {b}" for p in COMMAND_MODULES for b in restated_options(p.read_text(), found)}
    assert bad - UNRELATED == set(), "\n".join(sorted(bad - UNRELATED))


@pytest.mark.parametrize("derived", list(DERIVED), ids=lambda c: c.__name__)
def test_derived_configs_keep_no_default_of_a_setting(derived):
    assert redeclared_fields(derived, *DERIVED[derived]) == []


def test_derived_configs_take_the_params_values():
    params = GrpoParams(lr=3e-4, group_size=4, micro_batch_size=2, verl={"nnodes": 2}, episode={"max_turns": 6})
    grpo = GrpoConfig.from_params(params)
    assert (grpo.lr, grpo.micro_batch_size, grpo.skip_forced_tokens) == (3e-4, 2, True)
    run = GrpoRunConfig.from_params(params, out_dir="o")
    assert (run.group_size, run.checkpoint_every, run.rollout.max_turns, run.trainer) == (4, 5, 6, params)
    spec = VerlJobSpec.from_params(params, model_path="m", out_dir="o")
    assert (spec.lr, spec.group_size, spec.nnodes, spec.max_turns, spec.save_freq) == (3e-4, 4, 2, 6, 5)
    rollout = EpisodeParams(max_turns=3, top_p=0.5, ground_arguments=False).rollout_config(seed=7)
    assert (rollout.max_turns, rollout.top_p, rollout.ground_arguments, rollout.seed) == (3, 0.5, False, 7)
    assert EnvsSpec(distractors_medium=4).mix() == DistractorMix(high=1, medium=4, low=1)
    sft = SftConfig.from_params(SftParams(lr=3e-4, lora_rank=2), out_dir="o")
    assert (sft.lr, sft.lora_rank, sft.epochs, sft.out_dir) == (3e-4, 2, 1, "o")


def test_job_functions_keep_no_default_of_a_setting():
    found = {k: v for k, v in all_settings().items() if not k.startswith("Config.")}
    bad = {b for p in JOB_MODULES for b in job_keyword_defaults(p.read_text(), found, p.name)}
    assert bad - PENDING == set(), "\n".join(sorted(bad - PENDING))


def test_flow_forms_take_the_models_defaults():
    bad = [f"{p.name}: {b}" for p in FLOW_MODULES for b in flow_form_defaults(p.read_text())]
    assert not bad, "\n".join(bad)


def test_options_show_the_models_defaults():
    """Every command built with ParamsOptions offers each field it exposes with that field's default."""
    import importlib

    from arenaforge.flows.options import ParamsOptions

    seen = 0
    for path in COMMAND_MODULES:
        module = importlib.import_module(f"arenaforge.flows.{'commands.' if path.parent.name == 'commands' else ''}"
                                         f"{path.stem}")
        for options in (v for v in vars(module).values() if isinstance(v, ParamsOptions)):
            found = settings(options.model)
            for option in options.options:
                where = ".".join((options.model.__name__, *option.path))
                assert option.default is ... or option.default == found[where], where
                seen += 1
    assert seen > 100


def test_the_recipe_overrides_known_settings():
    assert GrpoParams(**RECIPE).lr == RECIPE["lr"]
    with pytest.raises(ValueError, match="extra"):
        recipe(learning_rate=1e-4)  # a typo, or a field since removed
    with pytest.raises(ValueError, match="restate"):
        recipe(steps=48, group_size=8)  # the default again: a second declaration


# --------------------------------------------------------------------------- each rule sees a planted violation


def test_the_option_rule_sees_a_restated_default():
    source = ("def grpo(lr: float = typer.Option(5e-5, help='x'), out: str = typer.Option(None, help='y'),\n"
              "         layers: int = typer.Option(2, help='z')) -> None: ...\n")
    assert restated_options(source, {"GrpoParams.lr": 5e-5, "GrpoParams.out_dir": None}) == ["grpo: --lr 5e-05"]


def test_the_derived_rule_sees_a_field_with_its_own_default():
    @dataclasses.dataclass(frozen=True)
    class Planted:
        lr: float = 2e-6
        eps_low: float = 0.2

    assert redeclared_fields(Planted, GrpoParams) == ["Planted.lr"]

    @dataclasses.dataclass(frozen=True)
    class PlantedMix:
        high: int
        low: int = 1

    assert redeclared_fields(PlantedMix, EnvsSpec, "distractors_") == ["PlantedMix.low"]


def test_the_job_rule_sees_a_keyword_default():
    source = "async def grpo_job(params, seed: int = 0, eval_rollouts=None, *, lr: float = 2e-6) -> None: ...\n"
    assert job_keyword_defaults(source, {"GrpoParams.seed": 0, "GrpoParams.lr": 5e-5}, "jobs.py") == [
        "jobs.py: grpo_job(seed=0)", "jobs.py: grpo_job(lr=2e-06)"]


def test_the_flow_rule_sees_a_form_default():
    source = ("async def train_grpo(params: GrpoParams = GrpoParams(steps=3)) -> None: ...\n"
              "async def rollout(params: RolloutParams = RolloutParams()) -> None: ...\n")
    assert flow_form_defaults(source) == ["train_grpo(params=GrpoParams(steps=3))"]
