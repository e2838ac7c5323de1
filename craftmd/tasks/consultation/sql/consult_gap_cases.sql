-- consult_gap_cases: for the share of the bound gap a conversation closes ((consult - lower) / (upper - lower)),
-- per consultation release, grader, format, conversation kind and share of rounds: each case's correct trials
-- and trials in that setting and in both bounds, on the cases that have all three (the pairing). Read by
-- analysis.py beside this folder, which resamples the cases.
with
cases as (
    select release, grader, setting, format, case_position, n_trials, n_correct
    from case_groups
    where group_by = 'all' and not with_image and release in (select release from releases where task = 'consultation')
),
bounds as (
    pivot (select release, grader, format, case_position, setting, n_trials, n_correct from cases)
    on setting in ('upper', 'lower')
    using max(n_trials) as trials, max(n_correct) as correct
),
conversations as (
    select
        release, grader, format, case_position,
        regexp_extract(setting, '^(.*)_([0-9]+)$', 1) as conversation,
        regexp_extract(setting, '_([0-9]+)$', 1)::integer as share,
        n_trials, n_correct
    from cases
    where setting not in ('upper', 'lower')
),
final as (
    select c.*, b.upper_trials, b.upper_correct, b.lower_trials, b.lower_correct
    from conversations as c
    join bounds as b using (release, grader, format, case_position)
    where b.upper_trials is not null and b.lower_trials is not null
)
select * from final
order by release, grader, format, conversation, share, case_position
