-- comparisons: the paired tests to run, with McNemar's 2x2 counts on paired trials.
-- Family 'setting': two settings of one model (same format, grader, group): setting_comparisons.sql.
-- Family 'model': two models in one setting (same format, grader, group). Which pairs (pair_options, set by
--   craftmd analyse): in each setting, format, grader and image flag, the models are ranked by accuracy over their
--   cases (ties by release id); each is tested against its neighbour in that ranking and against the leader (the
--   reference), so the work grows linearly with the board; every pair when the family has at most
--   all_pairs_up_to models, or with all_pairs (--all-pairs).
-- Trials pair on (case, trial): per case, the trials both sides have are matched through the
-- bit masks of case_scores, then the counts are summed over each group's cases.
with
case_scores as (
    select release, grader, setting, format, with_image, case_id, n_trials, n_correct, trials_mask, correct_mask from case_scores
),
ranked as (
    select
        release, grader, setting, format, with_image,
        row_number() over (partition by grader, setting, format, with_image
                           order by avg(n_correct / n_trials) desc, release) as rk,
        count(*) over (partition by grader, setting, format, with_image) as n_models
    from case_scores
    group by release, grader, setting, format, with_image
),
tested as (
    select x.grader, x.setting, x.format, x.with_image, x.release as a, y.release as b
    from ranked as x
    join ranked as y using (grader, setting, format, with_image)
    cross join pair_options as o
    where x.release < y.release
        and (o.all_pairs or x.n_models <= o.all_pairs_up_to or abs(x.rk - y.rk) = 1 or least(x.rk, y.rk) = 1)
),
setting_order as (
    select setting, position from setting_order
),
s as (
    select cs.*, o.position from case_scores as cs join setting_order as o using (setting)
),
model_pairs as (
    select
        'model' as family, null::varchar as model, a.setting, a.format, a.grader, a.with_image,
        a.release as a, b.release as b, a.position as pa, a.case_id,
        a.trials_mask & b.trials_mask as both_mask, a.correct_mask as ca, b.correct_mask as cb
    from tested as t
    join s as a
        on a.release = t.a and a.setting = t.setting and a.grader = t.grader and a.format = t.format and a.with_image = t.with_image
    join s as b
        on b.release = t.b and a.setting = b.setting and a.grader = b.grader and a.format = b.format
        and a.with_image = b.with_image and a.case_id = b.case_id
),
per_case as (
    select * from mcnemar_cases(model_pairs)
),
membership as (
    select case_id, with_image, group_by, "group" from case_membership
),
grouped as (
    select p.* exclude (a, b), 'all' as group_by, 'all' as "group", p.a, p.b from per_case as p
    union all
    select p.* exclude (a, b), m.group_by, m."group", p.a, p.b from per_case as p join membership as m using (case_id, with_image)
),
final as (
    select * from mcnemar_sums(grouped)
    union all by name
    select * from setting_comparisons
)
select * exclude (pa) from final
order by family, model, setting, format, grader, with_image, group_by, "group", pa, a, b
