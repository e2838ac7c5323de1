-- agentclinic_case_scores: per release and case, what its conversations did and how they were scored: the trials, those
-- whose call failed (never measured), the doctor's messages and tests summed over the others, those that ran out of
-- budget, and per scorer (the moderator, the offline grader) the scored trials and the correct ones, and the trials both
-- scored with the verdicts they agree on (each conversation's verdicts: agentclinic_verdicts). Case-level means and
-- their bootstrap CIs are made from this in analysis.py.
with
osce as (
    select release, case_id, trial, ended, questions_used, tests_requested
    from osce
),
joined as (
    select o.*, v.moderator, v.offline, o.ended in ('refusal', 'error') as failed
    from osce as o
    left join agentclinic_verdicts as v using (release, case_id, trial)
),
final as (
    select
        release, case_id,
        count(*)::integer as n_trials,
        count(*) filter (where failed)::integer as n_failed,
        coalesce(sum(questions_used) filter (where not failed), 0)::integer as questions_used,
        coalesce(sum(tests_requested) filter (where not failed), 0)::integer as tests_requested,
        count(*) filter (where ended = 'out_of_budget')::integer as out_of_budget,
        count(moderator)::integer as moderator_n,
        coalesce(sum(moderator), 0)::integer as moderator_correct,
        count(offline)::integer as offline_n,
        coalesce(sum(offline), 0)::integer as offline_correct,
        count(*) filter (where moderator is not null and offline is not null)::integer as both_n,
        count(*) filter (where moderator = offline)::integer as both_agree
    from joined
    group by release, case_id
)
select * from final
order by release, case_id
