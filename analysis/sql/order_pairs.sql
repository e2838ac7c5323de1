-- order_pairs: a model's runs in two answer orders (CRAFT-MD's -T answer_order: upstream's order and shuffled), paired
-- by case. Two releases pair when they have one model and protocols that differ in the answer order (and its seed)
-- alone; for each pair, grader, setting and MCQ format, one row per case both have: its trials and correct trials on
-- each side (from case_scores). analysis.answer_order adds the accuracy difference and its paired case-bootstrap CI
-- (tables/order_tests.csv). A release's order is its protocol's option; none recorded is upstream's order.
with
orders as (
    select
        release, model,
        coalesce(json_extract_string(protocol, '$.options.answer_order'), 'upstream') as answer_order,
        json_merge_patch(protocol, '{"options": {"answer_order": null, "order_seed": null}}') as rest
    from releases
    where task = 'craftmd' and protocol is not null
),
pairs as (
    select a.model, a.release as upstream_release, b.release as other_release, b.answer_order
    from orders as a
    join orders as b on a.model = b.model and a.rest = b.rest
    where a.answer_order = 'upstream' and b.answer_order <> 'upstream'
),
scores as (
    select release, grader, setting, format, case_id, n_trials, n_correct
    from case_scores
    where format in ('mcq4', 'mcq_many') and not with_image
        -- (the paired releases' alone: the board's case scores are never all held for a join)
        and release in (select upstream_release from pairs union all select other_release from pairs)
),
final as (
    select
        p.model, p.upstream_release, p.other_release, p.answer_order, a.grader, a.setting, a.format, a.case_id,
        a.n_trials as upstream_trials, a.n_correct as upstream_correct, b.n_trials as other_trials, b.n_correct as other_correct
    from pairs as p
    join scores as a on a.release = p.upstream_release
    join scores as b
        on b.release = p.other_release and b.grader = a.grader and b.setting = a.setting and b.format = a.format
        and b.case_id = a.case_id
)
select * from final
order by model, upstream_release, other_release, grader, setting, format, case_id
