-- Browsing views that keep full text (the CLI cuts long cells only when it prints them), typed
-- run timestamps, the GRPO step fields a reader needs (skipped, groups_used, grad_norm), a view of
-- the tool graphs, and comments on every table and view (DuckDB: duckdb_tables(), duckdb_views(),
-- duckdb_columns() list them; `arenaforge db tables` prints them).

CREATE OR REPLACE VIEW v_runs AS
SELECT id, record->>'flow' AS flow, record->>'status' AS status,
       CAST(record->>'started_at' AS TIMESTAMPTZ) AS started_at,
       CAST(record->>'finished_at' AS TIMESTAMPTZ) AS finished_at,
       epoch(CAST(record->>'finished_at' AS TIMESTAMPTZ)) - epoch(CAST(record->>'started_at' AS TIMESTAMPTZ)) AS duration_s,
       CAST(record->'counts' AS VARCHAR) AS counts, record->>'error' AS error
FROM runs;

CREATE OR REPLACE VIEW v_tools AS
SELECT id, record->>'server' AS server, record->'function'->>'name' AS name, record->>'source' AS source,
       record->'function'->>'description' AS description, (record->>'code') IS NOT NULL AS has_code, run_id
FROM tools;

CREATE OR REPLACE VIEW v_trajectories AS
SELECT t.id, t.record->>'server' AS server, t.record->>'task_id' AS task_id,
       json_array_length(t.record->'messages') AS messages, CAST(t.record->>'tool_calls' AS INTEGER) AS tool_calls,
       CAST(t.record->>'faults_injected' AS INTEGER) AS faults, t.record->>'executor' AS executor,
       t.record->>'final_answer' AS final_answer, t.run_id, t.created_at
FROM trajectories t;

CREATE OR REPLACE VIEW v_environments AS
SELECT id, record->>'name' AS name, record->>'qa_id' AS qa_id, json_array_length(record->'tools') AS tools,
       json_array_length(record->'distractors') AS distractors, json_array_length(record->'calls') AS gold_calls,
       CAST(record->'verification'->>'passed' AS BOOLEAN) AS verified, record->>'question' AS question,
       run_id, created_at
FROM environments;

CREATE OR REPLACE VIEW v_qa_instances AS
SELECT id, record->>'source' AS source, record->>'structure' AS structure, CAST(record->>'hop_level' AS INTEGER) AS hops,
       json_array_length(record->'sub_qas') AS sub_qas, record->>'main_question' AS main_question,
       record->>'main_answer' AS main_answer, run_id
FROM qa_instances;

CREATE OR REPLACE VIEW v_servers AS
SELECT id, record->>'name' AS name, record->>'source' AS source, record->>'domain' AS domain,
       json_array_length(record->'tool_names') AS tools, (record->'launch') IS NOT NULL AND CAST(record->'launch' AS VARCHAR) <> 'null' AS live,
       record->>'title' AS title, run_id, created_at
FROM servers;

CREATE OR REPLACE VIEW v_tasks AS
SELECT id, record->>'server' AS server, record->>'mode' AS mode, record->>'augmentation' AS augmentation,
       CAST(record->>'accepted' AS BOOLEAN) AS accepted,
       CAST(record->'scores'->>'clarity' AS DOUBLE) AS clarity, CAST(record->'scores'->>'realism' AS DOUBLE) AS realism,
       CAST(record->'scores'->>'tool_necessity' AS DOUBLE) AS tool_necessity,
       record->>'query' AS query, CAST(record->'reasons' AS VARCHAR) AS reasons, record->>'chain_id' AS chain_id,
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
       record->>'rationale' AS rationale, run_id, created_at
FROM judge_scores;

CREATE OR REPLACE VIEW v_train_steps AS
SELECT id, record->>'experiment' AS experiment, record->>'algorithm' AS algorithm,
       CAST(record->>'step' AS INTEGER) AS step,
       coalesce(CAST(record->'metrics'->>'skipped' AS DOUBLE), 0) > 0 AS skipped,
       CAST(record->'metrics'->>'groups_used' AS DOUBLE) AS groups_used,
       CAST(record->'metrics'->>'reward' AS DOUBLE) AS reward,
       CAST(record->'metrics'->>'recall' AS DOUBLE) AS recall,
       CAST(record->'metrics'->>'precision' AS DOUBLE) AS precision,
       CAST(record->'metrics'->>'calls' AS DOUBLE) AS calls,
       CAST(record->'metrics'->>'zero_variance_share' AS DOUBLE) AS zero_variance_share,
       CAST(record->'metrics'->>'loss' AS DOUBLE) AS loss,
       CAST(record->'metrics'->>'grad_norm' AS DOUBLE) AS grad_norm,
       CAST(record->'metrics'->>'response_len' AS DOUBLE) AS response_len,
       CAST(record->'metrics'->>'rollout_s' AS DOUBLE) AS rollout_s,
       CAST(record->'metrics'->>'train_s' AS DOUBLE) AS train_s,
       run_id, created_at
FROM train_steps;

CREATE OR REPLACE VIEW v_graph_edges AS
SELECT server, src, dst, src || ' -> ' || dst AS edge, weight, uses, origin, evidence, updated_at
FROM graph_edges;

