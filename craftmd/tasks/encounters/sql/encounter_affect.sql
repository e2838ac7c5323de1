-- encounter_affect: the AI patient's affect over the turns, per release and patient turn: the mean valence
-- (-10..10) and arousal (0..10) of the emotion step's valid states, and the three emotions scored highest on
-- average. A turn whose emotion step failed (status invalid or error: the previous state carried over) is counted
-- in n_failed and left out of the means.
with
states as (
    select release, case_id, trial, turn, valence, arousal, emotions, status from patient_states
),
ok as (
    select * from states where status = 'ok'
),
emotion_means as (
    select release, turn, e.key as emotion, avg(e.value) as mean
    from (select release, turn, unnest(map_entries(cast(emotions as map(varchar, integer)))) as e from ok)
    group by all
),
ranked as (
    select release, turn, emotion, mean,
           row_number() over (partition by release, turn order by mean desc, emotion) as rank
    from emotion_means
),
top as (
    select release, turn, string_agg(emotion || ' ' || printf('%.1f', mean), ', ' order by rank) as top_emotions
    from ranked
    where rank <= 3 and mean > 0
    group by all
),
final as (
    select
        s.release as model, s.turn,
        count(*) filter (where s.status = 'ok')::integer as n_states,
        count(*) filter (where s.status <> 'ok')::integer as n_failed,
        round(avg(s.valence) filter (where s.status = 'ok'), 6) as mean_valence,
        round(avg(s.arousal) filter (where s.status = 'ok'), 6) as mean_arousal,
        t.top_emotions
    from states as s
    left join top as t using (release, turn)
    group by s.release, s.turn, t.top_emotions
)
select * from final
order by model, turn
