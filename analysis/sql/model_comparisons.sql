-- model_comparisons: comparisons.sql's family 'model': two models in one setting (same format, grader, group), for
-- the pairs of pairs_to_test (grader, setting, format, with_image, a, b: tested_pairs.sql's rows, or those of them
-- whose counts an earlier analysis did not keep: analysis.runner), with McNemar's 2x2 counts on paired trials.
-- Trials pair on (case, trial): per case, the trials both models have are matched through the bit masks of
-- case_scores, then the counts are summed over each group's cases.
with
case_scores as (
    select release, grader, setting, format, with_image, case_id, trials_mask, correct_mask from case_scores
),
tested as (
    select grader, setting, format, with_image, a, b from pairs_to_test
),
s as (
    select * from with_position(case_scores)
),
sides as (
    -- each tested pair's two sides, each found by one join of the pairs to the case scores (joining the case scores to
    -- themselves first, as one join of the three would, costs a pass over every pair of cells)
    select t.a, t.b, t.a as release, s.* exclude (release) from tested as t join s using (setting, grader, format, with_image)
    where s.release = t.a
    union all
    select t.a, t.b, t.b as release, s.* exclude (release) from tested as t join s using (setting, grader, format, with_image)
    where s.release = t.b
),
model_pairs as (
    select
        'model' as family, null::varchar as model, x.setting, x.format, x.grader, x.with_image,
        x.a, x.b, x.position as pa, x.case_id,
        x.trials_mask & y.trials_mask as both_mask, x.correct_mask as ca, y.correct_mask as cb
    from sides as x
    join sides as y using (a, b, setting, format, grader, with_image, case_id)
    where x.release = x.a and y.release = y.b
),
final as (
    select * from mcnemar_groups(model_pairs)
)
select * from final
order by a, b, grader, setting, format, with_image, group_by, "group"
