-- Per run and step, how many answers were schema-valid at the first try (no re-ask) and the seconds spent
-- waiting for the endpoint: what a small model's structured output costs (docs/MODELS.md).
CREATE OR REPLACE VIEW v_llm_usage AS
SELECT run_id, step, model, count(*) AS calls,
       count(*) FILTER (WHERE cost_class = 'sent') AS sent,
       count(*) FILTER (WHERE cost_class = 'cached') AS cache_hits,
       count(*) FILTER (WHERE cost_class = 'failed') AS failed,
       count(*) FILTER (WHERE cost_class = 'sent' AND reasks = 0) AS valid_first_try,
       sum(prompt_tokens) FILTER (WHERE cost_class <> 'cached') AS prompt_tokens,
       sum(completion_tokens) FILTER (WHERE cost_class <> 'cached') AS completion_tokens,
       sum(wasted_tokens) AS wasted_tokens,
       avg(latency_s) AS mean_latency_s,
       sum(latency_s) FILTER (WHERE cost_class <> 'cached') AS endpoint_s
FROM llm_calls GROUP BY ALL;

COMMENT ON VIEW v_llm_usage IS 'Model calls per run, step and model: tokens, answers valid at the first try, seconds.';
