-- consult_comparisons: the paired tests between the consultation releases' settings and between releases, in
-- the shape of comparisons.sql (McNemar's counts on paired trials, from case_scores' bit masks), all text cases.
-- Family 'setting': within a release, the bounds against each other and against the doctor's whole
-- consultation, the consultation against the direct-order oracle, and the oracle's three orders against each other.
-- Family 'model': two releases in one setting (same format and grader).
with
case_scores as (
    select release, grader, setting, format, with_image, case_id, trials_mask, correct_mask
    from case_scores
    where not with_image and release in (select release from releases where task = 'consultation')
),
pairs (a, b, pa) as (
    values
        ('upper', 'lower', 0),
        ('consult_100', 'upper', 1),
        ('consult_100', 'lower', 2),
        ('consult_100', 'oracle_direct_100', 3),
        ('oracle_direct_100', 'oracle_random_100', 4),
        ('oracle_direct_100', 'oracle_reverse_100', 5),
        ('oracle_random_100', 'oracle_reverse_100', 6)
),
setting_pairs as (
    select
        'setting' as family, x.release as model, null::varchar as setting, x.format, x.grader, x.with_image,
        p.a, p.b, p.pa, x.case_id,
        x.trials_mask & y.trials_mask as both_mask, x.correct_mask as ca, y.correct_mask as cb
    from pairs as p
    join case_scores as x on x.setting = p.a
    join case_scores as y
        on y.setting = p.b and x.release = y.release and x.grader = y.grader and x.format = y.format and x.case_id = y.case_id
),
model_pairs as (
    select
        'model' as family, null::varchar as model, x.setting, x.format, x.grader, x.with_image,
        x.release as a, y.release as b, 0 as pa, x.case_id,
        x.trials_mask & y.trials_mask as both_mask, x.correct_mask as ca, y.correct_mask as cb
    from case_scores as x
    join case_scores as y
        on x.setting = y.setting and x.grader = y.grader and x.format = y.format and x.case_id = y.case_id and x.release < y.release
),
all_pairs as (
    select * from setting_pairs union all select * from model_pairs
),
per_case as (
    select * exclude (a, b), 'all' as group_by, 'all' as "group", a, b from mcnemar_cases(all_pairs)
),
final as (
    select * from mcnemar_sums(per_case)
)
select * exclude (pa) from final
order by family, model, setting, format, grader, pa, a, b
