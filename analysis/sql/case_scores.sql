-- case_scores: one row per cell (release x grader x setting x format x image flag) and case:
-- how many trials the case has and how many were correct, plus the trials as bit masks
-- (bit t = trial t present / correct) so that paired comparisons can match trials per case. Ordered, so that a
-- release's rows kept by the analysis (analysis.runner.keep) are the same bytes every time.
with
trial_grades as (
    select release, grader, setting, format, with_image, case_id, trial, correct from trial_grades
),
final as (
    select
        release, grader, setting, format, with_image, case_id,
        count(*)::integer as n_trials,
        sum(correct::integer)::integer as n_correct,
        bit_or(1::bigint << trial) as trials_mask,
        bit_or(case when correct then 1::bigint << trial else 0::bigint end) as correct_mask
    from trial_grades
    group by all
)
select * from final
order by release, grader, setting, format, with_image, case_id
