-- grades: the 'correct' scores of answers (metric correct, with the CRAFT-MD answer keys), one row
-- per answer and grader: the verdict (null when the grader could not produce one), what it resolved,
-- and how (resolved_kind, from the score's detail). Read by trial_grades and mcq_rule_gap.
with
scores as (
    select release, case_id, trial, setting, format, with_image, scorer, value, label, detail, status
    from scores
    where metric = 'correct' and setting is not null
),
final as (
    select
        release, case_id, trial, setting, format, with_image,
        scorer as grader,
        label as resolved,
        json_extract_string(detail, '$.resolved_kind') as resolved_kind,
        value = 1 as correct,
        status
    from scores
)
select * from final
