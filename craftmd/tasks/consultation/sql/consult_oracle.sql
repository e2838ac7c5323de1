-- consult_oracle: the consultation-order oracle: the same keys asked in direct, random and reverse order, the
-- solver's accuracy after each share of rounds, and each order's difference from the direct order at that share.
-- Reads consult_accuracy.
with
accuracy as (
    select * from consult_accuracy where conversation like 'oracle_%'
),
orders as (
    select *, replace(conversation, 'oracle_', '') as "order" from accuracy
),
direct as (
    select model, format, grader, share, accuracy as direct from orders where "order" = 'direct'
),
final as (
    select
        o.model, o.format, o.grader, o.share, o."order", o.n_cases, o.accuracy, o.ci_low, o.ci_high,
        o.accuracy - d.direct as vs_direct
    from orders as o
    left join direct as d using (model, format, grader, share)
)
select * from final
order by model, format, grader, share, case "order" when 'direct' then 0 when 'random' then 1 else 2 end
