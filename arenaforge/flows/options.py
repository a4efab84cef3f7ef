"""CLI options derived from a params model: one typer option per field, and the model's fields back from them.

A params model (pydantic) is where a setting is declared: its type, its one default and its help text (the field's
description, also the Prefect form's). A command lists only what is special about its flags (another name, a short
form, a field it does not expose, one it requires), the way `flows/commands/bench.py` derives a benchmark's options
from its signature. Fields of nested models (`envs: EnvSelection`, `episode: EpisodeParams`, `verl: VerlParams`)
become flat options named after the leaf field (`--max-turns`), or after `prefixes` (`--verl-nnodes`); their
defaults are those of the parent field's default (GrpoParams' `envs` defaults to the train split).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from arenaforge.flows.context import flag_errors
from arenaforge.schemas.errors import InputError

Path = tuple[str, ...]  # a field's place in the params model: ("envs", "limit")


@dataclass(frozen=True)
class Option:
    path: Path
    name: str  # the command function's parameter name
    decls: tuple[str, ...]  # the flag and its short forms
    annotation: Any
    default: Any
    help: str


@dataclass(frozen=True)
class Grouped:
    """One flag for the int fields `<prefix><part>`, one per part: 'a,b,c' in the parts' order, or 'part=n,...'
    (a part not named keeps its field's default); e.g. `--distractors 1,2,0` for distractors_high/medium/low."""

    prefix: str
    parts: tuple[str, ...]
    help: str


def _cli_type(annotation: Any) -> Any:
    """The type typer parses: a `Literal` is read as text (the params model checks it, so a wrong value fails with
    the model's message); `X | None` stays optional; lists keep their item type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return type(args[0])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _cli_type(inner[0]) | None if len(inner) == 1 else str
    if origin is list:
        return list[_cli_type(args[0])]  # type: ignore[misc]
    return annotation


def _nested(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _paths(model: type[BaseModel], at: Path = ()) -> Iterable[Path]:
    for name, field in model.model_fields.items():
        yield (*at, name)
        if _nested(field.annotation):
            yield from _paths(field.annotation, (*at, name))


def _default(model: type[BaseModel], name: str, parent: BaseModel | None) -> Any:
    if parent is not None:
        return getattr(parent, name)
    field = model.model_fields[name]
    value = field.get_default(call_default_factory=True)
    return ... if value is PydanticUndefined else value


class ParamsOptions:
    """The options of one command that builds `model` from its flags.

    flags: field path ("envs.limit") -> its flag and short forms (`"--env-limit"` or `("--source", "-s")`);
    prefixes: nested field -> the prefix of its fields' flags (`{"verl": "verl-"}`);
    exclude: field paths the command does not expose (they come from elsewhere: its context, another option);
    required: field paths the command requires;
    grouped: option name -> `Grouped` top-level int fields it sets in one flag."""

    def __init__(self, model: type[BaseModel], *, flags: Mapping[str, str | tuple[str, ...]] | None = None,
                 prefixes: Mapping[str, str] | None = None, exclude: Iterable[str] = (),
                 required: Iterable[str] = (), grouped: Mapping[str, Grouped] | None = None) -> None:
        self.model = model
        self.grouped = dict(grouped or {})
        flags = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in (flags or {}).items()}
        exclude = set(exclude) | {g.prefix + part for g in self.grouped.values() for part in g.parts}
        required = set(required)
        self.options = list(self._options(model, (), None, flags, dict(prefixes or {}), exclude, required))
        names = [o.name for o in self.options]
        clash = {n for n in names if names.count(n) > 1}
        if clash:
            raise TypeError(f"{model.__name__}: several fields would be the option {sorted(clash)}; rename them")
        unknown = (set(flags) | exclude | required) - {".".join(p) for p in _paths(model)}
        if unknown:
            raise TypeError(f"{model.__name__} has no field {sorted(unknown)}")

    def _options(self, model: type[BaseModel], at: Path, parent: BaseModel | None,
                 flags: dict[str, tuple[str, ...]], prefixes: dict[str, str], exclude: set[str],
                 required: set[str]) -> Iterable[Option]:
        prefix = prefixes.get(".".join(at), "")
        for name, field in model.model_fields.items():
            path = (*at, name)
            dotted = ".".join(path)
            if dotted in exclude:
                continue
            if _nested(field.annotation):
                yield from self._options(field.annotation, path, _default(model, name, parent), flags, prefixes,
                                         exclude, required)
                continue
            if not field.description:
                raise TypeError(f"{model.__name__}.{name}: no description (it is the option's help text)")
            # no flag given: typer names it after the parameter (`--roc/--no-roc` for a bool)
            decls = flags.get(dotted, ())
            long = next((d for d in decls if d.startswith("--")), "--" + prefix + name).split("/")[0]
            yield Option(path, long[2:].replace("-", "_"), decls, _cli_type(field.annotation),
                         ... if dotted in required else _default(model, name, parent),
                         field.description.replace("[", "\\["))  # rich markup would eat `[lora]`

    def _grouped_default(self, name: str) -> str:
        group = self.grouped[name]
        return ",".join(str(_default(self.model, group.prefix + part, None)) for part in group.parts)

    def _grouped_fields(self, name: str, text: str) -> dict[str, int]:
        """`text` of the grouped option `name` as its fields' values; one line naming the flag when it is neither
        form or names another part."""
        group = self.grouped[name]
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            if all("=" not in item for item in items) and len(items) == len(group.parts):
                values = dict(zip(group.parts, (int(item) for item in items)))
            else:
                values = {**{p: _default(self.model, group.prefix + p, None) for p in group.parts},
                          **{k.strip(): int(v) for k, v in (item.split("=", 1) for item in items)}}
        except ValueError:
            values = {}
        if set(values) != set(group.parts):
            raise InputError(f"--{name.replace('_', '-')} {text!r}: use {','.join(group.parts)} counts like "
                             f"{self._grouped_default(name)}")
        return {group.prefix + part: n for part, n in values.items()}

    @property
    def flags(self) -> dict[str, str]:
        """Field name -> flag, where the two differ (for `flag_errors`)."""
        return {o.path[-1]: "--" + o.name.replace("_", "-") for o in self.options if o.name != o.path[-1]}

    def command(self, name: str, context: Callable[..., Mapping[str, Any]],
                into: type[BaseModel] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """`fn(ctx, ..., params)` as the typer command `name`: its own parameters, plus one option per field. The
        params model (or `into`) is built here, from what the options gave plus `context(ctx, ..., fields=...)`
        (what comes from elsewhere: the global --config and --db, another option; it may also adjust `fields`,
        nested as the model's fields are), so a setting goes from its flag to the command in one step."""
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            return self._command(fn, name, context, into)

        return decorate

    def _command(self, fn: Callable[..., Any], command_name: str, context: Callable[..., Mapping[str, Any]],
                 into: type[BaseModel] | None) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "params"]
        hints = typing.get_type_hints(fn)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in own]
        own_names = {p.name for p in own}
        by_name = {o.name: o for o in self.options}

        def command(**kwargs: Any) -> Any:
            fields: dict[str, Any] = {}
            for name, value in kwargs.items():
                if name in by_name:
                    *at, leaf = by_name[name].path
                    node = fields
                    for key in at:
                        node = node.setdefault(key, {})
                    node[leaf] = list(value) if isinstance(value, tuple) else value
                elif name in self.grouped:
                    fields.update(self._grouped_fields(name, value))
            given = {k: v for k, v in kwargs.items() if k in own_names}
            rest = context(**given, fields=fields)
            return fn(**given, params=self.build(command_name, fields, into, **rest))

        derived = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation,
                                     default=typer.Option(o.default, *o.decls, help=o.help))
                   for o in self.options]
        derived += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str,
                                      default=typer.Option(self._grouped_default(name), help=group.help))
                    for name, group in self.grouped.items()]
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        command.__signature__ = inspect.Signature(own + derived)  # type: ignore[attr-defined]
        command.__name__, command.__doc__ = fn.__name__, fn.__doc__
        return command

    def build(self, command: str, fields: Mapping[str, Any], into: type[BaseModel] | None = None, **rest: Any) -> Any:
        """The params model (or `into`, a model with its fields and more) from a command's `fields` plus `rest` (what
        comes from elsewhere); a value a flag gave out of range is one line naming the flag."""
        nested = dict(fields)
        for name, field in self.model.model_fields.items():  # a nested model's fields not exposed: the parent's default
            if name in nested and _nested(field.annotation):
                nested[name] = {**_default(self.model, name, None).model_dump(), **nested[name]}
        with flag_errors(command, self.flags):
            return (into or self.model)(**nested, **rest)
