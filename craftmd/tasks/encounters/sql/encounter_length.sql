-- encounter_length: messages per patient-led encounter (doctor and patient together, the cap MedPI counts), per
-- release ('all') and per release and ending: the median, the middle 60 % (20th to 80th percentile), the mean, the
-- range, and the doctor's turns. Encounters that failed (ended = error or refusal) are counted (n_failed), never
-- measured; every release has its 'all' row.
with
conversations as (
    select
        release, ended,
        case when ended in ('error', 'refusal') then null else len(messages) end as n_messages,
        case when ended in ('error', 'refusal') then null else n_turns end as n_turns
    from encounter_conversations
),
by_release as (
    select release, 'all' as ended, n_messages, n_turns from conversations
    union all
    select release, ended, n_messages, n_turns from conversations where n_messages is not null
),
totals as (
    select release, count(*) filter (where n_messages is null)::integer as n_failed, count(*)::integer as n_encounters
    from conversations
    group by release
),
final as (
    select
        b.release as model, b.ended,
        count(b.n_messages)::integer as n,
        t.n_encounters, t.n_failed,
        quantile_cont(b.n_messages, 0.5) as median_messages,
        quantile_cont(b.n_messages, 0.2) as p20_messages,
        quantile_cont(b.n_messages, 0.8) as p80_messages,
        round(avg(b.n_messages), 6) as mean_messages,
        min(b.n_messages)::integer as min_messages,
        max(b.n_messages)::integer as max_messages,
        round(avg(b.n_turns), 6) as mean_doctor_turns
    from by_release as b
    join totals as t using (release)
    group by b.release, b.ended, t.n_encounters, t.n_failed
)
select * from final
order by model, ended <> 'all', ended
