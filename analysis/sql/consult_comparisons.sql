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
per_case as (
    select
        family, model, setting, format, grader, with_image, a, b, pa, case_id,
        bit_count(both_mask)::integer as n_trials,
        bit_count(both_mask & ca & cb)::integer as n11,
        bit_count(both_mask & ca & ~cb)::integer as n10,
        bit_count(both_mask & ~ca & cb)::integer as n01,
        bit_count(both_mask & ~ca & ~cb)::integer as n00
    from (select * from setting_pairs union all select * from model_pairs)
    where both_mask <> 0
),
final as (
    select
        family, model, setting, format, grader, with_image, 'all' as group_by, 'all' as "group", a, b,
        min(pa) as pa,
        count(*)::integer as n_cases,
        sum(n_trials)::integer as n_trials,
        sum(n11)::integer as n11,
        sum(n10)::integer as n10,
        sum(n01)::integer as n01,
        sum(n00)::integer as n00
    from per_case
    group by all
)
select * exclude (pa) from final
order by family, model, setting, format, grader, pa, a, b
