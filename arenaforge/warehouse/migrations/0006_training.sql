-- Training: per-step metrics, checkpoints and evaluation runs (records, same shape as `tools`),
-- plus browsing views.
CREATE TABLE IF NOT EXISTS train_steps  (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints  (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS eval_runs    (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);

CREATE OR REPLACE VIEW v_train_steps AS
SELECT id, record->>'experiment' AS experiment, record->>'algorithm' AS algorithm,
       CAST(record->>'step' AS INTEGER) AS step,
       CAST(record->'metrics'->>'reward' AS DOUBLE) AS reward,
       CAST(record->'metrics'->>'recall' AS DOUBLE) AS recall,
       CAST(record->'metrics'->>'precision' AS DOUBLE) AS precision,
       CAST(record->'metrics'->>'calls' AS DOUBLE) AS calls,
       CAST(record->'metrics'->>'zero_variance_share' AS DOUBLE) AS zero_variance_share,
       CAST(record->'metrics'->>'loss' AS DOUBLE) AS loss,
       CAST(record->'metrics'->>'response_len' AS DOUBLE) AS response_len,
       CAST(record->'metrics'->>'rollout_s' AS DOUBLE) AS rollout_s,
       CAST(record->'metrics'->>'train_s' AS DOUBLE) AS train_s,
       run_id, created_at
FROM train_steps;

CREATE OR REPLACE VIEW v_checkpoints AS
SELECT id, record->>'experiment' AS experiment, record->>'algorithm' AS algorithm,
       CAST(record->>'step' AS INTEGER) AS step, record->>'path' AS path,
       CAST(record->>'has_optimizer' AS BOOLEAN) AS has_optimizer, run_id, created_at
FROM checkpoints;

CREATE OR REPLACE VIEW v_eval_runs AS
SELECT id, record->>'policy' AS policy, record->>'engine' AS engine,
       CAST(record->>'episodes' AS INTEGER) AS episodes, CAST(record->>'f1' AS DOUBLE) AS f1,
       CAST(record->>'recall' AS DOUBLE) AS recall, CAST(record->>'precision' AS DOUBLE) AS precision,
       CAST(record->>'calls_per_task' AS DOUBLE) AS calls_per_task, CAST(record->'failure_reasons' AS VARCHAR) AS failures,
       run_id, created_at
FROM eval_runs;
