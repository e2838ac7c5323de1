-- agentclinic_verdicts: every conversation both the moderator and the offline grader scored, with their two verdicts
-- (1 correct, 0 not): what their agreement beyond chance (Cohen's kappa) is computed from.
with
scores as (
    select release, case_id, trial, scorer, value
    from osce_scores
    where metric = 'correct' and status = 'ok' and scorer in ('agentclinic-moderator', 'agentclinic-offline')
),
final as (
    select
        release, case_id, trial,
        max(value) filter (where scorer = 'agentclinic-moderator') as moderator,
        max(value) filter (where scorer = 'agentclinic-offline') as offline
    from scores
    group by release, case_id, trial
    having count(*) filter (where scorer = 'agentclinic-moderator') > 0 and count(*) filter (where scorer = 'agentclinic-offline') > 0
)
select * from final
order by release, case_id, trial
