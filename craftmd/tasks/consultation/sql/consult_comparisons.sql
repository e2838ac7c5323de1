-- consult_comparisons: the paired tests between the consultation releases' settings and between releases, in
-- the shape of comparisons.sql (McNemar's counts on paired trials, from case_scores' bit masks), all text cases.
-- Family 'setting': within a release, the bounds against each other and against the doctor's whole
-- consultation, the consultation against the direct-order oracle, and the oracle's three orders against each other.
-- Family 'model': two releases of one protocol in one setting (same format and grader); releases of two protocols are
-- never paired, and each row names its protocol, so that a Holm family never holds two protocols' tests.
with
protocols as (
    select release, protocol from releases
),
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
    join protocols as px on px.release = x.release
    join protocols as py on py.release = y.release
    where px.protocol = py.protocol
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
select f.* exclude (pa), p.protocol
from final as f
left join protocols as p on p.release = coalesce(f.model, f.a)
order by f.family, f.model, f.setting, f.format, f.grader, f.pa, f.a, f.b
