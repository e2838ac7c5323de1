-- metric_case_scores: every metric but 'correct' (that one is accuracy's), per release, scorer,
-- metric, variant and case: how many trials were scored, how many could not be (status error:
-- no value, never counted as one), and the sum of the scored values. Case-level means and their
-- bootstrap CIs are computed from this in analysis/stats.py (metric_table).
with
scores as (
    select release, case_id, variant, scorer, metric, value, status from score_rows where metric <> 'correct'
),
per_case as (
    select
        release, scorer, metric, variant, case_id,
        count(*) filter (where status = 'ok')::integer as n_trials,
        count(*) filter (where status <> 'ok')::integer as n_failed,
        coalesce(sum(value) filter (where status = 'ok'), 0)::double as value_sum
    from scores
    group by all
),
final as (
    select p.*, o.position as case_position
    from per_case as p
    join sample_order as o using (case_id)
)
select * from final
order by release, scorer, metric, variant, case_position
