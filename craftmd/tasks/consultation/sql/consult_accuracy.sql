-- consult_accuracy: the consultation releases' accuracy in every setting (all text cases, every grader), with the
-- case-bootstrap CI of tables/accuracy.csv (registered as accuracy_ci). A setting is a bound (upper: the whole
-- vignette; lower: the initial request alone) or a conversation kind cut after a share of its rounds
-- (consult_40: the doctor's consultation, its first 40 % of rounds).
with
accuracy as (
    select model, setting, format, grader, n_cases, accuracy, ci_low, ci_high
    from accuracy_ci
    where group_by = 'all' and not with_image
),
releases as (
    select release from releases where task = 'consultation'
),
final as (
    select
        a.model,
        a.format,
        a.grader,
        a.setting,
        case when a.setting in ('upper', 'lower') then a.setting else regexp_extract(a.setting, '^(.*)_([0-9]+)$', 1) end
            as conversation,
        case when a.setting in ('upper', 'lower') then null else regexp_extract(a.setting, '_([0-9]+)$', 1)::integer end
            as share,
        a.n_cases,
        a.accuracy,
        a.ci_low,
        a.ci_high
    from accuracy as a
    join releases as r on a.model = r.release
)
select * from final
order by model, format, grader, conversation, share nulls first
