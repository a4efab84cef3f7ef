-- RL environment track (issue 4): QA verification verdicts, tool merges, distractor sets, and browsing views.
CREATE TABLE IF NOT EXISTS qa_verifications (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS env_merges       (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS distractor_sets  (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);

CREATE OR REPLACE VIEW v_qa_verifications AS
SELECT id, record->>'qa_id' AS qa_id, record->>'verifier' AS verifier, CAST(record->>'qs' AS DOUBLE) AS qs,
       CAST(record->>'kept' AS BOOLEAN) AS kept, record->>'keep_rule' AS keep_rule,
       CAST(record->'reasons' AS VARCHAR) AS reasons, run_id, created_at
FROM qa_verifications;

CREATE OR REPLACE VIEW v_env_merges AS
SELECT id, record->>'merged_tool' AS merged_tool, record->>'signature' AS signature,
       json_array_length(record->'members') AS members, CAST(record->>'merged' AS BOOLEAN) AS merged,
       CAST(record->>'rows' AS INTEGER) AS rows, CAST(record->'reasons' AS VARCHAR) AS reasons, run_id, created_at
FROM env_merges;

CREATE OR REPLACE VIEW v_distractor_sets AS
SELECT id, record->>'env_id' AS env_id, CAST(record->'mix' AS VARCHAR) AS mix,
       json_array_length(record->'picks') AS picks, run_id, created_at
FROM distractor_sets;
