-- trial_grades: every answer of every release, once per grader that graded its cell
-- (release x setting x format x image flag), with that grader's verdict.
-- A missing / non-text answer, or an answer the grader left without a row, counts as wrong:
-- answers are never dropped. A grade the grader could not produce (status error: a failed call)
-- is no verdict: that trial is left out of the cell, never counted as wrong.
with
answers as (
    select release, case_id, trial, setting, format, with_image, status
    from answers
),
grades as (
    select release, case_id, trial, setting, format, with_image, grader, correct, status as grade_status
    from grades
),
graded_cells as (
    select distinct release, setting, format, with_image, grader
    from grades
),
final as (
    select
        a.release,
        c.grader,
        a.setting,
        a.format,
        a.with_image,
        a.case_id,
        a.trial,
        a.status,
        coalesce(g.correct, false) and a.status = 'ok' as correct
    from answers as a
    join graded_cells as c using (release, setting, format, with_image)
    left join grades as g using (release, setting, format, with_image, grader, case_id, trial)
    where g.grade_status is distinct from 'error'
)
select * from final
