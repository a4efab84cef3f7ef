"""What the agent sees (issue 20): tool code compiled with its own future flags, and observations rendered
the way agent harnesses render them, per environment."""

from __future__ import annotations

import json

from arenaforge.environments.runtime import run_calls
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.environments.conftest import PoolHandle

ANNOTATED = '''
from dataclasses import dataclass, fields

@dataclass
class Order:
    order_id: str
    total: float

class Typed:
    """A typed-toolkit base: it reads its subclasses' annotations when the class is created."""
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.kinds = {name: kind.__name__ for name, kind in cls.__annotations__.items()}

class Item(Typed):
    qty: int
    price: float

def kinds():
    return {"order": [f.type.__name__ for f in fields(Order)], "item": Item.kinds,
            "real_types": all(isinstance(f.type, type) for f in fields(Order))}
'''

RESULTS = '''
import dataclasses

@dataclasses.dataclass
class Point:
    x: int
    y: float

def text():
    return "plain text"

def number():
    return 112.5

def flag():
    return True

def record():
    return {"status": "pending", "total": 12.5, "tags": ("a", "b")}

def point():
    return Point(1, 2.5)

def nothing():
    return None

def fails(order_id: str):
    raise ValueError(f"Order {order_id} not found")

def fails_empty():
    raise KeyError
'''
CALLS = [("text", {}), ("number", {}), ("flag", {}), ("record", {}), ("point", {}), ("nothing", {}),
         ("fails", {"order_id": "W9"}), ("fails_empty", {})]


def _env(code: str, names: list[str]) -> Environment:
    return Environment(name="render", tools=[FunctionDoc(name=n) for n in names], code=code)


def _texts(h: PoolHandle, code: str) -> list[str]:
    obs = h.run(run_calls(h.pool, _env(code, [c for c, _ in CALLS]), CALLS))
    return [o.text() for o in obs]


def test_class_creation_time_annotations_are_real_types(sandbox: PoolHandle) -> None:
    plain = sandbox.run(run_calls(sandbox.pool, _env(ANNOTATED, ["kinds"]), [("kinds", {})]))[0]
    assert json.loads(plain.output) == {"order": ["str", "float"], "item": {"qty": "int", "price": "float"}, "real_types": True}
    # code that asks for postponed annotations gets them: its own future flags, never the worker's
    postponed = "from __future__ import annotations\n" + ANNOTATED.replace("kind.__name__", "kind").replace(
        "f.type.__name__", "f.type")
    own = sandbox.run(run_calls(sandbox.pool, _env(postponed, ["kinds"]), [("kinds", {})]))[0]
    assert json.loads(own.output) == {"order": ["str", "float"], "item": {"qty": "int", "price": "float"}, "real_types": False}


def test_default_rendering_is_the_harness_convention(sandbox: PoolHandle) -> None:
    assert _texts(sandbox, RESULTS) == [
        "plain text", "112.5", "true", '{"status": "pending", "total": 12.5, "tags": ["a", "b"]}', '{"x": 1, "y": 2.5}',
        "(no output)", "Error: Order W9 not found", "Error: KeyError",
    ]


def test_tau2_rendering_is_selected_by_the_environment(sandbox: PoolHandle) -> None:
    texts = _texts(sandbox, 'OBSERVATION_STYLE = "tau2"\n' + RESULTS)
    assert texts[:6] == ["plain text", '"112.5"', '"True"', '{"status": "pending", "total": "12.5", "tags": ["a", "b"]}',
                         '"Point(x=1, y=2.5)"', "null"]
    assert texts[6] == "Error: Order W9 not found"


def test_traceback_rendering_and_custom_renderers(sandbox: PoolHandle) -> None:
    traced = _texts(sandbox, 'OBSERVATION_STYLE = "traceback"\n' + RESULTS)
    assert traced[6].startswith("Error: Traceback (most recent call last):") and "ValueError: Order W9 not found" in traced[6]
    custom = _texts(sandbox, RESULTS + '\ndef render_result(value):\n    return f"<{value!r}>"\n'
                    'def render_error(err):\n    return f"{type(err).__name__} ({err})"\n')
    assert custom[1] == "<112.5>" and custom[6] == "Error: ValueError (Order W9 not found)"
