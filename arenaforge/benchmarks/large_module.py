"""A BFCL-size tool module, generated: one stateful class whose source is about 240 KB.

BFCL multi-turn's API classes (file system, trading, travel, ...) are tens of kilobytes each and an
environment combines several, so a session loads a quarter megabyte of tool code. What makes that
slow is the code's size, not its state: `large_module_environment(target_bytes)` writes a class
`Suite` with as many documented methods over a small dict state as it takes to reach the target,
deterministically, plus a module-level `DEFAULT_STATE` the way BFCL's classes declare theirs.
`large_module_calls(n)` gives `n` gold calls (reads and writes) for replay tests and benchmarks.
"""

from __future__ import annotations

from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall

HEADER = '''\
"""A generated suite of stateful tools (BFCL-size)."""
import copy
import json

DEFAULT_STATE = {"counters": {}, "notes": [], "directory": {"root": {}}}


class Suite:
    """Counters, notes and a directory tree; every public method is a tool."""

    def __init__(self):
        self.state = copy.deepcopy(DEFAULT_STATE)

    def _load_scenario(self, scenario, long_context=False):
        self.state = copy.deepcopy(scenario)
        self.long_context = long_context

    def read_counter(self, name: str) -> int:
        """Read one counter (0 when it was never set)."""
        return self.state["counters"].get(name, 0)
'''

METHOD = '''
    def op_{i}(self, name: str, amount: int = 1) -> dict:
        """Operation {i}: add `amount` times {k} to the counter `name` and log a note.

        Args:
            name (str): The counter to change. Counters that do not exist start at zero; names are
                case-sensitive and may contain any character, including spaces and punctuation.
            amount (int): How many steps to add (default 1). Negative amounts subtract; zero only logs.

        Returns:
            result (dict): The counter's new value under "value", the operation under "op", and the
                number of notes logged so far under "notes".
        """
        if not isinstance(amount, int):
            raise TypeError("amount must be an integer")
        counters = self.state["counters"]
        value = counters.get(name, 0) + amount * {k}
        counters[name] = value
        self.state["notes"].append({{"op": {i}, "name": name, "amount": amount}})
        if len(self.state["notes"]) > 1000:
            del self.state["notes"][:500]
        folder = self.state["directory"].setdefault("root", {{}})
        folder[name] = value
        return {{"value": value, "op": {i}, "notes": len(self.state["notes"])}}
'''


def large_module_code(target_bytes: int = 240_000) -> tuple[str, int]:
    """The module's source (at least `target_bytes` long) and how many `op_i` methods it has."""
    parts, size, i = [HEADER], len(HEADER), 0
    while size < target_bytes:
        method = METHOD.format(i=i, k=i % 7 + 1)
        parts.append(method)
        size += len(method)
        i += 1
    return "".join(parts), i


def large_module_environment(target_bytes: int = 240_000, exposed: int = 20) -> Environment:
    """A class-style environment over the generated module; the agent sees `read_counter` and `exposed` ops."""
    code, count = large_module_code(target_bytes)
    ops = [f"op_{i}" for i in range(min(exposed, count))]
    tools = [FunctionDoc(name="read_counter", description="Read one counter.",
                         parameters={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})]
    tools += [FunctionDoc(name=op, description=f"Operation {op}.",
                          parameters={"type": "object", "properties": {"name": {"type": "string"}, "amount": {"type": "integer"}},
                                      "required": ["name"]}) for op in ops]
    state = {"counters": {f"c{i}": i for i in range(200)}, "notes": [], "directory": {"root": {}}}
    return Environment(name="bench-large-module", tools=tools, code=code, style="class", class_name="Suite",
                       initial_state=state, calls=large_module_calls(8, exposed))


def large_module_calls(n: int, exposed: int = 20) -> list[GoldCall]:
    """`n` gold calls alternating a write and a read of the same counter."""
    calls = []
    for j in range(n):
        if j % 2 == 0:
            calls.append(GoldCall(tool=f"op_{j % exposed}", arguments={"name": f"c{j}", "amount": 2}))
        else:
            calls.append(GoldCall(tool="read_counter", arguments={"name": f"c{j - 1}"}))
    return calls
