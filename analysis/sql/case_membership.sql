-- case_membership: which groups each case belongs to, besides 'all': its specialty, its source
-- dataset, and, for single-diagnosis cases, the single-diagnosis subset overall ('all') and within
-- its dataset. Read by case_groups and comparisons.
with
cases as (
    select case_id, with_image, source, specialty, single_dx from cases
),
final as (
    select case_id, with_image, 'specialty' as group_by, specialty as "group" from cases where specialty is not null
    union all
    select case_id, with_image, 'dataset', source from cases where source is not null
    union all
    select case_id, with_image, 'single_dx', 'all' from cases where single_dx
    union all
    select case_id, with_image, 'single_dx', source from cases where single_dx and source is not null
)
select * from final
