-- Incremental merging (issue 17): every verified tool merging has seen, with its group and subset, so a later
-- window or run continues the greedy grouping against everything already in the warehouse.
CREATE TABLE IF NOT EXISTS merge_candidates (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);

CREATE OR REPLACE VIEW v_merge_candidates AS
SELECT id, record->>'qa_id' AS qa_id, record->'doc'->>'name' AS tool, record->>'signature' AS signature,
       record->>'group' AS "group", record->>'subset' AS subset, CAST(record->>'position' AS INTEGER) AS position,
       CAST(record->>'served_by' AS INTEGER) AS served_by, run_id, created_at
FROM merge_candidates;

COMMENT ON TABLE merge_candidates IS 'Tools merging has seen, with their group and greedy subset (incremental merging).';
