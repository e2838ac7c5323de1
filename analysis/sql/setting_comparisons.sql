-- setting_comparisons: comparisons.sql's family 'setting' (two settings of one model, same format, grader and
-- group), with McNemar's 2x2 counts on paired trials. A model's rows read only its own case scores, so the analysis
-- keeps them per release (analysis.runner.keep); comparisons.sql adds the pairs of models and orders both.
-- Trials pair on (case, trial): per case, the trials both settings have are matched through the bit masks of
-- case_scores, then the counts are summed over each group's cases.
with
s as (
    select release, grader, setting, format, with_image, case_id, trials_mask, correct_mask, position
    from with_position(case_scores)
),
setting_pairs as (
    select
        'setting' as family, a.release as model, null::varchar as setting, a.format, a.grader, a.with_image,
        a.setting as a, b.setting as b, a.position as pa, a.case_id,
        a.trials_mask & b.trials_mask as both_mask, a.correct_mask as ca, b.correct_mask as cb
    from s as a
    join s as b
        on a.release = b.release and a.grader = b.grader and a.format = b.format
        and a.with_image = b.with_image and a.case_id = b.case_id and a.position < b.position
),
final as (
    select * from mcnemar_groups(setting_pairs)
)
select * from final
order by model, format, grader, with_image, group_by, "group", pa, a, b
