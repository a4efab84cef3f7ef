"""Hand-written tool sets of both shapes, written the way independent benchmarks write them.

- `retail_functions_env`: tau2-bench style, plain functions over a module-level data dict (`DB`).
- `retail_class_env`: the same shop as a class whose constructor takes the initial-state dict.
- `message_api_env`: BFCL/ACEBench style, a class with a no-argument constructor whose state is
  loaded by `_load_scenario(config)`, plus a long-context flag it ignores.
"""

from __future__ import annotations

from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall

RETAIL_STATE = {
    "orders": {
        "W1001": {"user_id": "u1", "status": "pending", "items": [{"sku": "mug", "price": 12.5}], "total": 12.5},
        "W1002": {"user_id": "u2", "status": "delivered", "items": [{"sku": "lamp", "price": 40.0}], "total": 40.0},
    },
    "users": {"u1": {"name": "Ada Lovelace", "balance": 100.0}, "u2": {"name": "Alan Turing", "balance": 5.0}},
}

RETAIL_FUNCTIONS = '''\
"""tau2-style retail tools: functions over the module-level DB dict."""
import copy
import json

DB = {"orders": {}, "users": {}}


def get_order_details(order_id: str) -> dict:
    order = DB["orders"].get(order_id)
    if order is None:
        raise ValueError(f"order {order_id} not found")
    return copy.deepcopy(order)


def cancel_pending_order(order_id: str, reason: str) -> str:
    order = DB["orders"][order_id]
    if order["status"] != "pending":
        raise ValueError("non-pending order cannot be cancelled")
    order["status"] = "cancelled"
    DB["users"][order["user_id"]]["balance"] += order["total"]
    return json.dumps({"order_id": order_id, "status": "cancelled", "reason": reason})


def get_user_balance(user_id: str) -> float:
    return DB["users"][user_id]["balance"]


def log_note(note: str) -> None:
    print("note:", note)


def noop() -> None:
    return None
'''

RETAIL_CLASS = '''\
class RetailTools:
    """The same shop as a stateful class built from the initial state."""

    def __init__(self, db: dict):
        self.db = db

    def get_order_details(self, order_id: str) -> dict:
        return self.db["orders"][order_id]

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        order = self.db["orders"][order_id]
        if order["status"] != "pending":
            raise ValueError("non-pending order cannot be cancelled")
        order["status"] = "cancelled"
        self.db["users"][order["user_id"]]["balance"] += order["total"]
        return "cancelled"

    def get_user_balance(self, user_id: str) -> float:
        return self.db["users"][user_id]["balance"]

    def _audit(self):  # private: never a tool
        return self.db
'''

MESSAGE_API = '''\
from copy import deepcopy
from typing import Dict, List, Optional

DEFAULT_STATE = {"generated_ids": set(), "user_count": 2,
                 "user_map": {"alice": "USR001", "bob": "USR002"}, "inbox": [], "current_user": None}


class MessageAPI:
    """BFCL-style: no-argument constructor, state loaded from the scenario config."""

    def __init__(self):
        self.user_map: Dict[str, str] = {}
        self.inbox: List[Dict[str, str]] = []
        self.current_user: Optional[str] = None
        self._api_description = "messaging"

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        state = deepcopy(DEFAULT_STATE)
        state.update(scenario)
        self.user_map = state["user_map"]
        self.inbox = state["inbox"]
        self.current_user = state["current_user"]

    def message_login(self, user_id: str) -> Dict[str, bool]:
        if user_id not in self.user_map.values():
            return {"login_status": False, "message": f"User ID '{user_id}' not found."}
        self.current_user = user_id
        return {"login_status": True, "message": f"User '{user_id}' logged in successfully."}

    def send_message(self, receiver_id: str, message: str) -> Dict[str, object]:
        if self.current_user is None:
            return {"error": "No user is currently logged in."}
        self.inbox.append({"sender": self.current_user, "receiver": receiver_id, "message": message})
        return {"sent_status": True, "message_count": len(self.inbox)}

    def view_messages_sent(self) -> Dict[str, List[str]]:
        return {"messages": [m["message"] for m in self.inbox if m["sender"] == self.current_user]}
'''


