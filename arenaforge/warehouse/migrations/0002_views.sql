-- Browsing views: one row per artifact with the columns a person scans first.
CREATE OR REPLACE VIEW v_runs AS
SELECT id, record->>'flow' AS flow, record->>'status' AS status, record->>'started_at' AS started_at,
       record->>'finished_at' AS finished_at, CAST(record->'counts' AS VARCHAR) AS counts, record->>'error' AS error
FROM runs;

CREATE OR REPLACE VIEW v_rejections AS
SELECT id, run_id, record->>'stage' AS stage, record->>'subject' AS subject, record->>'reason' AS reason,
       record->>'detail' AS detail, CAST(record->>'environment_failure' AS BOOLEAN) AS environment_failure, created_at
FROM rejections;

CREATE OR REPLACE VIEW v_tools AS
SELECT id, record->>'server' AS server, record->'function'->>'name' AS name, record->>'source' AS source,
       left(record->'function'->>'description', 80) AS description, (record->>'code') IS NOT NULL AS has_code, run_id
FROM tools;

CREATE OR REPLACE VIEW v_trajectories AS
SELECT t.id, t.record->>'server' AS server, t.record->>'task_id' AS task_id,
       json_array_length(t.record->'messages') AS messages, CAST(t.record->>'tool_calls' AS INTEGER) AS tool_calls,
       CAST(t.record->>'faults_injected' AS INTEGER) AS faults, t.record->>'executor' AS executor,
       left(t.record->>'final_answer', 60) AS final_answer, t.run_id, t.created_at
FROM trajectories t;

CREATE OR REPLACE VIEW v_environments AS
SELECT id, record->>'name' AS name, record->>'qa_id' AS qa_id, json_array_length(record->'tools') AS tools,
       json_array_length(record->'distractors') AS distractors, json_array_length(record->'calls') AS gold_calls,
       CAST(record->'verification'->>'passed' AS BOOLEAN) AS verified, left(record->>'question', 60) AS question,
       run_id, created_at
FROM environments;

CREATE OR REPLACE VIEW v_rollouts AS
SELECT id, record->>'env_id' AS env_id, record->>'engine' AS engine, record->>'policy' AS policy,
       record->>'group' AS "group", CAST(record->'reward'->>'f1' AS DOUBLE) AS f1,
       CAST(record->'reward'->>'recall' AS DOUBLE) AS recall, CAST(record->'reward'->>'precision' AS DOUBLE) AS "precision",
       CAST(record->'reward'->>'calls' AS INTEGER) AS calls, record->>'status' AS status, record->>'failure_reason' AS failure_reason,
       run_id, created_at
FROM rollouts;

CREATE OR REPLACE VIEW v_qa_instances AS
SELECT id, record->>'source' AS source, record->>'structure' AS structure, CAST(record->>'hop_level' AS INTEGER) AS hops,
       json_array_length(record->'sub_qas') AS sub_qas, left(record->>'main_question', 70) AS main_question,
       record->>'main_answer' AS main_answer, run_id
FROM qa_instances;

CREATE OR REPLACE VIEW v_llm_usage AS
SELECT run_id, step, model, count(*) AS calls, sum(CASE WHEN cached THEN 1 ELSE 0 END) AS cache_hits,
       sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens, avg(latency_s) AS mean_latency_s
FROM llm_calls GROUP BY ALL;
