-- agentclinic_verdicts: per release and conversation scored by the moderator or the offline grader, their two verdicts
-- (1 correct, 0 not; null where that scorer gave none). agentclinic_case_scores sums them per case; their agreement beyond
-- chance (Cohen's kappa) is computed from the conversations both scored.
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
)
select * from final
order by release, case_id, trial
