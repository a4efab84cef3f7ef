"""A scripted "model" for every envs prompt, for the scripted OpenAI-compatible endpoint (benchmarks, tests).

`EnvsResponder` answers per step (read from the request's response_format name): it writes QA
decompositions grounded in the sample source (answers computed by SQL, like a careful model would),
judges, tool docs, implementations and merge groups. `bad_code` switches the implementation to code that
loops forever or leaks the answer.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from arenaforge.testing.scripted_openai import Reply, chat_completion

if TYPE_CHECKING:
    from arenaforge.services.models import Step


def _step(req: dict[str, Any]) -> str:
    """The step that sent the request: its schema name is the step label with "." written "_"."""
    return ((req.get("response_format") or {}).get("json_schema") or {}).get("name", "").replace("_", ".", 1)


def _prompt(req: dict[str, Any]) -> str:
    return req["messages"][0]["content"]


class EnvsResponder:
    """Per-step JSON answers for the envs prompts (see module docstring)."""

    def __init__(self, bad_code: str | None = None, not_json_steps: tuple[Step, ...] = (),
                 not_json_variants: tuple[int, ...] = ()) -> None:
        # the stages are imported here, not at the top: `arenaforge bench --help` imports this module
        from arenaforge.tracks.envs.build_tools import AUGMENT_TOOL, IMPLEMENT_TOOL, TOOL_DOC
        from arenaforge.tracks.envs.decompose_qa import DECOMPOSE
        from arenaforge.tracks.envs.knowledge import load_sample
        from arenaforge.tracks.envs.merge_envs import MERGE_CLUSTER
        from arenaforge.tracks.envs.verify_qa import VERIFY

        src = load_sample()
        self.customers = {r[0]: dict(zip(("city", "tier", "country", "last_name"), r[1:], strict=True))
                          for r in src.query("SELECT customer_id, city, tier, country, last_name FROM customers")}
        self.orders = src.query("SELECT order_id, customer_id FROM orders ORDER BY 1")
        src.close()
        self.bad_code = bad_code
        self.not_json_steps = {s.name for s in not_json_steps}
        self.not_json_variants = not_json_variants  # decomposition variants answered in prose
        self.decompose_step = DECOMPOSE.name
        self.handlers = {DECOMPOSE.name: self.decompose, VERIFY.name: self.verify, TOOL_DOC.name: self.tool_doc,
                         AUGMENT_TOOL.name: self.augment, IMPLEMENT_TOOL.name: self.implement,
                         MERGE_CLUSTER.name: self.merge}

    def __call__(self, req: dict[str, Any]) -> Reply:
        step = _step(req)
        variant = re.search(r"Variant number[^:]*: (\d+)", _prompt(req))
        broken = (step == self.decompose_step and variant is not None
                  and int(variant.group(1)) in self.not_json_variants)
        if broken or step in self.not_json_steps:
            return Reply(body=chat_completion(content="Sure! Here is what you asked for, in prose."))
        handler = self.handlers.get(step)
        body = handler(_prompt(req)) if handler else {"error": f"unknown step {step}"}
        return Reply(body=chat_completion(content=json.dumps(body)))

    ATTRS = ("city", "tier", "country", "last_name")

    def decompose(self, prompt: str) -> dict[str, Any]:
        k = int(re.search(r"Variant number[^:]*: (\d+)", prompt).group(1))  # type: ignore[union-attr]
        attr = self.ATTRS[(k // 2) % len(self.ATTRS)]
        label = attr.replace("_", " ")
        if k % 2 == 0:
            order_id, customer_id = self.orders[(k // 8) % len(self.orders)]
            value = self.customers[customer_id][attr]
            return {"main_question": f"What is the {label} of the customer who placed order {order_id}?",
                    "main_answer": value,
                    "sub_qas": [
                        {"index": 1, "question": f"Which customer placed order {order_id}?", "answer": customer_id,
                         "depends_on": [], "needs_tool": True,
                         "evidence": {"kind": "lookup", "table": "orders", "key": "order_id", "value": order_id,
                                      "column": "customer_id"}},
                        {"index": 2, "question": f"What is the {label} of customer {customer_id}?", "answer": value,
                         "depends_on": [1], "needs_tool": True,
                         "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id",
                                      "value": customer_id, "column": attr}}]}
        cid = sorted(self.customers)[(k // 8) % len(self.customers)]
        value = self.customers[cid][attr]
        return {"main_question": f"Which {label} is on file for customer {cid}?", "main_answer": value,
                "sub_qas": [{"index": 1, "question": f"What is the {label} of customer {cid}?", "answer": value,
                             "depends_on": [], "needs_tool": True,
                             "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": cid,
                                          "column": attr}}]}

    def verify(self, prompt: str) -> dict[str, Any]:
        qa = json.loads(prompt.split("Task:\n", 1)[1].split("\n\nChecks:", 1)[0])
        return {"dependency_consistency": 1, "sub_question_atomicity": 1, "sequential_rationality": 1,
                "task_completeness": 1, "tool_necessity": [{"index": s["index"], "needs_tool": s["needs_tool"]}
                                                           for s in qa["sub_qas"]], "reasons": []}

    @classmethod
    def _kind(cls, question: str) -> str:
        if "placed order" in question:
            return "order_customer"
        return "customer_" + next(a for a in cls.ATTRS if a.replace("_", " ") in question)

    def tool_doc(self, prompt: str) -> dict[str, Any]:
        question = re.search(r"Sub-question: (.*)", prompt).group(1)  # type: ignore[union-attr]
        kind = self._kind(question)
        key = "order_id" if kind == "order_customer" else "customer_id"
        return {"name": f"lookup_{kind}", "description": f"Look up the {kind.replace('_', ' ')} by {key}.",
                "parameters": {"type": "object", "properties": {key: {"type": "string", "description": key}},
                               "required": [key]}}

    def augment(self, prompt: str) -> dict[str, Any]:
        doc = json.loads(prompt.split("Tool document:\n", 1)[1].split("\n\nAnswer", 1)[0])
        doc["parameters"]["properties"]["verbose"] = {"type": "boolean", "description": "Return the whole record."}
        return doc

    def implement(self, prompt: str) -> dict[str, Any]:
        doc = json.loads(prompt.split("Tool document:\n", 1)[1].split("\n\nSub-question", 1)[0])
        name = doc["name"]
        key = next(p for p in doc["parameters"]["required"])
        answer = re.search(r"Gold answer the call must return: (.*)", prompt).group(1)  # type: ignore[union-attr]
        column = re.search(r"What the tool computes: the (\w+) of the", prompt).group(1)  # type: ignore[union-attr]
        key_value = re.search(r"\(its \w+ is (.*)\)\.", prompt).group(1)  # type: ignore[union-attr]
        if self.bad_code == "loop":
            code = f"def {name}({key}, verbose=False):\n    while True:\n        pass\n"
        elif self.bad_code == "leak":  # the answer it was told, whatever it is asked
            code = f"def {name}({key}, verbose=False):\n    return {answer!r}\n"
        else:
            code = (f"def {name}({key}, verbose=False):\n    row = DATA[{name!r}].get(str({key}))\n    if row is None:\n"
                    f"        raise ValueError('unknown ' + str({key}))\n"
                    f"    return row if verbose else {{{column!r}: row[{column!r}]}}\n")
        return {"code": code, "call": {"arguments": {key: key_value}}}

    def merge(self, prompt: str) -> dict[str, Any]:
        names = re.findall(r'"tool": "([^"]+)"', prompt)
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(n.split("@")[0], []).append(n)
        return {"groups": [{"tools": g, "operation": base} for base, g in groups.items() if len(g) > 1]}
