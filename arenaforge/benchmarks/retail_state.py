"""A real-size stateful environment, generated: a tau2-style retail shop over a multi-megabyte JSON DB.

`retail_environment(target_bytes)` builds the shop (products with variants, users with payment
methods, orders in every status) deterministically from a seed until its JSON reaches the target
size (7 MB: about 1,300 users and 2,600 orders), with 14 tools written the way tau2-bench's retail
domain writes them: plain functions over a module-level `DB`, lookups that raise `ValueError`, and
writes that check the order's status first. `retail_episodes(env, n)` gives `n` gold call sequences
(read, then one to three writes, then `get_db_hash`), for replay tests and benchmarks.
"""

from __future__ import annotations

import json
import random
from typing import Any

from arenaforge.schemas.models import Environment, FunctionDoc

TOOLS_CODE = '''\
"""tau2-style retail tools over the module-level DB."""
import hashlib
import json

DB = {"products": {}, "users": {}, "orders": {}}


def _order(order_id):
    if order_id not in DB["orders"]:
        raise ValueError("Order not found")
    return DB["orders"][order_id]


def _user(user_id):
    if user_id not in DB["users"]:
        raise ValueError("User not found")
    return DB["users"][user_id]


def find_user_id_by_email(email: str) -> str:
    for user_id, user in DB["users"].items():
        if user["email"].lower() == email.lower():
            return user_id
    raise ValueError("User not found")


def find_user_id_by_name_zip(first_name: str, last_name: str, zip: str) -> str:
    for user_id, user in DB["users"].items():
        name = user["name"]
        if (name["first_name"], name["last_name"], user["address"]["zip"]) == (first_name, last_name, zip):
            return user_id
    raise ValueError("User not found")


def get_user_details(user_id: str) -> dict:
    return _user(user_id)


def get_order_details(order_id: str) -> dict:
    return _order(order_id)


def get_product_details(product_id: str) -> dict:
    if product_id not in DB["products"]:
        raise ValueError("Product not found")
    return DB["products"][product_id]


def list_all_product_types() -> dict:
    return {p["name"]: pid for pid, p in sorted(DB["products"].items())}


def cancel_pending_order(order_id: str, reason: str) -> dict:
    order = _order(order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be cancelled")
    if reason not in ("no longer needed", "ordered by mistake"):
        raise ValueError("Invalid reason")
    for payment in list(order["payment_history"]):
        order["payment_history"].append({"transaction_type": "refund", "amount": payment["amount"],
                                         "payment_method_id": payment["payment_method_id"]})
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    return order


def modify_pending_order_address(order_id: str, address1: str, address2: str, city: str, state: str,
                                 country: str, zip: str) -> dict:
    order = _order(order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be modified")
    order["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                        "country": country, "zip": zip}
    return order


def modify_pending_order_payment(order_id: str, payment_method_id: str) -> dict:
    order = _order(order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be modified")
    if payment_method_id not in _user(order["user_id"])["payment_methods"]:
        raise ValueError("Payment method not found")
    old = order["payment_history"][0]
    order["payment_history"] += [
        {"transaction_type": "payment", "amount": old["amount"], "payment_method_id": payment_method_id},
        {"transaction_type": "refund", "amount": old["amount"], "payment_method_id": old["payment_method_id"]},
    ]
    return order


def modify_user_address(user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                        zip: str) -> dict:
    user = _user(user_id)
    user["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                       "country": country, "zip": zip}
    return user


def return_delivered_order_items(order_id: str, item_ids: list, payment_method_id: str) -> dict:
    order = _order(order_id)
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be returned")
    if payment_method_id not in _user(order["user_id"])["payment_methods"]:
        raise ValueError("Payment method not found")
    present = [item["item_id"] for item in order["items"]]
    if not item_ids or any(i not in present for i in item_ids):
        raise ValueError("Some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


def _swaps(order, item_ids, new_item_ids):
    """(the order's item, its new variant) per pair, and the price difference; ValueError as tau2 words it."""
    if len(item_ids) != len(new_item_ids):
        raise ValueError("The number of items to be exchanged should match")
    swaps, diff = [], 0.0
    for old_id, new_id in zip(item_ids, new_item_ids):
        item = next((i for i in order["items"] if i["item_id"] == old_id), None)
        if item is None:
            raise ValueError(f"Item {old_id} not found")
        variant = DB["products"][item["product_id"]]["variants"].get(new_id)
        if variant is None or not variant["available"]:
            raise ValueError(f"New item {new_id} not found or available")
        swaps.append((item, variant))
        diff += variant["price"] - item["price"]
    return swaps, diff


def exchange_delivered_order_items(order_id: str, item_ids: list, new_item_ids: list,
                                   payment_method_id: str) -> dict:
    order = _order(order_id)
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be exchanged")
    _, diff = _swaps(order, item_ids, new_item_ids)
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_price_difference"] = round(diff, 2)
    order["exchange_payment_method_id"] = payment_method_id
    return order


def calculate(expression: str) -> str:
    if any(c not in "0123456789+-*/(). " for c in expression):
        raise ValueError("Invalid characters in expression")
    return str(round(float(eval(expression, {"__builtins__": {}}, {})), 2))


def get_db_hash() -> str:
    return hashlib.sha256(json.dumps(DB, sort_keys=True).encode()).hexdigest()
'''
TOOLS = (
    "find_user_id_by_email", "find_user_id_by_name_zip", "get_user_details", "get_order_details",
    "get_product_details", "list_all_product_types", "cancel_pending_order", "modify_pending_order_address",
    "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
    "exchange_delivered_order_items", "calculate", "get_db_hash",
)  # fmt: skip
FIRST = ("Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Radia", "Ken", "Lynn", "Niklaus")
LAST = ("Lovelace", "Turing", "Hopper", "Dijkstra", "Liskov", "Knuth", "Allen", "Backus", "Perlman", "Thompson")
CITIES = (("Denver", "CO", "802"), ("Austin", "TX", "787"), ("Boston", "MA", "021"), ("Seattle", "WA", "981"))
PRODUCTS = ("T-Shirt", "Water Bottle", "Office Chair", "Desk Lamp", "Backpack", "Headphones", "Sneakers", "Tea Kettle")
OPTIONS = {"color": ("red", "blue", "black", "green"), "size": ("S", "M", "L", "XL"), "material": ("cotton", "steel")}
STATUSES = ("pending", "pending", "processed", "delivered", "delivered", "cancelled")


