-- more_comparisons: the paper's other paired tests, with McNemar's 2x2 counts on paired trials (as comparisons.sql).
-- Family 'format': one model's four-choice MCQ (side a, under each MCQ rule) against its free response (side b, under
--   each FRQ grader), in one setting (the paper's Supplementary Table 3).
-- Family 'image': one model's answers with the case's image (side a) against its answers to the same image case
--   without it (side b), in one setting, format and grader (Supplementary Table 21); the image cases, overall only.
-- Each side is a cell of case_scores: release x grader x setting x format x image flag. Trials pair on (case, trial),
-- matched per case through the bit masks, then summed over each group's cases. Groups: overall, per dataset and the
-- single-diagnosis subset (the groups McNemar runs on).
with
case_scores as (
    select release, grader, setting, format, with_image, case_id, trials_mask, correct_mask from case_scores
),
s as (
    select * from with_position(case_scores)
),
image_cases as (
    select distinct case_id from cases where with_image
),
all_pairs as (
    select
        if(a.format = b.format, 'image', 'format') as family, a.release as model, a.setting, a.position as pa,
        a.format as format_a, a.grader as grader_a, a.with_image as image_a,
        b.format as format_b, b.grader as grader_b, b.with_image as image_b,
        a.case_id, a.with_image,
        a.trials_mask & b.trials_mask as both_mask, a.correct_mask as ca, b.correct_mask as cb
    from s as a
    join s as b on a.release = b.release and a.setting = b.setting and a.case_id = b.case_id
    where (a.format = 'mcq4' and b.format = 'frq' and a.with_image = b.with_image)
        or (a.format = b.format and a.grader = b.grader and a.with_image and not b.with_image
            and a.case_id in (select case_id from image_cases))
),
per_case as (
    select * from mcnemar_cases(all_pairs)
),
membership as (
    select case_id, with_image, group_by, "group" from case_membership where group_by in ('dataset', 'single_dx')
),
grouped as (
    select p.* exclude (with_image), 'all' as group_by, 'all' as "group" from per_case as p
    union all
    select p.* exclude (with_image), m.group_by, m."group" from per_case as p join membership as m using (case_id, with_image)
    where p.family = 'format'
),
final as (
    select * from mcnemar_sums(grouped)
)
select * from final  -- (pa, the setting's position, stays: the analysis orders the rows it kept per release by it)
order by family, model, grader_a, grader_b, format_a, image_a, group_by, "group", pa
