-- case_groups: one row per cell (release x grader x setting x format x image flag), group and case:
-- the case's correct trials out of its trials (from case_scores). A case scores the mean of its trials, a cell the
-- mean over its cases (the paper's accuracy). Groups: all cases, and those of case_membership.
with
case_scores as (
    select release, grader, setting, format, with_image, case_id, n_trials, n_correct from case_scores
),
membership as (
    select case_id, with_image, group_by, "group" from case_membership
),
grouped as (
    select s.*, 'all' as group_by, 'all' as "group" from case_scores as s
    union all
    select s.*, m.group_by, m."group"
    from case_scores as s
    join membership as m using (case_id, with_image)
),
final as (
    select
        release, grader, setting, format, with_image, group_by, "group",
        o.position as case_position,
        n_trials, n_correct
    from grouped
    join sample_order as o using (case_id)
)
select * from final
order by release, grader, setting, format, with_image, group_by, "group", case_position
