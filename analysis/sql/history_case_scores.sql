-- history_case_scores: the history scorer's metrics of standard text conversations, per release,
-- metric and case: the trials scored and the sum of their values (failed scores left out). Read by
-- analysis/history.py (paired tests between models, complexity groups).
with
scores as (
    select release, case_id, metric, value
    from scores
    where scorer = 'history' and status = 'ok' and conversation = 'standard' and not with_image
),
final as (
    select release, metric, case_id, count(*)::integer as n_trials, sum(value)::double as value_sum
    from scores
    group by all
)
select * from final
order by release, metric, case_id
