-- SFT track: tool-call graph edges with synthesis-frequency weights, and browsing views for
-- servers, chains, tasks and judge scores.

-- One row per directed edge (legal consecutive call) of a server's tool graph.
-- weight: strength of the evidence for the edge (data-flow match score or model votes), 0..1.
-- uses: how many synthesized trajectories walked the edge; sampling prefers rarely used edges
-- (probability ~ weight / (1 + uses)), so coverage spreads over the graph run after run.
CREATE TABLE IF NOT EXISTS graph_edges (
    server     VARCHAR NOT NULL,
    src        VARCHAR NOT NULL,
    dst        VARCHAR NOT NULL,
    weight     DOUBLE NOT NULL,
    uses       INTEGER NOT NULL DEFAULT 0,
    origin     VARCHAR NOT NULL,          -- dataflow | model | both
    evidence   VARCHAR,                   -- e.g. "order_id -> order_id (name)"
    updated_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (server, src, dst)
);

CREATE OR REPLACE VIEW v_servers AS
SELECT id, record->>'name' AS name, record->>'source' AS source, record->>'domain' AS domain,
       json_array_length(record->'tool_names') AS tools, (record->'launch') IS NOT NULL AND CAST(record->'launch' AS VARCHAR) <> 'null' AS live,
       left(record->>'title', 40) AS title, run_id, created_at
FROM servers;

CREATE OR REPLACE VIEW v_tool_chains AS
SELECT id, record->>'server' AS server, json_array_length(record->'tools') AS length,
       array_to_string(CAST(record->'tools' AS VARCHAR[]), ' > ') AS tools,
       CAST(record->>'verified' AS BOOLEAN) AS verified, CAST(record->'reasons' AS VARCHAR) AS reasons, run_id, created_at
FROM tool_chains;

CREATE OR REPLACE VIEW v_tasks AS
SELECT id, record->>'server' AS server, record->>'mode' AS mode, record->>'augmentation' AS augmentation,
       CAST(record->>'accepted' AS BOOLEAN) AS accepted,
       CAST(record->'scores'->>'clarity' AS DOUBLE) AS clarity, CAST(record->'scores'->>'realism' AS DOUBLE) AS realism,
       CAST(record->'scores'->>'tool_necessity' AS DOUBLE) AS tool_necessity,
       left(record->>'query', 70) AS query, CAST(record->'reasons' AS VARCHAR) AS reasons, record->>'chain_id' AS chain_id,
       run_id, created_at
FROM tasks;

CREATE OR REPLACE VIEW v_judge_scores AS
SELECT id, record->>'trajectory_id' AS trajectory_id, record->>'judge' AS judge,
       CAST(record->>'mean' AS DOUBLE) AS mean, CAST(record->>'keep' AS BOOLEAN) AS keep,
       CAST(record->>'query_understanding' AS DOUBLE) AS query_understanding,
       CAST(record->>'planning' AS DOUBLE) AS planning,
       CAST(record->>'tool_response_understanding' AS DOUBLE) AS tool_response_understanding,
       CAST(record->>'context_conditioned_planning' AS DOUBLE) AS context_conditioned_planning,
       CAST(record->>'tool_call_status' AS DOUBLE) AS tool_call_status,
       CAST(record->>'tool_conciseness' AS DOUBLE) AS tool_conciseness,
       CAST(record->>'final_answer_quality' AS DOUBLE) AS final_answer_quality,
       left(record->>'rationale', 60) AS rationale, run_id, created_at
FROM judge_scores;

-- SFT-ready trajectories: kept by their judge score (the latest score per trajectory wins).
CREATE OR REPLACE VIEW v_sft_kept AS
SELECT t.id, t.record->>'server' AS server, CAST(s.record->>'mean' AS DOUBLE) AS score,
       json_array_length(t.record->'messages') AS messages, CAST(t.record->>'tool_calls' AS INTEGER) AS tool_calls,
       CAST(t.record->>'faults_injected' AS INTEGER) AS faults, t.run_id
FROM trajectories t
JOIN (SELECT record, record->>'trajectory_id' AS tid,
             row_number() OVER (PARTITION BY record->>'trajectory_id' ORDER BY created_at DESC) AS rn
      FROM judge_scores) s ON s.tid = t.id AND s.rn = 1
WHERE CAST(s.record->>'keep' AS BOOLEAN);
