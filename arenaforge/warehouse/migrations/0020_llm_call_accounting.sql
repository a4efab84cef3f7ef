-- Every model request is a `llm_calls` row with its cost class: sent (tokens spent), cached (answered from
-- llm_cache, no tokens spent) or failed (error_kind says why). wasted_tokens: tokens of answers thrown away.
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS cost_class VARCHAR;
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS error_kind VARCHAR;
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS wasted_tokens INTEGER;
UPDATE llm_calls SET cost_class = CASE WHEN cached THEN 'cached' ELSE 'sent' END WHERE cost_class IS NULL;

CREATE OR REPLACE VIEW v_llm_usage AS
SELECT run_id, step, model, count(*) AS calls,
       count(*) FILTER (WHERE cost_class = 'sent') AS sent,
       count(*) FILTER (WHERE cost_class = 'cached') AS cache_hits,
       count(*) FILTER (WHERE cost_class = 'failed') AS failed,
       sum(prompt_tokens) FILTER (WHERE cost_class <> 'cached') AS prompt_tokens,
       sum(completion_tokens) FILTER (WHERE cost_class <> 'cached') AS completion_tokens,
       sum(wasted_tokens) AS wasted_tokens,
       avg(latency_s) AS mean_latency_s
FROM llm_calls GROUP BY ALL;

-- Rejections counted apart by failure kind (quality vs. provider vs. infrastructure).
CREATE OR REPLACE VIEW v_rejections AS
SELECT id, run_id, record->>'stage' AS stage, record->>'subject' AS subject, record->>'reason' AS reason,
       coalesce(record->>'kind', CASE WHEN CAST(record->>'environment_failure' AS BOOLEAN) THEN 'infrastructure'
                                      ELSE 'quality_rejection' END) AS kind,
       record->>'detail' AS detail, CAST(record->>'environment_failure' AS BOOLEAN) AS environment_failure, created_at
FROM rejections;
