-- consult_rounds: accuracy against the share of rounds shown to the solver (the framework's turn analysis), per
-- consultation release, format, grader and conversation kind, with the release's two bounds beside each point
-- (upper: the whole vignette; lower: the initial request alone). Reads consult_accuracy.
with
accuracy as (
    select * from consult_accuracy
),
bounds as (
    pivot (select model, format, grader, setting, accuracy from accuracy) on setting in ('upper', 'lower') using max(accuracy)
),
final as (
    select a.model, a.format, a.grader, a.conversation, a.share, a.n_cases, a.accuracy, a.ci_low, a.ci_high, b.upper, b.lower
    from accuracy as a
    left join bounds as b using (model, format, grader)
    where a.share is not null
)
select * from final
order by model, format, grader, conversation, share
