-- history_trials: every standard text conversation the history scorer scored, one row per release,
-- FRQ grader, case and trial: the conversation's patient_info_recall (how much of the vignette the
-- patient revealed) beside whether that grader counted the same trial's multi-turn and vignette
-- free-response answers right. Read by analysis/history.py (accuracy by coverage and by complexity).
with
recall as (
    select release, case_id, trial, value as recall
    from scores
    where scorer = 'history' and metric = 'patient_info_recall' and status = 'ok'
      and conversation = 'standard' and not with_image
),
graded as (
    select
        release, grader, case_id, trial,
        bool_or(correct) filter (where setting = 'multiturn') as multiturn_correct,
        bool_or(correct) filter (where setting = 'vignette') as vignette_correct
    from trial_grades
    where format = 'frq' and not with_image and setting in ('multiturn', 'vignette')
    group by all
),
final as (
    select r.release, g.grader, r.case_id, r.trial, r.recall, g.multiturn_correct, g.vignette_correct
    from recall as r
    join graded as g using (release, case_id, trial)
)
select * from final
order by release, grader, case_id, trial
