"""ASTRA's environment-synthesis knowledge contexts (`shared/data/astra_knowledge/en`): `--source astra`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.tracks.envs.knowledge.source import KnowledgeSource, from_records

NAME = "astra"


def load(shared_data: Path, **profile_kw: Any) -> KnowledgeSource:
    base = shared_data / "astra_knowledge" / "en"
    return load_text_corpus(base / "context.jsonl", questions=base / "questions.jsonl", **profile_kw)


_SECTION = re.compile(r"Known Infomation:|Known Information:", re.IGNORECASE)
_FACT = re.compile(r"([A-Z][A-Za-z /]{1,40}?):\s*([^.:;]{1,80}?)(?:\.\s|\.$|;|$)")


def load_text_corpus(path: str | Path, limit: int | None = 400, questions: str | Path | None = None,
                     **profile_kw: Any) -> KnowledgeSource:
    """ASTRA knowledge contexts (`context.jsonl`) as `passages` plus one fact table per domain.

    Each context's "Known Information" part is split into `Key: value` facts; a domain's facts
    are pivoted into a table `<domain>_facts` (doc_id -> one column per fact key), whose
    `doc_id` links back to `passages`. Keys most documents lack become NULL-heavy columns and
    are rejected by profiling like any other.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "context.jsonl"
    if not path.is_file():
        raise InputError(f"no knowledge corpus at {path}")
    passages: list[dict[str, Any]] = []
    facts: dict[str, list[dict[str, Any]]] = {}
    with path.open() as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                break
            rec = json.loads(line)
            doc_id = f"DOC{i:05d}"
            domain = re.sub(r"\W+", "_", str(rec.get("domain", "general")).lower()).strip("_") or "general"
            text = str(rec.get("knowledge_corpus", ""))
            passages.append({"doc_id": doc_id, "domain": domain, "text": text[:2000]})
            known = _SECTION.split(text, maxsplit=1)
            if len(known) < 2:
                continue
            body = known[1].split("Information Needed")[0]
            row: dict[str, Any] = {"doc_id": doc_id}
            for key, value in _FACT.findall(body):
                col = re.sub(r"\W+", "_", key.strip().lower()).strip("_")
                if col and col != "doc_id" and col not in row:
                    row[col] = value.strip()
            if len(row) > 1:
                facts.setdefault(domain, []).append(row)
    tables: dict[str, list[dict[str, Any]]] = {"passages": passages}
    for domain, rows in facts.items():
        keys = sorted({k for r in rows for k in r})
        tables[f"{domain}_facts"] = [{k: r.get(k) for k in keys} for r in rows]
    source = from_records("astra_knowledge", tables, **profile_kw)
    if questions is not None and Path(questions).is_file():
        with Path(questions).open() as fh:
            source.seed_questions = [json.loads(line)["question"] for line in fh if line.strip()]
    return source