def _address(rng: random.Random) -> dict[str, str]:
    city, state, zip3 = rng.choice(CITIES)
    return {"address1": f"{rng.randint(1, 999)} {rng.choice(LAST)} Street", "address2": f"Suite {rng.randint(1, 999)}",
            "city": city, "country": "USA", "state": state, "zip": f"{zip3}{rng.randint(10, 99)}"}


def _products(rng: random.Random) -> dict[str, Any]:
    products = {}
    for n in range(50):
        pid = f"{8000000000 + n * 7919}"
        variants = {}
        for _ in range(rng.randint(4, 12)):
            item_id = str(rng.randint(10**9, 10**10 - 1))
            variants[item_id] = {"item_id": item_id, "options": {k: rng.choice(v) for k, v in OPTIONS.items()},
                                 "available": rng.random() < 0.8, "price": round(rng.uniform(10, 500), 2)}
        products[pid] = {"name": f"{PRODUCTS[n % len(PRODUCTS)]} {n // len(PRODUCTS)}", "product_id": pid,
                         "variants": variants}
    return products


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def retail_state(target_bytes: int = 7_000_000, seed: int = 0) -> dict[str, Any]:
    """A retail DB whose compact JSON is at least `target_bytes` long, the same for the same arguments."""
    rng = random.Random(seed)
    db: dict[str, Any] = {"products": _products(rng), "users": {}, "orders": {}}
    size, n = _size(db), 0
    while size < target_bytes:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        user_id = f"{first.lower()}_{last.lower()}_{n}"
        methods = {f"credit_card_{n}": {"source": "credit_card", "id": f"credit_card_{n}", "brand": "visa",
                                        "last_four": f"{rng.randint(0, 9999):04d}"},
                   f"gift_card_{n}": {"source": "gift_card", "id": f"gift_card_{n}",
                                      "balance": round(rng.uniform(0, 300), 2)}}
        user = {"user_id": user_id, "name": {"first_name": first, "last_name": last}, "address": _address(rng),
                "email": f"{first.lower()}.{last.lower()}{n}@example.com", "payment_methods": methods, "orders": []}
        for k in range(2):
            order_id = f"#W{1000000 + 2 * n + k}"
            items = []
            for _ in range(rng.randint(1, 4)):
                pid = rng.choice(sorted(db["products"]))
                item_id = rng.choice(sorted(db["products"][pid]["variants"]))
                variant = db["products"][pid]["variants"][item_id]
                items.append({"name": db["products"][pid]["name"], "product_id": pid, "item_id": item_id,
                              "price": variant["price"], "options": variant["options"]})
            method = rng.choice(sorted(methods))
            order = {"order_id": order_id, "user_id": user_id, "address": dict(user["address"]), "items": items,
                     "status": rng.choice(STATUSES), "fulfillments": [],
                     "payment_history": [{"transaction_type": "payment", "payment_method_id": method,
                                          "amount": round(sum(i["price"] for i in items), 2)}]}
            db["orders"][order_id] = order
            user["orders"].append(order_id)
            size += _size(order) + len(order_id) + 4
        db["users"][user_id] = user
        size += _size(user) + len(user_id) + 4
        n += 1
    return db


def retail_environment(target_bytes: int = 7_000_000, seed: int = 0, state: dict[str, Any] | None = None) -> Environment:
    """The retail shop as an environment package (functions over `DB`), with the generated state."""
    return Environment(name=f"retail-{target_bytes // 1_000_000}mb", tools=[FunctionDoc(name=t) for t in TOOLS],
                       code=TOOLS_CODE, data_var="DB", initial_state=state or retail_state(target_bytes, seed))


def retail_episodes(env: Environment, n: int, seed: int = 1) -> list[list[tuple[str, dict[str, Any]]]]:
    """`n` gold call sequences: look a user up, read an order, write one to three times, hash the DB."""
    db = env.initial_state or {}
    rng = random.Random(seed)
    users = sorted(db["users"])
    episodes = []
    for _ in range(n):
        user = db["users"][rng.choice(users)]
        calls: list[tuple[str, dict[str, Any]]] = [("find_user_id_by_email", {"email": user["email"]}),
                                                   ("get_user_details", {"user_id": user["user_id"]})]
        for order_id in user["orders"]:
            order = db["orders"][order_id]
            calls.append(("get_order_details", {"order_id": order_id}))
            method = sorted(user["payment_methods"])[0]
            if order["status"] == "pending":
                calls.append(rng.choice([
                    ("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"}),
                    ("modify_pending_order_address", {"order_id": order_id, **_address(rng)}),
                    ("modify_pending_order_payment", {"order_id": order_id, "payment_method_id": method}),
                ]))
            elif order["status"] == "delivered":
                calls.append(("return_delivered_order_items", {"order_id": order_id, "payment_method_id": method,
                                                                "item_ids": [order["items"][0]["item_id"]]}))
        calls.append(("modify_user_address", {"user_id": user["user_id"], **_address(rng)}))
        calls.append(("get_db_hash", {}))
        episodes.append(calls)
    return episodes
