-- Foundation: one table per record kind (same shape), rejections, the model-response cache,
-- per-call usage, and the browsing views for those kinds.
-- Every artifact table: content id, lineage (parents), the run that made it, and the record JSON.

CREATE TABLE IF NOT EXISTS tools        (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS servers      (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS tool_chains  (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS tasks        (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS trajectories (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS judge_scores (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS qa_instances (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS environments (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts     (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS runs         (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);
CREATE TABLE IF NOT EXISTS rejections   (id VARCHAR PRIMARY KEY, run_id VARCHAR, parents VARCHAR[], created_at TIMESTAMP DEFAULT current_timestamp, record JSON NOT NULL);

-- Model responses keyed by hash(model, parameters, messages, tools, schema): a re-run makes no calls.
CREATE TABLE IF NOT EXISTS llm_cache (
    key        VARCHAR PRIMARY KEY,
    model      VARCHAR NOT NULL,
    request    JSON NOT NULL,
    response   JSON NOT NULL,
    created_at TIMESTAMP DEFAULT current_timestamp
);

-- One row per model call actually sent (cache hits are counted too, with cached = true).
CREATE TABLE IF NOT EXISTS llm_calls (
    call_id           VARCHAR PRIMARY KEY,
    key               VARCHAR NOT NULL,
    run_id            VARCHAR,
    step              VARCHAR,
    model             VARCHAR NOT NULL,
    cached            BOOLEAN NOT NULL,
    attempts          INTEGER NOT NULL,
    reasks            INTEGER NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    latency_s         DOUBLE,
    created_at        TIMESTAMP DEFAULT current_timestamp
);