def _docs(*names: str) -> list[FunctionDoc]:
    return [FunctionDoc(name=n, description=f"{n} tool") for n in names]


def retail_functions_env(extra_code: str = "", extra_tools: tuple[str, ...] = ()) -> Environment:
    return Environment(
        name="retail-functions",
        tools=_docs("get_order_details", "cancel_pending_order", "get_user_balance", "log_note", "noop", *extra_tools),
        code=RETAIL_FUNCTIONS + extra_code,
        style="functions",
        data_var="DB",
        initial_state=RETAIL_STATE,
        calls=[
            GoldCall(tool="get_order_details", arguments={"order_id": "W1001"}, sub_qa=1, answer="pending"),
            GoldCall(tool="get_user_balance", arguments={"user_id": "u2"}, sub_qa=2, answer="5.0"),
        ],
        gold_answers=["pending", "5.0"],
    )


def retail_class_env() -> Environment:
    return Environment(
        name="retail-class",
        tools=_docs("get_order_details", "cancel_pending_order", "get_user_balance"),
        code=RETAIL_CLASS,
        style="class",
        class_name="RetailTools",
        initial_state=RETAIL_STATE,
    )


def message_api_env() -> Environment:
    return Environment(
        name="bfcl-message",
        tools=_docs("message_login", "send_message", "view_messages_sent"),
        code=MESSAGE_API,
        style="class",
        class_name="MessageAPI",
        initial_state={"inbox": [{"sender": "USR002", "receiver": "USR001", "message": "hi"}]},
    )


# Adversarial tools, appended to the retail functions so each runs in a realistic environment.
ADVERSARIAL = '''

import os, sys, time, socket, ctypes

def spin():
    while True:
        pass

def sleep_forever():
    time.sleep(10_000)

def nap(seconds: float):
    time.sleep(seconds)
    return "rested"

def burn(seconds: float):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return "burnt"

def fork_bomb():
    while True:
        os.fork()

def hog_memory():
    chunks = []
    while True:
        chunks.append(bytearray(50 * 1024 * 1024))

def flood_return():
    return "x" * (100 * 1024 * 1024)

def flood_print():
    chunk = "y" * (1024 * 1024)
    for _ in range(100):
        print(chunk)

def flood_fd():
    chunk = b"z" * (1024 * 1024)
    for _ in range(100):
        os.write(1, chunk)
        os.write(2, chunk)
    return "done"

def read_path(path: str):
    with open(path) as fh:
        return fh.read()

def environ_dump():
    found = [json_env() ]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    found.append(fh.read().decode("utf-8", "replace"))
            except OSError:
                pass
    return "\\n".join(found)

def json_env():
    return repr(dict(os.environ))

def connect(host: str, port: int):
    s = socket.create_connection((host, port), timeout=2)
    s.sendall(b"leak")
    return "connected"

def write_file(path: str):
    with open(path, "w") as fh:
        fh.write("owned")
    return "wrote " + path

def scratch_roundtrip():
    with open("note.txt", "w") as fh:
        fh.write("kept")
    with open("note.txt") as fh:
        return os.getcwd() + ":" + fh.read()

def kill_parent():
    os.kill(os.getppid(), 9)
    return "parent killed"

def exit_hard():
    os._exit(3)

def segfault():
    ctypes.string_at(0)

def whoami():
    return {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd()}
'''
ADVERSARIAL_TOOLS = (
    "spin", "sleep_forever", "nap", "burn", "fork_bomb", "hog_memory", "flood_return", "flood_print", "flood_fd",
    "read_path", "environ_dump", "connect", "write_file", "scratch_roundtrip", "kill_parent", "exit_hard",
    "segfault", "whoami",
)  # fmt: skip


def adversarial_env() -> Environment:
    return retail_functions_env(ADVERSARIAL, ADVERSARIAL_TOOLS)
