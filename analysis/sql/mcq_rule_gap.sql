-- mcq_rule_gap: where the two MCQ rules disagree, per release and setting. 'paper' credits an
-- answer whenever the correct choice's text appears in it, so an answer naming several choices
-- is credited; 'strict' needs exactly one choice.
with
grades as (
    select release, case_id, trial, setting, format, with_image, grader, resolved_kind, correct
    from grades
    where format = 'mcq4' and grader in ('paper', 'strict')
),
paired as (
    select
        p.release, p.setting, p.with_image,
        p.correct as paper_correct, s.correct as strict_correct,
        p.resolved_kind as paper_kind, s.resolved_kind as strict_kind
    from grades as p
    join grades as s
        on p.release = s.release and p.case_id = s.case_id and p.trial = s.trial
        and p.setting = s.setting and p.with_image = s.with_image
    where p.grader = 'paper' and s.grader = 'strict'
),
final as (
    select
        release as model, setting,
        count(*)::integer as n_answers,
        count(*) filter (where paper_correct)::integer as paper_correct,
        count(*) filter (where strict_correct)::integer as strict_correct,
        count(*) filter (where paper_correct and not strict_correct)::integer as paper_only,
        count(*) filter (where strict_correct and not paper_correct)::integer as strict_only,
        count(*) filter (where paper_correct and paper_kind = 'multiple')::integer as paper_credits_several,
        count(*) filter (where strict_kind = 'multiple')::integer as names_several
    from paired
    group by all
)
select * from final
order by model, setting
