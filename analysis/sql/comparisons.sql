-- comparisons: the paired tests to run, with McNemar's 2x2 counts on paired trials: family 'setting', two settings
-- of one model (setting_comparisons.sql), and family 'model', two models in one setting (model_comparisons.sql, for
-- the pairs of tested_pairs.sql), each in the same format, grader and group.
with
final as (
    select * from model_comparisons
    union all by name
    select * from setting_comparisons
)
select * exclude (pa) from final
order by family, model, setting, format, grader, with_image, group_by, "group", pa, a, b
