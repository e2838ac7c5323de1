-- answer_status: per release, setting and format, how many answers were usable (ok) and how
-- many were missing, non-text, refused or failed. Those count as wrong and are shown, not dropped.
with
answers as (
    select release, setting, format, with_image, status from answers
),
final as (
    select
        release as model, setting, format, with_image,
        count(*)::integer as n_answers,
        count(*) filter (where status = 'ok')::integer as n_ok,
        count(*) filter (where status = 'missing')::integer as n_missing,
        count(*) filter (where status = 'non_text')::integer as n_non_text,
        count(*) filter (where status in ('refusal', 'error'))::integer as n_failed
    from answers
    group by all
)
select * from final
order by model, format, setting, with_image
