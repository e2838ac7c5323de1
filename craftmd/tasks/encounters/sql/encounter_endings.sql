-- encounter_endings: how the patient-led encounters ended, per release: who or what closed each one (ended:
-- doctor_closed, patient_closed, max_messages, refusal, error) crossed with the closure classifier's label
-- (reasonable, not_reasonable; failed when the classifier gave none; missing when no label was recorded), with
-- each cell's share of the release's encounters. Failed encounters are counted here, as every other.
with
conversations as (
    select release, case_id, trial, ended from encounter_conversations
),
closures as (
    select release, case_id, trial, label, status from closures
),
labelled as (
    select
        c.release, c.ended,
        case when l.status is null then 'missing' when l.status <> 'ok' then 'failed' else l.label end as closure
    from conversations as c
    left join closures as l using (release, case_id, trial)
),
counted as (
    select release, ended, closure, count(*)::integer as n
    from labelled
    group by release, ended, closure
),
final as (
    select release as model, ended, closure, n, round(n / sum(n) over (partition by release), 6) as share
    from counted
)
select * from final
order by model, ended, closure
