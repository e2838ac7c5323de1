-- accuracy: the point estimate of every cell and group: the mean over cases of each case's
-- share of correct trials (all cases count; a wrong or missing answer counts 0).
with
case_groups as (
    select * from case_groups
),
releases as (
    select release, kind from releases
),
final as (
    select
        g.release as model,
        r.kind,
        g.setting,
        g.format,
        g.grader,
        g.with_image,
        g.group_by,
        g."group",
        count(*)::integer as n_cases,
        avg(g.n_correct / g.n_trials) as accuracy
    from case_groups as g
    join releases as r using (release)
    group by all
)
select * from final
order by model, format, grader, setting, with_image, group_by, "group"
