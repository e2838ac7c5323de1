-- tested_pairs: which pairs of models the comparisons test (comparisons.sql's family 'model'), one row per setting,
-- format, grader, image flag and pair (a < b). Only releases of one protocol are paired (the releases view's protocol,
-- null when unknown: never paired): a release of another protocol is ranked and tested among its own. Which pairs
-- (pair_options, set by craftmd analyse): in each protocol, setting, format, grader and image flag, the models are
-- ranked by accuracy over their cases (ties by release id); each is tested against its neighbour in that ranking and
-- against the leader (the reference), so the work grows linearly with the board; every pair when the family has at
-- most all_pairs_up_to models, or with all_pairs (--all-pairs).
with
case_scores as (
    select release, grader, setting, format, with_image, n_trials, n_correct from case_scores
),
protocols as (
    select release, protocol from releases where protocol is not null
),
ranked as (
    select
        c.release, p.protocol, c.grader, c.setting, c.format, c.with_image,
        -- accuracy over cases from integers (each case's score on a grid of 1e-9, summed exactly, divided once), so
        -- that equal models tie exactly, whatever order the cases are summed in, and the tie goes to the release id
        row_number() over (partition by p.protocol, c.grader, c.setting, c.format, c.with_image
                           order by sum(c.n_correct::bigint * 1000000000 // c.n_trials) / count(*) desc, c.release) as rk,
        count(*) over (partition by p.protocol, c.grader, c.setting, c.format, c.with_image) as n_models
    from case_scores as c
    join protocols as p using (release)
    group by c.release, p.protocol, c.grader, c.setting, c.format, c.with_image
),
tested as (
    select x.grader, x.setting, x.format, x.with_image, x.release as a, y.release as b
    from ranked as x
    join ranked as y using (protocol, grader, setting, format, with_image)
    cross join pair_options as o
    where x.release < y.release
        and (o.all_pairs or x.n_models <= o.all_pairs_up_to or abs(x.rk - y.rk) = 1 or least(x.rk, y.rk) = 1)
)
select * from tested
order by grader, setting, format, with_image, a, b
