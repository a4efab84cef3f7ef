"""Child-process script: every table of a single-file DuckDB warehouse to Parquet (argv: FILE OUTDIR).

Run by `legacy.export_single_file` with whichever duckdb can read FILE; imports nothing but duckdb.
JSON columns are written as text (the reader may not know the writer's JSON extension type).
Prints the table names as one JSON line.
"""

import json
import sys

import duckdb


def main(src: str, out: str) -> list[str]:
    con = duckdb.connect(src, read_only=True)
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE' "
        "ORDER BY 1").fetchall()]
    for table in tables:
        columns = con.execute(f'DESCRIBE "{table}"').fetchall()
        select = ", ".join(f'CAST("{c[0]}" AS VARCHAR) AS "{c[0]}"' if c[1] == "JSON" else f'"{c[0]}"' for c in columns)
        target = f"{out}/{table}.parquet".replace("'", "''")
        con.execute(f"COPY (SELECT {select} FROM \"{table}\") TO '{target}' (FORMAT parquet)")
    con.close()
    return tables


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
