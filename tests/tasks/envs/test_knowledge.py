"""Knowledge sources: table files and corpora into DuckDB, profiled; unusable parts become rejection rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arenaforge.schemas.errors import InputError
from arenaforge.tracks.envs.knowledge import load_sample, load_source, load_tables, load_tau2_retail, load_text_corpus


def test_sample_source_profiles_keys_and_links() -> None:
    src = load_sample()
    assert set(src.tables) == {"customers", "orders", "order_items", "products", "stores", "suppliers"}
    assert src.tables["orders"].key == "order_id"
    links = {(link.table, link.column, link.ref_table) for link in src.links}
    assert ("orders", "customer_id", "customers") in links
    assert ("order_items", "product_id", "products") in links
    assert ("products", "supplier_id", "suppliers") in links
    assert src.rejections == []
    assert "table customers" in src.summary()


def test_formats_and_bad_columns_become_rejections(tmp_path: Path) -> None:
    (tmp_path / "people.csv").write_text("person_id,city,note,ville\n" + "\n".join(
        f"P{i},{'Oslo' if i % 2 else 'Bergen'},{'x' if i == 0 else ''},{'Zürich' if i % 2 else 'Genève'}"
        for i in range(10)))
    pq.write_table(pa.table({"visit_id": [f"V{i}" for i in range(6)], "person_id": [f"P{i}" for i in range(6)],
                             "minutes": list(range(6))}), tmp_path / "visits.parquet")
    (tmp_path / "planets.json").write_text(json.dumps([{"planet": p, "moons": m} for p, m in
                                                       [("Mars", 2), ("Earth", 1), ("Venus", 0)]]))
    src = load_tables("mixed", sorted(tmp_path.iterdir()))
    assert set(src.tables) == {"people", "visits", "planets"}
    reasons = {(r.subject, r.reason) for r in src.rejections}
    assert ("mixed.people.note", "null_heavy_column") in reasons
    assert ("mixed.people.ville", "non_ascii_column") in reasons
    assert ("mixed.planets", "no_joinable_columns") in reasons  # kept for single-hop use
    assert "planets" in src.tables and not src.joinable("planets")
    assert src.joinable("visits")
    assert "note" not in src.tables["people"].attributes


def test_unknown_source_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        load_source(str(tmp_path / "missing.csv"))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(InputError):
        load_tables("x", [tmp_path / "x.txt"])


@pytest.mark.shared_data
def test_tau2_retail_flattened(shared_data: Path) -> None:
    src = load_tau2_retail(shared_data / "tau2_retail")
    assert {"products", "variants", "users", "orders", "order_items", "payment_methods"} <= set(src.tables)
    assert src.query("SELECT count(*) FROM orders")[0][0] == 1000
    links = {(link.table, link.column, link.ref_table) for link in src.links}
    assert ("orders", "user_id", "users") in links and ("order_items", "item_id", "variants") in links


@pytest.mark.shared_data
def test_text_corpus_passages_and_fact_tables(shared_data: Path) -> None:
    src = load_text_corpus(shared_data / "astra_knowledge" / "en", limit=300)
    assert src.tables["passages"].rows == 300
    fact_tables = [t for t in src.tables if t.endswith("_facts")]
    assert fact_tables
    assert any(r.reason == "null_heavy_column" for r in src.rejections)


def test_queries_from_worker_threads_use_their_own_cursor_and_are_memoised() -> None:
    from concurrent.futures import ThreadPoolExecutor

    source = load_sample()
    sql = "SELECT count(*) FROM customers"
    assert not source.memoised(sql)
    expected = source.query(sql)
    assert source.memoised(sql) and expected[0][0] > 0
    lookups = [f"SELECT city FROM customers WHERE customer_id = '{cid}'" for (cid,) in
               source.query("SELECT customer_id FROM customers ORDER BY 1")]
    with ThreadPoolExecutor(4) as pool:  # one DuckDB connection shared by threads would fail or interleave
        cities = list(pool.map(source.query, lookups * 3))
    assert cities == [source.query(q) for q in lookups] * 3
    assert all(len(rows) == 1 for rows in cities)
    source.close()