-- Tables
COMMENT ON TABLE tools IS 'Normalised tool documents (OpenAI function schema), one per tool and server; record JSON, content id.';
COMMENT ON TABLE servers IS 'Tool servers (services): name, source, tool names, launch command of live MCP servers.';
COMMENT ON TABLE tool_chains IS 'Sampled walks over a server''s tool graph (candidate call chains), verified or not.';
COMMENT ON TABLE tasks IS 'Synthesized user tasks (chain-conditioned or server-only), with quality scores and acceptance.';
COMMENT ON TABLE trajectories IS 'Multi-turn agent trajectories (OpenAI messages) over MCP servers, the sandbox or the simulator.';
COMMENT ON TABLE judge_scores IS 'Seven-dimension judge scores of trajectories; keep = mean above the SFT threshold.';
COMMENT ON TABLE qa_instances IS 'Question decompositions over a knowledge source: a DAG of sub-QAs with evidence.';
COMMENT ON TABLE qa_verifications IS 'Verdicts of the four QA checks with the keep rule applied.';
COMMENT ON TABLE environments IS 'Executable RL environments: tool code, state, gold calls and answers, verification.';
COMMENT ON TABLE env_merges IS 'Merges of functionally equivalent tools across environments, done or refused.';
COMMENT ON TABLE distractor_sets IS 'Distractor tools chosen per environment by similarity band.';
COMMENT ON TABLE rollouts IS 'Policy episodes on environments with the F1 reward (env_failure rows are excluded from rewards).';
COMMENT ON TABLE runs IS 'One row per flow execution: flow, parameters, status, counts; its id stamps what it wrote.';
COMMENT ON TABLE rejections IS 'Everything a stage refused, with stage, reason and detail; environment_failure marks infrastructure.';
COMMENT ON TABLE llm_cache IS 'Model responses keyed by a hash of model, parameters, messages, tools and schema.';
COMMENT ON TABLE llm_calls IS 'One row per model call (cache hits included): tokens, latency, attempts, re-asks.';
COMMENT ON TABLE graph_edges IS 'Directed edges of each server''s tool graph with evidence weight and how often walks used them.';
COMMENT ON TABLE train_steps IS 'Per-step training metrics (GRPO, SFT, warm start).';
COMMENT ON TABLE checkpoints IS 'Saved checkpoints of training experiments.';
COMMENT ON TABLE eval_runs IS 'Evaluation summaries of a policy on held-out environments.';
COMMENT ON TABLE schema_migrations IS 'Applied warehouse migrations.';

-- Columns every record table shares
COMMENT ON COLUMN tools.id IS 'Content id: hash of the canonical record JSON (re-runs add no duplicates).';
COMMENT ON COLUMN tools.run_id IS 'The run (runs.id) that wrote the row.';
COMMENT ON COLUMN tools.parents IS 'Ids of the records this one was made from (lineage).';
COMMENT ON COLUMN tools.record IS 'The record, validated against arenaforge/schemas/json/tool.schema.json.';
COMMENT ON COLUMN environments.record IS 'The record, validated against arenaforge/schemas/json/environment.schema.json.';
COMMENT ON COLUMN rejections.record IS 'stage, subject, reason, detail, payload, environment_failure (rejection.schema.json).';
COMMENT ON COLUMN graph_edges.weight IS 'Evidence for the edge, 0..1 (data-flow match score or model votes).';
COMMENT ON COLUMN graph_edges.uses IS 'Trajectories that walked the edge; sampling prefers rarely used edges.';
COMMENT ON COLUMN graph_edges.origin IS 'dataflow, model or both.';

-- Views
COMMENT ON VIEW v_runs IS 'Runs with typed timestamps and duration.';
COMMENT ON COLUMN v_runs.started_at IS 'When the run started (TIMESTAMPTZ).';
COMMENT ON COLUMN v_runs.duration_s IS 'finished_at - started_at in seconds; NULL while running.';
COMMENT ON VIEW v_rejections IS 'Rejections by stage and reason; environment_failure = infrastructure, not the data.';
COMMENT ON VIEW v_tools IS 'Tools with their full descriptions.';
COMMENT ON VIEW v_servers IS 'Servers: tool count, live (MCP) or from documents.';
COMMENT ON VIEW v_tool_chains IS 'Sampled tool chains as "a > b > c".';
COMMENT ON VIEW v_tasks IS 'Tasks with their quality scores and full query text.';
COMMENT ON VIEW v_trajectories IS 'Trajectories: message and call counts, injected faults, final answer.';
COMMENT ON VIEW v_judge_scores IS 'Judge scores per dimension with the rationale.';
COMMENT ON VIEW v_sft_kept IS 'Trajectories whose latest judge score keeps them for SFT (what sft export writes).';
COMMENT ON VIEW v_qa_instances IS 'QA decompositions: structure, hops, full main question and answer.';
COMMENT ON VIEW v_qa_verifications IS 'QA verification verdicts.';
COMMENT ON VIEW v_environments IS 'Environments: tool, distractor and gold-call counts, verified, full question.';
COMMENT ON VIEW v_env_merges IS 'Tool merges across environments.';
COMMENT ON VIEW v_distractor_sets IS 'Distractor picks per environment.';
COMMENT ON VIEW v_rollouts IS 'Rollouts with reward components and status.';
COMMENT ON VIEW v_train_steps IS 'Training steps: skipped (no usable group), groups used, reward, loss, gradient norm, timings.';
COMMENT ON COLUMN v_train_steps.skipped IS 'True when the step had no group with reward variance and did not update the policy.';
COMMENT ON COLUMN v_train_steps.groups_used IS 'Rollout groups that entered the update (GRPO).';
COMMENT ON COLUMN v_train_steps.grad_norm IS 'Gradient norm before clipping; -1 when it was not finite.';
COMMENT ON VIEW v_checkpoints IS 'Checkpoints per experiment and step.';
COMMENT ON VIEW v_eval_runs IS 'Evaluation results: F1, recall, precision, calls per task, failure reasons.';
COMMENT ON VIEW v_llm_usage IS 'Model calls and tokens per run, step and model.';
COMMENT ON VIEW v_graph_edges IS 'Tool-graph edges per server with weight, uses and evidence.';
