-- encounter_length: messages per patient-led encounter (doctor and patient together, the cap MedPI counts), per
-- release and per release and ending: the median, the middle 60 % (20th to 80th percentile), the mean, the range,
-- and the doctor's turns. Encounters that failed (ended = error or refusal) are counted (n_failed), never measured.
with
conversations as (
    select release, ended, len(messages) as n_messages, n_turns
    from encounter_conversations
),
measured as (
    select * from conversations where ended not in ('error', 'refusal')
),
by_release as (
    select release, 'all' as ended, n_messages, n_turns from measured
    union all
    select release, ended, n_messages, n_turns from measured
),
failed as (
    select release, count(*) filter (where ended in ('error', 'refusal'))::integer as n_failed, count(*)::integer as n_encounters
    from conversations
    group by all
),
final as (
    select
        b.release as model, b.ended,
        count(*)::integer as n,
        f.n_encounters, f.n_failed,
        quantile_cont(n_messages, 0.5) as median_messages,
        quantile_cont(n_messages, 0.2) as p20_messages,
        quantile_cont(n_messages, 0.8) as p80_messages,
        round(avg(n_messages), 6) as mean_messages,
        min(n_messages)::integer as min_messages,
        max(n_messages)::integer as max_messages,
        round(avg(n_turns), 6) as mean_doctor_turns
    from by_release as b
    join failed as f using (release)
    group by b.release, b.ended, f.n_encounters, f.n_failed
)
select * from final
order by model, ended <> 'all', ended
