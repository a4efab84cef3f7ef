"""τ²-bench retail (`shared/data/tau2_retail/db.json`) flattened into tables: `--source tau2_retail`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.tracks.envs.knowledge.source import KnowledgeSource, from_records

NAME = "tau2_retail"


def load(shared_data: Path, **profile_kw: Any) -> KnowledgeSource:
    return load_tau2_retail(shared_data / "tau2_retail" / "db.json", **profile_kw)


def load_tau2_retail(db_json: str | Path, **profile_kw: Any) -> KnowledgeSource:
    """τ²-bench retail `db.json` flattened into products, variants, users, payment_methods, orders, order_items."""
    path = Path(db_json)
    if path.is_dir():
        path = path / "db.json"
    if not path.is_file():
        raise InputError(f"no tau2 retail db.json at {path}")
    db = json.loads(path.read_text())
    tables: dict[str, list[dict[str, Any]]] = {k: [] for k in
                                               ("products", "variants", "users", "payment_methods", "orders", "order_items")}
    for p in db.get("products", {}).values():
        tables["products"].append({"product_id": p["product_id"], "name": p["name"], "variant_count": len(p.get("variants", {}))})
        for v in p.get("variants", {}).values():
            opts = v.get("options", {})
            tables["variants"].append({
                "item_id": v["item_id"], "product_id": p["product_id"], "price": v.get("price"),
                "available": bool(v.get("available")),
                "options": ", ".join(f"{k} {val}" for k, val in sorted(opts.items())),
                "color": opts.get("color"), "size": opts.get("size"), "material": opts.get("material")})
    for u in db.get("users", {}).values():
        addr = u.get("address", {})
        tables["users"].append({
            "user_id": u["user_id"], "first_name": u["name"]["first_name"], "last_name": u["name"]["last_name"],
            "email": u.get("email"), "city": addr.get("city"), "state": addr.get("state"), "zip": addr.get("zip"),
            "country": addr.get("country"), "order_count": len(u.get("orders", []))})
        for pm in u.get("payment_methods", {}).values():
            tables["payment_methods"].append({"payment_method_id": pm["id"], "user_id": u["user_id"], "source": pm.get("source"),
                                              "brand": pm.get("brand"), "last_four": pm.get("last_four"), "balance": pm.get("balance")})
    line = 0
    for o in db.get("orders", {}).values():
        addr = o.get("address", {})
        pay = sum(h.get("amount", 0) for h in o.get("payment_history", []) if h.get("transaction_type") == "payment")
        tables["orders"].append({"order_id": o["order_id"], "user_id": o["user_id"], "status": o.get("status"),
                                 "city": addr.get("city"), "state": addr.get("state"), "zip": addr.get("zip"),
                                 "item_count": len(o.get("items", [])), "amount_paid": round(pay, 2)})
        for it in o.get("items", []):
            line += 1
            tables["order_items"].append({"line_id": f"L{line:05d}", "order_id": o["order_id"], "item_id": it["item_id"],
                                          "product_id": it["product_id"], "name": it.get("name"), "price": it.get("price")})
    return from_records("tau2_retail", tables, **profile_kw)
