-- comparisons: the paired tests to run, with McNemar's 2x2 counts on paired trials: family 'setting', two settings
-- of one model (setting_comparisons.sql), and family 'model', two models in one setting (model_comparisons.sql, for
-- the pairs of tested_pairs.sql), each in the same format, grader and group. Each row names its protocol (the
-- releases view's: the model's, or the pair's, whose two releases ran one protocol), so that a Holm family never holds
-- two protocols' tests.
with
final as (
    select * from model_comparisons
    union all by name
    select * from setting_comparisons
),
protocols as (
    select release, protocol from releases
)
select f.* exclude (pa), p.protocol
from final as f
left join protocols as p on p.release = coalesce(f.model, f.a)
order by f.family, f.model, f.setting, f.format, f.grader, f.with_image, f.group_by, f."group", f.pa, f.a, f.b
