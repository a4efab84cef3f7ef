-- Train/test splits of environments as data (issue 11): one row per (scheme, environment).
CREATE TABLE IF NOT EXISTS env_splits (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);

CREATE OR REPLACE VIEW v_env_splits AS
SELECT id, record->>'scheme' AS scheme, record->>'env_id' AS env_id, record->>'split' AS split,
       record->>'stratum' AS stratum, record->>'group' AS "group",
       CAST(record->>'test_share' AS DOUBLE) AS test_share, CAST(record->>'seed' AS INTEGER) AS seed,
       run_id, created_at
FROM env_splits;
