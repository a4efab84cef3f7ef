"""Write `arenaforge/schemas/json/<kind>.schema.json` for every registered record kind.

Run `python -m arenaforge.schemas.generate` after changing a model; `tests/schemas` fails when the files
and the models disagree.
"""

from __future__ import annotations

import json

from arenaforge.schemas.contracts import JSON_DIR, build_schema, schema_path
from arenaforge.schemas.registry import kinds


def render(kind_model) -> str:
    return json.dumps(build_schema(kind_model), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    JSON_DIR.mkdir(exist_ok=True)
    for kind, model in kinds().items():
        schema_path(kind).write_text(render(model))
        print(f"wrote {schema_path(kind).relative_to(JSON_DIR.parent.parent)}")


if __name__ == "__main__":
    main()
